"""The last-iterate accountant inside the ledger: per-step diameters, a run stopped before its random-stopping
horizon, ProjectedStepDpEvent composed in order, the composition baseline, persistence, and the observers' events."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpfl.accounting import accountants
from dpfl.accounting import last_iterate as li
from dpfl.accounting.events import ProjectedStepDpEvent, event_from_dict, event_to_dict
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import OTHER_SILO, THIRD_PARTY, Cohort, Release, observer_events

N, M, L, RHO = 30, 1, 1.0, 1.0


def brute(eps, lrs, sigmas, flags, n=N, m=M, stop_horizon=None):
    """Theorem 2 by its double sum; with stop_horizon T, W_min(tau, t) for tau ~ U{1..T} (joint convexity)."""
    def s_tau(tau):
        total = 0.0
        for t in range(tau):
            term = li.theta(eps, 2 * L / (math.sqrt(m) * sigmas[t]))
            for j in range(t + 1, tau):
                d = 2 * (RHO + lrs[j] * L) if flags[j] else 2 * RHO
                term *= li.theta(eps, d * math.sqrt(m) / (lrs[j] * sigmas[j]))
            total += term
        return m / n * total

    steps = len(lrs)
    if stop_horizon is None:
        return s_tau(steps)
    return (sum(s_tau(tau) for tau in range(1, steps)) + (stop_horizon - steps + 1) * s_tau(steps)) / stop_horizon


def step(lr=0.5, sigma=2.0, nonconvex=False, random_stop=False, horizon=N, composed=dp_event.NoOpDpEvent()):
    return ProjectedStepDpEvent(N, M, L, RHO, lr, sigma, nonconvex, random_stop, horizon, composed)


def test_per_step_diameters_match_the_double_sum():
    lrs, sigmas = [0.9, 0.7, 0.5, 0.5, 0.3, 0.3], [2.0, 2.0, 3.0, 3.0, 3.0, 1.5]
    flags = [True, True, False, False, True, False]
    accountant = li.LastIterateAccountant(n=N, batch_size=M, lipschitz=L, radius=RHO)
    for lr, sigma, flag in zip(lrs, sigmas, flags):
        accountant.step(lr, sigma, nonconvex=flag)
    for eps in (0.2, 1.0):
        assert accountant.delta(eps) == pytest.approx(brute(eps, lrs, sigmas, flags), rel=1e-10)
    counted = li.LastIterateAccountant(n=N, batch_size=M, lipschitz=L, radius=RHO)
    counted.step(0.5, 2.0, count=4)
    single = li.LastIterateAccountant(n=N, batch_size=M, lipschitz=L, radius=RHO)
    for _ in range(4):
        single.step(0.5, 2.0)
    assert counted.log_delta(0.7) == single.log_delta(0.7) and counted.steps == 4


@pytest.mark.parametrize("steps", [1, 4, 10])
def test_a_run_stopped_before_its_horizon_releases_w_min_tau_t(steps):
    accountant = li.LastIterateAccountant(n=N, batch_size=M, lipschitz=L, radius=RHO, random_stop=True, horizon=10)
    for _ in range(steps):
        accountant.step(0.5, 2.0)
    for eps in (0.3, 1.0):
        expected = brute(eps, [0.5] * steps, [2.0] * steps, [False] * steps, stop_horizon=10)
        assert accountant.delta(eps) == pytest.approx(expected, rel=1e-10)
    with pytest.raises(Exception, match="horizon = 10"):
        accountant.step(0.5, 2.0, count=11 - steps)


def test_the_ledger_feeds_the_last_iterate_accountant_in_order():
    early, late = step(lr=0.9, sigma=1.0, nonconvex=True), step(lr=0.2, sigma=4.0)
    ledgers = {}
    for order in ("early first", "late first"):
        ledger = PrivacyLedger([THIRD_PARTY], 1e-5, accountant={THIRD_PARTY: "last_iterate"})
        sequence = [early] * 3 + [late] * 2 + [early] if order == "early first" else [late] * 2 + [early] * 4
        for t, event in enumerate(sequence):
            ledger.record(t, {THIRD_PARTY: event})
        ledgers[order] = ledger
        lrs, sigmas, flags = zip(*((e.lr, e.sigma, e.nonconvex) for e in sequence))
        acc = li.LastIterateAccountant(n=N, batch_size=M, lipschitz=L, radius=RHO)
        for lr, sigma, flag in zip(lrs, sigmas, flags):
            acc.step(lr, sigma, nonconvex=flag)
        expected = acc.epsilon(1e-5)
        assert ledger.epsilon()[THIRD_PARTY] == pytest.approx(expected, rel=1e-12)
    # the same multiset of steps, another order: another epsilon (a count per distinct event would merge them)
    assert ledgers["early first"].epsilon() != ledgers["late first"].epsilon()
    restored = PrivacyLedger.from_dict(ledgers["early first"].to_dict())
    assert restored.epsilon() == ledgers["early first"].epsilon()
    assert restored.accountants() == {THIRD_PARTY: "last_iterate"}


def test_steps_of_different_runs_are_not_composed_together():
    accountant = accountants.make("last_iterate", accountants.NeighborRel.REPLACE_ONE)
    accountant.compose(step())
    accountant.compose(ProjectedStepDpEvent(N + 1, M, L, RHO, 0.5, 2.0, False, False, N, dp_event.NoOpDpEvent()))
    with pytest.raises(ValueError, match="different runs"):
        accountant.get_epsilon(1e-5)
    assert not accountant.supports_event(dp_event.GaussianDpEvent(1.0))


def test_epsilon_composition_composes_what_each_hidden_step_carries():
    composed = dp_event.GaussianDpEvent(1.0)  # sigma = 2 = 2 L z
    ledger = PrivacyLedger([THIRD_PARTY, OTHER_SILO], 1e-5, accountant={THIRD_PARTY: "last_iterate"})
    ledger.record(0, {THIRD_PARTY: step(composed=composed), OTHER_SILO: composed})
    for t in range(1, 5):
        ledger.record(t, {THIRD_PARTY: step(), OTHER_SILO: dp_event.NoOpDpEvent()})
    assert ledger.hides_iterates()
    gaussian = accountants.make("tightest", accountants.NeighborRel.REPLACE_ONE).compose(composed).get_epsilon(1e-5)
    assert ledger.epsilon_composition() == pytest.approx({THIRD_PARTY: gaussian, OTHER_SILO: gaussian}, rel=1e-12)
    assert ledger.epsilon()[OTHER_SILO] == pytest.approx(gaussian, rel=1e-12)
    # and that baseline is the exact composition of Asoodeh et al. (a Gaussian shift 2L / (sqrt(m) sigma) = 1)
    assert gaussian == pytest.approx(li.composition_epsilon(1e-5, 2.0, N, M, L), rel=2e-3)
    assert ledger.epsilon()[THIRD_PARTY] < gaussian


def test_events_round_trip_through_json():
    event = step(nonconvex=True, random_stop=True, composed=dp_event.GaussianDpEvent(1.5))
    assert event_from_dict(event_to_dict(event)) == event


def test_only_a_third_party_of_the_final_model_is_charged_the_hidden_step():
    hidden = step()
    release = Release((dp_event.GaussianDpEvent(1.0),), (True,), 1.0, Cohort.scheduled(N, 3, 3, True), hidden=hidden)
    every = observer_events(release, release.cohort, "trusted")
    final = observer_events(release, release.cohort, "trusted", released="final")
    # the batch's three shares
    assert every[THIRD_PARTY] == dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(math.sqrt(3)), 1)
    assert final[THIRD_PARTY] == ProjectedStepDpEvent(*[getattr(hidden, f) for f in (
        "population", "batch_size", "lipschitz", "radius", "lr", "sigma", "nonconvex", "random_stop", "horizon")],
        composed=every[THIRD_PARTY])
    assert final[OTHER_SILO] == every[OTHER_SILO]  # another silo receives W_{t-1}: composition
    plain = Release((dp_event.GaussianDpEvent(1.0),), (True,))
    assert observer_events(plain, Cohort.fixed(10, 5), released="final") == observer_events(plain, Cohort.fixed(10, 5))
    assert np.isfinite(PrivacyLedger([THIRD_PARTY], 1e-5).epsilon()[THIRD_PARTY])
