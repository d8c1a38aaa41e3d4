"""Exact privacy loss distributions (PLDs) of dpfl's discrete mechanisms on the integer lattice: one coordinate of the
Skellam mechanism (Agarwal, Kairouz, Liu 2021), alone or Poisson-sampled, and one coordinate of Cheu et al.'s (2021)
binomial summation P_vec. No Renyi bound and no per-composition slack: the PLD of the pair of output distributions
itself, on the lattice, composed by ``dpfl.accounting.pld`` (Koskela et al. 2020; Doroshenko et al. 2022).

**The worst shift is the largest one.** Both noises have log-concave pmfs p on Z: Sk(lam, lam) is the law of the
difference of two independent Poisson(lam) (each log-concave; so is its reflection, and a convolution of log-concave
sequences is log-concave: Hoggar 1974), Bin(m, p) is a sum of Bernoullis. So for an integer shift k > 0 the
likelihood ratio p(x - k) / p(x) is non-decreasing in x (+inf above the support of p, 0 below that of p(. - k)),
and by Neyman-Pearson the hockey-stick divergence of P_k = p(. - k) against P_0 = p at any e^eps is attained on an
upper set {x >= t} (randomised at t):

    E_eps(P_k || P_0) = max_t [ P(N >= t - k) - e^eps P(N >= t) ]   (and its randomisations between t and t + 1),

non-decreasing in k, for every eps; the reverse direction E_eps(P_0 || P_k) = max_t [ P(N < t) - e^eps P(N < t - k) ]
is attained on lower sets and also non-decreasing in k. The Poisson-sampled pair (1 - q) P_0 + q P_k against P_0
has the likelihood ratio (1 - q) + q p(x - k) / p(x), monotone in x as well, so the same holds for it in both
directions. A pair with the larger shift K therefore dominates every smaller one at every (eps, delta): its PLD is
a dominating pair for them all (Zhu, Dong, Wang 2022, "Optimal accounting of differential privacy via
characteristic function", Def. 8: dominance is what composition needs).

**Randomised rounding.** The mechanisms round a real value y at random to an integer with the SAME uniforms u in
both neighbouring worlds, so the two integer inputs differ by an integer Delta_u with |Delta_u| <= K for every u
(below). The output is the mixture E_u over the coins of P_{Delta_u} (shifted by a common offset), and the
hockey-stick divergence is jointly convex, so E_eps(E_u P_u || E_u Q_u) <= sup_u E_eps(P_u || Q_u) <= that of the
pair at shift K: the rounding is charged through K, the dominating pair is exact for the worst coins.

* ``SkellamDpEvent`` of dimension 1 (``dimension`` declared): the integer inputs' l2 sensitivity is s D2' (the
  event's scale times its l2 sensitivity, which already holds the rounding: D2' = s D + sqrt(d) in integer units,
  ``dpfl.algorithms.joint_skellam``), so K = floor(s D2'), an integer shift of at most s D2'. The noise is
  Sk(lam, lam) with 2 lam = s^2 mu: p(x) = e^{-2 lam} I_|x|(2 lam) (``scipy.special.ive``). Sampled
  (``PoissonSampledDpEvent(q, SkellamDpEvent)``, add/remove or zero-out, whose null record adds nothing to the
  sampled statistic): remove direction (1 - q) P_0 + q P_K vs P_0, add direction P_0 vs that mixture.
* ``BinomialSumDpEvent`` of dimension 1 and p = 1/2 (replace-one): K = min(g, ceil(S))
  (``dpfl.accounting.binomial.largest_shift``), the pair Bin(m, 1/2) + K vs Bin(m, 1/2) on 0..m + K. The outcomes
  outside the other distribution's support are privacy loss +inf (the PLD's infinity mass): no delta0 approximation.
  Bin(m, 1/2) is symmetric, so the reflection x -> m + K - x swaps the two distributions (one symmetric PLD) and maps
  a negative shift onto the positive one. For p != 1/2 the shifts +K and -K give two different pairs, neither
  dominating the other: refused here (the RDP accountant answers).

**The modular clamp.** Secure aggregation sums the integers mod 2^b; a wrap-around is a deterministic function of
the integer sum (post-processing), so the PLD of the sum bounds the wrapped one. The clamp does not enter the
sensitivity: dpfl refuses a round whose messages could wrap before anything is sent (``dpfl.engine.secure_sum``),
and the shift K is that of the unwrapped integer inputs.

**Several coordinates: not here.** The privacy loss of independent coordinates is the sum of theirs, but the worst
allocation of an l2 budget over the coordinates' integer shifts has no single dominating pair (Skellam and the
binomial are not rotation invariant, unlike the Gaussian), so events of dimension > 1 (and undeclared) are refused
and the RDP accountant's bounds answer for them (Agarwal et al.'s Thm 3.5 with its l1 term; the knapsack of
``dpfl.accounting.binomial``).

**Discretisation, all pessimistic.** The Skellam lattice is cut at +-R beyond the means, R the smallest with the
Chernoff bound 2 P(Sk >= R) <= ``LATTICE_TAIL``; the upper distribution's mass outside is put at loss +inf.
Each privacy loss is rounded up to the grid (with a 1e-9 slack for the ~1e-11 error of the log-pmfs); the upper
mass of the largest losses, up to ``LOSS_TAIL`` in all, goes to +inf, and that of the smallest losses, up to
``LOSS_TAIL``, is moved up to the smallest loss kept (a higher loss never lowers a hockey-stick divergence).
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event, privacy_accountant
from dp_accounting.pld import pld_pmf, privacy_loss_distribution
from scipy import stats
from scipy.special import ive

from dpfl.accounting.binomial import check_parameters, largest_shift
from dpfl.accounting.events import BinomialSumDpEvent, SkellamDpEvent

NeighborRel = privacy_accountant.NeighboringRelation

#: The noise mass left outside the Skellam lattice (put at loss +inf).
LATTICE_TAIL = 1e-18
#: The upper mass of the largest (to +inf) and of the smallest (moved up) privacy losses in each direction.
LOSS_TAIL = 1e-16
#: The most lattice points one pair may span (about 80 MB of float64 arrays while it is built).
MAX_LATTICE = 1 << 22
#: The largest integer-unit variance 2 lam whose pmf is evaluated (``scipy.special.ive(v, z)`` is NaN above z ~ 1.07e9)
MAX_VARIANCE = 1e9
#: Slack added to every privacy loss before it is rounded up (the log-pmfs' error is ~1e-11).
LOSS_SLACK = 1e-9
_SAMPLED_RELATIONS = (NeighborRel.ADD_OR_REMOVE_ONE, NeighborRel.REPLACE_SPECIAL)


def handles(event: dp_event.DpEvent) -> bool:
    """Whether ``event`` is one of the discrete events this module answers for (supported or refused)."""
    return isinstance(event, (SkellamDpEvent, BinomialSumDpEvent)) or (
        isinstance(event, dp_event.PoissonSampledDpEvent) and isinstance(event.event, SkellamDpEvent))


def unsupported(event: dp_event.DpEvent, relation: NeighborRel) -> str | None:
    """Why this module has no exact PLD of ``event`` (one of ``handles``) under ``relation``, or None."""
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        if relation not in _SAMPLED_RELATIONS:
            return f"{event} (Poisson sampling under {relation.name})"
        return unsupported(event.event, relation)
    if isinstance(event, SkellamDpEvent):
        if event.dimension != 1:
            return f"{event} (an exact Skellam PLD needs dimension 1: several coordinates have no single worst shift)"
        if event.scale**2 * event.variance > MAX_VARIANCE:
            return f"{event} (an integer-unit variance above {MAX_VARIANCE:g}, beyond the Bessel function's range)"
        if skellam_lattice_size(event) > MAX_LATTICE:
            return f"{event} (its lattice spans about {skellam_lattice_size(event):.3g} points, over {MAX_LATTICE})"
        return None
    if relation != NeighborRel.REPLACE_ONE:
        return f"{event} (the binomial summation is accounted under REPLACE_ONE)"
    if event.dimension != 1 or event.probability != 0.5:
        return f"{event} (an exact binomial PLD needs dimension 1 and probability 1/2)"
    return None


def pld(event: dp_event.DpEvent, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The exact PLD of ``event`` (``unsupported`` is None for it) on a grid of step ``interval``."""
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        return skellam_pld(event.event, event.sampling_probability, interval)
    if isinstance(event, SkellamDpEvent):
        return skellam_pld(event, 1.0, interval)
    return binomial_pld(event, interval)


def skellam_shift(event: SkellamDpEvent) -> int:
    """K = floor(s D2'): the largest integer shift of one coordinate's integer input (module docstring)."""
    return math.floor(event.scale * event.l2_sensitivity + 1e-9)


def skellam_log_pmf(support: np.ndarray, variance: float) -> np.ndarray:
    """log P(Sk(lam, lam) = x), 2 lam = ``variance`` (integer units): log(e^{-2 lam} I_|x|(2 lam)); -inf where it
    underflows."""
    with np.errstate(divide="ignore"):
        log_pmf = np.log(ive(np.abs(support), variance))
    if np.isnan(log_pmf).any():
        raise ValueError(f"the Skellam pmf of variance {variance:g} is not computable here (over {MAX_VARIANCE:g}?)")
    return log_pmf


def skellam_tail(radius: float, variance: float) -> float:
    """Chernoff's bound on P(Sk(lam, lam) >= radius), 2 lam = ``variance``: E e^{tX} = exp(2 lam (cosh t - 1)), at
    its minimiser t = asinh(radius / (2 lam))."""
    t = math.asinh(radius / variance)
    return math.exp(min(0.0, variance * (math.cosh(t) - 1) - t * radius))


def _skellam_radius(variance: float) -> int:
    """The smallest integer R with 2 ``skellam_tail``(R) <= ``LATTICE_TAIL`` (doubling, then bisection)."""
    high = max(1, math.ceil(math.sqrt(variance)))
    while 2 * skellam_tail(high, variance) > LATTICE_TAIL:
        high *= 2
    low = 0
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if 2 * skellam_tail(middle, variance) <= LATTICE_TAIL else (middle, high)
    return high


def skellam_lattice_size(event: SkellamDpEvent) -> int:
    """The lattice points of the Skellam pair: -R..K + R."""
    return 2 * _skellam_radius(event.scale**2 * event.variance) + skellam_shift(event) + 1


def skellam_pld(event: SkellamDpEvent, sampling_probability: float,
                interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of one coordinate's Skellam mechanism at the worst shift K, its record Poisson-sampled with
    probability q (1: not sampled); module docstring."""
    variance, shift = event.scale**2 * event.variance, skellam_shift(event)
    radius = _skellam_radius(variance)
    support = np.arange(-radius, shift + radius + 1)
    base, shifted = skellam_log_pmf(support, variance), skellam_log_pmf(support - shift, variance)
    outside = LATTICE_TAIL
    if sampling_probability >= 1:
        return privacy_loss_distribution.PrivacyLossDistribution(_direction(shifted, base, interval, outside))
    q = sampling_probability
    with np.errstate(invalid="ignore"):  # logaddexp(-inf, -inf) = -inf, with numpy's warning
        mixture = np.logaddexp(math.log1p(-q) + base, math.log(q) + shifted)
    return privacy_loss_distribution.PrivacyLossDistribution(_direction(mixture, base, interval, outside),
                                                             _direction(base, mixture, interval, outside))


def binomial_pld(event: BinomialSumDpEvent, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of Bin(m, 1/2) + K against Bin(m, 1/2), K = min(g, ceil(S)) (module docstring; symmetric)."""
    check_parameters(event.trials, event.probability, event.dimension, event.grid, event.l2_shift)
    shift = largest_shift(event.grid, event.l2_shift)
    support = np.arange(event.trials + shift + 1)
    noise = stats.binom(event.trials, event.probability)
    return privacy_loss_distribution.PrivacyLossDistribution(
        _direction(noise.logpmf(support - shift), noise.logpmf(support), interval, 0.0))


def _direction(log_upper: np.ndarray, log_lower: np.ndarray, interval: float, outside: float) -> pld_pmf.DensePLDPmf:
    """The pessimistic PLD pmf of mu_upper against mu_lower, given on a common lattice as log-pmfs, with ``outside``
    of mu_upper's mass off the lattice (dp_accounting's convention: the loss log(mu_upper / mu_lower) with the outcome
    drawn from mu_upper; module docstring for the rounding and the tails)."""
    upper = np.exp(log_upper)
    kept = upper > 0
    finite = kept & np.isfinite(log_lower)
    infinity = outside + float(upper[kept & ~finite].sum())
    masses = upper[finite]
    steps = np.ceil((log_upper[finite] - log_lower[finite] + LOSS_SLACK) / interval)
    order = np.argsort(steps, kind="stable")
    steps, masses = steps[order], masses[order]
    above = np.cumsum(masses[::-1])[::-1]  # mass at this loss or higher
    keep = above > LOSS_TAIL
    infinity += float(masses[~keep].sum())
    steps, masses = steps[keep], masses[keep]
    if not len(steps):  # every outcome's loss is +inf
        return pld_pmf.DensePLDPmf(interval, 0, np.zeros(1), min(1.0, infinity), True)
    below = np.cumsum(masses)  # mass at this loss or lower
    lowest = steps[min(int(np.searchsorted(below, LOSS_TAIL, side="right")), len(steps) - 1)]
    steps = np.maximum(steps, lowest).astype(np.int64)
    probs = np.bincount(steps - int(lowest), weights=masses)
    return pld_pmf.DensePLDPmf(interval, int(lowest), probs, min(1.0, infinity), True)


__all__ = ["LATTICE_TAIL", "LOSS_TAIL", "MAX_LATTICE", "handles", "unsupported", "pld", "skellam_shift",
           "skellam_log_pmf", "skellam_tail", "skellam_lattice_size", "skellam_pld", "binomial_pld"]
