"""RDP curves (dpfl.accounting.rdp): delegation to dp_accounting, the Wang et al. 2019 subsampling bound, the accountant."""

import math

import mpmath
import numpy as np
import pytest
from dp_accounting import NeighboringRelation, UnsupportedEventError, dp_event
from dp_accounting.rdp import rdp_privacy_accountant as dpa

from dpfl.accounting.conversion import rdp_to_epsilon
from dpfl.accounting.rdp import (QUADRATURE_MARGIN, THM27_MAX_ORDER, DEFAULT_ORDERS, RdpAccountant,
                                 composition_error, gaussian_even_differences_in_log, rdp_curve,
                                 wang_gaussian_subsampled_rdp, wang_subsampled_rdp)
from dpfl.errors import ConfigError

INTS = np.arange(2, 257, dtype=float)


def wor(population, sample, inner):
    return dp_event.SampledWithoutReplacementDpEvent(population, sample, inner)


def test_default_orders_cover_the_grid():
    assert set(range(2, 257)) <= set(DEFAULT_ORDERS.tolist())
    assert np.any((DEFAULT_ORDERS > 1) & (DEFAULT_ORDERS < 2))
    assert np.any((DEFAULT_ORDERS > 2) & (DEFAULT_ORDERS != np.round(DEFAULT_ORDERS)))
    assert np.all(np.diff(DEFAULT_ORDERS) > 0) and DEFAULT_ORDERS.min() > 1


def test_gaussian_is_delegated():
    np.testing.assert_allclose(rdp_curve(dp_event.GaussianDpEvent(2.0)), DEFAULT_ORDERS / 8)


def test_poisson_matches_dp_accounting_and_tf_privacy_anchor():
    """anchors.md: N=60000, B=256, sigma=1.1, 14063 steps, delta=1e-5: classic 3.008, RDP (modern) 2.597."""
    event = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(256 / 60000, dp_event.GaussianDpEvent(1.1)), 14063)
    orders = np.array(dpa.DEFAULT_RDP_ORDERS, dtype=float)
    curve = rdp_curve(event, orders)
    np.testing.assert_allclose(curve, dpa.RdpAccountant(orders).compose(event).rdp)
    assert rdp_to_epsilon(orders, curve, 1e-5)[0] == pytest.approx(3.008, abs=5e-4)
    assert rdp_to_epsilon(orders, curve, 1e-5, "modern")[0] == pytest.approx(2.597, abs=5e-4)


def test_composition_adds_curves_and_zero_count_is_free():
    a, b = dp_event.GaussianDpEvent(1.0), dp_event.LaplaceDpEvent(2.0)
    np.testing.assert_allclose(
        rdp_curve(dp_event.ComposedDpEvent([a, dp_event.SelfComposedDpEvent(b, 3)])), rdp_curve(a) + 3 * rdp_curve(b)
    )
    np.testing.assert_array_equal(rdp_curve(dp_event.SelfComposedDpEvent(dp_event.NonPrivateDpEvent(), 0)), 0)
    np.testing.assert_array_equal(rdp_curve(dp_event.NoOpDpEvent()), 0)


def test_returns_a_copy_of_the_cached_curve():
    event = dp_event.GaussianDpEvent(3.0)
    curve = rdp_curve(event)
    curve[:] = -1
    np.testing.assert_allclose(rdp_curve(event), DEFAULT_ORDERS / 18)


# ---- Wang, Balle, Kasiviswanathan 2019, Thm 9 -------------------------------------------------------------------


def test_wang_bound_formula_at_small_orders():
    """eps(2) = log(1 + q^2 min{4(e^{eps(2)}-1), 2 e^{eps(2)}}); eps(3) adds 3 q^2 (...) + 2 q^3 e^{2 eps(3)}."""
    q, inner = 0.1, INTS / 2
    got = wang_subsampled_rdp(q, inner)
    second = min(4 * math.expm1(1.0), 2 * math.e)
    assert got[0] == pytest.approx(math.log1p(q**2 * second))
    assert got[1] == pytest.approx(math.log1p(3 * q**2 * second + 2 * q**3 * math.exp(2 * 1.5)) / 2)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 5.0, 60.0])
def test_wang_bound_sanity(sigma):
    inner = INTS / (2 * sigma**2)
    at_one = wang_subsampled_rdp(1.0, inner)
    assert np.all(at_one >= inner * (1 - 1e-12))  # q = 1: an upper bound of the inner curve
    previous = np.zeros_like(inner)
    for q in (1e-4, 1e-2, 0.1, 0.3, 0.7, 1.0):
        current = wang_subsampled_rdp(q, inner)
        assert np.all(np.isfinite(current)) and np.all(current >= previous)  # finite, monotone in q
        previous = current


def test_wor_event_limits():
    gaussian = dp_event.GaussianDpEvent(1.0)
    np.testing.assert_allclose(rdp_curve(wor(100, 100, gaussian)), rdp_curve(gaussian))  # q = 1 is the mechanism
    np.testing.assert_array_equal(rdp_curve(wor(100, 0, gaussian)), 0)
    with pytest.raises(ConfigError, match="sample_size"):
        rdp_curve(wor(10, 11, gaussian))


def test_wor_interpolates_non_integer_orders():
    """Convexity of (a-1) eps(a) between integer orders (seed 000 App. B); for a in (1, 2) the bound is eps(2)."""
    orders = np.array([1.5, 2.0, 3.0, 3.25, 4.0])
    curve = rdp_curve(wor(1000, 50, dp_event.GaussianDpEvent(2.0)), orders, subsampling_bound="paper")
    eps2, eps3, eps4 = curve[1], curve[2], curve[4]
    assert curve[0] == pytest.approx(eps2)
    assert curve[3] == pytest.approx((0.75 * 2 * eps3 + 0.25 * 3 * eps4) / 2.25)
    np.testing.assert_allclose(curve[[1, 2, 4]], wang_subsampled_rdp(0.05, INTS[:3] / 8))


def test_wor_gaussian_paper_bound_is_the_general_one_and_tight_adds_thm27():
    """The general bound is looser than dp_accounting's Gaussian-specific Thm 27; DP-SCAFFOLD's numbers need the
    general one ("paper"); "tight" takes the smaller at every order."""
    event, orders = wor(4000, 800, dp_event.GaussianDpEvent(3.0)), INTS[:40]
    general = rdp_curve(event, orders, subsampling_bound="paper")
    np.testing.assert_allclose(general, wang_subsampled_rdp(0.2, orders / 18))
    thm27 = dpa.RdpAccountant(orders, NeighboringRelation.REPLACE_ONE).compose(event).rdp
    assert np.all(general >= thm27 - 1e-12) and np.any(general > 1.1 * thm27)
    low = orders <= THM27_MAX_ORDER  # Thm 27 is evaluated up to dp_accounting's own limit
    expected = np.minimum(general, orders / 18)
    expected[low] = np.minimum(expected[low], thm27[low])
    np.testing.assert_allclose(rdp_curve(event, orders), expected)
    assert np.any(expected[low] < general[low])


@pytest.mark.parametrize("q, sigma", [(1 / 142, 4.27), (0.2, 0.7), (0.01, 240.0)])
def test_thm27_for_all_orders_at_once_is_dp_accountings_value_where_float64_holds_it(q, sigma):
    """Where dp_accounting's float64 differences are accurate, the vectorised Thm 27 is its per-order value, never
    below it and within 2e-9 above (the margins), at every integer order up to 256 (checked at 2..48, 128 and 256:
    dp_accounting's cost grows as the order cubed; the time is benchmarks/accounting_speed.py's)."""
    ours = wang_gaussian_subsampled_rdp(q, sigma, 256)
    orders = np.concatenate([np.arange(2, 49), [128, 256]])
    reference = dpa._compute_rdp_sample_wor_gaussian(q, sigma, orders)
    assert np.all(ours[orders - 2] >= reference) and np.all(ours[orders - 2] <= reference * (1 + 2e-9))


def exact_differences(sigma: float, orders) -> dict:
    """log Delta^j g(0), g(k) = e^{c(k-1)}, as 800-digit alternating sums."""
    with mpmath.workdps(800):
        t = mpmath.mpf(1) / (2 * mpmath.mpf(sigma) ** 2)
        g = [mpmath.exp(t * (k - 1) * k) for k in range(max(orders) + 1)]
        return {j: mpmath.log(sum((-1) ** (j - k) * mpmath.binomial(j, k) * g[k] for k in range(j + 1)))
                for j in orders}


@pytest.mark.parametrize("sigma", [0.7, 4.27, 19.217762113447193, 60.0, 240.0])
def test_the_even_differences_are_the_exact_ones_never_below(sigma):
    """The expectation form of Thm 27's even forward differences against 800-digit alternating sums: never below,
    within the margin above (at sigma = 19.2 and 60 dp_accounting's float64 sums are off by factors up to e^{215},
    some below)."""
    orders = [2, 4, 16, 64, 128, 256]
    ours = gaussian_even_differences_in_log(sigma, 256)
    exact = exact_differences(sigma, orders)
    for j in orders:
        excess = float(ours[j // 2] - exact[j])
        assert 0 <= excess <= QUADRATURE_MARGIN + 1e-11, (j, excess)


@pytest.mark.parametrize("q, sigma", [(0.2, 60.0), (0.01, 4.27)])
def test_thm27_is_never_below_its_value_in_exact_arithmetic(q, sigma):
    """Thm 27's RDP at orders 8, 64, 128 and 256, against the same formula evaluated with 800 digits and exact
    differences: never below, within 1e-8 relative. (dp_accounting's float64 value at (0.2, 60), order 256, is 34
    times the exact one; elsewhere its noise can fall below it.)"""
    ours = wang_gaussian_subsampled_rdp(q, sigma, 256)
    orders = [8, 64, 128, 256]
    deltas = exact_differences(sigma, list(range(2, 257, 2)))
    with mpmath.workdps(800):
        c = [mpmath.mpf(x) * (x + 1) / (2 * mpmath.mpf(sigma) ** 2) for x in range(257)]
        eps2 = c[1]
        second = min(4 * (mpmath.exp(eps2) - 1), 2 * mpmath.exp(eps2))
        for a in orders:
            moment = 1 + q**2 * mpmath.binomial(a, 2) * second
            for j in range(3, a + 1):
                lo, hi = 2 * (j // 2), 2 * ((j + 1) // 2)
                factor = min(4 * mpmath.sqrt(mpmath.exp(deltas[lo] + deltas[hi])), 2 * mpmath.exp(c[j - 1]))
                moment += mpmath.mpf(q) ** j * mpmath.binomial(a, j) * factor
            exact = float(mpmath.log(moment) / (a - 1))
            assert exact <= ours[a - 2] <= exact * (1 + 1e-8), (a, ours[a - 2], exact)


def test_wor_epsilon_falls_with_the_noise_down_to_the_conversion_floor():
    """50 fixed-size steps at b/n = 1/142, delta 1e-5: epsilon keeps falling as the noise grows (it stopped at 0.10
    while Thm 27 was evaluated only up to order 32) and matches dp_accounting's own WOR accountant."""
    found = []
    for sigma in (4.27, 20.0, 240.0):
        event = wor(142, 1, dp_event.GaussianDpEvent(sigma))
        ours = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE, conversion="modern")
        theirs = dpa.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
        found.append(ours.compose(event, 50).get_epsilon(1e-5))
        assert found[-1] <= theirs.compose(event, 50).get_epsilon(1e-5) + 1e-9
    assert found[0] == pytest.approx(0.0833, abs=1e-4) and found[1] < 0.025 and found[2] < 0.02


def test_wor_around_a_non_gaussian_mechanism():
    laplace = dp_event.LaplaceDpEvent(1.0)
    curve = rdp_curve(wor(1000, 10, laplace))
    assert np.all(np.isfinite(curve)) and np.all(curve < rdp_curve(laplace))


def test_nested_dp_scaffold_round_is_amplified():
    """(Its time, under a second: benchmarks/accounting_speed.py.)"""
    sigma = 59.5 * math.sqrt(20)
    inner = dp_event.SelfComposedDpEvent(wor(4000, 800, dp_event.GaussianDpEvent(sigma)), 50)
    curve = rdp_curve(wor(100, 20, inner), subsampling_bound="paper")
    assert np.all(np.isfinite(curve)) and np.all(curve < rdp_curve(inner, subsampling_bound="paper"))


def test_tight_bound_never_exceeds_the_paper_bound_nor_the_inner_curve():
    for q_size, sigma in ((20, 268.0), (50, 1.0), (90, 5.0)):
        inner = dp_event.SelfComposedDpEvent(wor(4000, 800, dp_event.GaussianDpEvent(sigma)), 5)
        tight = rdp_curve(wor(100, q_size, inner), subsampling_bound="tight")
        paper = rdp_curve(wor(100, q_size, inner), subsampling_bound="paper")
        assert np.all(tight <= paper + 1e-12)
        assert np.all(tight <= rdp_curve(inner, subsampling_bound="tight") + 1e-12)
    # Saturation: at large noise the general bound exceeds the unamplified Gaussian, the tight one does not.
    gaussian = dp_event.GaussianDpEvent(268.0)
    assert np.any(rdp_curve(wor(10, 5, gaussian), subsampling_bound="paper") > rdp_curve(gaussian))
    assert np.all(rdp_curve(wor(10, 5, gaussian)) <= rdp_curve(gaussian) + 1e-12)
    with pytest.raises(ConfigError, match="subsampling_bound"):
        rdp_curve(gaussian, subsampling_bound="loose")


def test_unsupported_events():
    with pytest.raises(UnsupportedEventError):  # Poisson sampling (add/remove) around a replace-one event
        rdp_curve(dp_event.PoissonSampledDpEvent(0.1, wor(10, 2, dp_event.GaussianDpEvent(1.0))))
    with pytest.raises(UnsupportedEventError):
        rdp_curve(wor(10, 2, dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))))
    assert "REPLACE_ONE" in composition_error(wor(10, 2, dp_event.GaussianDpEvent(1.0)), NeighboringRelation.ADD_OR_REMOVE_ONE)


def test_poisson_sampling_around_events_dp_accounting_cannot_sample():
    """Poisson(Laplace) goes through Zhu & Wang 2019 Thm 6 (dpfl.accounting.skellam): finite, and below the Laplace
    mechanism's own curve."""
    laplace = dp_event.LaplaceDpEvent(1.0)
    sampled = rdp_curve(dp_event.PoissonSampledDpEvent(0.1, laplace))
    assert np.all(np.isfinite(sampled)) and np.all(sampled < rdp_curve(laplace))


@pytest.mark.parametrize("orders", [[1.0, 2.0], [], [2.0, np.inf], [[2.0, 3.0]]])
def test_bad_orders(orders):
    with pytest.raises(ConfigError, match="orders"):
        rdp_curve(dp_event.GaussianDpEvent(1.0), orders)


# ---- RdpAccountant ---------------------------------------------------------------------------------------------


def test_accountant_matches_dp_accounting_with_the_modern_conversion():
    event = dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0))
    ours = RdpAccountant(conversion="modern").compose(event, 1000)
    theirs = dpa.RdpAccountant().compose(event, 1000)
    assert ours.get_epsilon(1e-5) == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-9)
    classic = RdpAccountant().compose(event, 1000)
    assert classic.get_epsilon(1e-5) > ours.get_epsilon(1e-5)
    assert classic.ledger == dp_event.SelfComposedDpEvent(event, 1000)


def test_accountant_supports_wor_around_anything_under_replace_one():
    event = wor(1000, 10, dp_event.LaplaceDpEvent(1.0))
    assert not dpa.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE).supports(event)
    assert not RdpAccountant().supports(event)  # add/remove by default, like dp_accounting
    accountant = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    assert accountant.supports(event)
    epsilon, order = accountant.compose(event, 5).get_epsilon_and_optimal_order(1e-5)
    assert (epsilon, order) == rdp_to_epsilon(DEFAULT_ORDERS, 5 * rdp_curve(event), 1e-5)
    with pytest.raises(UnsupportedEventError):
        RdpAccountant().compose(event)


def test_accountant_rejects_a_bad_conversion():
    with pytest.raises(ConfigError, match="conversion"):
        RdpAccountant(conversion="pld")


def test_disjoint_union_is_the_worst_part_and_round_trips():
    from dpfl.accounting.events import DisjointUnionDpEvent, event_from_dict, event_to_dict

    weak, strong = dp_event.GaussianDpEvent(1.0), dp_event.GaussianDpEvent(4.0)
    union = DisjointUnionDpEvent([strong, weak, strong])
    np.testing.assert_allclose(rdp_curve(union), rdp_curve(weak))
    # Parallel composition is far cheaper than sequential composition of the same parts.
    sequential = dp_event.ComposedDpEvent([strong, weak, strong])
    assert np.all(rdp_curve(union) < rdp_curve(sequential))
    assert event_from_dict(event_to_dict(union)) == union
