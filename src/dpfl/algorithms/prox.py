"""Proximal operators of the non-smooth part f1 of a composite loss f(w, x) = f0(w, x) + f1(w) (Lowy, Ghafelebashi,
Razaviyayn 2023, Sec. 2), and the gradient mapping, the stationarity measure of proximal methods.

    prox_{eta f1}(z) = argmin_y  eta f1(y) + (1/2) ||y - z||^2

Closed forms (lambda = ``strength``, alpha = ``l1_ratio``, rho = ``radius``; soft(z, t)_k = sign(z_k) max(|z_k| - t, 0)):

* ``none``:        f1 = 0,                                         prox = z
* ``l1``:          f1 = lambda ||w||_1,                            prox = soft(z, eta lambda)
* ``l2``:          f1 = (lambda / 2) ||w||^2,                      prox = z / (1 + eta lambda)
* ``elastic_net``: f1 = lambda (alpha ||w||_1 + (1 - alpha)/2 ||w||^2),
                                                                   prox = soft(z, eta lambda alpha) / (1 + eta lambda (1 - alpha))
* ``l2_ball``:     f1 = indicator of {||w||_2 <= rho},             prox = z min(1, rho / ||z||)
* ``box``:         f1 = indicator of [-rho, rho]^d,                prox = clamp(z, -rho, rho)

(the elastic net's is the l2 prox after the l1 prox: its objective is separable per coordinate, and the minimiser of
eta lambda alpha |y| + eta lambda (1 - alpha) y^2 / 2 + (y - z)^2 / 2 is soft(z, eta lambda alpha) / (1 + eta lambda
(1 - alpha)) by the first-order condition). The gradient mapping (Lowy et al. 2023, Sec. 3)

    G_eta(w) = (w - prox_{eta f1}(w - eta grad F0(w))) / eta

is zero exactly at the stationary points of F0 + f1, and equals grad F0(w) when f1 = 0.

Every operator acts on the last axis, so a leading row axis (one independent model per row) is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dpfl.errors import ConfigError, check_range

REGULARIZERS = ("none", "l1", "l2", "elastic_net", "l2_ball", "box")


def soft_threshold(z: torch.Tensor, threshold: float) -> torch.Tensor:
    """sign(z) max(|z| - t, 0), coordinate-wise: the prox of t ||.||_1."""
    return torch.sign(z) * torch.clamp(z.abs() - threshold, min=0.0)


@dataclass(frozen=True)
class Regularizer:
    """f1, one of ``REGULARIZERS`` with its parameters (see the module docstring)."""

    name: str = "none"
    strength: float = 0.0
    l1_ratio: float = 0.5
    radius: float = 1.0

    def __post_init__(self):
        if self.name not in REGULARIZERS:
            raise ConfigError("algorithm.regularizer", self.name, f"one of {list(REGULARIZERS)}")
        check_range("algorithm.reg_strength", self.strength, 0.0)
        check_range("algorithm.l1_ratio", self.l1_ratio, 0.0, 1.0)
        check_range("algorithm.radius", self.radius, 0.0, low_open=True)

    @property
    def l1(self) -> float:
        """The coefficient of ||w||_1 in f1."""
        return {"l1": self.strength, "elastic_net": self.strength * self.l1_ratio}.get(self.name, 0.0)

    @property
    def l2(self) -> float:
        """The coefficient of ||w||^2 / 2 in f1."""
        return {"l2": self.strength, "elastic_net": self.strength * (1.0 - self.l1_ratio)}.get(self.name, 0.0)

    def prox(self, z: torch.Tensor, eta: float) -> torch.Tensor:
        """prox_{eta f1}(z), row-wise over the last axis."""
        check_range("eta", eta, 0.0, low_open=True)
        if self.name == "l2_ball":
            norm = z.norm(dim=-1, keepdim=True)
            return z * torch.clamp(self.radius / norm.clamp_min(torch.finfo(z.dtype).tiny), max=1.0)
        if self.name == "box":
            return z.clamp(-self.radius, self.radius)
        return soft_threshold(z, eta * self.l1) / (1.0 + eta * self.l2)

    def value(self, w: torch.Tensor) -> float:
        """f1(w) (inf outside the constraint set of an indicator, up to a relative 1e-5 for float32 round-off)."""
        w = w.double()
        if self.name == "l2_ball":
            return 0.0 if float(w.norm()) <= self.radius * (1 + 1e-5) else math.inf
        if self.name == "box":
            return 0.0 if float(w.abs().max()) <= self.radius * (1 + 1e-5) else math.inf
        return self.l1 * float(w.abs().sum()) + 0.5 * self.l2 * float(w.square().sum())

    def gradient_mapping(self, w: torch.Tensor, grad: torch.Tensor, eta: float) -> torch.Tensor:
        """G_eta(w) = (w - prox_{eta f1}(w - eta grad)) / eta, ``grad`` the gradient of the smooth part F0 at w."""
        return (w - self.prox(w - eta * grad, eta)) / eta


__all__ = ["REGULARIZERS", "Regularizer", "soft_threshold"]
