"""A run directory's archive: `--restart` moves the run there (out/archive/<UTC time>/) instead of deleting it, and
every later report of that directory keeps the privacy the archived runs spent.

Restarting a run on the same data does not give the privacy it spent back: whoever saw that run's models or
messages saw them. ``archived_spend`` reads each archived ledger; the report lists each run's epsilon per observer and
their total with the current run by basic composition (Dwork & Roth 2014, Thm 3.16: (eps_1, delta_1)- and
(eps_2, delta_2)-DP releases together are (eps_1 + eps_2, delta_1 + delta_2)-DP), an upper bound that holds whatever
the runs were.
"""

from __future__ import annotations

import math
import os
from datetime import datetime, timezone
from pathlib import Path

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.engine.keys import KEY_FILE
from dpfl.errors import RunDirectoryError

RUN_FILES = ("ledger.json", "checkpoint.pt", "results.json", "run.json", KEY_FILE)


def archive_run(out: Path) -> Path | None:
    """Moves the run files in ``out`` (RUN_FILES) into out/archive/<UTC timestamp>/ and returns that folder (None if
    there was nothing to archive). Nothing is deleted: the archived ledger still records the privacy it spent."""
    present = [name for name in RUN_FILES if (out / name).exists()]
    if not present:
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target, n = out / "archive" / stamp, 1
    while target.exists():
        n += 1
        target = out / "archive" / f"{stamp}-{n}"
    try:
        target.mkdir(parents=True)
        for name in present:
            os.replace(out / name, target / name)
    except OSError as err:
        raise RunDirectoryError(f"cannot archive the run in {out} to {target}: {err.strerror or err}") from None
    return target


def archived_spend(out: Path | None) -> list[dict]:
    """Each archived run of ``out`` that has a ledger, oldest first: {"directory", "rounds", "epsilon" per observer
    (None: infinite), "delta"}. A damaged archived ledger is refused (RunDirectoryError naming it): it records privacy
    spent."""
    folder = None if out is None else out / "archive"
    if folder is None or not folder.is_dir():
        return []
    runs = []
    for run in sorted(p for p in folder.iterdir() if (p / "ledger.json").is_file()):
        ledger = PrivacyLedger.load(run / "ledger.json")
        runs.append({"directory": str(run), "rounds": ledger.compositions, "delta": ledger.delta,
                     "epsilon": {o: None if math.isinf(e) else e for o, e in ledger.epsilon().items()}})
    return runs


def with_archived(epsilon: dict, delta: float, archived: list[dict]) -> dict:
    """{"epsilon" per observer, "delta"}: this run's and the archived runs' together, by basic composition (an
    observer an archived run did not have is charged this run's epsilon alone; None: infinite)."""
    total = {}
    for observer, eps in epsilon.items():
        parts = [eps, *(run["epsilon"].get(observer, 0.0) for run in archived)]
        total[observer] = None if any(p is None for p in parts) else sum(parts)
    return {"epsilon": total, "delta": delta + sum(run["delta"] for run in archived)}


__all__ = ["RUN_FILES", "archive_run", "archived_spend", "with_archived"]
