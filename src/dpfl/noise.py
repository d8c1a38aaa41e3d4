"""Noise mechanisms that carry their privacy event (docs/architecture.md).

A mechanism object binds the noise it adds to the event that describes it: the simulator reads ``.event`` to account
for a round *before* it runs (so a budget can stop it), and every call returns the event its noise was drawn from,
which the simulator checks against what was declared. The noise's scale is read from that event in one place,
``gaussian_noise`` / ``laplace_noise`` / ``skellam_noise`` / ``BinomialBits``, ``randomised_rounding`` and
``discrete_gaussian_draws`` (the only functions of dpfl that draw noise; a test scans the package for others), so the
noise cannot change without its event changing.

Noise is calibrated to a per-client sensitivity Delta_i (a [clients] tensor: clients may have different batch sizes)
and a noise multiplier z: std_i = z * Delta_i, so every client's release is the same mechanism Gaussian(z) in
sensitivity units.

**Secure noise** (``run.secure_noise``, ``DiscreteGaussianMechanism``): the Gaussian mechanism without floating-point
noise. Mironov (2012) recovered values from the low bits of floating-point Laplace samples; float Gaussian samples
have the same weakness, and the default streams (a Mersenne twister) are predictable from enough of their outputs. The
secure mechanism rounds the value to a grid of power-of-two step gamma_i (exact in binary floating point), adds
exact discrete Gaussian noise in grid units (Canonne, Kamath, Steinke 2020, sampled with integer arithmetic only:
``dpfl.exact_noise``) drawn from each client's ChaCha20 stream (``dpfl.engine.secure_streams``), and releases
gamma_i times the noisy integers: a function of the integers alone. ``DiscreteGaussianDpEvent`` charges the rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import numpy as np
import torch
from dp_accounting import dp_event

from dpfl.accounting.events import DiscreteGaussianDpEvent, SkellamDpEvent
from dpfl.errors import ConfigError, check_range
from dpfl.exact_noise import MAX_DENOMINATOR, UniformWords, discrete_gaussian, gaussian_scale


def gaussian_noise(event: dp_event.GaussianDpEvent, sensitivity: torch.Tensor, like: torch.Tensor,
                   randomness: torch.Generator | torch.Tensor) -> torch.Tensor:
    """Noise shaped like ``like`` [clients, ...] with row i ~ N(0, (z Delta_i)^2 I), z = ``event.noise_multiplier``.

    ``randomness``: a generator, or standard normal draws shaped like ``like`` (each client's own stream,
    ``dpfl.engine.randomness``)."""
    std = (event.noise_multiplier * sensitivity).to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))
    if isinstance(randomness, torch.Generator):
        return std * torch.randn(like.shape, generator=randomness, dtype=like.dtype)
    if randomness.shape != like.shape:
        raise ValueError(f"standard normal draws of shape {tuple(randomness.shape)} for a value of {tuple(like.shape)}")
    return std * randomness.to(like.dtype)


def laplace_noise(event: dp_event.LaplaceDpEvent, sensitivity: torch.Tensor, like: torch.Tensor,
                  randomness: torch.Generator | torch.Tensor) -> torch.Tensor:
    """Noise shaped like ``like`` [clients, ...] with row i ~ Lap(0, b Delta_i) per coordinate, b =
    ``event.noise_multiplier``.

    Lap(0, 1) = E1 - E2 for independent Exp(1) draws (always finite, unlike the log of a uniform that can be 0).
    ``randomness``: a generator, or the Exp(1) draws themselves, [clients, 2, ...] (each client's own stream,
    ``dpfl.engine.randomness.ClientStreams.exponential``).
    """
    scale = (event.noise_multiplier * sensitivity).to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))
    if isinstance(randomness, torch.Generator):
        exponentials = torch.empty((2, *like.shape), dtype=like.dtype).exponential_(generator=randomness)
        return scale * (exponentials[0] - exponentials[1])
    expected = (like.shape[0], 2, *like.shape[1:])
    if tuple(randomness.shape) != expected:
        raise ValueError(f"Exp(1) draws of shape {tuple(randomness.shape)} for a value of {tuple(like.shape)}: "
                         f"expected {expected}")
    return scale * (randomness[:, 0] - randomness[:, 1]).to(like.dtype)


def skellam_noise(event: SkellamDpEvent, like: torch.Tensor, generator: torch.Generator,
                  shares: int = 1, ratio: float = 1.0) -> torch.Tensor:
    """One client's share of the event's integer noise, shaped like ``like``: int64 entries Pois(lam) - Pois(lam),
    lam = (ratio s)^2 mu / (2 shares), with s = ``event.scale`` and mu = ``event.variance``. ``ratio`` >= 1: a client
    whose sensitivity is ``ratio`` times the event's unit draws noise of std ``ratio`` times the event's (the same
    noise multiplier in units of its own sensitivity, as ``gaussian_noise``).

    The Skellam distribution Sk(lam, lam) has variance 2 lam and is infinitely divisible: the shares of ``shares``
    clients sum to Sk(s^2 mu / 2, s^2 mu / 2), the noise of variance s^2 mu (in integer units, after scaling by s) of
    the Skellam mechanism of Agarwal, Kairouz, Liu 2021 (Sec. 3) that ``event`` accounts for."""
    check_range("shares", shares, 1, integer=True)
    check_range("ratio", ratio, 1.0)
    rate = torch.full((2, *like.shape), (ratio * event.scale) ** 2 * event.variance / (2 * shares),
                      dtype=torch.float64)
    counts = torch.poisson(rate, generator=generator)
    return (counts[0] - counts[1]).to(torch.int64)


def randomised_rounding(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Unbiased randomised rounding to int64: floor(y) + 1[u < y - floor(y)], u ~ U[0, 1) from ``generator``
    (E = y; the coins of Cheu et al.'s 2021 local randomiser, whose privacy ``dpfl.accounting.binomial`` proves)."""
    values = values.double()
    low = torch.floor(values)
    coins = torch.rand(values.shape, generator=generator, dtype=torch.float64)
    return (low + (coins < values - low).double()).to(torch.int64)


@dataclass(frozen=True)
class BinomialBits:
    """b Bernoulli(p) noise bits per coordinate (Cheu et al. 2021): the count of 1-bits, Bin(b, p), per entry.

    Its event depends on how many users' bits an observer does not know, so the caller declares it
    (``dpfl.accounting.events.BinomialSumDpEvent`` with trials = U b)."""

    trials: int
    probability: float

    def __post_init__(self):
        check_range("trials", self.trials, 1, integer=True)
        check_range("probability", self.probability, 0.0, 1.0, low_open=True, high_open=True)

    def __call__(self, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """int64 counts of ``shape``, each ~ Bin(b, p), from ``generator``."""
        count = torch.full(shape, float(self.trials), dtype=torch.float64)
        return torch.binomial(count, torch.full_like(count, self.probability), generator=generator).to(torch.int64)


class NoiseStreams(Protocol):
    """The streams of one purpose a mechanism draws from (``dpfl.engine.randomness.ClientStreams`` /
    ``ServerStreams``): standard normals, or each client's (row's) secure stream of 64-bit words."""

    def normal(self, shape: tuple[int, ...]) -> torch.Tensor: ...

    def secure(self) -> list[UniformWords]: ...


@dataclass(frozen=True)
class GaussianMechanism:
    """x + N(0, (z Delta)^2 I): the Gaussian mechanism with noise multiplier z in units of the l2 sensitivity Delta."""

    noise_multiplier: float

    def __post_init__(self):
        check_range("noise_multiplier", self.noise_multiplier, 0.0)

    @property
    def is_private(self) -> bool:
        return self.noise_multiplier > 0

    @property
    def event(self) -> dp_event.DpEvent:
        if not self.is_private:
            return dp_event.NonPrivateDpEvent()
        return dp_event.GaussianDpEvent(self.noise_multiplier)

    def with_multiplier(self, noise_multiplier: float) -> "GaussianMechanism":
        """The same mechanism at another noise multiplier."""
        return GaussianMechanism(noise_multiplier)

    def draws(self, streams: NoiseStreams, shape: tuple[int, ...]) -> torch.Tensor:
        """N(0, 1) draws of ``shape`` from each client's stream (``streams.normal``): what ``__call__`` scales."""
        return streams.normal(shape)

    def __call__(self, value: torch.Tensor, sensitivity: torch.Tensor, randomness: torch.Generator | torch.Tensor):
        """Adds noise row-wise: value [clients, P], sensitivity [clients] (l2); ``randomness`` as for
        ``gaussian_noise``. Returns (noisy value, event)."""
        event = self.event
        if not self.is_private:
            return value, event
        return value + gaussian_noise(event, sensitivity, value, randomness), event


@dataclass(frozen=True)
class LaplaceMechanism:
    """x + Lap(0, b Delta_1) per coordinate: pure eps = 1/b per release (Dwork et al. 2006), Delta_1 the l1 sensitivity."""

    scale_multiplier: float

    def __post_init__(self):
        check_range("scale_multiplier", self.scale_multiplier, 0.0, low_open=True)

    is_private = True

    @property
    def event(self) -> dp_event.DpEvent:
        return dp_event.LaplaceDpEvent(self.scale_multiplier)

    def __call__(self, value: torch.Tensor, sensitivity: torch.Tensor, randomness: torch.Generator | torch.Tensor):
        """Adds noise row-wise: value [clients, P], sensitivity [clients] (l1); ``randomness`` as for
        ``laplace_noise``. Returns (noisy value, event)."""
        event = self.event
        return value + laplace_noise(event, sensitivity, value, randomness), event


def grid_variance(noise_multiplier: float, grid_bits: int) -> int:
    """s = ceil(z^2 4^k), the discrete Gaussian's variance parameter in grid units (an integer: the exact sampler's
    int64 arithmetic takes s with 2 s (floor(sqrt(s)) + 1)^2 <= 2^62, sigma up to about 3.9 * 10^4:
    ``exact_noise.discrete_gaussian``); s >= (z 2^k)^2, so the noise is at least what ``DiscreteGaussianDpEvent``
    charges. ConfigError naming ``run.secure_noise_bits`` (and the largest k that fits z) when z 2^k is out of the
    sampler's range."""
    check_range("run.secure_noise_bits", grid_bits, 1, integer=True)
    if _in_range(_variance(noise_multiplier, grid_bits)):
        return _variance(noise_multiplier, grid_bits)
    fits = [k for k in range(1, grid_bits) if _in_range(_variance(noise_multiplier, k))]
    allowed = f"at most {fits[-1]}" if fits else "none: lower the noise multiplier"
    raise ConfigError("run.secure_noise_bits", grid_bits,
                      f"{allowed} for the noise multiplier z = {noise_multiplier:g} (the exact sampler's int64 "
                      "arithmetic takes z 2^k up to about 3.9e4)")


def _variance(noise_multiplier: float, grid_bits: int) -> int:
    return math.ceil(Fraction(noise_multiplier) ** 2 * 4**grid_bits)


def _in_range(variance: int) -> bool:
    return 2 * variance * gaussian_scale(Fraction(variance)) ** 2 <= MAX_DENOMINATOR


def grid_steps(sensitivity: torch.Tensor, grid_bits: int) -> torch.Tensor:
    """gamma_i = 2^(ceil(log2 Delta_i) - k) (float64): the power of two at least Delta_i 2^-k, so Delta_i / gamma_i
    <= 2^k and a value divided by gamma_i, or an integer multiplied by it, is exact in binary floating point."""
    mantissa, exponent = torch.frexp(sensitivity.double())  # Delta = m 2^e, m in [0.5, 1)
    ceiling = torch.where(mantissa == 0.5, exponent - 1, exponent)  # ceil(log2 Delta)
    return torch.ldexp(torch.ones_like(mantissa), ceiling - grid_bits)


def discrete_gaussian_draws(sources: list[UniformWords], variance: int, shape: tuple[int, ...]) -> torch.Tensor:
    """int64 draws [sources, *shape], row i ~ N_Z(0, ``variance``) i.i.d. from the words of ``sources[i]``
    (Canonne, Kamath, Steinke 2020, Alg. 3: ``exact_noise.discrete_gaussian``)."""
    out = np.empty((len(sources), math.prod(shape)), dtype=np.int64)  # filled row by row: 8 bytes a draw at most
    for row, source in zip(out, sources):
        row[:] = discrete_gaussian(source, variance, row.size)
    return torch.from_numpy(out.reshape(len(sources), *shape))


@dataclass(frozen=True)
class DiscreteGaussianMechanism:
    """The Gaussian mechanism of ``run.secure_noise`` (module docstring): x rounded to the grid gamma_i Z^d
    (``grid_steps``), plus N_Z(0, s)^d in grid units, s = ``grid_variance(z, k)`` >= (z 2^k)^2, released as gamma_i
    times the noisy integers; its event ``DiscreteGaussianDpEvent(z, k, d)`` charges the rounding (sensitivity
    2^k + sqrt(d) grid units, noise multiplier z_eff = z 2^k / (2^k + sqrt(d))). The noise's std in the value's
    units is at least z Delta_i and below 2 z Delta_i (gamma_i 2^k is in [Delta_i, 2 Delta_i)); exactly z Delta_i
    when Delta_i is a power of two.

    The released dtype is the value's (float32 by default): gamma_i y is exact while |y| < 2^24 (float32) or 2^53
    (float64) and otherwise the nearest float, still a multiple of gamma_i (a power of two at least the dtype's
    smallest normal number, which ``__call__`` checks) and a function of y alone: post-processing. The value's
    coordinates over gamma_i are clamped to [-2^52, 2^52] before rounding (a 1-Lipschitz map: the sensitivity
    holds), so y fits int64 and float64 exactly. A non-finite coordinate (a diverged model) stays as it is, as it
    does under the default mechanism."""

    noise_multiplier: float
    grid_bits: int
    dimension: int

    def __post_init__(self):
        check_range("noise_multiplier", self.noise_multiplier, 0.0, low_open=True)
        check_range("dimension", self.dimension, 1, integer=True)
        grid_variance(self.noise_multiplier, self.grid_bits)  # refuses a z 2^k out of the sampler's range

    is_private = True

    @property
    def variance(self) -> int:
        """s, the noise's variance parameter in grid units (``grid_variance``)."""
        return grid_variance(self.noise_multiplier, self.grid_bits)

    @property
    def event(self) -> DiscreteGaussianDpEvent:
        return DiscreteGaussianDpEvent(self.noise_multiplier, self.grid_bits, self.dimension)

    def with_multiplier(self, noise_multiplier: float) -> "DiscreteGaussianMechanism":
        """The same mechanism at another noise multiplier."""
        return DiscreteGaussianMechanism(noise_multiplier, self.grid_bits, self.dimension)

    def draws(self, streams: NoiseStreams, shape: tuple[int, ...]) -> torch.Tensor:
        """N_Z(0, s) draws [clients, *shape] (int64) from each client's secure stream (``streams.secure()``): what
        ``__call__`` adds in grid units."""
        return discrete_gaussian_draws(streams.secure(), self.variance, tuple(shape))

    def __call__(self, value: torch.Tensor, sensitivity: torch.Tensor, randomness: torch.Tensor):
        """Row i: gamma_i (round(value_i / gamma_i) + draws_i): value [clients, d], sensitivity [clients] (l2),
        ``randomness`` the int64 ``draws`` [clients, d]. Returns (released value, event)."""
        if value.shape[-1] != self.dimension or tuple(randomness.shape) != tuple(value.shape):
            raise ValueError(f"a value of shape {tuple(value.shape)} and draws of {tuple(randomness.shape)} for a "
                             f"mechanism declared on {self.dimension} coordinates")
        if randomness.dtype != torch.int64:
            raise ValueError(f"the discrete Gaussian mechanism adds int64 draws, not {randomness.dtype}")
        gamma = grid_steps(sensitivity, self.grid_bits).to(value.device).reshape(-1, *([1] * (value.dim() - 1)))
        if float(gamma.min()) < torch.finfo(value.dtype).tiny:
            raise ValueError(f"a grid step {float(gamma.min()):.3g} below {value.dtype}'s smallest normal number")
        scaled = value.double() / gamma  # exact: gamma is a power of two
        finite = torch.isfinite(scaled)
        grid = torch.round(torch.where(finite, scaled, 0.0).clamp(-2.0**52, 2.0**52)).to(torch.int64)
        released = ((grid + randomness.to(value.device)).double() * gamma).to(value.dtype)
        return torch.where(finite, released, value), self.event
