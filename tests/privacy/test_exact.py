"""The ground truth itself (tests/helpers/exact.py), checked against closed forms, dp_accounting and direct quadrature."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.rdp import rdp_privacy_accountant as dpa
from scipy import integrate, special, stats

import exact as ex
from dpfl.errors import ConfigError

ORDERS = np.array([1.05, 1.1, 1.5, 2, 2.5, 3, 4, 6.5, 8, 16, 32, 64, 128, 256])
INTS = np.arange(2, 257, dtype=float)


def _log_density(w, m, sigma, x):
    return special.logsumexp(np.log(w)[None, :] + stats.norm.logpdf(x[:, None], np.asarray(m)[None, :], sigma), axis=1)


def direct_rdp(wp, mp, wq, mq, sigma, a):
    """D_a by a plain trapezoid rule on a dense uniform grid, in log space (independent of the module's windows and
    Gauss-Legendre panels); the integrand is smooth and negligible at the ends, where the rule converges fast."""
    means = np.concatenate([mp, mq])
    x = np.arange(means.min() - 40 * sigma - a * np.ptp(means), means.max() + 40 * sigma + a * np.ptp(means), 2e-3 * sigma)
    f = a * _log_density(wp, mp, sigma, x) + (1 - a) * _log_density(wq, mq, sigma, x)
    return (special.logsumexp(f) + math.log(x[1] - x[0])) / (a - 1)


def direct_delta(wp, mp, wq, mq, sigma, eps):
    """int (p - e^eps q)_+ dx by a dense trapezoid rule (one composition)."""
    means = np.concatenate([mp, mq])
    x = np.arange(means.min() - 15 * sigma, means.max() + 15 * sigma, 1e-4 * sigma)
    p, q = np.exp(_log_density(wp, mp, sigma, x)), np.exp(_log_density(wq, mq, sigma, x))
    return integrate.trapezoid(np.maximum(p - math.exp(eps) * q, 0.0), x)


# --- Renyi divergence -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_gaussian_pair_by_quadrature_is_a_over_two_sigma_squared(sigma):
    """Splitting N(1, s^2) into two equal halves forces the quadrature path; the closed form is a / (2 s^2)."""
    orders = np.concatenate([ORDERS, [512, 1024]])
    got = ex.gaussian_mixture_rdp([0.5, 0.5], [1.0, 1.0], [1.0], [0.0], sigma, orders)
    np.testing.assert_allclose(got, orders / (2 * sigma**2), rtol=1e-10)
    np.testing.assert_allclose(ex.gaussian_mixture_rdp([1], [1], [1], [0], sigma, orders), orders / (2 * sigma**2))


@pytest.mark.parametrize("q, sigma", [(0.1, 1.0), (0.01, 2.0), (0.5, 0.7)])
def test_poisson_pair_matches_dp_accounting_at_integer_orders(q, sigma):
    """(1-q) N(0) + q N(1) against N(0): dp_accounting's RDP (add/remove) is the exact binomial expansion at integer
    orders (Mironov, Talwar, Zhang 2019)."""
    got = ex.gaussian_mixture_rdp([1 - q, q], [0, 1], [1], [0], sigma, INTS)
    event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    np.testing.assert_allclose(got, dpa.RdpAccountant(INTS).compose(event).rdp, rtol=1e-9)


@pytest.mark.parametrize("a", [1.1, 2.5, 3.3])
def test_poisson_pair_at_fractional_orders_against_direct_quadrature(a):
    """Both directions against scipy quad. dp_accounting's fractional-order value is an upper bound, not exact
    (1.5% above at a = 2.5 for q = 0.1, sigma = 1; infinite at 1.1, where its series does not converge)."""
    q = 0.1
    forward = ex.gaussian_mixture_rdp([1 - q, q], [0, 1], [1], [0], 1.0, [a])[0]
    backward = ex.gaussian_mixture_rdp([1], [0], [1 - q, q], [0, 1], 1.0, [a])[0]
    assert forward == pytest.approx(direct_rdp([1 - q, q], [0, 1], [1], [0], 1.0, a), rel=1e-8)
    assert backward == pytest.approx(direct_rdp([1], [0], [1 - q, q], [0, 1], 1.0, a), rel=1e-8)
    assert backward <= forward  # the removal direction dominates for the subsampled Gaussian
    reference = dpa.RdpAccountant([a]).compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(1.0))).rdp[0]
    assert reference >= forward * (1 - 1e-12)


def test_mixture_against_mixture_against_direct_quadrature():
    wp, mp, wq, mq = [0.6, 0.3, 0.1], [0.0, 0.5, -1.0], [0.5, 0.5], [0.2, -0.3]
    for a in (1.5, 3.0, 7.0):
        got = ex.gaussian_mixture_rdp(wp, mp, wq, mq, 0.8, [a])[0]
        assert got == pytest.approx(direct_rdp(wp, mp, wq, mq, 0.8, a), rel=1e-8)


def test_participation_identity():
    """Far owner-absent component: D_a = log(1 - l + l exp((a-1) D_a(P_in || Q_in))) / (a - 1), up to order 256."""
    for l, inner in [(0.01, ([1.0], [1.0], [1.0], [0.0])), (0.3, ([0.9, 0.1], [0.0, 1.0], [1.0], [0.0]))]:
        wp, mp, wq, mq = ex.participation_pair(l, *inner)
        got = ex.gaussian_mixture_rdp(wp, mp, wq, mq, 1.0, ORDERS)
        want = ex.participation_rdp(l, ex.gaussian_mixture_rdp(*inner, 1.0, ORDERS), ORDERS)
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # a far component that is too close cuts high orders off: the identity is the far -> inf limit
    wp, mp, wq, mq = ex.participation_pair(0.01, [1.0], [1.0], [1.0], [0.0], far=50.0)
    near = ex.gaussian_mixture_rdp(wp, mp, wq, mq, 1.0, [256.0])[0]
    assert near < ex.participation_rdp(0.01, [128.0], [256.0])[0] / 2


def test_symmetric_is_the_max_of_both_directions():
    args = ([0.9, 0.1], [0.0, 1.0], [1.0], [0.0], 1.0)
    sym = ex.gaussian_mixture_rdp_symmetric(*args, ORDERS)
    forward = ex.gaussian_mixture_rdp(*args, ORDERS)
    np.testing.assert_array_equal(sym, forward)  # the removal direction dominates here
    swapped = ex.gaussian_mixture_rdp_symmetric([1.0], [0.0], [0.9, 0.1], [0.0, 1.0], 1.0, ORDERS)
    np.testing.assert_array_equal(sym, swapped)


# --- delta -------------------------------------------------------------------------------------------------------------


EPS = np.array([0.0, 0.5, 1.0, 2.0, 4.0])


@pytest.mark.parametrize("sigma, compositions", [(1.0, 1), (2.0, 1), (5.0, 25)])
def test_gaussian_pair_delta_is_a_tight_lower_bound_of_gdp(sigma, compositions):
    """N(1, s^2) vs N(0, s^2) composed T times is sqrt(T)/s-GDP (Dong, Roth, Su 2019)."""
    got = ex.gaussian_mixture_delta([1], [1], [1], [0], sigma, EPS, compositions)
    want = ex.gdp_delta(math.sqrt(compositions) / sigma, EPS)
    assert np.all(got <= want)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-12)


def test_poisson_pair_composition_against_dp_accounting_pld():
    """Ours (certified lower bound) lies below dp_accounting's pessimistic PLD and within 1% of its optimistic one."""
    q, sigma, compositions = 0.1, 1.0, 100
    eps = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    got = ex.gaussian_mixture_delta([1 - q, q], [0, 1], [1], [0], sigma, eps, compositions)
    kwargs = dict(sampling_prob=q, value_discretization_interval=1e-4)
    upper = pld.from_gaussian_mechanism(sigma, **kwargs).self_compose(compositions)
    lower = pld.from_gaussian_mechanism(sigma, pessimistic_estimate=False, use_connect_dots=False,
                                        **kwargs).self_compose(compositions)
    for e, d in zip(eps, got):
        assert d <= upper.get_delta_for_epsilon(e)
        assert d == pytest.approx(lower.get_delta_for_epsilon(e), rel=1e-2)


def test_delta_against_direct_integral_for_non_monotone_losses():
    """The participation pair's privacy loss rises then falls back to 0 near the far component."""
    wp, mp, wq, mq = ex.participation_pair(0.2, [0.7, 0.3], [0.0, 1.0], [1.0], [0.0], far=12.0)
    for eps in (0.0, 1.0):
        got = ex.gaussian_mixture_delta(wp, mp, wq, mq, 1.0, eps)
        want = max(direct_delta(wp, mp, wq, mq, 1.0, eps), direct_delta(wq, mq, wp, mp, 1.0, eps))
        assert got <= want * (1 + 1e-9)
        assert got == pytest.approx(want, rel=2e-3)


def test_finite_far_participation_matches_the_limit_instance():
    wp, mp, wq, mq = ex.participation_pair(0.01, [1.0], [1.0], [1.0], [0.0])
    finite = ex.gaussian_mixture_delta(wp, mp, wq, mq, 1.0, [1.0, 1.8962], compositions=100)
    limit = ex.Instance(((1.0, 0.01, ex.gaussian_pair(1.0)),)).delta(np.array([1.0, 1.8962]), 100)
    np.testing.assert_allclose(finite, limit, rtol=1e-6)


def test_epsilon_inverts_delta():
    instance = ex.Instance(((1.0, 0.05, ex.gaussian_pair(1.5)),))
    for target in (1e-2, 1e-5):
        eps = instance.epsilon(target, compositions=20)
        assert instance.delta(eps, 20) == pytest.approx(target, rel=1e-6)
        assert instance.delta(eps * 0.99, 20) > target


# --- GDP ----------------------------------------------------------------------------------------------------------------


def test_gdp():
    assert ex.gdp_delta(1.0, 0.0) == pytest.approx(2 * stats.norm.cdf(0.5) - 1)
    for mu in (0.1, 0.7, 3.0):
        for delta in (1e-3, 1e-5, 1e-10):
            eps = ex.gdp_epsilon(mu, delta)
            assert ex.gdp_delta(mu, eps) == pytest.approx(delta, rel=1e-8)
    assert ex.gdp_epsilon(0.01, 0.5) == 0.0
    np.testing.assert_allclose(ex.gdp_rdp(2.0, ORDERS), 2 * ORDERS)
    # delta(eps) of dp_accounting's exact Gaussian PLD at z = 1/mu
    accountant = pld.from_gaussian_mechanism(1 / 0.7, value_discretization_interval=1e-4)
    assert ex.gdp_delta(0.7, 1.0) == pytest.approx(accountant.get_delta_for_epsilon(1.0), rel=1e-3)


# --- instances ------------------------------------------------------------------------------------------------------------


def test_review_counterexample_instance():
    """Cohort 1 of 100 (l = 0.01), sigma_g = 1, 100 rounds: delta at the paper's epsilon 1.90 is about 5.5e-2."""
    instance = ex.observer_instance("third_party", ex.gaussian_pair(1.0), 100, 1)
    assert instance.delta(1.8962, 100) == pytest.approx(0.05496, rel=1e-3)
    assert instance.epsilon(1e-5, 100) == pytest.approx(8.61, abs=0.01)
    # with a cohort of 1, every observer of a fixed-size cohort meets the same instance
    for observer, boundary in [("server", "plain"), ("server", "secagg"), ("other_silo", "plain")]:
        other = ex.observer_instance(observer, ex.gaussian_pair(1.0), 100, 1, boundary)
        assert other.delta(1.8962, 100) == pytest.approx(0.05496, rel=1e-3)
        np.testing.assert_allclose(other.rdp(ORDERS), instance.rdp(ORDERS), rtol=1e-12)


def test_instance_rdp_is_the_participation_identity():
    instance = ex.Instance(((1.0, 0.2, ex.gaussian_pair(2.0)),))
    np.testing.assert_allclose(instance.rdp(ORDERS), ex.participation_rdp(0.2, ORDERS / 8, ORDERS))


def test_poisson_cohorts_add_noise_and_fixed_cohorts_sum_shares():
    step = ex.gaussian_pair(1.0)
    fixed = ex.observer_instance("third_party", step, 10, 4)
    assert fixed.branches == ((1.0, 0.4, step.scaled(2.0)),)
    poisson = ex.observer_instance("third_party", step, 10, 4, client_sampling="poisson")
    assert len(poisson.branches) == 10 and sum(w for w, _, _ in poisson.branches) == pytest.approx(1)
    assert poisson.branches[0][2] == step and poisson.branches[3][2] == step.scaled(2.0)
    silo = ex.observer_instance("other_silo", step, 10, 4)
    assert [(w, l) for w, l, _ in silo.branches] == [(pytest.approx(0.6), pytest.approx(4 / 9)),
                                                     (pytest.approx(0.4), pytest.approx(3 / 9))]
    with pytest.raises(ConfigError):
        ex.observer_instance("eavesdropper", step, 10, 4)


def test_without_replacement_worst_case_dominates_the_antipodal_instance():
    """Replace-one, fixed-size batch: the others at -C and the record +C vs -C gives (1-q) N(0) + q N(1) vs N(0),
    which dominates the antipodal (1-q) N(0) + q N(1/2) vs (1-q) N(0) + q N(-1/2), in RDP and in delta."""
    for q, z in [(0.1, 1.0), (0.5, 2.0)]:
        worst, antipodal = ex.without_replacement_pair(q, z), ex.without_replacement_antipodal_pair(q, z)
        assert np.all(antipodal.rdp_symmetric(ORDERS) <= worst.rdp_symmetric(ORDERS))
        eps = np.array([0.1, 0.5, 1.0])
        assert np.all(antipodal.delta(eps, 10) <= worst.delta(eps, 10))


def test_bad_input():
    with pytest.raises(ConfigError):
        ex.gaussian_mixture_rdp([0.5, 0.4], [0, 1], [1], [0], 1.0, ORDERS)
    with pytest.raises(ConfigError):
        ex.gaussian_mixture_rdp([1], [0], [1], [0], 1.0, [1.0])
    with pytest.raises(ConfigError):
        ex.gaussian_mixture_delta([1], [0], [1], [0], 0.0, 1.0)
