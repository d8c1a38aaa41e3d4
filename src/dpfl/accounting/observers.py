"""What each observer of a federated run sees, as privacy events (ARCHITECTURE principle 2).

A record lives on one client. One local step of that client releases a noisy statistic described by a *step event*
(record sampling around a noise mechanism, e.g. SampledWithoutReplacement(R, sR, Gaussian(sigma_g))). Who sees what:

* ``server`` (honest but curious) sees every client message and knows the cohort: no amplification by user
  sampling and no averaging with other clients' noise. With secure aggregation it only sees the cohort's sum.
* ``third_party`` sees released global models only: the cohort's noise adds up (Gaussian shares of n clients sum to a
  Gaussian with sqrt(n) times the noise multiplier, seed 002 Thm 4.7; seed 000 App. B uses sigma_g sqrt(lM)) and the
  record's user is in the cohort with probability l = cohort/population (fixed-size sampling without replacement,
  amplified with Wang et al. 2019, seed 000 App. B).
* ``other_silo`` sees global models (broadcast to it), knows whether it was itself in the cohort, and knows its own
  update, so it can subtract its own noise share from the aggregate (seed 002: shares must reach the target without
  one client, sigma / sqrt(N - 1)): it is credited the noise of the cohort minus itself, and no user-sampling
  amplification.
"""

from __future__ import annotations

import math

import attr
from dp_accounting import dp_event

THIRD_PARTY = "third_party"
SERVER = "server"
OTHER_SILO = "other_silo"
OBSERVERS = (THIRD_PARTY, SERVER, OTHER_SILO)

BOUNDARIES = ("plain", "secagg")


def scale_noise(event: dp_event.DpEvent, factor: float) -> dp_event.DpEvent:
    """Returns ``event`` with every Gaussian noise multiplier multiplied by ``factor``.

    Used to describe the sum of ``factor**2`` independent clients' noise shares: each client's share has the same
    sensitivity (one record changes one client's clipped sum), so the sum's noise multiplier is sqrt(n) z.
    """
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier * factor)
    if isinstance(event, (dp_event.NoOpDpEvent, dp_event.NonPrivateDpEvent)):
        return event
    children = {
        field.name: getattr(event, field.name)
        for field in attr.fields(type(event))
        if isinstance(getattr(event, field.name), dp_event.DpEvent)
    }
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([scale_noise(e, factor) for e in event.events])
    if not children:
        raise ValueError(
            f"cannot aggregate noise of {type(event).__name__} across clients: only Gaussian noise shares sum to a "
            "mechanism of the same family"
        )
    return attr.evolve(event, **{name: scale_noise(child, factor) for name, child in children.items()})


def round_events(
    step_event: dp_event.DpEvent,
    local_steps: int,
    num_clients: int,
    cohort_size: int,
    boundary: str = "plain",
    client_sampling: str = "fixed",
    sensitivity_ratio: float = 1.0,
) -> dict[str, dp_event.DpEvent]:
    """Events of one round for every observer, given one local step's event of one client.

    Args:
      step_event: what one client releases per local step about its records (sampling around noise).
      local_steps: K, the number of noisy local steps per round (all visible to the observer through the update).
      num_clients: M, the population the cohort is drawn from (fixed size, without replacement).
      cohort_size: floor(l M), the clients sampled this round.
      boundary: "plain" (the server sees each client's message) or "secagg" (the server sees only their sum).
      client_sampling: "fixed" (cohort of exactly cohort_size) or "poisson" (each client independently). With
        Poisson the cohort's size is random, so the third party gets no credit for the other clients' noise (its view
        is post-processing of the record owner's message alone, valid whatever the cohort) and, conservatively, no
        amplification by user sampling either: Poisson sampling around a K-fold composition needs the general Poisson
        bound of Zhu & Wang 2019, which is not implemented yet.
      sensitivity_ratio: min_j Delta_j / max_j Delta_j over the clients' per-step sensitivities (1 when all clients
        have the same batch size). Client j's noise has std z Delta_j, so for a record of the client with the largest
        Delta the cohort's summed noise is z sqrt(Delta_max^2 + sum_{j != i} Delta_j^2) >= z Delta_max
        sqrt(1 + (n - 1) ratio^2): the noise multiplier credited for the sum of n clients' shares (n - 2 others for
        another silo, which removes its own share).
    """
    if boundary not in BOUNDARIES:
        raise ValueError(f"boundary = {boundary!r} is not allowed: expected one of {BOUNDARIES}")
    if client_sampling not in ("fixed", "poisson"):
        raise ValueError(f"client_sampling = {client_sampling!r} is not allowed: expected 'fixed' or 'poisson'")
    individual = dp_event.SelfComposedDpEvent(step_event, local_steps)
    if client_sampling == "poisson":
        aggregate = third_party = individual
    else:
        aggregate = _summed(step_event, local_steps, others=cohort_size - 1, ratio=sensitivity_ratio)
        third_party = aggregate
        if cohort_size < num_clients:
            third_party = dp_event.SampledWithoutReplacementDpEvent(num_clients, cohort_size, aggregate)
    # A silo in the cohort subtracts its own share: the owner's noise plus that of the cohort's other members.
    other_silo = individual if client_sampling == "poisson" else _summed(
        step_event, local_steps, others=max(cohort_size - 2, 0), ratio=sensitivity_ratio)
    return {
        THIRD_PARTY: third_party,
        SERVER: individual if boundary == "plain" else aggregate,
        OTHER_SILO: other_silo,
    }


def _summed(step_event: dp_event.DpEvent, local_steps: int, others: int, ratio: float) -> dp_event.DpEvent:
    """K steps of the record owner's noise summed with ``others`` clients' shares (sensitivities >= ratio times the
    owner's): noise multiplier times sqrt(1 + others ratio^2)."""
    return dp_event.SelfComposedDpEvent(scale_noise(step_event, math.sqrt(1 + others * ratio**2)), local_steps)


__all__ = ["OBSERVERS", "THIRD_PARTY", "SERVER", "OTHER_SILO", "scale_noise", "round_events"]
