"""SCAFFOLD-warm's warm rounds credit no share of the other clients' noise, and must not: the next round's messages
re-release the owner's warm control variate with its own noise alone (tests/helpers/scaffold_warm_reuse.py derives
the two-round view; the engine test confirms its law)."""

import math

import pytest

import scaffold_warm_reuse as reuse
import worst_case
from dpfl.accounting.theory import gdp_epsilon
from dpfl.algorithms.registry import Setting
from dpfl.engine.boundary import Boundary
from dpfl.engine.sampling import ClientSampler
from dpfl.experiments.noise_level import declared_epsilon

DELTA = 1e-5


def ledger_epsilon(instance, rounds: int) -> dict[str, float]:
    """The ledger's epsilon after ``rounds`` rounds of the whole cohort, as the simulator declares them."""
    n = instance.num_clients
    setting = Setting(client_rate=1.0, num_clients=n, train_counts=(instance.records,) * n, rounds=rounds,
                      delta=DELTA)
    return declared_epsilon(worst_case.build_algorithm(instance), setting, Boundary("plain"), ClientSampler(n, 1.0))


def test_crediting_the_warm_round_would_understate_the_two_round_view():
    """Exact: mu = 0.8972 for the warm round and the SCAFFOLD round after it. A credit of every client's share in
    the warm round (FedSGD's claim, the warm round's exact view alone) composed with the owner's own K draws in the
    next round claims mu = 0.7246, below it; the ledger (no credit: 2K draws, mu = sqrt(2K) / z = 1) stays above."""
    instance = reuse.INSTANCE
    n, k, z = instance.num_clients, instance.local_steps, instance.noise_multiplier
    exact = reuse.exact_mu(instance)
    assert exact == pytest.approx(0.897190, abs=1e-6)
    warm_alone = worst_case.claimed_epsilon(worst_case.FEDSGD, "plain", DELTA)["third_party"]
    assert warm_alone == pytest.approx(gdp_epsilon(math.sqrt(k / n) / z, DELTA), rel=1e-3)
    credited = gdp_epsilon(math.hypot(math.sqrt(k / n) / z, math.sqrt(k) / z), DELTA)
    truth = gdp_epsilon(exact, DELTA)
    claims = ledger_epsilon(instance, 2)
    assert credited < truth / 1.2
    assert claims["third_party"] == pytest.approx(gdp_epsilon(math.sqrt(2 * k) / z, DELTA), rel=1e-3)
    assert claims["third_party"] >= truth and claims["other_silo"] >= truth


@pytest.mark.slow
def test_the_engine_releases_the_derived_two_round_law():
    """Coupled runs (the same noise, the record at +C and -C) move (W, H) by exactly the derived shifts; the
    covariance of 400 copies is the derived diagonal one (within sampling error), so the measured mu is the exact
    one and above the credited claim; the quadratic clients' clipping never binds."""
    measured = reuse.measure(trials=400, coupled=4)
    assert measured.clipped == 0
    assert measured.shift == pytest.approx(reuse.shifts(reuse.INSTANCE), abs=1e-4)
    expected = reuse.covariance(reuse.INSTANCE)
    assert measured.covariance[0, 0] == pytest.approx(expected[0, 0], rel=0.25)
    assert measured.covariance[1, 1] == pytest.approx(expected[1, 1], rel=0.25)
    assert abs(measured.covariance[0, 1]) < 0.2 * math.sqrt(expected[0, 0] * expected[1, 1])
    assert measured.mu == pytest.approx(reuse.exact_mu(reuse.INSTANCE), rel=0.1)
    assert measured.mu > 0.7246 * 1.1
