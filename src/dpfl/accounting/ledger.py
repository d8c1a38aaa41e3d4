"""The per-observer privacy ledger of a run (ARCHITECTURE principle 2).

For every observer (third party, server, another silo) the ledger composes the events of every round the run has
*started*, and reports epsilon at the run's delta. It is

* composed BEFORE a round draws its noise, so a configured budget stops the run before the round that would exceed
  it (``BudgetExceededError``), never after;
* a journal: one entry per composed round, saved with the run's checkpoint. A resumed run that replays a round with
  the same randomness (same events and same fingerprint of the generator state: an identical release, so no new
  privacy loss) finds it already recorded and does not count it twice; anything else is counted again. Spent budget
  is never forgotten.

Sampling without replacement is bounded as in seed 000 App. B by default (``subsampling_bound="paper"``, which
reproduces the paper's epsilons) or with the tighter valid cap (``"tight"``, see ``dpfl.accounting.rdp``).

Epsilon comes from RDP, which is linear in composition: the ledger keeps a count per distinct event and sums
count * curve(event), so a per-round report costs one conversion, whatever the number of rounds.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
from dp_accounting import dp_event

from dpfl.accounting.conversion import rdp_to_epsilon
from dpfl.accounting.events import event_from_dict, event_to_dict
from dpfl.accounting.rdp import DEFAULT_ORDERS, SUBSAMPLING_BOUNDS, rdp_curve
from dpfl.errors import BudgetExceededError, ConfigError, RunDirectoryError, check_range, json_problem

OBSERVER_NAMES = {"third_party": "a third party", "server": "the server", "other_silo": "another silo"}


class PrivacyLedger:
    """Composes each observer's events and answers epsilon(delta) for each."""

    def __init__(self, observers, delta: float, budget: dict[str, float] | None = None, conversion: str = "classic",
                 subsampling_bound: str = "paper"):
        self.observers = tuple(observers)
        if subsampling_bound not in SUBSAMPLING_BOUNDS:
            raise ConfigError("privacy.subsampling_bound", subsampling_bound, f"one of {list(SUBSAMPLING_BOUNDS)}")
        self.subsampling_bound = subsampling_bound
        self.delta = check_range("privacy.delta", delta, 0.0, 1.0, low_open=True, high_open=True)
        self.conversion = conversion
        self.budget = dict(budget or {})
        for observer, eps in self.budget.items():
            if observer not in self.observers:
                raise ConfigError("privacy.budget", {observer: eps}, f"a budget for one of {list(self.observers)}")
            check_range(f"privacy.budget.{observer}", eps, 0.0, low_open=True)
        self._counts: dict[str, Counter] = {o: Counter() for o in self.observers}
        self._journal: list[tuple] = []  # (round index, events, fingerprint) of every composition, in order
        self._latest: dict[int, tuple] = {}  # round index -> (events, fingerprint) of its latest composition

    # -- composition --------------------------------------------------------------------------------------------
    def record(self, round_index: int, events: dict[str, dp_event.DpEvent], fingerprint: str | None = None):
        """Composes one round's events (one per observer) unless that round is already recorded with the same events
        and the same ``fingerprint`` (an identifier of the randomness the round will use: the same fingerprint means
        the same release, so a replay adds no privacy loss; None never matches). Raises BudgetExceededError,
        composing nothing, if a budget would be exceeded. Returns epsilon per observer."""
        missing = set(self.observers) - set(events)
        if missing:
            raise ValueError(f"round {round_index} has no event for observer(s) {sorted(missing)}")
        if fingerprint is not None and self._latest.get(round_index) == (dict(events), fingerprint):
            return self.epsilon()
        after = self._epsilon(extra=events)
        for observer, limit in self.budget.items():
            if after[observer] > limit:
                raise BudgetExceededError(
                    f"round {round_index} would raise epsilon towards {OBSERVER_NAMES.get(observer, observer)} to "
                    f"{after[observer]:.4g} > privacy.budget.{observer} = {limit:g} (delta = {self.delta:g}); "
                    f"the run stops before that round draws any noise, having spent {self.epsilon()[observer]:.4g}"
                )
        self._append(round_index, events, fingerprint)
        return after

    def _append(self, round_index: int, events: dict[str, dp_event.DpEvent], fingerprint: str | None) -> None:
        self._journal.append((round_index, dict(events), fingerprint))
        self._latest[round_index] = (dict(events), fingerprint)
        for observer in self.observers:
            self._counts[observer][events[observer]] += 1

    def epsilon(self) -> dict[str, float]:
        """Epsilon spent so far towards each observer, at ``self.delta`` (inf for a non-private run)."""
        return self._epsilon()

    def _epsilon(self, extra: dict[str, dp_event.DpEvent] | None = None) -> dict[str, float]:
        result = {}
        for observer in self.observers:
            counts = Counter(self._counts[observer])
            if extra is not None:
                counts[extra[observer]] += 1
            result[observer] = self._epsilon_of(counts)
        return result

    def _epsilon_of(self, counts: Counter) -> float:
        if not counts:
            return 0.0
        total = np.zeros(len(DEFAULT_ORDERS))
        for event, count in counts.items():
            if isinstance(event, dp_event.NonPrivateDpEvent):
                return math.inf
            total = total + count * rdp_curve(event, subsampling_bound=self.subsampling_bound)
        return rdp_to_epsilon(DEFAULT_ORDERS, total, self.delta, self.conversion)[0]

    @property
    def compositions(self) -> int:
        """How many rounds were composed (a round re-run with different randomness counts twice)."""
        return len(self._journal)

    # -- persistence --------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        distinct: list[dp_event.DpEvent] = []
        index: dict[dp_event.DpEvent, int] = {}
        journal = []
        for round_index, events, fingerprint in self._journal:
            refs = {}
            for observer, event in events.items():
                if event not in index:
                    index[event] = len(distinct)
                    distinct.append(event)
                refs[observer] = index[event]
            journal.append({"round": round_index, "events": refs, "fingerprint": fingerprint})
        return {
            "observers": list(self.observers),
            "delta": self.delta,
            "conversion": self.conversion,
            "accountant": "rdp",
            "subsampling_bound": self.subsampling_bound,
            "budget": self.budget,
            "events": [event_to_dict(e) for e in distinct],
            "journal": journal,
            "epsilon": {o: _json_number(e) for o, e in self.epsilon().items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> "PrivacyLedger":
        ledger = cls(data["observers"], data["delta"], data.get("budget"), data["conversion"],
                     data.get("subsampling_bound", "paper"))
        events = [event_from_dict(e) for e in data["events"]]
        for entry in data["journal"]:
            ledger._append(entry["round"], {o: events[i] for o, i in entry["events"].items()}, entry.get("fingerprint"))
        return ledger

    def save(self, path: str | os.PathLike) -> None:
        """Writes the ledger atomically and durably (a temporary file, flushed to disk, then renamed over ``path``):
        a crash leaves either the old ledger or the new one, never a truncated file. RunDirectoryError if it cannot be
        written (the caller then must not release anything the ledger would not record)."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            with open(tmp, "w") as file:
                file.write(json.dumps(self.to_dict(), indent=1))
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, path)
        except OSError as err:
            raise RunDirectoryError(f"cannot write the privacy ledger {path}: {err.strerror or err}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PrivacyLedger":
        """Reads a ledger written by ``save``. RunDirectoryError naming the file and what is wrong with it if it is
        unreadable, not JSON or not a ledger: it records privacy already spent, so nothing may start over silently."""
        path = Path(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise _invalid_ledger(path, getattr(err, "strerror", None) or str(err)) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise _invalid_ledger(path, json_problem(text, err)) from None
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            what = f"no {err} entry" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
            raise _invalid_ledger(path, what) from None


def _invalid_ledger(path: Path, problem: str) -> RunDirectoryError:
    return RunDirectoryError(f"{path} is not a valid privacy ledger ({problem}); it records privacy already spent, so "
                             "dpfl will not start over: restore it, or move it away deliberately")


def _json_number(value: float):
    """JSON has no infinity: a non-private epsilon is written as null."""
    return None if math.isinf(value) else value
