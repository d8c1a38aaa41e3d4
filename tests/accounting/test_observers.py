"""What each observer sees: scale_noise and round_events."""

import math

import pytest
from dp_accounting import dp_event

from dpfl.accounting.conversion import rdp_to_epsilon
from dpfl.accounting.dp_scaffold import dp_scaffold_round_events
from dpfl.accounting.observers import OBSERVERS, OTHER_SILO, SERVER, THIRD_PARTY, round_events, scale_noise
from dpfl.accounting.rdp import DEFAULT_ORDERS, rdp_curve

G = dp_event.GaussianDpEvent


def wor(n, b, inner):
    return dp_event.SampledWithoutReplacementDpEvent(n, b, inner)


def epsilon(event, rounds=100, delta=1e-5):
    return rdp_to_epsilon(DEFAULT_ORDERS, rounds * rdp_curve(event), delta, "classic")[0]


def test_scale_noise_gaussian():
    assert scale_noise(G(2.0), 3.0) == G(6.0)
    assert scale_noise(G(1.5), math.sqrt(4)) == G(3.0)


def test_scale_noise_nested():
    event = wor(100, 10, dp_event.SelfComposedDpEvent(
        dp_event.ComposedDpEvent([G(1.0), dp_event.PoissonSampledDpEvent(0.1, G(2.0)), dp_event.NoOpDpEvent()]), 5))
    expected = wor(100, 10, dp_event.SelfComposedDpEvent(
        dp_event.ComposedDpEvent([G(3.0), dp_event.PoissonSampledDpEvent(0.1, G(6.0)), dp_event.NoOpDpEvent()]), 5))
    assert scale_noise(event, 3.0) == expected
    assert scale_noise(event, 1.0) == event


def test_scale_noise_leaves_non_noise_events_and_rejects_other_noise():
    assert scale_noise(dp_event.NoOpDpEvent(), 2.0) == dp_event.NoOpDpEvent()
    assert scale_noise(dp_event.NonPrivateDpEvent(), 2.0) == dp_event.NonPrivateDpEvent()
    with pytest.raises(ValueError, match="LaplaceDpEvent"):
        scale_noise(dp_event.LaplaceDpEvent(1.0), 2.0)
    with pytest.raises(ValueError, match="LaplaceDpEvent"):
        scale_noise(wor(10, 2, dp_event.LaplaceDpEvent(1.0)), 2.0)


def test_fixed_cohort_round_events():
    step = wor(4000, 800, G(60.0))
    ev = round_events(step, 50, 100, 20)
    aggregate = dp_event.SelfComposedDpEvent(wor(4000, 800, G(60.0 * math.sqrt(20))), 50)
    assert ev[THIRD_PARTY] == wor(100, 20, aggregate)
    assert ev[SERVER] == dp_event.SelfComposedDpEvent(step, 50)
    assert ev[OTHER_SILO] == dp_event.SelfComposedDpEvent(wor(4000, 800, G(60.0 * math.sqrt(19))), 50)
    assert set(ev) == set(OBSERVERS)


def test_whole_population_cohort_has_no_user_sampling():
    step = wor(50, 10, G(1.0))
    ev = round_events(step, 3, 8, 8)
    assert ev[THIRD_PARTY] == dp_event.SelfComposedDpEvent(wor(50, 10, G(math.sqrt(8))), 3)
    # another silo subtracts its own share: the owner's noise and 6 others'
    assert ev[OTHER_SILO] == dp_event.SelfComposedDpEvent(wor(50, 10, G(math.sqrt(7))), 3)


def test_secagg_server_sees_the_aggregate():
    step = wor(100, 20, G(1.0))
    plain, secagg = round_events(step, 4, 30, 6), round_events(step, 4, 30, 6, "secagg")
    assert secagg[SERVER] == dp_event.SelfComposedDpEvent(wor(100, 20, G(math.sqrt(6))), 4)
    assert secagg[OTHER_SILO] == plain[OTHER_SILO] == dp_event.SelfComposedDpEvent(wor(100, 20, G(math.sqrt(5))), 4)
    assert epsilon(secagg[SERVER]) < epsilon(secagg[OTHER_SILO])  # a silo can remove its own share, the server not
    assert secagg[THIRD_PARTY] == plain[THIRD_PARTY]
    assert secagg[SERVER] != plain[SERVER]
    assert epsilon(secagg[SERVER]) < epsilon(plain[SERVER])


def test_poisson_cohort_round_is_accounted_conservatively():
    """A Poisson cohort has a random size: no credit for the others' noise and (until Zhu & Wang's general Poisson
    bound is implemented) no amplification by user sampling: the third party is charged what the server is."""
    ev = round_events(wor(100, 10, G(1.2)), 5, 40, 10, client_sampling="poisson")
    fixed = round_events(wor(100, 10, G(1.2)), 5, 40, 10)
    assert ev[THIRD_PARTY] == ev[SERVER] == dp_event.SelfComposedDpEvent(wor(100, 10, G(1.2)), 5)
    assert 0 < epsilon(ev[THIRD_PARTY]) < float("inf")
    # the fixed-size cohort, with its sqrt(10) noise credit and amplification, is cheaper
    assert epsilon(fixed[THIRD_PARTY]) < epsilon(ev[THIRD_PARTY])


@pytest.mark.parametrize("step, k, m, cohort, boundary, sampling", [
    (wor(100, 20, G(1.0)), 5, 20, 5, "plain", "fixed"),
    (wor(100, 20, G(3.0)), 1, 50, 2, "plain", "fixed"),
    (wor(10, 9, G(0.7)), 2, 10, 10, "plain", "fixed"),
    (dp_event.PoissonSampledDpEvent(0.2, G(1.0)), 3, 20, 4, "plain", "poisson"),
    (wor(100, 20, G(1.0)), 5, 20, 5, "secagg", "fixed"),
])
def test_server_epsilon_at_least_third_party(step, k, m, cohort, boundary, sampling):
    ev = round_events(step, k, m, cohort, boundary, sampling)
    third, server, silo = (epsilon(ev[o]) for o in (THIRD_PARTY, SERVER, OTHER_SILO))
    assert server >= third - 1e-9
    assert silo >= third - 1e-9
    if boundary == "plain" and sampling == "fixed" and cohort > 1:
        assert server > third


def test_bad_arguments():
    step = wor(10, 2, G(1.0))
    with pytest.raises(ValueError, match="boundary"):
        round_events(step, 1, 10, 2, boundary="tee")
    with pytest.raises(ValueError, match="client_sampling"):
        round_events(step, 1, 10, 2, client_sampling="shuffle")


def test_dp_scaffold_round_events_are_round_events():
    ev = dp_scaffold_round_events(100, 4000, 0.2, 0.2, 50, 60.0)
    expected = round_events(wor(4000, 800, G(60.0)), 50, 100, 20)
    assert ev == {THIRD_PARTY: expected[THIRD_PARTY], SERVER: expected[SERVER]}


def test_unequal_client_sensitivities_shrink_the_noise_credit():
    """A record of the client with the largest sensitivity Delta_max gets noise z sqrt(Delta_max^2 + sum others^2):
    with others' Delta at ratio r of it, the credited multiplier is z sqrt(1 + (n-1) r^2), not z sqrt(n)."""
    step = G(2.0)
    equal = round_events(step, 1, 10, 5, sensitivity_ratio=1.0)
    skewed = round_events(step, 1, 10, 5, sensitivity_ratio=0.5)
    assert equal[OTHER_SILO] == dp_event.SelfComposedDpEvent(G(2.0 * math.sqrt(4)), 1)  # minus the observer
    assert skewed[OTHER_SILO] == dp_event.SelfComposedDpEvent(G(2.0 * math.sqrt(1 + 3 * 0.25)), 1)
    assert epsilon(skewed[THIRD_PARTY]) > epsilon(equal[THIRD_PARTY])
