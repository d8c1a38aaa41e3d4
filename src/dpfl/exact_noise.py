"""Exact samplers of the discrete Laplace and discrete Gaussian distributions, driven by uniform 64-bit words.

Canonne, Kamath, Steinke 2020 ("The Discrete Gaussian for Differential Privacy", NeurIPS; Algorithms 1-3) sample
these distributions exactly from uniform random bits with integer arithmetic only, so a released value's low-order
bits say nothing about the value before noise (Mironov's 2012 attack on floating-point Laplace and Gaussian sampling
needs the sampler's rounding, and there is none):

* ``bernoulli_exp``: Bernoulli(exp(-gamma)) for a rational gamma = n / d >= 0 (their Algorithm 1). For gamma in
  [0, 1]: draw A_K ~ Bernoulli(gamma / K) for K = 1, 2, ... until the first A_K = 0, and output 1 iff that K is odd
  (P = sum over odd K of gamma^(K-1) / (K-1)! (1 - gamma / K) = exp(-gamma)). For gamma > 1: floor(gamma)
  independent Bernoulli(exp(-1)) trials and one Bernoulli(exp(-(gamma - floor(gamma)))), all of which must be 1
  (exp(-gamma) = exp(-1)^floor(gamma) exp(-frac)).
* ``discrete_laplace``: P(Y = y) proportional to exp(-|y| s / t) for a rational scale t / s (their Algorithm 2):
  U ~ Uniform{0..t-1} accepted with probability exp(-U / t), V ~ Geometric(1 - exp(-1)) (the count of Bernoulli(exp(-1))
  successes before the first failure), X = U + t V ~ Geometric(1 - exp(-1/t)), Y = +-floor(X / s) with a fair sign,
  the pair (minus, 0) rejected so that 0 is not counted twice.
* ``discrete_gaussian``: P(Y = y) proportional to exp(-y^2 / (2 sigma^2)) for a rational sigma^2 (their Algorithm 3):
  Y ~ discrete Laplace of scale t = floor(sigma) + 1, accepted with probability
  exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)).

The bits: Bernoulli(a / b) is 1[U < a] for U ~ Uniform{0..b-1}, and U is drawn by rejection from the low
bitlength(b - 1) bits of a word (``uniform_below``: each try succeeds with probability > 1/2). Inside Algorithm 1,
Bernoulli(gamma / K) = Bernoulli(n / d) AND Bernoulli(1 / K) (independent draws), so no denominator exceeds d.

**Floating point: none.** Every quantity is an int64 numpy array or a Python int / ``Fraction``; t = floor(sigma) + 1
is isqrt(floor(p / q)) + 1 for sigma^2 = p / q (floor(sqrt(x)) = floor(sqrt(floor(x))) for x >= 0). int64 bounds the
parameters: the discrete Gaussian needs 2 p q t^2 <= 2^62 (the denominator of its acceptance exponent; this allows,
e.g., sigma up to about 3.9 * 10^4 for an integer sigma^2), and the rare far-tail candidates whose exponent's
numerator (|Y| q t - p)^2 passes 2^62 are reduced with Python integers instead.

**Vectorised.** Each function draws a whole batch at once: numpy masks select the rows still running, and Python
loops only over the steps of Algorithm 1 and of the rejection (their number grows like the log of the batch size),
so the cost is numpy's per element, about 1.5-2 microseconds of one core per coordinate, 10^4 coordinates in about
20 ms (``benchmarks/secure_noise.py``; 100-200 times torch's float32 normal draws). Which word of the stream a row
receives depends on the batch: a batch's draws are reproducible from its stream and size, not row by row.
"""

from __future__ import annotations

from fractions import Fraction
from math import isqrt
from typing import Protocol

import numpy as np

#: The largest denominator (and uniform bound) the int64 arithmetic takes.
MAX_DENOMINATOR = 2**62


class UniformWords(Protocol):
    """A source of independent uniform 64-bit words (e.g. ``dpfl.engine.secure_streams.SecureStream``)."""

    def words(self, count: int) -> np.ndarray:
        """The next ``count`` words, uint64."""


def uniform_below(source: UniformWords, bound: np.ndarray) -> np.ndarray:
    """Row i uniform on {0, ..., bound_i - 1} (int64 ``bound``, 1 <= bound_i <= 2^62), exactly: the low bits of a
    word under the mask of bound_i - 1 (all ones up to its highest bit), redrawn while they reach bound_i."""
    bound = np.asarray(bound, dtype=np.int64)
    if bound.size and (bound.min() < 1 or bound.max() > MAX_DENOMINATOR):
        raise ValueError(f"uniform bounds must lie in [1, 2^62]: got [{bound.min()}, {bound.max()}]")
    mask = bound - 1
    width, shift = int(mask.max()).bit_length() if mask.size else 0, 1
    while shift < width:  # smear the highest bit down: enough shifts for the widest bound
        mask |= mask >> shift
        shift *= 2
    draws = (source.words(bound.size) >> np.uint64(1)).astype(np.int64) & mask
    rejected = np.flatnonzero(draws >= bound)
    while rejected.size:
        again = (source.words(rejected.size) >> np.uint64(1)).astype(np.int64) & mask[rejected]
        draws[rejected] = again
        rejected = rejected[again >= bound[rejected]]
    return draws


def bernoulli(source: UniformWords, numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Row i ~ Bernoulli(numerator_i / denominator_i) (int64 arrays of one shape, 0 <= numerator_i <= denominator_i
    <= 2^62), as 1[U < n] for U ~ Uniform{0..d-1}; rows with probability 0 or 1 take no word."""
    out = numerator >= denominator
    coin = np.flatnonzero((numerator > 0) & ~out)
    if coin.size:
        out[coin] = uniform_below(source, denominator[coin]) < numerator[coin]
    return out


def _continues(source: UniformWords, numerator: np.ndarray, denominator: np.ndarray, k: np.ndarray) -> np.ndarray:
    """A_K ~ Bernoulli(gamma / K) = Bernoulli(n / d) AND Bernoulli(1 / K) per row (independent draws, one call)."""
    m = k.size
    coins = bernoulli(source, np.concatenate([numerator, np.ones(m, np.int64)]), np.concatenate([denominator, k]))
    return coins[:m] & coins[m:]


def _bernoulli_exp_split(source: UniformWords, whole: np.ndarray, remainder: np.ndarray,
                         denominator: np.ndarray) -> np.ndarray:
    """Row i ~ Bernoulli(exp(-(whole_i + remainder_i / d_i))), 0 <= remainder_i < d_i: Algorithm 1's draw for the
    fractional part, then, while each comes out 1, its draws for gamma = 1 until one is 0 or whole_i have been 1.
    One loop over the rows' steps: each step draws A_K of the row's current trial (the trials of a row are
    independent, so which words of the stream a step receives does not change its law)."""
    out = np.zeros(whole.shape, dtype=bool)
    left, numerator, denominator = whole.copy(), remainder.copy(), denominator.copy()
    k = np.ones(whole.shape, dtype=np.int64)
    running = np.arange(whole.size)
    while running.size:
        going_on = _continues(source, numerator[running], denominator[running], k[running])
        k[running[going_on]] += 1
        ended = running[~going_on]
        one = ended[k[ended] % 2 == 1]  # this trial's Bernoulli(exp(-gamma)) is 1
        out[one[left[one] == 0]] = True
        more = one[left[one] > 0]
        left[more] -= 1
        numerator[more], denominator[more], k[more] = 1, 1, 1
        running = np.concatenate([running[going_on], more])
    return out


def bernoulli_exp(source: UniformWords, numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Row i ~ Bernoulli(exp(-n_i / d_i)) for int64 arrays of one shape, n_i >= 0 and 1 <= d_i <= 2^62 (Canonne et
    al. 2020, Alg. 1)."""
    numerator, denominator = np.asarray(numerator, np.int64), np.asarray(denominator, np.int64)
    if numerator.size and numerator.min() < 0:
        raise ValueError(f"Bernoulli(exp(-gamma)) needs gamma >= 0: got a numerator {numerator.min()}")
    return _bernoulli_exp_split(source, numerator // denominator, numerator % denominator, denominator)


def _geometric(source: UniformWords, size: int) -> np.ndarray:
    """``size`` draws of the number of Bernoulli(exp(-1)) successes before the first failure: one loop over steps,
    each drawing A_K ~ Bernoulli(1 / K) of the row's current Bernoulli(exp(-1)) trial (Algorithm 1, gamma = 1)."""
    count = np.zeros(size, dtype=np.int64)
    k = np.ones(size, dtype=np.int64)
    running = np.arange(size)
    while running.size:
        going_on = bernoulli(source, np.ones(running.size, np.int64), k[running])
        k[running[going_on]] += 1
        ended = running[~going_on]
        one = ended[k[ended] % 2 == 1]
        count[one] += 1
        k[one] = 1
        running = np.concatenate([running[going_on], one])
    return count


def _positive_fraction(name: str, value: Fraction | int) -> Fraction:
    value = Fraction(value)
    if value <= 0:
        raise ValueError(f"{name} = {value} is not allowed: expected a positive rational")
    return value


def _laplace_attempts(source: UniformWords, t: int, s: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``size`` independent attempts of Algorithm 2's loop body: (value, whether the attempt is accepted)."""
    u = uniform_below(source, np.full(size, t, dtype=np.int64))
    kept = np.flatnonzero(bernoulli_exp(source, u, np.full(size, t, dtype=np.int64)))
    tens = _geometric(source, kept.size)
    if tens.size and tens.max() > (2**63 - 1 - t) // t:  # probability below exp(-(2^63 / t - 1))
        raise OverflowError(f"a discrete Laplace draw of scale {t}/{s} is too far out for int64")
    magnitude = (u[kept] + t * tens) // s
    minus = bernoulli(source, np.ones(kept.size, np.int64), np.full(kept.size, 2, np.int64))
    values = np.zeros(size, dtype=np.int64)
    values[kept] = np.where(minus, -magnitude, magnitude)
    accepted = np.zeros(size, dtype=bool)
    accepted[kept] = ~(minus & (magnitude == 0))
    return values, accepted


def _first_accepted(size: int, attempts) -> np.ndarray:
    """``size`` draws by rejection: ``attempts(n)`` gives n independent (value, accepted) attempts, and row i takes
    the i-th accepted value. The attempts are independent and identically distributed, so the accepted values are
    independent draws of the accepted law, whichever attempts they come from. Each round tries twice the rows
    still missing, plus 64 (the acceptance rates here are about 0.5 or more), so one or two rounds suffice."""
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        values, accepted = attempts(2 * (size - filled) + 64)
        found = values[accepted][: size - filled]
        out[filled: filled + found.size] = found
        filled += found.size
    return out


def discrete_laplace(source: UniformWords, scale: Fraction | int, size: int) -> np.ndarray:
    """``size`` int64 draws with P(y) proportional to exp(-|y| / scale), a positive rational scale = t / s with
    t <= 2^62 (Canonne et al. 2020, Alg. 2)."""
    scale = _positive_fraction("scale", scale)
    t, s = scale.numerator, scale.denominator
    if t > MAX_DENOMINATOR:
        raise ValueError(f"scale = {scale} is not allowed: its numerator must be at most 2^62")
    return _first_accepted(size, lambda n: _laplace_attempts(source, t, s, n))


def gaussian_scale(sigma2: Fraction) -> int:
    """t = floor(sigma) + 1, the discrete Laplace scale of Algorithm 3, for sigma^2 = p / q exactly."""
    return isqrt(sigma2.numerator // sigma2.denominator) + 1


def _exponent_parts(magnitude: np.ndarray, sigma2: Fraction, t: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(floor, remainder, denominator) of gamma = (|Y| - sigma^2 / t)^2 / (2 sigma^2) = (|Y| q t - p)^2 /
    (2 p q t^2) per row. Since t^2 > p / q, the denominator exceeds 2 p^2, so p < 2^31 under the 2^62 bound and
    rows with |Y| q t <= 2^31 - 1 + p have |numerator root| < 2^31: their square fits int64. Other rows (the far
    tail) are reduced with Python integers."""
    p, q = sigma2.numerator, sigma2.denominator
    denominator = 2 * p * q * t * t
    near = magnitude <= (2**31 - 1 + p) // (q * t)
    root = magnitude[near] * (q * t) - p
    whole = np.empty(magnitude.shape, dtype=np.int64)
    remainder = np.empty(magnitude.shape, dtype=np.int64)
    whole[near], remainder[near] = np.divmod(root * root, denominator)
    for i in np.flatnonzero(~near):
        quotient, remainder[i] = divmod((int(magnitude[i]) * q * t - p) ** 2, denominator)
        if quotient >= 2**63:  # |Y| > 2^31 sigma: a discrete Laplace draw of probability below exp(-2^31)
            raise OverflowError(f"a discrete Laplace candidate {int(magnitude[i])} is too far out for int64")
        whole[i] = quotient
    return whole, remainder, denominator


def discrete_gaussian(source: UniformWords, sigma2: Fraction | int, size: int) -> np.ndarray:
    """``size`` int64 draws with P(y) proportional to exp(-y^2 / (2 sigma^2)), a positive rational sigma^2 = p / q
    with 2 p q (floor(sigma) + 1)^2 <= 2^62 (Canonne et al. 2020, Alg. 3; Fraction(x).limit_denominator(n) brings a
    float within reach). An attempt is one of Algorithm 2's (scale t) followed, if it is accepted, by the
    Bernoulli(exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2))) draw."""
    sigma2 = _positive_fraction("sigma2", sigma2)
    t = gaussian_scale(sigma2)
    if 2 * sigma2.numerator * sigma2.denominator * t * t > MAX_DENOMINATOR:
        raise ValueError(f"sigma2 = {sigma2} is not allowed: the exact sampler needs 2 p q (floor(sigma) + 1)^2 <= "
                         f"2^62 for sigma^2 = p / q (a smaller denominator q, or a smaller sigma)")

    def attempts(n: int) -> tuple[np.ndarray, np.ndarray]:
        values, accepted = _laplace_attempts(source, t, 1, n)
        rows = np.flatnonzero(accepted)
        whole, remainder, denominator = _exponent_parts(np.abs(values[rows]), sigma2, t)
        accepted[rows] = _bernoulli_exp_split(source, whole, remainder, np.full(rows.size, denominator, np.int64))
        return values, accepted

    return _first_accepted(size, attempts)


__all__ = ["MAX_DENOMINATOR", "UniformWords", "uniform_below", "bernoulli", "bernoulli_exp", "discrete_laplace",
           "gaussian_scale", "discrete_gaussian"]
