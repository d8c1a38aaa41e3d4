"""Noise mechanisms that carry their privacy event (ARCHITECTURE principle 1).

A mechanism object binds the noise it adds to the event that describes it: the simulator reads ``.event`` to account
for a round *before* it runs (so a budget can stop it), and every call returns the event of the noise it actually
drew, which the simulator checks against what was declared. Changing the noise without changing the event is
impossible: both come from the same two numbers.

Noise is calibrated to a per-client sensitivity Delta_i (a [clients] tensor: clients may have different batch sizes)
and a noise multiplier z: std_i = z * Delta_i, so every client's release is the same mechanism Gaussian(z) in
sensitivity units.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.errors import check_range


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

    def __call__(self, value: torch.Tensor, sensitivity: torch.Tensor, generator: torch.Generator):
        """Adds noise row-wise: value [clients, P], sensitivity [clients] (l2). Returns (noisy value, event)."""
        if not self.is_private:
            return value, self.event
        std = (self.noise_multiplier * sensitivity).to(value.dtype).unsqueeze(-1)
        noise = torch.randn(value.shape, generator=generator, dtype=value.dtype)
        return value + std * noise, self.event


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

    def __call__(self, value: torch.Tensor, sensitivity: torch.Tensor, generator: torch.Generator):
        scale = (self.scale_multiplier * sensitivity).to(value.dtype).unsqueeze(-1)
        # Lap(0, 1) = E1 - E2 for independent Exp(1) draws (always finite, unlike log of a uniform that can be 0)
        exponentials = torch.empty((2, *value.shape), dtype=value.dtype).exponential_(generator=generator)
        noise = exponentials[0] - exponentials[1]
        return value + scale * noise, self.event
