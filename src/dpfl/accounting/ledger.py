"""The per-observer privacy ledger of a run: the privacy each observer has been charged, round by round.

For every observer (third party, server, another silo) the ledger composes the events of every round the run has
*started*, and reports epsilon at the run's delta. It is

* composed BEFORE a round releases anything, so a configured budget stops the run before the round that would exceed
  it (``BudgetExceededError``), never after;
* a journal: one entry per composed round, which the simulator saves (``save``) as soon as a round is composed,
  before the round releases anything, and again with every checkpoint (``record_later`` does both on the recorder
  thread while the simulator computes the round's first chunk of client work, which it uses only after). A resumed
  run that replays a round with the same randomness (same events and same fingerprint: an identical release, so no
  new privacy loss) finds it already recorded and does not count it twice; anything else is counted again. Spent
  budget is never forgotten.
  Each distinct event and each journal entry is encoded to JSON once, when it is recorded; a save joins their text (one
  line per entry) and writes it atomically, so a save at round T copies O(T) bytes but encodes nothing of the rounds
  before (0.5 s at 5,000 rounds when the whole journal was re-encoded, 30 ms now, most of it the fsync).

How epsilon is computed follows the run's analysis (``dpfl.accounting.observers``):

* ``analysis="sound"`` (default): each observer's composition goes to the tightest accountant that supports it
  (PLD where it can, else RDP with the modern conversion, Canonne, Kamath, Steinke 2020), with the record-level
  subsampling bound capped by the unsampled curve and Wang et al.'s Thm 27 (``dpfl.accounting.rdp``); any observer
  may be given another accountant by name (``dpfl.accounting.accountants``: rdp, pld, pure-DP basic composition);
* ``analysis="paper"``: RDP with Wang et al.'s general bound and the classic conversion, as Noble et al. 2022, App. B
  computes it (reproduces the paper's numbers).

The ledger keeps a count per distinct event; epsilon is each observer's accountant (``dpfl.accounting.accountants``)
over the count-fold events, which costs one cached curve (RDP) or one self-composition (PLD) per distinct event,
whatever the number of rounds: one FFT at the composed PLD's size, the round event's PLD built once and its Chernoff
moments and transform kept (``dpfl.accounting.pld_power``: dp_accounting's numbers bit for bit). An accountant whose
answer depends on the order of the events (``accountants.ORDERED``: the last-iterate accountant, for runs that release
only their final model) is fed the runs of equal consecutive events in order instead.

Epsilon is computed when it is read, once per composition and observer (remembered per composition): ``record`` accounts
only the observers a budget names (the others' epsilon is not needed to decide the round), and not even those at every
round: a check also finds the budget's headroom, how many more rounds of the same event the budget allows
(``_repeats_within_budget``: the composition doubled, else a bisection), and the rounds within it are admitted without
accounting (sound because the true epsilon never falls as mechanisms are added; the derivation is there), so T equal
rounds cost O(log^2 T) compositions, and a new event or a new budget is checked again. A check tries the doubled
composition first (``_doubled_within_budget``): within budget, it admits the round and its headroom at one accounting,
so T equal rounds well within a budget cost log2 T. ``epsilon`` accounts the others
when first asked; ``to_dict(summary=False)``, the journal a round saves before its noise, asks nobody. Composing
incrementally (the composition so far convolved with the new round's PLD, or count-fold events by repeated doubling) is
not done: its truncation and rounding differ from the self-composition's, so the numbers would differ from those a fresh
ledger reports, and a convolution at the composed size costs what the one FFT of the self-composition costs. The numbers
are those of a fresh ledger composing from scratch, exactly (tests/accounting/test_ledger_fresh.py).

**Reads off the critical path.** ``epsilon_through_later`` answers ``epsilon_through`` on a background thread (one per
process, ``_READER``): the compositions it accounts are taken when it is asked (immutable tuples of (event, rounds)),
so rounds recorded meanwhile change nothing, and the number is the synchronous read's, the same accountant on the same
composition (remembered in the same memo). dp_accounting's and dpfl's accountant caches are process-wide, so all
accounting (``_epsilon_of``, ``epsilon_composition``) takes one lock (``_ACCOUNTING``), which a thread on a round's
path gets before any waiting read: a budget check waits at most for the accounting a read has in progress, never
races it. ``accountants`` (which accountant answers) needs no PLD and does not wait; once asked, the recorder thread
decides it for each new composition after its record. The simulator asks for each scheduled read this way and joins
them at the last round and any stop (``dpfl.engine.simulator``; a mid-run checkpoint takes the reads done so far),
so the FFTs of a read overlap the rounds that follow it. Given the run's horizon, a budget check that grants headroom
has the planner thread account, at once, the check that will end it (``_prepare_next_check``), so that check finds
its epsilon remembered.

``epsilon_curve`` gives epsilon after any recorded round (``epsilon_through``: what the round reported when it ran),
the whole curve of a run whose results report epsilon at some rounds only (``dpfl.engine.epsilon_schedule``).

A round that declares what it releases about a record of each client (``events.WorstOwnerDpEvent``: clients whose
sampling ratios, weights or noise differ) is accounted per owner: epsilon is the largest over the clients of the
composition of their own parts (``dpfl.accounting.owners``, which leaves out dominated clients).

``epsilon_composition`` answers, beside it, what composing every round's iterate would cost the same observers (an
event that describes a hidden iterate, ``ProjectedStepDpEvent``, carries that event): the baseline a run that
hides its iterates is compared with. It is a report only; each observer's epsilon, and its budget, is its own
accountant's.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from dp_accounting import dp_event

from dpfl.accounting import accountants, owners, pld
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.accounting.conversion import CONVERSIONS
from dpfl.accounting.events import ProjectedStepDpEvent, event_from_dict, event_to_dict
from dpfl.accounting.observers import ANALYSES
from dpfl.durable import write_text_atomically
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
        self._runs: dict[str, list] = {o: [] for o in self.observers}  # [repr(event), rounds] of consecutive rounds
        self._events: dict[str, dp_event.DpEvent] = {}  # repr(event) -> event (events may hold lists: unhashable)
        self._journal: list[tuple] = []  # (round index, events, fingerprint) of every composition, in order
        self._latest: dict[int, int] = {}  # round index -> the journal position of its latest composition
        self._spent: dict[str, float] = {}  # observer -> epsilon of its compositions so far, once asked
        #: budgeted observer -> (event key, the budget, k): k more rounds of that event keep it within that budget
        self._headroom: dict[str, tuple[str, float, int]] = {}
        #: the events of a "tightest" observer's composition -> {"pld": rounds of a composition of them that answered
        #: PLD, "rdp": one that answered RDP} (``_tightest_by_bounds``); None where they declare per-owner events
        self._tightest_bounds: dict[tuple, dict | None] = {}
        self._names_asked = False  # whether ``accountants`` was asked (then ``record_later`` decides them ahead)
        self._memo: dict[tuple, float | str] = {}  # (accountant name, composition) -> epsilon at self.delta, and
        # ("chosen", accountant name, composition) -> the accountant that answers
        #: ledger.json's parts, each encoded once (``save``): repr(event) -> its index in "events", those events as
        #: JSON, and the "journal" entries ({observer: event index} and the entry as one JSON line)
        self._event_index: dict[str, int] = {}
        self._event_texts: list[str] = []
        self._refs: list[dict[str, int]] = []
        self._entry_texts: list[str] = []

    # -- composition --------------------------------------------------------------------------------------------
    def record(self, round_index: int, events: dict[str, dp_event.DpEvent], fingerprint: str | None = None,
               horizon: int | None = None):
        """Composes one round's events (one per observer) unless that round is already recorded with the same events
        and the same ``fingerprint`` (an identifier of the randomness the round will use: the same fingerprint means
        the same release, so a replay adds no privacy loss; None never matches). Raises BudgetExceededError,
        composing nothing, if a budget would be exceeded. Epsilon is accounted here only towards the observers a
        budget names; the others' when it is read (``epsilon``). ``horizon``: the last round the run means to take;
        given, a budget check that leaves headroom starts, on the background thread, the accounting of the check
        that will end it if that check falls within the horizon (``_prepare_next_check``)."""
        missing = set(self.observers) - set(events)
        if missing:
            raise ValueError(f"round {round_index} has no event for observer(s) {sorted(missing)}")
        latest = self._latest.get(round_index)
        if fingerprint is not None and latest is not None and self._journal[latest][1:] == (dict(events), fingerprint):
            return
        checked = [o for o in self.budget if not self._cleared_for(o, events[o])]  # the others: within headroom
        doubled = [o for o in checked if self._doubled_within_budget(o, events[o])]  # this round and n + 1 more
        after = self._epsilon(extra=[events], observers=[o for o in checked if o not in doubled])
        for observer in after:
            if after[observer] > self.budget[observer]:
                raise BudgetExceededError(
                    f"round {round_index} would raise epsilon towards {OBSERVER_NAMES.get(observer, observer)} to "
                    f"{after[observer]:.4g} > privacy.budget.{observer} = {self.budget[observer]:g} "
                    f"(delta = {self.delta:g}); the run stops before that round releases anything, having spent "
                    f"{self._spent_by(observer):.4g}"
                )
        self._append(round_index, events, fingerprint)
        self._spent = after  # the same compositions: no need to account them again
        for observer in self.budget:
            key = self._key(events[observer])
            if observer in doubled:
                self._headroom[observer] = (key, self.budget[observer], self.compositions)
            elif observer in checked:
                self._headroom[observer] = (key, self.budget[observer], self._repeats_within_budget(observer, key))
            else:
                self._headroom[observer] = (key, self.budget[observer], self._headroom[observer][2] - 1)
                continue
            if horizon is not None:
                self._prepare_next_check(observer, round_index, horizon)

    def record_later(self, round_index: int, events: dict[str, dp_event.DpEvent], fingerprint: str | None = None,
                     save_to: str | os.PathLike | None = None, horizon: int | None = None) -> Future:
        """``record``, then the journal's durable ``save`` to ``save_to`` (if given; no summary), on the ledger's
        recorder thread (``_RECORDER``): a Future that completes once the round is on record and on disk, or raises
        what ``record`` or ``save`` raised (BudgetExceededError: nothing composed). The simulator computes the round's
        client work meanwhile and releases none of it before the Future completes (``dpfl.engine.simulator``); no
        other call may touch this ledger until then."""

        def record_and_save() -> None:
            self.record(round_index, events, fingerprint, horizon)
            if save_to is not None:
                self.save(save_to, summary=False)

        recorded = _RECORDER.submit(record_and_save)
        if self._names_asked:  # after it, unwaited: the names a caller (results.json) asks for after each round
            _RECORDER.submit(self.accountants)
        return recorded

    def _prepare_next_check(self, observer: str, round_index: int, horizon: int) -> None:
        """Starts, on the planner thread, the accountings of the budget check that ends ``observer``'s headroom just
        granted (h more rounds of event ``key`` after round ``round_index``), if that check, at round
        round_index + h + 1, is within ``horizon``: it will find h more rounds of ``key`` composed (if the headroom's
        rounds repeat it) and c + h compositions, c those of now (``_prepared``). Their epsilons land in the memo,
        where the check finds them; if the rounds turn out otherwise, they are never asked and the check accounts
        what it needs then. Nothing for an accountant in ``accountants.ORDERED`` (no headroom)."""
        key, limit, repeats = self._headroom[observer]
        if repeats <= 0 or round_index + repeats + 1 > horizon or \
                self.accountant_names[observer] in accountants.ORDERED:
            return
        at_check = Counter(self._counts[observer])  # taken now: the recorder goes on composing meanwhile
        at_check[key] += repeats
        _PLANNER.submit(self._prepared, observer, key, limit, at_check, self.compositions + repeats)

    def _prepared(self, observer: str, key: str, limit: float, counts: Counter, compositions: int) -> None:
        """The accountings ``record`` does to check one more round of ``key`` against ``limit`` when ``compositions``
        rounds are composed, ``counts`` of them per event: the composition doubled (``_doubled_within_budget``,
        ``compositions`` + 2 more rounds); if it exceeds the limit, the round itself; if that is within, the
        headroom's bisection after it (``_repeats_within_budget``, n = ``compositions`` + 1 on the counts with the
        round), each remembered, and each deciding as the check will (``_within``)."""

        def within(more: int) -> bool:
            return self._within(observer, key, more, counts, limit)

        if not within(compositions + 2) and within(1):
            _largest_within(compositions + 1, lambda k: within(1 + k))

    def _cleared_for(self, observer: str, event: dp_event.DpEvent) -> bool:
        """Whether one more round of ``event`` is known to keep ``observer`` within its budget: it is the event whose
        headroom (``_repeats_within_budget``) was computed, against the same budget, and some of it is left."""
        key, limit, repeats = self._headroom.get(observer, (None, None, 0))
        return key == self._key(event) and limit == self.budget[observer] and repeats > 0

    def _doubled_within_budget(self, observer: str, event: dp_event.DpEvent) -> bool:
        """Whether the rounds composed so far (n of them) and n + 2 more of ``event`` keep ``observer`` within its
        budget: then this round is admitted with n + 1 more after it (``_repeats_within_budget`` says why that is
        sound) without accounting this round's own composition, one accounting per check instead of two (that of the
        round, then that of the composition doubled). False for an accountant in ``accountants.ORDERED``."""
        if self.accountant_names[observer] in accountants.ORDERED:
            return False
        return self._within(observer, self._key(event), self.compositions + 2, self._counts[observer],
                            self.budget[observer])  # False: the round is checked on its own

    def _repeats_within_budget(self, observer: str, key: str) -> int:
        """How many more rounds of event ``key``, after the rounds composed so far (n of them), the budget of
        ``observer`` is known to allow: the largest k <= n with epsilon(composition + k x event) <= budget, found by
        trying k = n (the composition doubled), then, if that exceeds the budget, by bisection on [0, n).

        Why later rounds within it need no accounting: adding a mechanism never lowers the true epsilon (the
        composition of k - 1 rounds is a post-processing of that of k: drop the last release), so for every
        j <= k, true eps(j) <= true eps(k) <= epsilon(k) <= budget, epsilon(k) being the accountant's upper bound
        (a PLD's pessimistic discretisation and truncation, an RDP conversion). Where the accountant's epsilon is
        non-decreasing in j, as it is up to floating-point noise, the run stops at the very round the round-by-round
        check stopped it (epsilon(k + 1) > budget is then the check's own answer, remembered); where it is not, the
        rounds it admits are still within budget, by the inequality above. An accountant whose answer depends on the
        order of the events (``accountants.ORDERED``) gets no headroom: each of its rounds is checked. Cost: at most
        1 + log2(n) compositions at round n + 1, so with one event every round, O(log^2 T) over T rounds, against T
        for a check every round; the epsilons it computes are remembered, so reading them later costs nothing."""
        n = self.compositions
        if self.accountant_names[observer] in accountants.ORDERED or n == 0:
            return 0
        return _largest_within(n, lambda k: self._within(observer, key, k, self._counts[observer],
                                                         self.budget[observer]))

    def _within(self, observer: str, key: str, more: int, counts: Counter, limit: float) -> bool:
        """Whether ``more`` rounds of event ``key`` composed after ``counts`` (an observer's rounds per event, for an
        accountant not in ``accountants.ORDERED``) keep its epsilon within ``limit``; False where that cannot be
        accounted (e.g. a PLD too large to build): no headroom is claimed beyond it."""
        try:
            return self._epsilon_of(observer, self._tally(observer, [key] * more, (), counts)) <= limit
        except ConfigError:
            return False

    def _append(self, round_index: int, events: dict[str, dp_event.DpEvent], fingerprint: str | None) -> None:
        self._spent = {}
        self._latest[round_index] = len(self._journal)
        self._journal.append((round_index, dict(events), fingerprint))
        keys = {observer: self._key(event) for observer, event in events.items()}
        for observer in self.observers:
            self._counts[observer][keys[observer]] += 1
            _extend(self._runs[observer], keys[observer])
        for observer, key in keys.items():
            if key not in self._event_index:
                self._event_index[key] = len(self._event_texts)
                self._event_texts.append(json.dumps(event_to_dict(events[observer])))
        refs = {observer: self._event_index[key] for observer, key in keys.items()}
        self._refs.append(refs)
        self._entry_texts.append(json.dumps({"round": round_index, "events": refs, "fingerprint": fingerprint}))

    def charged(self, round_index: int) -> dict[str, dp_event.DpEvent] | None:
        """Each observer's event of round ``round_index``'s latest composition (as ``record`` numbered it); None if
        that round was never composed."""
        position = self._latest.get(round_index)
        return None if position is None else dict(self._journal[position][1])

    def epsilon(self) -> dict[str, float]:
        """Epsilon spent so far towards each observer, at ``self.delta`` (inf for a non-private run)."""
        return {o: self._spent_by(o) for o in self.observers}

    def _spent_by(self, observer: str) -> float:
        """Epsilon spent so far towards ``observer``, accounted once per composition (when first asked)."""
        if observer not in self._spent:
            self._spent[observer] = self._epsilon_of(observer, self._composed(observer))
        return self._spent[observer]

    def spent_is_known(self) -> bool:
        """Whether ``epsilon()`` costs no accounting: every observer's composition so far is remembered."""
        return all(o in self._spent or self._remembered(o, self._composed(o)) for o in self.observers)

    def epsilon_through(self, round_index: int) -> dict[str, float]:
        """Epsilon towards each observer as it stood when round ``round_index`` was last composed: every composition
        up to and including it. A round replayed after a resume with the fingerprint on record reports what it
        reported when it first ran, not the rounds recorded after it (``epsilon()``: those too); a round not recorded
        reports ``epsilon()``. It costs what the round's own budget check cost (one accountant per observer), and
        nothing for the latest round."""
        position = self._latest.get(round_index)
        if position is None or position == len(self._journal) - 1:
            return self.epsilon()
        return {o: self._epsilon_of(o, composed) for o, composed in self._compositions_through(position).items()}

    def epsilon_through_later(self, round_index: int) -> Future:
        """``epsilon_through(round_index)``, computed on the ledger's background thread (module docstring): a Future
        of the same numbers, from the compositions as they stand now (rounds recorded before it completes change
        nothing); already completed when they are remembered."""
        position = self._latest.get(round_index)
        compositions = self._compositions_through(len(self._journal) - 1 if position is None else position)

        def read() -> dict[str, float]:
            return {o: self._epsilon_of(o, composed) for o, composed in compositions.items()}

        if all(self._remembered(o, composed) for o, composed in compositions.items()):
            done = Future()
            done.set_result(read())
            return done
        return _READER.submit(read)

    def _compositions_through(self, position: int) -> dict[str, list[tuple[str, int]]]:
        """Each observer's composition (``_composed``) of the journal's entries up to ``position`` (-1: none)."""
        if position == len(self._journal) - 1:
            return {o: self._composed(o) for o in self.observers}
        done = self._journal[: position + 1]
        return {o: self._tally(o, [self._key(events[o]) for _, events, _ in done]) for o in self.observers}

    def _remembered(self, observer: str, composed: list[tuple[str, int]]) -> bool:
        """Whether ``_epsilon_of(observer, composed)`` costs no accounting."""
        return not composed or (self.accountant_names[observer], tuple(composed)) in self._memo or any(
            isinstance(self._events[key], dp_event.NonPrivateDpEvent) for key, _ in composed)

    def epsilon_curve(self, rounds: Iterable[int] | None = None) -> dict[int, dict[str, float]]:
        """{round: epsilon towards each observer as it stood when that round was last composed} (``epsilon_through``)
        for each of ``rounds`` (default: every round recorded, in order): the whole per-round curve of a run whose
        results report epsilon at some rounds only (run.epsilon_every). Each round costs one accounting per observer,
        the same a fresh ledger's report of it costs, and gives the same number. ConfigError for a round never
        composed."""
        recorded = sorted(self._latest)
        chosen = recorded if rounds is None else list(rounds)
        for round_index in chosen:
            if round_index not in self._latest:
                raise ConfigError("rounds", round_index, f"a round the ledger recorded: {_spans(recorded)}")
        return {round_index: self.epsilon_through(round_index) for round_index in chosen}

    def epsilon_after(self, rounds: Iterable[dict[str, dp_event.DpEvent]],
                      observers: Iterable[str] | None = None) -> dict[str, float]:
        """Epsilon towards each of ``observers`` (default all) if ``rounds`` (one event per observer each) were
        composed after the rounds recorded so far, by the same accountants; records nothing (calibration, planning)."""
        return self._epsilon(list(rounds), observers)

    def accountants_after(self, rounds: Iterable[dict[str, dp_event.DpEvent]]) -> dict[str, str]:
        """The accountant that would answer for each observer after ``rounds`` (as ``epsilon_after``)."""
        rounds = list(rounds)
        return {o: self._chosen(o, self._composed(o, rounds)) for o in self.observers}

    def _epsilon(self, extra: list[dict[str, dp_event.DpEvent]] = (), observers=None) -> dict[str, float]:
        return {o: self._epsilon_of(o, self._composed(o, extra)) for o in
                (self.observers if observers is None else observers)}

    def _composed(self, observer: str, extra: list[dict[str, dp_event.DpEvent]] = ()) -> list[tuple[str, int]]:
        """(event key, rounds) of everything ``observer`` was charged, then of the rounds ``extra``, rounds that
        release nothing (``NoOpDpEvent``) left out: per distinct event, or in order, as runs of equal consecutive
        events, for an accountant in ``accountants.ORDERED``."""
        keys = []
        for events in extra:
            if observer not in events:
                raise ValueError(f"a round has no event for observer {observer!r}")
            keys.append(self._key(events[observer]))
        return self._tally(observer, keys, self._runs[observer], self._counts[observer])

    def _tally(self, observer: str, keys: list[str], runs: list = (), counts: Counter | None = None) -> list[tuple]:
        """(event key, rounds) of the events ``keys`` composed after ``runs`` (the observer's runs of equal
        consecutive events so far) or ``counts`` (its rounds per distinct event so far), as ``_composed`` says."""
        if self.accountant_names[observer] in accountants.ORDERED:
            runs = [list(run) for run in runs]
            for key in keys:
                _extend(runs, key)
            composed = [tuple(run) for run in runs]
        else:
            counts = Counter(counts or {})
            counts.update(keys)
            composed = list(counts.items())
        return [(key, count) for key, count in composed if key != _NO_OP]

    def _key(self, event: dp_event.DpEvent) -> str:
        key = repr(event)
        self._events.setdefault(key, event)
        return key

    def _accountant(self, observer: str, composed: list[tuple[str, int]], name: str | None = None):
        """A fresh accountant of ``observer`` (or the one called ``name``) that has composed ``composed``."""
        accountant = accountants.make(name or self.accountant_names[observer], NEIGHBORING[self.neighboring],
                                      self.conversion, self.subsampling_bound)
        for key, count in composed:
            accountant.compose(self._events[key], count)
        return accountant

    def _epsilon_of(self, observer: str, composed: list[tuple[str, int]]) -> float:
        """Epsilon of ``composed`` under ``observer``'s accountant, remembered per composition (a round that adds
        nothing, e.g. a round the record's owner cannot take part in, costs no new accounting)."""
        if not composed:
            return 0.0
        if any(isinstance(self._events[key], dp_event.NonPrivateDpEvent) for key, _ in composed):
            return math.inf
        memo_key = (self.accountant_names[observer], tuple(composed))
        if memo_key not in self._memo:
            with _ACCOUNTING:
                if memo_key not in self._memo:  # a read on the background thread may have just remembered it
                    self._memo[memo_key] = max(self._accountant(observer, owner).get_epsilon(self.delta)
                                               for owner in self._owners(composed))
        return self._memo[memo_key]

    def _owners(self, composed: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
        """The compositions of the owners whose worst epsilon is the claim (``owners.owner_compositions``: one per
        distinct client where rounds declare per-owner events, else ``composed`` itself)."""
        compositions = owners.owner_compositions([(self._events[key], count) for key, count in composed])
        return [[(self._key(event), count) for event, count in composition] for composition in compositions]

    def accountants(self) -> dict[str, str]:
        """The accountant that answers for each observer's composition so far (for "tightest", the one it chose).
        Once asked, ``record_later`` has the recorder thread decide it for each new composition after its record."""
        self._names_asked = True
        return {o: self._chosen(o, self._composed(o)) for o in self.observers}

    def _chosen(self, observer: str, composed: list[tuple[str, int]]) -> str:
        """The name of the accountant that answers for ``composed`` (``accountants.chosen_name``), remembered per
        composition as its epsilon is (ledger.json names it at every save, results.json after every evaluated round),
        and for "tightest" bounded by the compositions of the same events decided before (``_tightest_by_bounds``)."""
        memo_key = ("chosen", self.accountant_names[observer], tuple(composed))
        if memo_key not in self._memo:
            bounded = self._tightest_by_bounds(observer, composed)
            self._memo[memo_key] = bounded if bounded is not None else self._choose(observer, composed)
        return self._memo[memo_key]

    def _choose(self, observer: str, composed: list[tuple[str, int]]) -> str:
        """``_chosen``'s answer, decided: the accountant of the worst owner's composition."""
        per_owner = self._owners(composed)
        worst = per_owner[0] if len(per_owner) == 1 else max(
            per_owner, key=lambda owner: self._epsilon_of(observer, owner))
        return accountants.chosen_name(self._accountant(observer, worst))

    def _tightest_by_bounds(self, observer: str, composed: list[tuple[str, int]]) -> str | None:
        """For a "tightest" observer whose rounds declare no per-owner events: "pld" if ``composed`` has at most the
        rounds of a composition of the same events that answered PLD, "rdp" if at least those of one that answered
        RDP; otherwise, if the composition doubled is surely tractable (``pld.surely_tractable``: by the size
        estimate's bound at six integer orders, never the slowly converging fractional ones, which a composition
        near the limit may need), it is remembered as a bound and the answer is "pld"; else ``composed`` itself is
        decided (and remembered when RDP). None where no bound applies.

        Why it is the decision itself: "tightest" answers PLD iff every event has a PLD (the same events: the same
        answer) and ``pld.tractable``'s size estimate is within ``pld.MAX_POINTS``. The estimate is
        min over orders a of (R(a) + log(1 / tau) / (a - 1)) / interval, R the composition's RDP curve, which is
        the sum over its events of count x the event's curve: with the same events and no count larger, every R(a)
        is no larger (non-negative terms, in floating point too), so neither is the estimate, at the quick orders
        or at all of them (``within_max_points``). So a composition within one whose estimate is within the limit is
        within it, and one beyond a composition that is not is not. T rounds of one event then cost about log2 T
        decisions (each about a millisecond: the RDP curve, the conversion, the owners), not T."""
        if self.accountant_names[observer] != "tightest" or not composed:
            return None
        keys, counts = tuple(k for k, _ in composed), tuple(c for _, c in composed)
        if keys not in self._tightest_bounds:
            single = owners.owners_in(dp_event.ComposedDpEvent([self._events[k] for k in keys])) is None
            self._tightest_bounds[keys] = {} if single else None
        bounds = self._tightest_bounds[keys]
        if bounds is None:  # per-owner events: the worst owner decides (``_choose``)
            return None
        if "pld" in bounds and all(c <= b for c, b in zip(counts, bounds["pld"])):
            return "pld"
        if "rdp" in bounds and all(c >= b for c, b in zip(counts, bounds["rdp"])):
            return "rdp"
        doubled = tuple(2 * c for c in counts)
        accountant = self._accountant(observer, list(zip(keys, doubled)))
        if pld.surely_tractable(accountant.composition(), accountant.neighboring_relation):
            bounds["pld"] = doubled
            return "pld"
        chosen = self._choose(observer, composed)
        if chosen == "rdp":
            bounds["rdp"] = counts
        return chosen

    def hides_iterates(self) -> bool:
        """Whether some observer is charged hidden iterates (``ProjectedStepDpEvent``: only the final model)."""
        return any(isinstance(self._events[key], ProjectedStepDpEvent)
                   for o in self.observers for key in self._counts[o])

    def epsilon_composition(self) -> dict[str, float]:
        """Epsilon towards each observer had every iterate been released: each hidden step's ``composed`` event
        under the analysis's default accountant (``tightest`` or, for the paper analysis, ``rdp``); an observer
        charged no hidden step keeps its own epsilon."""
        result = self.epsilon()
        for observer in self.observers:
            composed = self._composed(observer)
            if not any(isinstance(self._events[key], ProjectedStepDpEvent) for key, _ in composed):
                continue
            events = Counter()
            for key, count in composed:
                event = self._events[key]
                events[self._key(event.composed if isinstance(event, ProjectedStepDpEvent) else event)] += count
            name = ANALYSIS_ACCOUNTING[self.analysis][2]
            if any(isinstance(self._events[key], dp_event.NonPrivateDpEvent) for key in events):
                result[observer] = math.inf
                continue
            with _ACCOUNTING:
                result[observer] = self._accountant(observer, list(events.items()), name).get_epsilon(self.delta)
        return result

    @property
    def compositions(self) -> int:
        """How many rounds were composed (a round re-run with different randomness counts twice)."""
        return len(self._journal)

    # -- persistence --------------------------------------------------------------------------------------------
    def to_dict(self, summary: bool = True) -> dict:
        """The ledger as ledger.json holds it: its settings, each distinct event once and the journal, and with
        ``summary`` the accountant and epsilon of each observer's composition so far (what a reader of the file wants;
        ``from_dict`` needs only the rest, and it costs each observer's accounting, so the save before a round's noise
        leaves it out: ``save``)."""
        return {**self._settings(), "events": [json.loads(text) for text in self._event_texts],
                "journal": [{"round": round_index, "events": dict(refs), "fingerprint": fingerprint}
                            for (round_index, _, fingerprint), refs in zip(self._journal, self._refs)],
                **(self._summary() if summary else {})}

    def _settings(self) -> dict:
        return {"observers": list(self.observers), "delta": self.delta, "conversion": self.conversion,
                "analysis": self.analysis, "neighboring": self.neighboring, "accountant_names": self.accountant_names,
                "subsampling_bound": self.subsampling_bound, "budget": self.budget}

    def _summary(self) -> dict:
        return {"accountant": self.accountants(), "epsilon": {o: _json_number(e) for o, e in self.epsilon().items()}}

    def _text(self, summary: bool) -> str:
        """``json.dumps(self.to_dict(summary))``'s content, from the parts encoded once as they were recorded
        (``_append``): each save encodes nothing of the rounds before, only joins their text (one line per distinct
        event and per journal entry), so a save at round T costs O(T) bytes copied, not T entries encoded."""
        settings = json.dumps(self._settings())[:-1]
        summary_text = "".join(f",\n{json.dumps(k)}: {json.dumps(v)}" for k, v in self._summary().items()) \
            if summary else ""
        return (f'{settings},\n"events": [\n' + ",\n".join(self._event_texts) + '\n],\n"journal": [\n'
                + ",\n".join(self._entry_texts) + f"\n]{summary_text}}}\n")

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

    def save(self, path: str | os.PathLike, summary: bool = True) -> None:
        """Writes the ledger atomically and durably (a temporary file, flushed to disk, then renamed over ``path``):
        a crash leaves either the old ledger or the new one, never a truncated file. RunDirectoryError if it cannot be
        written (the caller then must not release anything the ledger would not record). ``summary``: with each
        observer's accountant and epsilon (``to_dict``); without, the journal only, as a round's entry is saved
        before its noise (the simulator's checkpoints write the summary)."""
        write_text_atomically(Path(path), self._text(summary), "the privacy ledger")

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


_NO_OP = repr(dp_event.NoOpDpEvent())


class _AccountingLock:
    """One accounting at a time in this process (the accountants' caches, ``pld``'s PLDs and ``pld_power``'s moments
    and transforms, are process-wide and not thread-safe), the reads (``_READER``, which only report) after every
    accounting a round may be waiting for (the main thread's, the recorder's and the planner's): a read in progress
    finishes its accounting, but no read starts one while another thread waits."""

    def __init__(self):
        self._changed = threading.Condition()
        self._held = False
        self._urgent = 0  # threads other than the reader waiting for the lock
        self._waiting_reads = 0  # reads waiting for it (for inspection)

    def __enter__(self) -> None:
        urgent = not getattr(_THREAD, "reports", False)
        with self._changed:
            self._urgent += urgent
            self._waiting_reads += not urgent
            try:
                self._changed.wait_for(lambda: not self._held and (urgent or not self._urgent))
            finally:
                self._urgent -= urgent
                self._waiting_reads -= not urgent
            self._held = True

    def __exit__(self, *exc) -> None:
        with self._changed:
            self._held = False
            self._changed.notify_all()


_THREAD = threading.local()
_ACCOUNTING = _AccountingLock()


def _reporting() -> None:
    """The reader thread's set-up: its accountings yield to the others' (``_AccountingLock``); no stop signals."""
    _THREAD.reports = True
    _blocking_stop_signals()


def _blocking_stop_signals() -> None:
    """Blocks SIGINT and SIGTERM in the calling thread: the kernel then delivers them to the main thread, whose handler
    stops a run after its round (``dpfl.engine.stop_signal``); taken by another thread, CPython 3.11 runs the handler
    only when the main thread next checks for signals, which may be after the run has ended."""
    if hasattr(signal, "pthread_sigmask"):  # POSIX; elsewhere Python delivers every signal to the main thread
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


#: The background thread of ``epsilon_through_later`` (one: reads are answered in the order they are asked).
_READER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpfl-epsilon", initializer=_reporting)
#: The thread of ``record_later``: a round's record and durable save, beside its client work.
_RECORDER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpfl-record", initializer=_blocking_stop_signals)
#: The thread of the budget checks prepared ahead (``_prepare_next_check``): not queued behind the reads, which
#: only report, while a check may hold up a round (all three take ``_ACCOUNTING`` for each accounting).
_PLANNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpfl-plan", initializer=_blocking_stop_signals)


def _largest_within(n: int, within) -> int:
    """The largest k <= n with ``within(k)`` (``within(0)`` holds, ``within`` is taken to be monotone): n if
    within(n), else by bisection on [0, n)."""
    if within(n):
        return n
    low, high = 0, n  # within(low), not within(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if within(middle) else (low, middle)
    return low


def _extend(runs: list, key: str) -> None:
    """Appends one round of event ``key`` to ``runs`` ([key, rounds] of equal consecutive events)."""
    if runs and runs[-1][0] == key:
        runs[-1][1] += 1
    else:
        runs.append([key, 1])


def _spans(rounds: list[int]) -> str:
    """"1..5, 8" for [1, 2, 3, 4, 5, 8] (sorted); "none" for []."""
    spans: list[list[int]] = []
    for r in rounds:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in spans) or "none"


def _invalid_ledger(path: Path, problem: str) -> RunDirectoryError:
    return RunDirectoryError(f"{path} is not a valid privacy ledger ({problem}); it records privacy already spent, so "
                             "dpfl will not start over: restore it, or move it away deliberately")


def _json_number(value: float):
    """JSON has no infinity: a non-private epsilon is written as null."""
    return None if math.isinf(value) else value
