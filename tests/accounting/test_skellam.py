"""Skellam RDP (Agarwal et al. 2021) and Zhu & Wang 2019's Poisson subsampling bound (dpfl.accounting.skellam), and
Poisson-sampled Skellam through rdp_curve and account."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from dpfl.accounting.accountant import account
from dpfl.accounting.conversion import rdp_to_epsilon
from dpfl.accounting.events import SkellamDpEvent, skellam_l1_bound
from dpfl.accounting.rdp import NeighborRel, composition_error, rdp_curve
from dpfl.accounting.skellam import poisson_subsampled_rdp, skellam_rdp
from dpfl.errors import ConfigError

INTS = np.arange(2, 65, dtype=float)


def exact_poisson_gaussian(q, sigma, orders=INTS):
    """dp_accounting's Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019: exact at integer orders)."""
    accountant = rdp_privacy_accountant.RdpAccountant(orders)
    return accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))).rdp


def test_theorem_6_at_orders_2_and_3_by_hand():
    q, e2, e3 = 0.1, 0.3, 0.7
    a2 = math.log((1 - q) * (1 + q) + q**2 * math.exp(e2))
    a3 = math.log((1 - q) ** 2 * (1 + 2 * q) + 3 * q**2 * (1 - q) * math.exp(e2) + 3 * q**3 * math.exp(2 * e3)) / 2
    np.testing.assert_allclose(poisson_subsampled_rdp(q, [e2, e3]), [a2, a3], rtol=1e-12)


@pytest.mark.parametrize("q", [1e-3, 1e-2, 0.1, 0.5])
@pytest.mark.parametrize("sigma", [0.7, 1.0, 2.0, 5.0])
def test_the_general_bound_is_above_the_exact_gaussian_by_at_most_log3(q, sigma):
    """For a Gaussian curve a j / (2 sigma^2) Thm 6 upper-bounds the exact Poisson-subsampled Gaussian, equals it at
    order 2 (no l >= 3 terms) and exceeds it by at most log(3) / (a - 1) (the factor 3 of its l >= 3 terms)."""
    exact = exact_poisson_gaussian(q, sigma)
    general = poisson_subsampled_rdp(q, INTS / (2 * sigma**2))
    assert np.all(general >= exact * (1 - 1e-12))
    assert general[0] == pytest.approx(exact[0], rel=1e-9)
    assert np.all(general - exact <= math.log(3) / (INTS - 1) + 1e-12)


def test_the_general_bound_is_close_for_small_q():
    """The l >= 3 terms are O(q^3) against O(q^2): at q = 1e-3 orders 2..4 differ by < 2% relative and epsilon after
    10,000 steps (sigma = 1, delta = 1e-5) by about 2%."""
    q, sigma = 1e-3, 1.0
    exact, general = exact_poisson_gaussian(q, sigma), poisson_subsampled_rdp(q, INTS / (2 * sigma**2))
    np.testing.assert_allclose(general[:3], exact[:3], rtol=0.02)
    orders = np.arange(2, 257, dtype=float)
    eps_exact, _ = rdp_to_epsilon(orders, 10_000 * exact_poisson_gaussian(q, sigma, orders), 1e-5, "classic")
    general = poisson_subsampled_rdp(q, orders / (2 * sigma**2))
    eps_general, _ = rdp_to_epsilon(orders, 10_000 * general, 1e-5, "classic")
    assert eps_exact < eps_general < 1.03 * eps_exact


def test_edge_probabilities():
    inner = INTS / 2
    np.testing.assert_array_equal(poisson_subsampled_rdp(0.0, inner), np.zeros_like(inner))
    np.testing.assert_array_equal(poisson_subsampled_rdp(1.0, inner), inner)
    assert np.all(np.isinf(poisson_subsampled_rdp(0.1, np.full(5, np.inf))))
    with pytest.raises(ConfigError, match="sampling_probability"):
        poisson_subsampled_rdp(1.5, inner)


def test_skellam_tends_to_the_gaussian_as_the_variance_grows():
    """At fixed sensitivity and scale the Skellam curve over the Gaussian one a D2^2 / (2 mu) tends to 1 as mu grows
    (the discretisation term is O(1 / (s mu)) against the Gaussian's O(1 / mu) at small s, O(1 / mu^2) at large s)."""
    ratios = []
    for mu in (1.0, 10.0, 100.0, 1e4):
        event = SkellamDpEvent(1.0, skellam_l1_bound(1.0, 1000), mu, scale=30.0)
        ratios.append(np.max(skellam_rdp(event, INTS) / (INTS / (2 * mu))))
    assert all(r >= 1 for r in ratios)
    assert all(later < earlier for earlier, later in zip(ratios, ratios[1:]))
    assert ratios[-1] - 1 < 1e-4


def test_skellam_reference_value():
    """mu = 4, D2 = 1, D1 = 2 at a = 3: 3/8 + min((5 + 12) / 64, 6/8) = 41/64 at s = 1; at s = 2 (data units)
    3/8 + min(5/256 + 6/256, 6/16) = 107/256."""
    assert skellam_rdp(SkellamDpEvent(1.0, 2.0, 4.0, 1.0), [3])[0] == pytest.approx(41 / 64)
    assert skellam_rdp(SkellamDpEvent(1.0, 2.0, 4.0, 2.0), [3])[0] == pytest.approx(107 / 256)


def test_poisson_sampled_skellam_is_accounted():
    """PoissonSampled(q, Skellam) composes under add/remove: above the exact Poisson Gaussian of the same variance,
    and tending to Thm 6 around that Gaussian as the scale grows; "tight" (min with the mixture bound) <= "paper"."""
    q, sigma, d = 0.01, 1.1, 1000

    def skellam(scale):
        return SkellamDpEvent(1.0, skellam_l1_bound(1.0, d), sigma**2, scale)

    sampled = [rdp_curve(dp_event.PoissonSampledDpEvent(q, skellam(s)), INTS) for s in (1.0, 10.0, 1000.0)]
    general_gaussian = poisson_subsampled_rdp(q, INTS / (2 * sigma**2))
    assert np.all(sampled[0] >= sampled[1]) and np.all(sampled[1] >= sampled[2])
    assert np.all(sampled[2] >= exact_poisson_gaussian(q, sigma))
    np.testing.assert_allclose(sampled[2], general_gaussian, rtol=1e-3)
    paper = rdp_curve(dp_event.PoissonSampledDpEvent(q, skellam(1.0)), INTS, subsampling_bound="paper")
    assert np.all(sampled[0] <= paper)
    event = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, skellam(1000.0)), 1000)
    epsilon = account(event, 1e-5, "rdp").epsilon
    gaussian = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), 1000)
    assert account(gaussian, 1e-5, "rdp").epsilon < epsilon < 1.25 * account(gaussian, 1e-5, "rdp").epsilon


def test_the_mixture_bound_wins_at_large_q_and_noise():
    """With much noise and q = 0.5, Thm 6's factor 3 costs more than the mixture bound log(1 + q(e^{(a-1) eps} - 1)) /
    (a - 1) at low orders; "tight" takes the smaller of the two at every order."""
    strong = SkellamDpEvent(1.0, 1.0, 400.0, 100.0)
    tight = rdp_curve(dp_event.PoissonSampledDpEvent(0.5, strong), INTS)
    paper = rdp_curve(dp_event.PoissonSampledDpEvent(0.5, strong), INTS, subsampling_bound="paper")
    inner = rdp_curve(strong, INTS)
    mixture = np.log1p(0.5 * np.expm1((INTS - 1) * inner)) / (INTS - 1)
    np.testing.assert_allclose(tight, np.minimum(paper, mixture), rtol=1e-12)
    assert np.any(mixture < paper) and np.any(paper < mixture)


def test_poisson_sampling_is_add_remove_or_zero_out_only():
    """Zero-out's null record adds nothing to the sampled statistic: add/remove for the sampled mechanism."""
    event = dp_event.PoissonSampledDpEvent(0.1, SkellamDpEvent(1.0, 1.0, 1.0))
    assert composition_error(event) is None
    assert composition_error(event, NeighborRel.REPLACE_SPECIAL) is None
    np.testing.assert_array_equal(rdp_curve(event, INTS, NeighborRel.REPLACE_SPECIAL), rdp_curve(event, INTS))
    assert "ADD_OR_REMOVE_ONE (or zero-out), not" in composition_error(event, NeighborRel.REPLACE_ONE)
