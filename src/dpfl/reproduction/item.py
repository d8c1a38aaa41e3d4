"""One reproduced item of a paper (a table, a figure, a claim): what it is, the paper's numbers, how dpfl recomputes
them at two sizes, and one row per compared quantity.

An item's ``settings(quick)`` is everything its run depends on (JSON; its sha256 names the cache folder), and
``compute(settings, folder)`` runs it, draws the item's figure into ``folder`` and returns its ``Row``s and any other
results. Quick settings run in minutes on 2 cores on the data that ships with dpfl; full settings are the paper's
sizes, on the paper's data set where ``data`` names one that dpfl reads from its published files.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

#: An item's status, as `dpfl reproduce --list` prints it.
REPRODUCED, DIFFERS = "reproduced", "differs"


@dataclass(frozen=True)
class Row:
    """One compared quantity: the paper's value, dpfl's under the sound analysis and, where the paper's privacy
    argument differs, under the paper's analysis; whether they agree (None: nothing to agree on, e.g. a value the
    paper does not state) and the reason for a difference."""

    quantity: str
    paper: Any
    sound: Any
    paper_analysis: Any = None
    match: bool | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Item:
    """A paper's table, figure or claim, reproduced (module docstring)."""

    id: str
    paper: str  # "Noble, Bellet, Dieuleveut (2022)"
    what: str  # "Table 1: ..."
    source: str  # where the paper's numbers come from
    status: str  # REPRODUCED or DIFFERS
    why: str  # one line: what is reproduced, or why it differs
    settings: Callable[[bool], dict]
    compute: Callable[[dict, Path], dict]
    data: str | None = None  # the public data set (data.name) of the full run; None: generated or bundled data
    substitute: str = ""  # the quick run's stand-in for ``data``, and what else it scales down
    research_mode: bool = False  # trains with run.noise_seed (reproducible noise, labelled as such)
    full_run: str = ""  # the full run's expected wall time and what it was measured on (``dpfl.papers.full_runs``)
    no_full_run: str = ""  # why the item has no full run (refused; ``dpfl.papers.full_runs``); "": it has one
    tags: tuple[str, ...] = field(default_factory=tuple)


def agrees(paper: float, ours: float, digits: int) -> bool:
    """``ours`` printed to ``digits`` decimals is ``paper`` (the paper's own precision), or within half a unit of its
    last digit (a printed x.xx5 may round either way)."""
    return round(ours, digits) == round(paper, digits) or abs(ours - paper) <= 0.5 * 10 ** -digits + 1e-12


def about(paper: float, ours: float, tolerance: float) -> bool:
    """A size the paper states as "about ``paper``" (a gap read off its curves, printed in words), matched when
    ``ours`` is within ``tolerance`` of it: the one rule of every such claim, each row naming its tolerance (a direction
    alone is matched by the rows that state a direction)."""
    return abs(ours - paper) <= tolerance + 1e-12


def fmt(value: Any, digits: int = 3) -> str:
    """A value as a report prints it: None as an en dash, a float to ``digits`` significant digits (scientific below
    1e-3), a bool as holds / does not hold, anything else as its text."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "holds" if value else "does not hold"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
        if value != 0 and abs(value) < 1e-3:
            return f"{value:.{digits}e}"
        return f"{value:.{digits}g}" if abs(value) >= 10 ** digits else f"{value:#.{digits}g}".rstrip(".")
    return str(value)
