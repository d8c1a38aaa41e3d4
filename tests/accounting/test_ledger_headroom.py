"""A budgeted ledger checks a round by its headroom (``PrivacyLedger._repeats_within_budget``): it stops a run at the
very round, with the very message, that a check of every round gives, accounts O(log^2 T) compositions over T equal
rounds instead of T, checks every round again when the event changes or the budget does, and still reports epsilon
after each round exactly as a fresh ledger."""

import threading

import pytest
from dp_accounting import dp_event

from dpfl.accounting import ledger as ledger_module
from dpfl.accounting import pld, pld_power
from dpfl.accounting.events import ProjectedStepDpEvent
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.errors import BudgetExceededError

DELTA = 1e-6
OBSERVERS = ("third_party", "server")


def gaussian(z: float) -> dict[str, dp_event.DpEvent]:
    return {"third_party": dp_event.GaussianDpEvent(z), "server": dp_event.GaussianDpEvent(z / 2)}


def poisson(z: float) -> dict[str, dp_event.DpEvent]:
    return {o: dp_event.PoissonSampledDpEvent(0.2, dp_event.GaussianDpEvent(z * s)) for o, s in zip(OBSERVERS, (1, .5))}


def fresh_epsilon(played: list[dict], accountant: str) -> dict[str, float]:
    """Epsilon after ``played`` by a ledger without a budget, every PLD cache emptied."""
    pld._CACHE.clear()
    pld_power._MOMENTS.clear()
    ledger = PrivacyLedger(OBSERVERS, DELTA, neighboring="add_remove", accountant=accountant)
    for t, events in enumerate(played, start=1):
        ledger.record(t, events)
    return ledger.epsilon()


def counting(ledger: PrivacyLedger, monkeypatch) -> list[str]:
    """The observers of every accounting ``ledger`` does (each accountant it builds and asks)."""
    built = []
    make = ledger._accountant
    monkeypatch.setattr(ledger, "_accountant", lambda observer, composed, name=None:
                        built.append(observer) or make(observer, composed, name))
    return built


@pytest.mark.parametrize("accountant, make, budget", [("rdp", gaussian, 2.5), ("tightest", poisson, 0.4)])
def test_the_run_stops_at_the_round_a_check_of_every_round_stops_it(accountant, make, budget):
    played = [make(8.0)] * 40
    checked_every_round = PrivacyLedger(OBSERVERS, DELTA, neighboring="add_remove", accountant=accountant)
    spent = [checked_every_round.epsilon()]
    while spent[-1]["third_party"] <= budget:  # a check of every round: epsilon with the next round included
        checked_every_round.record(len(spent), played[len(spent) - 1])
        spent.append(checked_every_round.epsilon())
    stop = len(spent) - 1
    assert 5 < stop < 40  # the budget binds within the rounds played, after a few headrooms
    before, after = spent[stop - 1], spent[stop]
    ledger = PrivacyLedger(OBSERVERS, DELTA, {"third_party": budget}, neighboring="add_remove", accountant=accountant)
    for t in range(1, stop):
        ledger.record(t, played[t - 1])
        assert ledger.epsilon() == spent[t]  # what rows read: the numbers of a ledger that checks every round
    assert ledger.epsilon() == fresh_epsilon(played[:stop - 1], accountant)  # and a fresh one's
    with pytest.raises(BudgetExceededError) as refused:
        ledger.record(stop, played[stop - 1])
    assert str(refused.value) == (
        f"round {stop} would raise epsilon towards a third party to {after['third_party']:.4g} > "
        f"privacy.budget.third_party = {budget:g} (delta = {DELTA:g}); the run stops before that round releases "
        f"anything, having spent {before['third_party']:.4g}")
    assert ledger.compositions == stop - 1  # nothing composed for the refused round


def test_equal_rounds_are_accounted_at_rounds_1_3_7_15_31_63_only(monkeypatch):
    """Round n + 1 finds the composition doubled (2n + 2 rounds) within budget, which admits it and n + 1 more: 64
    rounds cost one accounting at each of rounds 1, 3, 7, 15, 31 and 63 (the composition doubled only), not 64."""
    ledger = PrivacyLedger(OBSERVERS, DELTA, {"third_party": 1e6}, neighboring="add_remove", accountant="rdp")
    built = counting(ledger, monkeypatch)
    checked = []
    for t in range(1, 65):
        before = len(built)
        ledger.record(t, gaussian(8.0))
        if len(built) > before:
            checked.append(t)
    assert checked == [1, 3, 7, 15, 31, 63] and built == ["third_party"] * 6
    for read in (2, 6, 14, 30, 62):  # the doubled compositions are remembered: reading them accounts nothing
        assert ledger.epsilon_through(read)["third_party"] > 0
    assert built.count("third_party") == 6


def test_a_new_event_or_a_new_budget_is_checked_again(monkeypatch):
    ledger = PrivacyLedger(OBSERVERS, DELTA, {"third_party": 1e6}, neighboring="add_remove", accountant="rdp")
    built = counting(ledger, monkeypatch)
    for t in range(1, 5):  # two events in turn: no round repeats the last one, so each is checked
        before = len(built)
        ledger.record(t, gaussian(8.0 if t % 2 else 9.0))
        assert len(built) > before
    spent = ledger.epsilon()["third_party"]
    ledger.record(5, gaussian(9.0))  # round 4's event again: within its headroom, not accounted
    ledger.budget = {"third_party": spent}  # lowered, as a resume with a smaller budget does
    with pytest.raises(BudgetExceededError, match="round 6 would raise"):
        ledger.record(6, gaussian(9.0))  # the headroom was for another budget: checked, and refused


def test_an_ordered_accountant_checks_every_round(monkeypatch):
    """The last-iterate accountant's epsilon depends on the order of the steps: no headroom is claimed for it."""
    step = ProjectedStepDpEvent(30, 1, 1.0, 1.0, 0.5, 4.0, False, False, 30, dp_event.NoOpDpEvent())
    ledger = PrivacyLedger(OBSERVERS, DELTA, {"third_party": 1e6}, neighboring="add_remove",
                           accountant="last_iterate")
    built = counting(ledger, monkeypatch)
    for t in range(1, 5):
        ledger.record(t, {o: step for o in OBSERVERS})
    assert built == ["third_party"] * 4


def test_a_horizon_prepares_each_check_ahead_and_stops_at_the_same_round(monkeypatch):
    """Given the run's horizon, the check that ends a headroom is accounted on the planner thread as soon as the
    headroom is granted (the composition doubled; where that exceeds the budget, the round itself and the headroom's
    bisection after it): the rounds themselves then account only round 1's check (on the recording thread), while the
    run stops at the very round, with the very epsilon, that the unprepared ledger stops at; no check beyond the
    horizon is prepared."""
    budget, horizon = 4.5, 40  # epsilon 4.33 after 25 rounds, 4.70 after 30
    played = [poisson(1.5)] * horizon
    plain = PrivacyLedger(OBSERVERS, DELTA, {"third_party": budget}, neighboring="add_remove")
    stop_plain = next(t for t, events in enumerate(played, start=1) if _refused(plain, t, events))

    prepared = PrivacyLedger(OBSERVERS, DELTA, {"third_party": budget}, neighboring="add_remove")
    pld._CACHE.clear()
    pld_power._MOMENTS.clear()
    here = []  # the accountings towards the budgeted observer on this thread
    make = prepared._accountant

    def accountant(observer, composed, name=None):
        if threading.current_thread() is threading.main_thread() and observer == "third_party":
            here.append(sum(count for _, count in composed))
        return make(observer, composed, name)

    monkeypatch.setattr(prepared, "_accountant", accountant)
    checked = []
    for t, events in enumerate(played, start=1):
        ledger_ahead()  # what the planner was given has been done
        before = len(here)
        if _refused(prepared, t, events, horizon):
            break
        if len(here) > before:
            checked.append(t)
    assert t == stop_plain < horizon  # the budget stops it within the horizon, at the unprepared ledger's round
    assert prepared.epsilon() == plain.epsilon()
    # round 1's check (the composition doubled: 2 rounds) and nothing more on this thread: rounds 3 and 7 find theirs
    # prepared (6 and 14 rounds); round 15's doubled composition (30) exceeds the budget, so the planner also accounted
    # round 15 itself and the bisection after it (22, 26, 28, 27 rounds: headroom 12); round 28's check (56, then 28
    # itself, which exceeds it: the stop) was prepared at round 15
    assert checked == [1] and here == [2], (checked, here)

    far = PrivacyLedger(OBSERVERS, DELTA, {"third_party": 1e6}, neighboring="add_remove", accountant="rdp")
    submitted = []
    monkeypatch.setattr(ledger_module._PLANNER, "submit", lambda *args: submitted.append(args[-1]))
    for t in range(1, 8):
        far.record(t, gaussian(8.0), horizon=6)
    # round 1 grants 1 round (next check at round 3, with 2 rounds composed: prepared), round 3 grants 3 (next check
    # at 7 > 6: not)
    assert submitted == [2]


def _refused(ledger: PrivacyLedger, t: int, events: dict, horizon: int | None = None) -> bool:
    try:
        ledger.record(t, events, horizon=horizon)
    except BudgetExceededError:
        return True
    return False


def ledger_ahead() -> None:
    """Waits until the planner thread has done what it was given."""
    ledger_module._PLANNER.submit(lambda: None).result()
