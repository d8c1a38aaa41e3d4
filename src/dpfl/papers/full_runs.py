"""The expected wall time of each item's full run (`dpfl reproduce ITEM`, the paper's sizes and data set), where it
was measured, and how. The items whose full run reads a data set this machine cannot download were timed on random
images in the real files' format and size (``DPFL_DATA`` pointing at them): the first three of an item's training runs
ran at full size, every later one was counted, not run, and the estimate is the item's rounds at the measured seconds
per round, plus its own work besides the runs."""

from __future__ import annotations

#: item id -> its full run's expected wall time, and on what it was measured
FULL_RUNS: dict[str, str] = {}
