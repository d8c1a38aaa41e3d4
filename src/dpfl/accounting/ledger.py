"""The per-observer privacy ledger of a run: the privacy each observer has been charged, round by round.

For every observer (third party, server, another silo) the ledger composes the events of every round the run has
*started*, and reports epsilon at the run's delta. It is

* composed BEFORE a round draws its noise, so a configured budget stops the run before the round that would exceed
  it (``BudgetExceededError``), never after;
* a journal: one entry per composed round, which the simulator saves (``save``) as soon as a round is composed,
  before the round draws any noise, and again with every checkpoint. A resumed run that replays a round with
  the same randomness (same events and same fingerprint: an identical release, so no new privacy loss) finds it
  already recorded and does not count it twice; anything else is counted again. Spent budget is never forgotten.

How epsilon is computed follows the run's analysis (``dpfl.accounting.observers``):

* ``analysis="sound"`` (default): each observer's composition goes to the tightest accountant that supports it
  (PLD where it can, else RDP with the modern conversion, Canonne, Kamath, Steinke 2020), with the record-level
  subsampling bound capped by the unsampled curve and Wang et al.'s Thm 27 (``dpfl.accounting.rdp``); any observer
  may be given another accountant by name (``dpfl.accounting.accountants``: rdp, pld, pure-DP basic composition);
* ``analysis="paper"``: RDP with Wang et al.'s general bound and the classic conversion, as Noble et al. 2022, App. B
  computes it (reproduces the paper's numbers).

The ledger keeps a count per distinct event; epsilon is each observer's accountant (``dpfl.accounting.accountants``)
over the count-fold events, which costs one cached curve (RDP) or one self-composition (PLD) per distinct event,
whatever the number of rounds. The epsilon after a recorded round is the one ``record`` computed for its budget
check, kept until the next composition.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Iterable

from dp_accounting import dp_event

from dpfl.accounting import accountants
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.accounting.conversion import CONVERSIONS
from dpfl.accounting.events import event_from_dict, event_to_dict
from dpfl.accounting.observers import ANALYSES
from dpfl.errors import BudgetExceededError, ConfigError, RunDirectoryError, check_range, json_problem

OBSERVER_NAMES = {"third_party": "a third party", "server": "the server", "other_silo": "another silo"}

#: Per analysis: (subsampling bound for records sampled without replacement, default conversion, forced accountant).
ANALYSIS_ACCOUNTING = {"sound": ("tight", "modern", "tightest"), "paper": ("paper", "classic", "rdp")}


class PrivacyLedger:
    """Composes each observer's events and answers epsilon(delta) for each.

    Args:
      observers: observer names.
      delta: the run's delta, in (0, 1).
      budget: {observer: epsilon} limits, checked before each round.
      conversion: RDP -> DP conversion; None picks the analysis's ("modern" for sound, "classic" for paper).
      analysis: "sound" or "paper" (module docstring).
      neighboring: the record-level relation of the run's events, "replace_one" (fixed-size record sampling) or
        "zero_out" (Poisson record sampling), or "add_remove".
      accountant: the accountant of every observer, or {observer: name}, from ``accountants.ACCOUNTANT_NAMES``;
        default the analysis's ("tightest" for sound, "rdp" for paper).
    """

    def __init__(self, observers, delta: float, budget: dict[str, float] | None = None, conversion: str | None = None,
                 analysis: str = "sound", neighboring: str = "replace_one", accountant: str | dict | None = None):
        self.observers = tuple(observers)
        if analysis not in ANALYSES:
            raise ConfigError("privacy.analysis", analysis, f"one of {list(ANALYSES)}")
        if neighboring not in NEIGHBORING:
            raise ConfigError("neighboring", neighboring, f"one of {list(NEIGHBORING)}")
        self.analysis, self.neighboring = analysis, neighboring
        self.subsampling_bound, default_conversion, default_accountant = ANALYSIS_ACCOUNTING[analysis]
        self.conversion = default_conversion if conversion is None else conversion
        chosen = accountant or default_accountant
        self.accountant_names = {o: chosen.get(o, default_accountant) if isinstance(chosen, dict) else chosen
                                 for o in self.observers}
        for observer, name in self.accountant_names.items():
            if name not in accountants.ACCOUNTANT_NAMES:
                raise ConfigError(f"accountant.{observer}", name, f"one of {list(accountants.ACCOUNTANT_NAMES)}")
        if self.conversion not in CONVERSIONS:
            raise ConfigError("privacy.conversion", self.conversion, f"one of {list(CONVERSIONS)}")
        self.delta = check_range("privacy.delta", delta, 0.0, 1.0, low_open=True, high_open=True)
        self.budget = dict(budget or {})
        for observer, eps in self.budget.items():
            if observer not in self.observers:
                raise ConfigError("privacy.budget", {observer: eps}, f"a budget for one of {list(self.observers)}")
            check_range(f"privacy.budget.{observer}", eps, 0.0, low_open=True)
        self._counts: dict[str, Counter] = {o: Counter() for o in self.observers}  # repr(event) -> rounds
        self._events: dict[str, dp_event.DpEvent] = {}  # repr(event) -> event (events may hold lists: unhashable)
        self._journal: list[tuple] = []  # (round index, events, fingerprint) of every composition, in order
        self._latest: dict[int, tuple] = {}  # round index -> (events, fingerprint) of its latest composition
        self._spent: dict[str, float] | None = None  # epsilon of the compositions so far (None: not computed yet)

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
        after = self._epsilon(extra=[events])
        for observer, limit in self.budget.items():
            if after[observer] > limit:
                raise BudgetExceededError(
                    f"round {round_index} would raise epsilon towards {OBSERVER_NAMES.get(observer, observer)} to "
                    f"{after[observer]:.4g} > privacy.budget.{observer} = {limit:g} (delta = {self.delta:g}); "
                    f"the run stops before that round draws any noise, having spent {self.epsilon()[observer]:.4g}"
                )
        self._append(round_index, events, fingerprint)
        self._spent = after  # the same compositions: no need to account them again
        return dict(after)

    def _append(self, round_index: int, events: dict[str, dp_event.DpEvent], fingerprint: str | None) -> None:
        self._spent = None
        self._journal.append((round_index, dict(events), fingerprint))
        self._latest[round_index] = (dict(events), fingerprint)
        for observer in self.observers:
            self._counts[observer][self._key(events[observer])] += 1

    def epsilon(self) -> dict[str, float]:
        """Epsilon spent so far towards each observer, at ``self.delta`` (inf for a non-private run)."""
        if self._spent is None:
            self._spent = self._epsilon()
        return dict(self._spent)

    def epsilon_after(self, rounds: Iterable[dict[str, dp_event.DpEvent]],
                      observers: Iterable[str] | None = None) -> dict[str, float]:
        """Epsilon towards each of ``observers`` (default all) if ``rounds`` (one event per observer each) were
        composed after the rounds recorded so far, by the same accountants; records nothing (calibration, planning)."""
        return self._epsilon(list(rounds), observers)

    def accountants_after(self, rounds: Iterable[dict[str, dp_event.DpEvent]]) -> dict[str, str]:
        """The accountant that would answer for each observer after ``rounds`` (as ``epsilon_after``)."""
        rounds = list(rounds)
        return {o: accountants.chosen_name(self._accountant(o, self._counts_with(o, rounds))) for o in self.observers}

    def _epsilon(self, extra: list[dict[str, dp_event.DpEvent]] = (), observers=None) -> dict[str, float]:
        return {o: self._epsilon_of(o, self._counts_with(o, extra)) for o in (observers or self.observers)}

    def _counts_with(self, observer: str, extra: list[dict[str, dp_event.DpEvent]]) -> Counter:
        counts = Counter(self._counts[observer])
        for events in extra:
            if observer not in events:
                raise ValueError(f"a round has no event for observer {observer!r}")
            counts[self._key(events[observer])] += 1
        return counts

    def _key(self, event: dp_event.DpEvent) -> str:
        key = repr(event)
        self._events.setdefault(key, event)
        return key

    def _accountant(self, observer: str, counts: Counter):
        """A fresh accountant of ``observer`` that has composed ``counts``."""
        accountant = accountants.make(self.accountant_names[observer], NEIGHBORING[self.neighboring], self.conversion,
                                      self.subsampling_bound)
        for key, count in counts.items():
            accountant.compose(self._events[key], count)
        return accountant

    def _epsilon_of(self, observer: str, counts: Counter) -> float:
        if not counts:
            return 0.0
        if any(isinstance(self._events[key], dp_event.NonPrivateDpEvent) for key in counts):
            return math.inf
        return self._accountant(observer, counts).get_epsilon(self.delta)

    def accountants(self) -> dict[str, str]:
        """The accountant that answers for each observer's composition so far (for "tightest", the one it chose)."""
        return {o: accountants.chosen_name(self._accountant(o, self._counts[o])) for o in self.observers}

    @property
    def compositions(self) -> int:
        """How many rounds were composed (a round re-run with different randomness counts twice)."""
        return len(self._journal)

    # -- persistence --------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        distinct: list[dp_event.DpEvent] = []
        index: dict[str, int] = {}
        journal = []
        for round_index, events, fingerprint in self._journal:
            refs = {}
            for observer, event in events.items():
                key = repr(event)
                if key not in index:
                    index[key] = len(distinct)
                    distinct.append(event)
                refs[observer] = index[key]
            journal.append({"round": round_index, "events": refs, "fingerprint": fingerprint})
        return {
            "observers": list(self.observers),
            "delta": self.delta,
            "conversion": self.conversion,
            "analysis": self.analysis,
            "neighboring": self.neighboring,
            "accountant": self.accountants(),
            "accountant_names": self.accountant_names,
            "subsampling_bound": self.subsampling_bound,
            "budget": self.budget,
            "events": [event_to_dict(e) for e in distinct],
            "journal": journal,
            "epsilon": {o: _json_number(e) for o, e in self.epsilon().items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> "PrivacyLedger":
        if not isinstance(data, dict):
            raise TypeError(f"a ledger is a JSON object, not a {type(data).__name__}")
        if "analysis" not in data:
            raise ConfigError("ledger", "a ledger written before dpfl's sound analysis",
                              "a ledger that names its analysis; its rounds were accounted with client-level "
                              "subsampling around record-level curves, which can under-state epsilon: start a new run")
        ledger = cls(data["observers"], data["delta"], data.get("budget"), data["conversion"], data["analysis"],
                     data["neighboring"], data["accountant_names"])
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
