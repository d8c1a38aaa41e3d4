"""Noise mechanisms that carry their privacy event (docs/architecture.md).

A mechanism object binds the noise it adds to the event that describes it: the simulator reads ``.event`` to account
for a round *before* it runs (so a budget can stop it), and every call returns the event its noise was drawn from,
which the simulator checks against what was declared. The noise's scale is read from that event in one place,
``gaussian_noise`` / ``laplace_noise`` / ``skellam_noise`` / ``BinomialBits`` and ``randomised_rounding`` (the only
functions of dpfl that draw noise; a test scans the package for others), so the noise cannot change without its event
changing.

Noise is calibrated to a per-client sensitivity Delta_i (a [clients] tensor: clients may have different batch sizes)
and a noise multiplier z: std_i = z * Delta_i, so every client's release is the same mechanism Gaussian(z) in
sensitivity units.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.accounting.events import SkellamDpEvent
from dpfl.errors import check_range


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
