"""Exact privacy of instances on the integer lattice, computed independently of ``dpfl.accounting.discrete_pld``:
Skellam pmfs summed from Poisson pmfs in mpmath at 40 digits, binomial pmfs from scipy, compositions as product
distributions (every outcome), and the hockey-stick divergence sum_y (P(y) - e^eps Q(y))_+ summed over every outcome
(Balle et al. 2018), an outcome outside Q's support an infinite loss. Shared by
tests/privacy/test_discrete_pld_worst_case.py (the claims of the lattice PLDs against these) and
benchmarks/tightness.py (Skellam shares of dp-fedavg-joint, P_vec of sdp-prox-sgd).

Sizes: a composition of T copies has (support)^T outcomes, so keep T <= 3 and supports of about 100.
"""

from __future__ import annotations

import functools
import math

import mpmath
import numpy as np
from scipy import stats


@functools.lru_cache(maxsize=4)
def skellam_values(variance: float, half: int) -> np.ndarray:
    """P(Sk(lam, lam) = x) at x = -half..half, 2 lam = ``variance``: sum_n Pois(n + |x|; lam) Pois(n; lam), summed in
    mpmath at 40 digits (by symmetry, at |x| only)."""
    mpmath.mp.dps = 40
    lam = mpmath.mpf(variance) / 2
    terms = int(variance + 40 * math.sqrt(variance) + 80)
    one_side = [float(mpmath.fsum(mpmath.exp(-2 * lam) * lam ** (2 * n + x)
                                  / (mpmath.factorial(n) * mpmath.factorial(n + x)) for n in range(terms)))
                for x in range(half + 1)]
    return np.array(one_side[:0:-1] + one_side)


def skellam_pmf(support: np.ndarray, variance: float, half: int = 60) -> np.ndarray:
    """P(Sk(lam, lam) = x) at ``support`` (inside -half..half)."""
    return skellam_values(variance, half)[support + half]


def product(pmf: np.ndarray, times: int) -> np.ndarray:
    """The pmf of ``times`` independent copies, flattened (every outcome of the composition)."""
    out = pmf
    for _ in range(times - 1):
        out = np.outer(out, pmf).ravel()
    return out


def exact_epsilon(pairs, delta: float) -> float:
    """The smallest eps with sum (P - e^eps Q)_+ <= delta for every (P, Q) of ``pairs`` (bisection, 1e-6); inf when
    even eps = 50 leaves more than delta (the mass P puts where Q has none, an infinite loss, exceeds delta)."""
    def worst(eps):
        return max(float(np.maximum(p - math.exp(eps) * q, 0).sum()) for p, q in pairs)
    low, high = 0.0, 50.0
    if worst(high) > delta:
        return math.inf
    while high - low > 1e-6:
        middle = (low + high) / 2
        low, high = (middle, high) if worst(middle) > delta else (low, middle)
    return high


def skellam_pairs(variance: float, offsets, q: float, times: int, half: int = 40):
    """Both directions of ``times`` compositions of one Skellam coordinate whose integer input is a rounding
    mixture: ``offsets`` = ([(weight, integer) ...] under D, [...] under D'); the record Poisson-sampled at rate q
    (mixture (1 - q) Q + q P under D), on -half..half + 10."""
    support = np.arange(-half, half + 11)
    noise = {}

    def law(mixture):
        total = np.zeros(len(support))
        for weight, shift in mixture:
            if shift not in noise:
                noise[shift] = skellam_pmf(support - shift, variance)
            total += weight * noise[shift]
        return total

    p, q_law = law(offsets[0]), law(offsets[1])
    p = (1 - q) * q_law + q * p
    return [(product(p, times), product(q_law, times)), (product(q_law, times), product(p, times))]


def binomial_pairs(trials: int, shift: int, times: int):
    """Both directions of ``times`` compositions of Bin(m, 1/2) + shift vs Bin(m, 1/2), on 0..m + shift."""
    noise = stats.binom.pmf(np.arange(trials + 1), trials, 0.5)
    p, q = np.zeros(trials + shift + 1), np.zeros(trials + shift + 1)
    p[shift:], q[: trials + 1] = noise, noise
    return [(product(p, times), product(q, times)), (product(q, times), product(p, times))]


__all__ = ["skellam_values", "skellam_pmf", "product", "exact_epsilon", "skellam_pairs", "binomial_pairs"]
