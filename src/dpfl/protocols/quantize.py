"""Discretisation of real vectors into the ring Z_(2^bits) that secure aggregation sums in, and back.

The client's value x (l2-clipped to C, so every coordinate lies in [-C, C]) is scaled by s and rounded to an integer
by unbiased randomised rounding (Agarwal, Kairouz, Liu 2021, Sec. 4; Kairouz, Liu, Steinke 2021):

    round(y) = floor(y) + 1[u < y - floor(y)],  u ~ U[0, 1),   so E[round(y)] = y,

then, for distributed DP, a share of integer Skellam noise is added (``dpfl.noise.skellam_noise``) and the
result is wrapped mod 2^bits. The server's modular sum is decoded to a signed integer in [-2^(bits-1), 2^(bits-1))
and divided by s. Decoding is exact as long as the true integer sum lies in that interval; ``check_headroom`` refuses
a configuration, before anything is encoded, when n clients' values plus the noise could leave it.

Rounding moves each coordinate by less than 1 (in integer units), so after rounding the l2 sensitivity in the data's
units is at most C + sqrt(d) / s (``rounded_l2_sensitivity``): the value to put in a ``SkellamDpEvent``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.accounting.events import SkellamDpEvent
from dpfl.noise import skellam_noise
from dpfl.errors import ConfigError, DpflError, check_range

#: Largest |s x| that float64 rounding represents exactly (2^52: integers and their halves are exact below it).
EXACT_FLOAT = 2.0**52


class OverflowRiskError(DpflError, ValueError):
    """The sum of the encoded values could wrap around mod 2^bits, so its decoding would be wrong."""


def rounded_l2_sensitivity(clip: float, scale: float, dimension: int) -> float:
    """C + sqrt(d) / s: the l2 norm bound, in the data's units, of a C-clipped d-vector after scaling by s and
    randomised rounding (each coordinate moves by less than 1 / s)."""
    check_range("clip", clip, 0)
    check_range("scale", scale, 0, low_open=True)
    check_range("dimension", dimension, 1, integer=True)
    return clip + math.sqrt(dimension) / scale


def skellam_tail_margin(variance: float, probability: float) -> float:
    """The smallest a with P(|X| >= a) <= ``probability`` by the Chernoff bound of X ~ Skellam of variance V
    (E e^{theta X} = exp(V (cosh theta - 1))): P(X >= a) <= exp(V (sqrt(1 + r^2) - 1) - a asinh(r)), r = a / V,
    doubled for both tails. 0 for V = 0."""
    check_range("variance", variance, 0)
    check_range("probability", probability, 0, 1, low_open=True, high_open=True)
    if variance == 0:
        return 0.0

    def log_tail(a: float) -> float:
        r = a / variance
        return math.log(2) + variance * (math.sqrt(1 + r * r) - 1) - a * math.asinh(r)

    low, high = 0.0, math.sqrt(variance) + 1.0
    while log_tail(high) > math.log(probability):
        low, high = high, 2 * high
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if log_tail(mid) > math.log(probability) else (low, mid)
    return high


def randomised_round(scaled: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """floor(y) + 1[u < y - floor(y)] as int64 (unbiased: E = y), with ``uniform`` U[0, 1) draws shaped like ``y``
    (float64 keeps it exact below ``EXACT_FLOAT``). Every coordinate moves by less than 1."""
    floor = torch.floor(scaled)
    return floor.to(torch.int64) + (uniform.to(scaled.dtype) < scaled - floor).to(torch.int64)


@dataclass(frozen=True)
class Discretisation:
    """Scale by ``scale``, round at random, wrap into Z_(2^bits); decode sums back to the data's units."""

    scale: float
    bits: int

    def __post_init__(self):
        check_range("scale", self.scale, 0, low_open=True)
        check_range("bits", self.bits, 2, 63, integer=True)

    @property
    def modulus(self) -> int:
        return 1 << self.bits

    def check_headroom(self, clip: float, clients: int, noise_variance: float = 0.0, dimension: int = 1,
                       failure_probability: float = 1e-9) -> int:
        """Refuses (``OverflowRiskError``) unless the sum of ``clients`` encoded values stays in
        [-2^(bits-1), 2^(bits-1)): each coordinate of a client's rounded value is at most ceil(s C) in magnitude, and
        the summed Skellam noise (variance ``noise_variance`` per coordinate, in integer units: s^2 mu) exceeds
        ``skellam_tail_margin`` in some of the ``dimension`` coordinates with probability at most
        ``failure_probability``. Returns the bound clients x ceil(s C) + margin."""
        check_range("clip", clip, 0)
        check_range("clients", clients, 1, integer=True)
        check_range("dimension", dimension, 1, integer=True)
        per_client = math.ceil(self.scale * clip)
        if per_client >= EXACT_FLOAT:
            raise OverflowRiskError(f"scale x clip = {self.scale} x {clip} = {self.scale * clip:.3g} is beyond 2^52, "
                                    "where float64 rounding is no longer exact: lower the scale or the clip")
        margin = math.ceil(skellam_tail_margin(noise_variance, failure_probability / dimension))
        bound = clients * per_client + margin
        limit = self.modulus // 2 - 1
        if bound > limit:
            raise OverflowRiskError(
                f"the sum of {clients} clients' encoded values can reach {clients} x ceil(scale {self.scale} x clip "
                f"{clip}) + noise margin {margin} = {bound}, beyond 2^(bits-1) - 1 = {limit} for bits = {self.bits}: "
                "it would wrap around mod 2^bits. Lower the scale, the clip or the cohort, or raise bits")
        return bound

    def encode(self, x: torch.Tensor, randomness: torch.Generator | torch.Tensor) -> torch.Tensor:
        """round(s x) mod 2^bits as int64 in [0, 2^bits). ``randomness``: a generator, or U[0, 1) draws shaped like
        ``x`` (a client's stream, ``dpfl.engine.randomness``)."""
        scaled = x.to(torch.float64) * self.scale
        largest = float(scaled.abs().max()) if scaled.numel() else 0.0
        if largest >= EXACT_FLOAT:
            raise ConfigError("scale", self.scale, f"a scale with |scale x value| < 2^52 (got {largest:.3g})")
        if isinstance(randomness, torch.Generator):
            uniform = torch.rand(scaled.shape, generator=randomness, dtype=torch.float64)
        elif randomness.shape != scaled.shape:
            raise ValueError(f"uniform draws of shape {tuple(randomness.shape)} for a value of {tuple(scaled.shape)}")
        else:
            uniform = randomness.to(torch.float64)
        return self.wrap(randomised_round(scaled, uniform))

    def encode_noisy(self, x: torch.Tensor, event: SkellamDpEvent, shares: int,
                     rounding: torch.Generator | torch.Tensor,
                     noise: torch.Generator) -> tuple[torch.Tensor, dp_event.DpEvent]:
        """``encode`` plus this client's share (one of ``shares``) of the event's Skellam noise, wrapped; returns the
        encoding and the event its noise was drawn from. The event's scale must be this discretisation's."""
        if event.scale != self.scale:
            raise ConfigError("event.scale", event.scale, f"the discretisation's scale {self.scale}")
        encoded = self.encode(x, rounding)
        return self.wrap(encoded + skellam_noise(event, encoded, noise, shares)), event

    def wrap(self, integers: torch.Tensor) -> torch.Tensor:
        """Integers mod 2^bits, in [0, 2^bits) (int64)."""
        return torch.remainder(integers.to(torch.int64), self.modulus)

    def decode(self, total: torch.Tensor) -> torch.Tensor:
        """The signed value of a sum mod 2^bits (in [-2^(bits-1), 2^(bits-1))) divided by s, as float64."""
        wrapped = self.wrap(total)
        signed = torch.where(wrapped >= self.modulus // 2, wrapped - self.modulus, wrapped)
        return signed.to(torch.float64) / self.scale


__all__ = ["EXACT_FLOAT", "OverflowRiskError", "randomised_round", "rounded_l2_sensitivity", "skellam_tail_margin", "Discretisation"]
