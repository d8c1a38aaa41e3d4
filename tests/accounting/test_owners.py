"""Per-owner accounting (``dpfl.accounting.owners``) and the PLD of a Gaussian sampled without replacement
(``dpfl.accounting.pld.without_replacement_as_poisson``): against exact epsilons of 1-D Gaussian mixtures
(``tests/helpers/exact.py``), never against an accountant."""

from __future__ import annotations

import logging

import pytest
from dp_accounting import dp_event

import exact as ex
from dpfl.accounting import accountants, owners
from dpfl.accounting.accountant import NEIGHBORING, account
from dpfl.accounting.events import ParticipationDpEvent, WorstOwnerDpEvent, event_from_dict, event_to_dict
from dpfl.accounting.ledger import PrivacyLedger

logging.getLogger("absl").setLevel(logging.ERROR)
DELTA = 1e-5
#: the exact PLDs' loss grid: coarser than the default for speed; the truth stays a certified lower bound
INTERVAL = 5e-4


def wor(n: int, b: int, z: float) -> dp_event.DpEvent:
    return dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(z))


def tightest(event: dp_event.DpEvent) -> tuple[str, float]:
    """(the accountant that answers, epsilon) of the sound analysis's default accountant, under replace-one."""
    accountant = accountants.make("tightest", NEIGHBORING["replace_one"]).compose(event)
    return accountant.chosen, accountant.get_epsilon(DELTA)


def exact(rate: float, z: float, rounds: int = 1) -> float:
    """The worst case of b of n without replacement, replace-one: (1-q) N(0, z^2) + q N(1, z^2) against N(0, z^2),
    both orders, composed ``rounds`` times (a certified lower bound on a 1e-4 loss grid)."""
    return ex.Instance(((1.0, 1.0, ex.without_replacement_pair(rate, z)),)).epsilon(DELTA, rounds, INTERVAL)


@pytest.mark.parametrize("n, b, z, rounds", [(4, 1, 0.9, 1), (7, 1, 1.3, 1), (100, 10, 0.8, 3)])
def test_a_gaussian_sampled_without_replacement_gets_the_pld_of_its_dominating_pair(n, b, z, rounds):
    """The PLD claim is at or above the exact epsilon of the attained worst case and within the two grids' rounding
    of it (1e-3 per round), where RDP (Wang et al.'s bounds) was 1.2x-1.5x above."""
    event = dp_event.SelfComposedDpEvent(wor(n, b, z), rounds)
    truth = exact(b / n, z, rounds)
    chosen, claimed = tightest(event)
    assert chosen == "pld"
    assert truth <= claimed <= truth + 1e-3 * rounds
    assert account(event, DELTA, "rdp", "modern", "replace_one").epsilon > 1.15 * truth
    # the antipodal instance (the record +C against -C, the others 0) is another instance, below the claim
    antipodal = ex.Instance(((1.0, 1.0, ex.without_replacement_antipodal_pair(b / n, z)),))
    assert antipodal.epsilon(DELTA, rounds, INTERVAL) <= claimed


def test_a_whole_batch_and_other_inner_events_are_not_read_as_poisson():
    assert account(wor(5, 5, 1.0), DELTA, "pld", neighboring="replace_one").epsilon == pytest.approx(
        account(dp_event.GaussianDpEvent(1.0), DELTA, "pld", neighboring="replace_one").epsilon)
    laplace = dp_event.SampledWithoutReplacementDpEvent(5, 2, dp_event.LaplaceDpEvent(1.0))
    assert tightest(laplace)[0] == "rdp"


# -- the worst owner --------------------------------------------------------------------------------------------
#: two owners that neither dominates: owner 0 samples 1 of 7 records at z = 0.6, owner 1 1 of 4 at z = 1.0
OWNER_EVENTS = (wor(7, 1, 0.6), wor(4, 1, 1.0), wor(4, 1, 1.2))
BOUND = wor(4, 1, 0.6)  # the least multiplier at the largest ratio: no owner's release


def test_the_ledger_charges_each_owner_its_own_rounds_and_reports_the_worst():
    """3 rounds of a per-owner event: the claim is max over owners of their own 3-fold composition, each exact to the
    grid; the bound's composition is far above both (owner 2, dominated by owner 1, is not accounted)."""
    round_event = WorstOwnerDpEvent(OWNER_EVENTS, BOUND)
    ledger = PrivacyLedger(("third_party",), DELTA, neighboring="replace_one")
    for t in range(3):
        ledger.record(t, {"third_party": round_event})
    truths = [exact(1 / 7, 0.6, 3), exact(1 / 4, 1.0, 3)]
    claimed = ledger.epsilon()["third_party"]
    assert max(truths) <= claimed <= max(truths) + 3e-3
    assert exact(1 / 4, 0.6, 3) > 1.2 * claimed  # what one event for every owner had to charge
    assert ledger.accountants() == {"third_party": "pld"}
    assert PrivacyLedger.from_dict(ledger.to_dict()).epsilon() == ledger.epsilon()


def test_owner_compositions_keep_the_undominated_owners_and_fall_back_to_the_bound_beyond_the_cap(monkeypatch):
    participation = ParticipationDpEvent(0.5, WorstOwnerDpEvent(OWNER_EVENTS, BOUND))
    kept = owners.owner_compositions([(participation, 2), (dp_event.GaussianDpEvent(3.0), 1)])
    assert kept == [[(ParticipationDpEvent(0.5, e), 2), (dp_event.GaussianDpEvent(3.0), 1)] for e in OWNER_EVENTS[:2]]
    monkeypatch.setattr(owners, "MAX_OWNERS", 1)
    assert owners.owner_compositions([(participation, 2)]) == [[(ParticipationDpEvent(0.5, BOUND), 2)]]
    assert owners.owner_compositions([(BOUND, 2)]) == [[(BOUND, 2)]]
    with pytest.raises(ValueError, match=r"\[2, 3\] clients"):
        owners.owner_compositions([(WorstOwnerDpEvent(OWNER_EVENTS[:2], BOUND), 1),
                                   (WorstOwnerDpEvent(OWNER_EVENTS, BOUND), 1)])


@pytest.mark.parametrize("a, b, expected", [
    (wor(7, 1, 1.0), wor(4, 1, 1.0), True),  # a smaller ratio
    (wor(4, 1, 1.0), wor(7, 1, 0.5), False),  # a larger ratio, however noisy
    (dp_event.GaussianDpEvent(2.0), dp_event.GaussianDpEvent(1.0), True),
    (ParticipationDpEvent(0.3, wor(4, 1, 1.0)), ParticipationDpEvent(0.5, wor(4, 1, 0.9)), True),
    (ParticipationDpEvent(0.5, wor(4, 1, 1.0)), ParticipationDpEvent(0.3, wor(4, 1, 1.0)), False),
    (dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0)),
     dp_event.PoissonSampledDpEvent(0.2, dp_event.GaussianDpEvent(1.0)), True),
    (dp_event.LaplaceDpEvent(2.0), dp_event.LaplaceDpEvent(1.0), False),  # only what is derived: equality
])
def test_dominated_means_no_larger_rate_and_no_smaller_multiplier(a, b, expected):
    assert owners.dominated(a, b) is expected


def test_a_worst_owner_event_outside_a_ledger_is_charged_its_bound_and_survives_json():
    event = WorstOwnerDpEvent(OWNER_EVENTS, BOUND)
    assert account(event, DELTA, "rdp", "modern", "replace_one").epsilon == pytest.approx(
        account(BOUND, DELTA, "rdp", "modern", "replace_one").epsilon)
    assert event_from_dict(event_to_dict(event)) == event
