"""Amplification by iteration (Feldman et al. 2018, Theorem 22) per position, and the sound last-iterate analysis that
takes per position the smaller of it and Asoodeh et al.'s Theorem 2 (``dpfl.accounting.last_iterate``)."""

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from dpfl.accounting import amplification_by_iteration as ai
from dpfl.accounting import last_iterate as li
from dpfl.errors import ConfigError


def test_shift_is_spread_over_the_contracting_rounds_after_entry():
    # eta = 0.5, sigma = 1, m = 2: shift 2 eta L / m = 0.5, s_t^2 = eta^2 sigma^2 / m = 0.125, mu = sqrt(2 / k)
    mu = ai.shift_mu(np.full(4, 0.5), np.full(4, 1.0), np.ones(4, dtype=bool), 2, 1.0)
    np.testing.assert_allclose(mu, [math.sqrt(2 / k) for k in (4, 3, 2, 1)], rtol=1e-14)
    # round 3 (index 2) does not contract: it ends the windows of rounds 1 and 2, not its own
    mu = ai.shift_mu(np.full(4, 0.5), np.full(4, 1.0), np.array([True, True, False, True]), 2, 1.0)
    np.testing.assert_allclose(mu, [1.0, math.sqrt(2), 1.0, math.sqrt(2)], rtol=1e-14)
    # unequal noise: a_t proportional to s_t^2, mu^2 = shift^2 / sum s_t^2 (entry eta = 1: shift 1, s^2 = 1/2 + 1/8)
    mu = ai.shift_mu(np.array([1.0, 0.5]), np.array([1.0, 1.0]), np.ones(2, dtype=bool), 2, 1.0)
    np.testing.assert_allclose(mu, [1 / math.sqrt(0.625), 0.5 / math.sqrt(0.125)], rtol=1e-14)


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 3.0, 10.0])
def test_gaussian_rdp_conversion_is_the_minimum_over_orders(eps):
    mus = np.array([0.05, 0.3, 1.0, 2.0, 4.0])
    got = ai.log_delta_gaussian_rdp(eps, mus)
    for mu, value in zip(mus, got):
        def bound(log_order_minus_one):  # Canonne, Kamath, Steinke 2020, Prop. 12 at alpha = 1 + e^x
            alpha = 1 + math.exp(log_order_minus_one)
            return (alpha - 1) * (alpha * mu * mu / 2 - eps) + alpha * math.log1p(-1 / alpha) - math.log(alpha - 1)
        best = minimize_scalar(bound, bounds=(-25, 15), method="bounded", options={"xatol": 1e-12}).fun
        assert value == pytest.approx(min(0.0, best), abs=1e-9)
        assert value >= li.log_theta(eps, mu) - 1e-12  # never below the Gaussian's exact curve


def per_position_reference(eps, lrs, sigmas, nonconvex, n, m, lipschitz, radius, random_stop=False):
    """The sound analysis in plain Python: per pair (entry t0, release tau) min(b prod a, CKS(mu)), mixed."""
    steps = len(lrs)
    b = [li.theta(eps, 2 * lipschitz / (math.sqrt(m) * s)) for s in sigmas]
    a = [li.theta(eps, (2 * (radius + eta * lipschitz) if nc else 2 * radius) * math.sqrt(m) / (eta * s))
         for eta, s, nc in zip(lrs, sigmas, nonconvex)]

    def term(t0, tau):  # 0-based entry t0, released after step tau
        contraction = b[t0] * math.prod(a[t0 + 1: tau + 1])
        window = t0 + 1
        while window <= tau and not nonconvex[window]:
            window += 1
        variance = sum((lrs[t] * sigmas[t]) ** 2 / m for t in range(t0, window))
        mu = 2 * lrs[t0] * lipschitz / m / math.sqrt(variance)
        return min(contraction, math.exp(ai.log_delta_gaussian_rdp(eps, np.array([mu]))[0]))

    if not random_stop:
        return m / n * sum(term(t0, steps - 1) for t0 in range(steps))
    return m / n / steps * sum(term(t0, tau) for tau in range(steps) for t0 in range(tau + 1))


def test_sound_is_the_per_position_minimum_with_a_schedule_and_nonconvex_rounds():
    lrs = [0.5] * 6 + [0.25] * 5 + list(np.linspace(0.2, 0.05, 5))
    sigmas = [2.0] * 9 + [3.0] * 7
    nonconvex = [False] * 4 + [True] * 2 + [False] * 10
    accountant = li.LastIterateAccountant(n=40, batch_size=2, lipschitz=1.0, radius=1.0)
    for lr, sigma, nc in zip(lrs, sigmas, nonconvex):
        accountant.step(lr, sigma, nonconvex=nc)
    for eps in (0.5, 2.0):
        expected = per_position_reference(eps, lrs, sigmas, nonconvex, 40, 2, 1.0, 1.0)
        assert math.exp(accountant.log_delta(eps)) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("radius", [0.3, 1e3])
def test_sound_random_stop_is_the_per_pair_minimum(radius):
    args = (0.5, 1.0, 24, 2, 1.0, radius)
    for eps in (0.5, 2.0):
        expected = per_position_reference(eps, [0.5] * 12, [1.0] * 12, [False] * 12, 24, 2, 1.0, radius,
                                          random_stop=True)
        got = li.delta(eps, *args, random_stop=True, analysis="sound")
        assert got == pytest.approx(expected, rel=1e-10)
        assert got <= li.delta(eps, *args, random_stop=True, analysis="paper")


def test_sound_random_stop_with_a_schedule_is_corollary_3():
    lrs = [0.5, 0.5, 0.25, 0.25]
    assert li.log_delta(1.0, lrs, 1.0, 8, 2, 1.0, 1.0, random_stop=True, analysis="sound") == \
        li.log_delta(1.0, lrs, 1.0, 8, 2, 1.0, 1.0, random_stop=True, analysis="paper")


def test_where_hiding_pays_sound_is_smaller_and_nonconvex_gives_theorem_2():
    # n = 100 users, one per round, a huge ball (no contraction from the diameter): Theorem 2 is composition
    args = (0.5, 4.0, 100, 1, 1.0, 1e6)
    paper, sound = li.epsilon(1e-5, *args), li.epsilon(1e-5, *args, analysis="sound")
    assert paper == pytest.approx(li.composition_epsilon(1e-5, 4.0, 100, 1, 1.0), rel=1e-9)
    assert sound == pytest.approx(1.3590, abs=1e-4) and paper == pytest.approx(1.9931, abs=1e-4)
    # no round contracts: the shift has one round's noise, the single-step bound b_t0 >= Theorem 2's term
    for eps in (0.5, 1.0, 3.0):
        assert li.log_delta(eps, *args, nonconvex=True, analysis="sound") == pytest.approx(
            li.log_delta(eps, *args, nonconvex=True), rel=1e-12)


def test_bad_analysis_names_the_field():
    with pytest.raises(ConfigError, match=r"analysis = 'tight' .*one of \['sound', 'paper'\]"):
        li.epsilon(1e-5, 0.5, 4.0, 100, 1, 1.0, 1.0, analysis="tight")
    with pytest.raises(ConfigError, match=r"analysis = 'x'"):
        li.LastIterateAccountant(n=10, batch_size=1, lipschitz=1.0, radius=1.0, analysis="x")
