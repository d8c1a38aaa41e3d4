"""The expected wall time of each item's full run (`dpfl reproduce ITEM`, the paper's sizes and data set), where it
was measured, and how. The items whose full run reads a data set this machine cannot download were timed on random
images in the real files' format and size (``DPFL_DATA`` pointing at them): the first three of an item's training runs
ran at full size, every later one was counted, not run, and the estimate is the item's rounds at the measured seconds
per round, plus its own work besides the runs."""

from __future__ import annotations

#: Where and how (2026-12-07): this 2-core machine beside other jobs (load average 3 to 4), one torch thread
_ON = "on 2 cores beside other jobs (load 3-4; about half on a quiet machine)"

#: item id -> its full run's expected wall time, and on what it was measured
FULL_RUNS: dict[str, str] = {
    "zhou2021-loss": f"about 17 h {_ON}: 720 runs, 113,490 rounds at 0.55 s a round (three runs of 10, 50 and 100 "
                     "rounds timed: 5.5, 26.6 and 55.2 s; every Laplace round is a full-batch gradient of 6,000 "
                     "records of 784 features a client), and 4 min of non-private constant estimates",
    "zhou2021-gaussian": f"about 8 min {_ON}: 120 runs, 9,030 rounds (a 100-round run timed: 2.9 s), and 2.6 min of "
                         "constant estimates",
    "zhou2021-fig1": f"about 13 h {_ON}: 530 runs, 82,620 rounds at 0.55 s a round (zhou2021-loss's) and 1.7 s of "
                     "evaluations a run (three 10-round runs timed: 7.0-7.5 s), and 3.6 min of constant estimates",
    "zhou2021-data-size": "not timed to the end: it estimates the constants at each of its 10 portions of the data "
                          "(2.6 min each at the whole of it) and runs 1,000 points at the planned (b*, T*); expect "
                          "several hours",
    "heikkila2024-local-steps": f"about 5 min {_ON}: 30 runs of 20 rounds (timed: 7.9 and 15.5 s, the first with its "
                                "warm-up)",
    "heikkila2024-rounds": f"about 20 min {_ON}: 160 runs, 3,160 rounds, at 2.2 s a run and 0.28 s a round (fitted "
                           "to the timed runs of both Heikkilä items: 1 round 2.3-3.7 s, 20 rounds 7.9 s)",
}

#: item id -> why it has no full run (``dpfl reproduce ITEM`` without --quick refuses, naming it)
NO_FULL_RUN: dict[str, str] = {
    "lowy2023-mnist": "the Lowy et al. experiment has no MNIST setting: the paper's PCA to 60 dimensions is "
                      "non-private, and no public projection is built",
}
