"""The t-fold self-composition of a PLD, bit for bit dp_accounting's, with what does not depend on t computed once.

A run's ledger composes the same round event again and again: at round t each observer's PLD is the round event's
PLD self-composed t times (``dpfl.accounting.pld``: ``SelfComposedDpEvent(event, t)``). dp_accounting's
``DensePLDPmf.self_compose(t, tail)`` (0.6.0) does, for a PMF p of n points,

1. the Chernoff truncation bounds of the t-fold convolution (``common.compute_self_convolve_bounds``): the log
   moment generating function M(s) = log sum_i p_i e^{s i} at 40 orders s = k / n (k = -20..-1, 1..20), then
   upper = min over s > 0 of ceil((t M(s) + log(2 / tail)) / s), lower = max over s < 0 of floor(the same);
2. the t-fold convolution by FFT: ifft(fft(p, L)^t), L = ``next_fast_len(max(upper - lower + 1, n))``, rolled by
   -lower and cut to upper - lower + 1 points;
3. the infinity mass tail - expm1(t log1p(-inf_mass)).

Step 1's 40 log-sum-exps over the n points (40 n exponentials, through scipy's ``logsumexp``) are 85-90% of the work
and do not depend on t; neither does fft(p, L) while L stays the same (``next_fast_len`` rounds L up, so it changes
every few rounds). ``self_compose`` keeps both per PMF (``_Moments``, held only as long as the PMF is: a weak
reference) and does the remaining operations exactly as dp_accounting does them, in the same order on the same
operands: the same numbers, bit for bit (tested against dp_accounting on Gaussian, Laplace, subsampled and mixture
PMFs). Sparse PMFs (a few points: randomized response) are left to dp_accounting, whose sparse path is cheap. Another
dp_accounting layout (private attributes renamed) falls back to dp_accounting's own ``self_compose``.

**The moments, fast and exact where it matters.** The moments enter the result only through the integers
ceil(b_k) and floor(b_k) of the bounds b_k = (t M(s_k) + log(2 / tail)) / s_k. ``_Moments`` first computes every
M(s_k) = log sum_i p_i e^{s_k i} with one exponential per point, e^{i / n}, raised to the power k by repeated
multiplication (e^{-i / n} for k < 0: the sums stay within e^{+-20} of the mass, no overflow), and pairwise sums: each
term is within 2k + 2 roundings of its exact value and the sum within log2(n) more, so this M is within about 1e-14
of scipy's (itself within as much of the true value); ``_Moments.bound`` takes it as known to ``MOMENT_TOLERANCE``
= 1e-11, 300 times that. Where b_k is farther than t MOMENT_TOLERANCE / |s_k| (plus its own rounding) from every
integer, both M give the same ceil and floor; where it is not, the order's exact moment, scipy's ``logsumexp`` as
dp_accounting calls it, is computed (once per order and PMF) and used instead. Either way the bounds, hence the
composition, are dp_accounting's bit for bit, at n + 80 n multiplications instead of 40 n exponentials (5-10x less).

**Memory.** The transforms are numpy's, not scipy's: scipy's pocketfft keeps the plans of the last 16 lengths it was
asked for (about 40 bytes per point each), and a ledger asks for a new length every few rounds, so a run held 16 plans
of 10^6 points and more (0.6-1.2 GB) for good. numpy's pocketfft keeps none. The numbers are the same: numpy's
``ifft`` is scipy's bit for bit, and scipy's ``fft`` of a real sequence is its real transform (numpy's ``rfft``, bit for
bit) completed by conjugate symmetry (``_transform``; tested).
"""

from __future__ import annotations

import math
import weakref

import numpy as np
from dp_accounting.pld import pld_pmf, privacy_loss_distribution
from scipy import fft, special

Pld = privacy_loss_distribution.PrivacyLossDistribution

#: dp_accounting's default tail mass truncated by a self-composition (``PrivacyLossDistribution.self_compose``)
TAIL_MASS_TRUNCATION = 1e-15
#: The most points the kept transforms hold in all (16 bytes each: 64 MB; the one in use is kept beyond it)
TRANSFORM_POINTS = 4_000_000
#: How far the fast moments are taken to be from scipy's ``logsumexp`` (about 300 times their error: module docstring)
MOMENT_TOLERANCE = 1e-11


class _Moments:
    """What the self-compositions of one dense PMF share: its log moment generating function at dp_accounting's 40
    Chernoff orders (fast, and exact on demand: module docstring), and its FFT at the last length asked for."""

    def __init__(self, probs: np.ndarray):
        n = len(probs)  # the moments: 40 numbers; the transform: one per point, within TRANSFORM_POINTS in all
        self.orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n
        self.fast_log_mgfs = _fast_log_mgfs(probs)
        self.exact_log_mgfs: dict[int, float] = {}  # order's position -> scipy's logsumexp, where one was needed
        self.fft_length, self.transform = 0, None

    def bound(self, probs: np.ndarray, position: int, count: int, tail: float) -> float:
        """dp_accounting's Chernoff bound (t M(s) + log(2 / tail)) / s at the order ``self.orders[position]``, or one
        with the same ceiling and floor (module docstring)."""
        order = self.orders[position]
        if position not in self.exact_log_mgfs:
            bound = (count * self.fast_log_mgfs[position] + math.log(2 / tail)) / order
            if math.isfinite(bound):
                margin = count * MOMENT_TOLERANCE / abs(order) + 1e-13 * abs(bound) + 1e-9
                if math.floor(bound - margin) == math.floor(bound + margin) and \
                        math.ceil(bound - margin) == math.ceil(bound + margin):
                    return bound
            self.exact_log_mgfs[position] = special.logsumexp(np.arange(len(probs)) * order, b=probs)
        return (count * self.exact_log_mgfs[position] + math.log(2 / tail)) / order

    def transform_at(self, probs: np.ndarray, length: int) -> np.ndarray:
        if length != self.fft_length:
            others = [m for m in list(_MOMENTS.values()) if m is not self]
            for other in others:  # within TRANSFORM_POINTS in all with this one: the others' go first
                if sum(m.fft_length for m in others) + length > TRANSFORM_POINTS:
                    other.fft_length, other.transform = 0, None
            self.fft_length, self.transform = length, _transform(probs, length)
        return self.transform


def _fast_log_mgfs(probs: np.ndarray) -> np.ndarray:
    """log sum_i p_i e^{k i / n} for k = -20..-1, 1..20 (``_Moments.orders``), each within about 1e-14 of scipy's
    ``logsumexp`` (module docstring): powers of e^{+-i / n} by repeated multiplication, pairwise sums."""
    step = np.exp(np.arange(len(probs)) / len(probs))
    result = np.empty(40)
    for sign, base in ((-1, 1 / step), (1, step)):
        power = np.ones_like(step)
        for k in range(1, 21):
            power *= base
            with np.errstate(divide="ignore"):
                result[20 + k - 1 if sign > 0 else 20 - k] = np.log(np.sum(probs * power))
    return result


def _transform(values: np.ndarray, length: int) -> np.ndarray:
    """``scipy.fft.fft(values, length)`` of a real sequence, bit for bit, without scipy's plan cache: the real
    transform X_0..X_{length // 2}, then X_{length - k} = conj(X_k)."""
    half = np.fft.rfft(values, length)
    full = np.empty(length, dtype=complex)
    full[: len(half)] = half
    full[len(half):] = np.conj(half[1: length - len(half) + 1][::-1])
    return full


_MOMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DensePLDPmf -> _Moments


def self_compose(pld: Pld, count: int, tail_mass_truncation: float = TAIL_MASS_TRUNCATION) -> Pld:
    """``pld.self_compose(count, tail_mass_truncation)``, bit for bit (module docstring)."""
    try:
        remove, add = pld._pmf_remove, None if pld._symmetric else pld._pmf_add  # noqa: SLF001 (0.6.0's layout)
    except AttributeError:
        return pld.self_compose(count, tail_mass_truncation)
    pmf_remove = _self_compose_pmf(remove, count, tail_mass_truncation)
    if add is None:
        return Pld(pmf_remove)
    return Pld(pmf_remove, _self_compose_pmf(add, count, tail_mass_truncation))


def _self_compose_pmf(pmf: pld_pmf.PLDPmf, count: int, tail: float) -> pld_pmf.PLDPmf:
    """``DensePLDPmf.self_compose`` (dp_accounting 0.6.0: ``common.self_convolve`` and its bounds) with the moments
    and the transform of ``_Moments``; any other PMF: its own."""
    if not isinstance(pmf, pld_pmf.DensePLDPmf) or count <= 0 or tail == 0:
        return pmf.self_compose(count, tail)
    try:  # noqa: SLF001 (0.6.0's layout)
        probs, lower_loss, infinity_mass = pmf._probs, pmf._lower_loss, pmf._infinity_mass
        discretization, pessimistic = pmf._discretization, pmf._pessimistic_estimate
    except AttributeError:
        return pmf.self_compose(count, tail)
    moments = _MOMENTS.get(pmf)
    if moments is None:
        moments = _MOMENTS[pmf] = _Moments(probs)
    lower, upper = _chernoff_bounds(moments, probs, count, tail)
    output_length = upper - lower + 1
    length = fft.next_fast_len(max(output_length, len(probs)))
    convolution = np.real(np.fft.ifft(moments.transform_at(probs, length) ** count))
    composed = np.array(np.roll(convolution, -lower)[:output_length])
    inf_prob = tail - math.expm1(count * math.log1p(-infinity_mass))
    return pld_pmf.DensePLDPmf(discretization, lower_loss * count + lower, composed, inf_prob, pessimistic)


def _chernoff_bounds(moments: _Moments, probs: np.ndarray, count: int, tail: float) -> tuple[int, int]:
    """``common.compute_self_convolve_bounds``: the range of the ``count``-fold convolution of the PMF ``probs``
    outside which it has mass at most ``tail`` (Chernoff's bound at each of the 40 orders), from its moments."""
    lower, upper = 0, (len(probs) - 1) * count
    for position, order in enumerate(moments.orders):
        bound = moments.bound(probs, position, count, tail)
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        if order < 0:
            lower = max(lower, math.floor(bound))
    return lower, upper


__all__ = ["TAIL_MASS_TRUNCATION", "TRANSFORM_POINTS", "MOMENT_TOLERANCE", "self_compose"]
