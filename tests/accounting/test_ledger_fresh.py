"""A ledger that reuses what it accounted (cached PLDs and their moments, RDP curves, epsilons read once per
composition, only a budget's observers at record time) reports, after every round, exactly what a fresh ledger that
composes the same rounds from scratch with every cache emptied reports: under each accountant (ORDERED ones too),
for constant, alternating and ever-new round events, across a resume from the saved ledger.json and replays."""

import json

import pytest
from dp_accounting import dp_event

from dpfl.accounting import pld, pld_power
from dpfl.accounting.events import ProjectedStepDpEvent
from dpfl.accounting.ledger import PrivacyLedger

DELTA = 1e-6
OBSERVERS = ("third_party", "server")


def poisson(z: float) -> dp_event.DpEvent:
    return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.2, dp_event.LaplaceDpEvent(z)), 2)


def step(sigma: float) -> ProjectedStepDpEvent:
    return ProjectedStepDpEvent(30, 1, 1.0, 1.0, 0.5, sigma, False, False, 30, dp_event.NoOpDpEvent())


def rounds(kind: str, accountant: str) -> list[dict]:
    """Six rounds' events: the same every round, two alternating, or a new one every round."""
    make = step if accountant == "last_iterate" else poisson
    noises = {"constant": [4.0] * 6, "alternating": [4.0, 4.0, 6.0, 4.0, 6.0, 6.0],
              "new": [4.0, 4.5, 5.0, 5.5, 6.0, 6.5]}[kind]
    return [{"third_party": make(z), "server": make(z / 2)} for z in noises]


def fresh_epsilon(accountant: str, done: list[dict]) -> dict[str, float]:
    """Epsilon after the rounds ``done``, by a new ledger with every composition cache emptied (PLDs, their moments;
    the RDP curves of single events, pure functions of the event, are kept)."""
    pld._CACHE.clear()
    pld_power._MOMENTS.clear()
    ledger = PrivacyLedger(OBSERVERS, DELTA, neighboring="add_remove", accountant=accountant)
    for t, events in enumerate(done, start=1):
        ledger.record(t, events)
    return ledger.epsilon()


@pytest.mark.parametrize("kind", ["constant", "alternating", "new"])
@pytest.mark.parametrize("accountant", ["tightest", "pld", "rdp", "last_iterate"])
def test_the_reusing_ledger_reports_what_a_fresh_one_does(accountant, kind):
    played = rounds(kind, accountant)
    budget = {"third_party": 1e6}  # a budget on one observer: accounted at each record; the other only when read
    ledger = PrivacyLedger(OBSERVERS, DELTA, budget, neighboring="add_remove", accountant=accountant)
    reported = []
    for t, events in enumerate(played[:4], start=1):
        ledger.record(t, events, f"fingerprint {t}")
        if t != 2:  # a round whose epsilon nobody reads: the next read accounts the rounds since
            reported.append((t, ledger.epsilon()))
    resumed = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))  # a resume from ledger.json
    resumed.budget = dict(budget)
    for t in (3, 4):  # replayed with the fingerprints on record: nothing new composed
        resumed.record(t, played[t - 1], f"fingerprint {t}")
    assert resumed.compositions == 4
    for t, events in enumerate(played[4:], start=5):
        resumed.record(t, events, f"fingerprint {t}")
        reported.append((t, resumed.epsilon()))
    assert resumed.epsilon_through(2) == fresh_epsilon(accountant, played[:2])
    for t, epsilon in reported:
        expected = fresh_epsilon(accountant, played[:t])
        assert epsilon == expected, (t, epsilon, expected)  # the same operations: equal, not merely within 1e-9
        assert all(0 < e < float("inf") for e in epsilon.values())
