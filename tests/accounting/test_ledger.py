"""PrivacyLedger: composition per observer, idempotent journal, budgets, JSON persistence."""

import json
import math

import pytest
from dp_accounting import dp_event

from dpfl.accounting.accountant import NEIGHBORING, account
from dpfl.accounting.conversion import rdp_to_epsilon
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import OBSERVERS, Cohort, Release, local_steps_additive, observer_events
from dpfl.accounting.rdp import DEFAULT_ORDERS, rdp_curve
from dpfl.errors import BudgetExceededError, ConfigError

DELTA = 1e-5


def step(z=1.0, n=100, b=20):
    return dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(z))


def events(z=1.0, k=3, m=20, cohort=5, analysis="sound", first=None):
    release = Release((first or step(z),) + (step(z),) * (k - 1), local_steps_additive(k, True, False))
    return observer_events(release, Cohort.fixed(m, cohort), analysis=analysis)


def expected_epsilon(event_counts, delta=DELTA):
    """The sound analysis of replace-one Gaussians sampled without replacement: their PLD (the Poisson pair that
    dominates them, ``pld.without_replacement_as_poisson``)."""
    composed = dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(e, c) for e, c in event_counts])
    return account(composed, delta, "pld", "modern", "replace_one").epsilon


def test_paper_analysis_is_the_papers_rdp_sum():
    ledger = PrivacyLedger(OBSERVERS, DELTA, analysis="paper")
    assert (ledger.conversion, ledger.subsampling_bound) == ("classic", "paper")
    ev = events(analysis="paper")
    for t in range(3):
        ledger.record(t, ev)
    for observer in OBSERVERS:
        total = 3 * rdp_curve(ev[observer], subsampling_bound="paper")
        assert ledger.epsilon()[observer] == pytest.approx(
            rdp_to_epsilon(DEFAULT_ORDERS, total, DELTA, "classic")[0], rel=1e-12)
    assert ledger.accountants() == {o: "rdp" for o in OBSERVERS}


def test_sound_analysis_uses_pld_where_it_can():
    """Poisson record sampling (add/remove) is PLD-supported: the ledger uses it, and it is tighter than RDP."""
    poisson = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))
    ev = events(first=poisson, k=1)
    ledger = PrivacyLedger(OBSERVERS, DELTA, neighboring="add_remove")
    for t in range(5):
        ledger.record(t, ev)
    assert ledger.accountants() == {o: "pld" for o in OBSERVERS}
    rdp = account(dp_event.SelfComposedDpEvent(ev["server"], 5), DELTA, "rdp", "modern").epsilon
    pld = account(dp_event.SelfComposedDpEvent(ev["server"], 5), DELTA, "pld").epsilon
    assert ledger.epsilon()["server"] == pytest.approx(pld, rel=1e-9) and pld < rdp


def recorded(ledger: PrivacyLedger, round_index: int, events, fingerprint=None) -> dict[str, float]:
    """Records a round, then reads epsilon towards every observer."""
    ledger.record(round_index, events, fingerprint)
    return ledger.epsilon()


def test_epsilon_equals_the_pld_composition():
    ledger = PrivacyLedger(OBSERVERS, DELTA)
    assert ledger.epsilon() == {o: 0.0 for o in OBSERVERS}
    ev = events()
    for t in range(4):
        ledger.record(t, ev)
    eps = ledger.epsilon()
    for observer in OBSERVERS:
        assert eps[observer] == pytest.approx(expected_epsilon([(ev[observer], 4)]), rel=1e-9)  # PLD self-composed
    assert ledger.compositions == 4


def test_record_accounts_only_the_observers_a_budget_names_and_the_others_when_read(monkeypatch):
    ledger = PrivacyLedger(OBSERVERS, DELTA, budget={"server": 100.0})
    asked = []
    epsilon_of = ledger._epsilon_of
    monkeypatch.setattr(ledger, "_epsilon_of", lambda observer, composed: asked.append(observer) or
                        epsilon_of(observer, composed))
    assert ledger.record(0, events()) is None
    assert asked == ["server"]  # its budget check: the composition doubled, within budget (``_doubled_within_budget``)
    checked = len(asked)
    after = ledger.epsilon()
    assert sorted(asked[checked:]) == sorted(OBSERVERS)  # each observer's epsilon of the round when read
    assert after == ledger.epsilon() and len(asked) == checked + len(OBSERVERS)  # read again: nothing again
    assert after == PrivacyLedger.from_dict(ledger.to_dict()).epsilon()
    assert after["third_party"] > 0


def test_mixed_events_compose():
    ledger = PrivacyLedger(("third_party", "server"), DELTA)
    a, b = events(z=1.0), events(z=2.0)
    ledger.record(0, a)
    ledger.record(1, b)
    ledger.record(2, a)
    assert ledger.epsilon()["server"] == pytest.approx(expected_epsilon([(a["server"], 2), (b["server"], 1)]),
                                                       rel=1e-9)
    # extra observers in the events are ignored
    assert set(ledger.epsilon()) == {"third_party", "server"}


def test_same_round_same_events_and_randomness_is_idempotent():
    ledger = PrivacyLedger(OBSERVERS, DELTA)
    ev = events()
    ledger.record(0, ev, "rng-0")
    ledger.record(1, ev, "rng-1")
    eps = ledger.epsilon()
    ledger.record(1, dict(events()), "rng-1")  # equal events, another dict, same randomness
    assert ledger.epsilon() == eps and ledger.compositions == 2
    ledger.record(0, ev, "rng-0")  # an earlier round replayed
    assert ledger.compositions == 2 and ledger.epsilon() == eps
    ledger.record(0, ev, "rng-other")  # the same round with other randomness is a new release
    assert ledger.compositions == 3 and ledger.epsilon()["third_party"] > eps["third_party"]
    ledger.record(1, ev)  # no fingerprint: never assumed to be a replay
    assert ledger.compositions == 4
    restored = PrivacyLedger.from_dict(ledger.to_dict())
    restored.record(1, ev, "rng-1")  # fingerprints survive a JSON round trip (the latest entry of round 1 has None)
    assert restored.compositions == 5


def test_same_round_different_events_counts_twice():
    ledger = PrivacyLedger(OBSERVERS, DELTA)
    ledger.record(0, events(z=1.0), "rng")
    before = ledger.epsilon()
    ledger.record(0, events(z=1.5), "rng")
    assert ledger.compositions == 2
    after = ledger.epsilon()
    assert all(after[o] > before[o] for o in OBSERVERS)
    assert after["server"] == pytest.approx(
        expected_epsilon([(events(z=1.0)["server"], 1), (events(z=1.5)["server"], 1)]), rel=1e-9)
    # the latest events of round 0 are now z = 1.5: replaying them is idempotent, replaying z = 1.0 is not
    ledger.record(0, events(z=1.5), "rng")
    assert ledger.compositions == 2
    ledger.record(0, events(z=1.0), "rng")
    assert ledger.compositions == 3


def test_epsilon_is_monotone_over_rounds():
    ledger = PrivacyLedger(OBSERVERS, DELTA)
    previous = {o: 0.0 for o in OBSERVERS}
    for t in range(10):
        ledger.record(t, events(z=0.8))
        eps = ledger.epsilon()
        assert all(eps[o] > previous[o] for o in OBSERVERS)
        assert eps["server"] >= eps["third_party"]
        previous = eps


def test_missing_observer_is_an_error():
    ledger = PrivacyLedger(OBSERVERS, DELTA)
    ev = events()
    del ev["server"]
    with pytest.raises(ValueError, match="server"):
        ledger.record(0, ev)
    assert ledger.compositions == 0


def test_budget_stops_before_composing():
    ev = events(z=1.0)
    one = PrivacyLedger(OBSERVERS, DELTA)
    one.record(0, ev)
    one.record(1, ev)
    two_rounds = one.epsilon()["third_party"]
    one.record(2, ev)
    three_rounds = one.epsilon()["third_party"]
    limit = (two_rounds + three_rounds) / 2
    ledger = PrivacyLedger(OBSERVERS, DELTA, budget={"third_party": limit})
    ledger.record(0, ev, "rng-0")
    ledger.record(1, ev, "rng-1")
    with pytest.raises(BudgetExceededError, match="privacy.budget.third_party"):
        ledger.record(2, ev, "rng-2")
    assert ledger.compositions == 2
    assert ledger.epsilon()["third_party"] == pytest.approx(two_rounds, rel=1e-12)
    assert ledger.epsilon()["third_party"] <= limit
    # still stopped on a second try, and a replay of a recorded round is still free
    with pytest.raises(BudgetExceededError):
        ledger.record(2, ev, "rng-2")
    ledger.record(1, ev, "rng-1")
    assert ledger.compositions == 2


def test_budget_validation():
    with pytest.raises(ConfigError) as err:
        PrivacyLedger(OBSERVERS, DELTA, budget={"attacker": 1.0})
    assert err.value.field == "privacy.budget"
    with pytest.raises(ConfigError) as err:
        PrivacyLedger(("third_party",), DELTA, budget={"server": 1.0})  # not an observer of this ledger
    assert err.value.field == "privacy.budget"
    for bad in (0.0, -1.0, "3", float("nan")):
        with pytest.raises(ConfigError) as err:
            PrivacyLedger(OBSERVERS, DELTA, budget={"server": bad})
        assert err.value.field == "privacy.budget.server"
    for bad in (0.0, 1.0, -1e-5):
        with pytest.raises(ConfigError) as err:
            PrivacyLedger(OBSERVERS, bad)
        assert err.value.field == "privacy.delta"


def test_non_private_is_infinite():
    ledger = PrivacyLedger(OBSERVERS, DELTA)
    ledger.record(0, observer_events(Release((dp_event.NonPrivateDpEvent(),) * 2, (False, True)), Cohort.fixed(10, 3)))
    assert all(math.isinf(e) for e in ledger.epsilon().values())
    assert ledger.to_dict()["epsilon"] == {o: None for o in OBSERVERS}
    loaded = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert all(math.isinf(e) for e in loaded.epsilon().values())
    # a budget cannot be met by a non-private round
    budgeted = PrivacyLedger(OBSERVERS, DELTA, budget={"server": 100.0})
    with pytest.raises(BudgetExceededError):
        budgeted.record(0, {o: dp_event.NonPrivateDpEvent() for o in OBSERVERS})


def test_json_round_trip(tmp_path):
    ledger = PrivacyLedger(OBSERVERS, DELTA, budget={"server": 50.0}, conversion="classic", analysis="paper")
    for t in range(3):
        ledger.record(t, events(z=1.0), f"rng-{t}")
    ledger.record(3, events(z=2.0, k=2), "rng-3")
    ledger.record(3, events(z=2.5, k=2), "rng-3")  # the same round with other events: counted twice, kept in the journal
    data = json.loads(json.dumps(ledger.to_dict()))
    assert data["delta"] == DELTA and data["observers"] == list(OBSERVERS) and data["budget"] == {"server": 50.0}
    assert len(data["journal"]) == 5 and len(data["events"]) == 9  # 3 distinct event sets x 3 observers
    assert [entry["round"] for entry in data["journal"]] == [0, 1, 2, 3, 3]
    restored = PrivacyLedger.from_dict(data)
    assert (restored.analysis, restored.conversion, restored.neighboring) == ("paper", "classic", "replace_one")
    assert restored.epsilon() == ledger.epsilon()
    assert data["epsilon"] == ledger.epsilon()
    assert restored.compositions == 5 and restored.budget == {"server": 50.0}
    # and after the round trip the journal still makes replays idempotent
    restored.record(3, events(z=2.5, k=2), "rng-3")
    assert restored.compositions == 5
    restored.record(3, events(z=2.0, k=2), "rng-3")
    assert restored.compositions == 6

    path = tmp_path / "ledger.json"
    ledger.save(path)
    assert not (tmp_path / "ledger.json.tmp").exists()
    loaded = PrivacyLedger.load(path)
    assert loaded.epsilon() == ledger.epsilon()
    assert loaded.delta == DELTA and loaded.observers == OBSERVERS
    loaded.record(4, events())
    loaded.save(path)
    assert PrivacyLedger.load(path).compositions == 6


def test_other_delta_gives_other_epsilon():
    a, b = PrivacyLedger(OBSERVERS, 1e-5), PrivacyLedger(OBSERVERS, 1e-3)
    for ledger in (a, b):
        ledger.record(0, events())
    assert a.epsilon()["server"] > b.epsilon()["server"]


def test_accountants_are_interchangeable_per_observer():
    """One accountant per observer behind dp_accounting's contract: the tightest (PLD here), RDP, or pure-DP basic
    composition for Laplace releases."""
    poisson = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))
    ev = events(first=poisson, k=1)
    ledger = PrivacyLedger(OBSERVERS, DELTA, neighboring="add_remove", accountant={"server": "rdp"})
    for t in range(3):
        ledger.record(t, ev)
    assert ledger.accountants() == {"third_party": "pld", "server": "rdp", "other_silo": "pld"}
    assert ledger.epsilon()["server"] == pytest.approx(
        account(dp_event.SelfComposedDpEvent(ev["server"], 3), DELTA, "rdp", "modern").epsilon, rel=1e-9)
    assert PrivacyLedger.from_dict(ledger.to_dict()).accountant_names == ledger.accountant_names
    laplace = {o: dp_event.LaplaceDpEvent(2.0) for o in OBSERVERS}  # epsilon 1/2 per round, pure DP
    pure = PrivacyLedger(OBSERVERS, DELTA, neighboring="add_remove", accountant="pure")
    for t in range(4):
        pure.record(t, laplace)
    assert pure.epsilon() == {o: pytest.approx(2.0) for o in OBSERVERS}
    with pytest.raises(ConfigError, match="accountant.server"):
        PrivacyLedger(OBSERVERS, DELTA, accountant={"server": "magic"})


@pytest.mark.parametrize("accountant", ["tightest", "rdp"])
def test_epsilon_through_a_round_is_what_the_round_reported_also_after_a_reload(accountant):
    """Each round's epsilon, as ``record`` returned it when the round was composed, is ``epsilon_through`` that round
    later on, exactly, in this ledger and in one read back from its JSON (a resumed run replaying a recorded round
    reports that round's own epsilon, not the latest); rounds of other events in between; a round not recorded, and
    the latest round, give ``epsilon()``."""
    ledger = PrivacyLedger(OBSERVERS, DELTA, accountant=accountant)
    rounds = [events(z) for z in (1.0, 1.0, 2.0, 1.0, 2.0)]
    reported = {t: recorded(ledger, t, ev, f"fingerprint {t}") for t, ev in enumerate(rounds, start=1)}
    assert len(set(map(str, reported.values()))) == 5
    loaded = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    for each in (ledger, loaded):
        assert {t: each.epsilon_through(t) for t in reported} == reported
        assert each.epsilon_through(6) == each.epsilon() == reported[5]
    assert recorded(loaded, 2, rounds[1], "fingerprint 2") == reported[5]  # a replay: nothing new composed ...
    assert loaded.epsilon_through(2) == reported[2]  # ... and it still reports its own epsilon
    loaded.record(2, rounds[1], "another fingerprint")  # a different release of round 2: composed again, at the end
    assert loaded.epsilon_through(2) == loaded.epsilon() != reported[5]


def test_epsilon_through_follows_an_ordered_accountant():
    """The last-iterate accountant composes runs of equal consecutive events in order: a prefix of the journal is
    composed in its own order."""
    from dpfl.accounting.events import ProjectedStepDpEvent

    hidden = [ProjectedStepDpEvent(30, 1, 1.0, 1.0, 0.5, sigma, False, False, 30, dp_event.NoOpDpEvent())
              for sigma in (2.0, 3.0, 2.0)]
    ledger = PrivacyLedger(["server"], DELTA, accountant="last_iterate")
    reported = {t: recorded(ledger, t, {"server": e}, str(t)) for t, e in enumerate(hidden, start=1)}
    loaded = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert {t: loaded.epsilon_through(t) for t in reported} == reported


def test_a_long_poisson_run_builds_each_round_event_once_and_keeps_its_numbers(monkeypatch):
    """A run's round t is accounted as SelfComposed(round event, t): the round event's PLD (its leaf Poisson-sampled
    Gaussians, the costly part) is built once per run, not once per round and observer, and every round's epsilon is
    bit-identical to accounting that round afresh with nothing cached."""
    from dpfl.accounting import pld

    def round_event(z):
        return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.2, dp_event.GaussianDpEvent(z)), 2)

    round_events = {"third_party": round_event(12.0), "server": round_event(8.0), "other_silo": round_event(12.0)}
    pld._CACHE.clear()
    built = []
    build = pld._build
    monkeypatch.setattr(pld, "_build", lambda event, *rest: built.append(repr(event)) or build(event, *rest))
    ledger = PrivacyLedger(list(round_events), DELTA, neighboring="zero_out")
    per_round = [recorded(ledger, t, round_events) for t in range(20)]
    leaves = [key for key in built if key.startswith("PoissonSampled")]
    assert sorted(leaves) == sorted({repr(e.event) for e in round_events.values()})  # each built once
    monkeypatch.setattr(pld, "_build", build)
    for t, epsilons in enumerate(per_round, start=1):
        for observer, event in round_events.items():
            pld._CACHE.clear()  # afresh: nothing cached
            composed = event if t == 1 else dp_event.SelfComposedDpEvent(event, t)
            assert epsilons[observer] == pld.pld_epsilon(composed, DELTA, NEIGHBORING["zero_out"]), (t, observer)
