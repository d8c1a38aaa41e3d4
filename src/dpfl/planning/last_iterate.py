"""The least noise for a target (epsilon, delta) when only the last iterate is released, beside the least noise
when every iterate is (Asoodeh, Chen, Calmon, Ozgur 2021): what hiding the iterates saves.

For T = n // m disjoint batches of m users, a constant step eta and noise sigma on each user's gradient (bounded
by L), projected on the ball of radius rho, the last-iterate accountant (Theorem 2, or Corollary 3 with random
stopping) and the composition over every iterate (``last_iterate.composition_epsilon``: a user is in one step, whose
Gaussian shift is 2L / (sqrt(m) sigma)) each give the smallest sigma whose epsilon at delta is at most the target
(``calibrate.solve_noise``). dpfl's ``algorithm.noise_multiplier`` of projected noisy SGD is z = sigma / (2L).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dpfl.accounting import last_iterate
from dpfl.accounting.calibrate import last_iterate_sigma, solve_noise


@dataclass(frozen=True)
class NoisePlan:
    """The least sigma (std of each user's noise) under each accountant, and dpfl's noise multipliers z."""

    sigma_last_iterate: float
    sigma_composition: float
    steps: int
    unused_users: int

    @property
    def saving(self) -> float:
        """sigma_composition / sigma_last_iterate: how much less noise hiding the iterates needs."""
        return self.sigma_composition / self.sigma_last_iterate

    def to_dict(self, lipschitz: float) -> dict:
        return {**asdict(self), "noise_multiplier_last_iterate": self.sigma_last_iterate / (2 * lipschitz),
                "noise_multiplier_composition": self.sigma_composition / (2 * lipschitz), "saving": self.saving}


def plan_noise(target_epsilon: float, delta: float, n: int, batch_size: int, lipschitz: float, radius: float,
               lr: float, *, nonconvex: bool = False, random_stop: bool = False,
               smoothness: float | None = None) -> NoisePlan:
    """The smallest sigma under the last-iterate accountant and under composition (see the module docstring)."""
    hidden = last_iterate_sigma(target_epsilon, delta, n, batch_size, lipschitz, radius, lr, nonconvex=nonconvex,
                                random_stop=random_stop, smoothness=smoothness)
    composed = solve_noise(lambda sigma: last_iterate.composition_epsilon(delta, sigma, n, batch_size, lipschitz),
                           target_epsilon, initial_noise=hidden)
    steps = n // batch_size
    return NoisePlan(hidden, composed, steps, n - steps * batch_size)


__all__ = ["NoisePlan", "plan_noise"]
