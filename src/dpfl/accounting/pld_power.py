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

Step 1's 40 log-sum-exps over the n points are 85-90% of the work and do not depend on t; neither does fft(p, L) while
L stays the same (``next_fast_len`` rounds L up, so it changes every few rounds). ``self_compose`` keeps both per PMF
(``_Moments``, held only as long as the PMF is: a weak reference) and does the remaining operations exactly as
dp_accounting does them, in the same order on the same operands: the same numbers, bit for bit (tested against
dp_accounting on Gaussian, Laplace, subsampled and mixture PMFs). Sparse PMFs (a few points: randomized response) are
left to dp_accounting, whose sparse path is cheap. Another dp_accounting layout (private attributes renamed) falls back
to dp_accounting's own ``self_compose``.

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


class _Moments:
    """What the self-compositions of one dense PMF share: its log moment generating function at dp_accounting's 40
    Chernoff orders, and its FFT at the last length asked for."""

    def __init__(self, probs: np.ndarray):
        n = len(probs)  # the moments: 40 numbers; the transform: one per point, within TRANSFORM_POINTS in all
        self.orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n
        self.log_mgfs = [special.logsumexp(np.arange(n) * order, b=probs) for order in self.orders]
        self.fft_length, self.transform = 0, None

    def transform_at(self, probs: np.ndarray, length: int) -> np.ndarray:
        if length != self.fft_length:
            others = [m for m in list(_MOMENTS.values()) if m is not self]
            for other in others:  # within TRANSFORM_POINTS in all with this one: the others' go first
                if sum(m.fft_length for m in others) + length > TRANSFORM_POINTS:
                    other.fft_length, other.transform = 0, None
            self.fft_length, self.transform = length, _transform(probs, length)
        return self.transform


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
    lower, upper = _chernoff_bounds(moments, len(probs), count, tail)
    output_length = upper - lower + 1
    length = fft.next_fast_len(max(output_length, len(probs)))
    convolution = np.real(np.fft.ifft(moments.transform_at(probs, length) ** count))
    composed = np.array(np.roll(convolution, -lower)[:output_length])
    inf_prob = tail - math.expm1(count * math.log1p(-infinity_mass))
    return pld_pmf.DensePLDPmf(discretization, lower_loss * count + lower, composed, inf_prob, pessimistic)


def _chernoff_bounds(moments: _Moments, size: int, count: int, tail: float) -> tuple[int, int]:
    """``common.compute_self_convolve_bounds``: the range of the ``count``-fold convolution of a PMF of ``size`` points
    outside which it has mass at most ``tail`` (Chernoff's bound at each of the 40 orders), from its cached moments."""
    lower, upper = 0, (size - 1) * count
    for order, log_mgf in zip(moments.orders, moments.log_mgfs):
        bound = (count * log_mgf + math.log(2 / tail)) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        if order < 0:
            lower = max(lower, math.floor(bound))
    return lower, upper


__all__ = ["TAIL_MASS_TRUNCATION", "TRANSFORM_POINTS", "self_compose"]
