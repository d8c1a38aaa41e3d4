"""Privacy loss distribution (PLD) accounting: a thin wrapper over ``dp_accounting.pld.PLDAccountant``.

The PLD accountant (Koskela et al. 2020; Doroshenko et al. 2022, "Connect the dots"; dp_accounting docs,
https://github.com/google/differential-privacy/tree/main/python/dp_accounting) composes discretised privacy loss
distributions by FFT and reads epsilon(delta) off the composition: tight up to the discretisation.

Discretisation: privacy losses are rounded to a grid of step ``VALUE_DISCRETIZATION_INTERVAL`` = 1e-4 (dp_accounting's
default). At 1e-4 every PLD number of the accounting test vectors (shared notes, anchors.md) comes out within 1e-3
relative (checked by tests/accounting/test_vectors.py); at 1e-3 they are up to 1.6% too high, at 1e-2 up to 80%.
dp_accounting's PLD constructors round *pessimistically* (``pessimistic_estimate=True``: losses rounded up), so the
epsilon reported is an upper bound on the true one, not merely an estimate.

Supported events are dp_accounting's (Gaussian, Laplace, discrete Laplace, randomized response, mixtures of Gaussians,
Poisson sampling around Gaussian or Laplace, truncated subsampled Gaussian, and compositions of those). Sampling
without replacement and dpfl's own events are not: use the RDP accountant (``accountant="rdp"``) for them.
"""

from __future__ import annotations

import math

from dp_accounting import dp_event, privacy_accountant
from dp_accounting.pld import pld_privacy_accountant

from dpfl.errors import ConfigError

NeighborRel = privacy_accountant.NeighboringRelation

#: Grid step of the discretised privacy losses (see the module docstring).
VALUE_DISCRETIZATION_INTERVAL = 1e-4


def pld_accountant(
    event: dp_event.DpEvent,
    neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
) -> pld_privacy_accountant.PLDAccountant:
    """A ``PLDAccountant`` that has composed ``event``.

    Raises:
      ConfigError (field ``accountant``) if dp_accounting's PLD accountant does not support ``event`` under
      ``neighboring_relation``; the message names the offending sub-event and suggests ``accountant="rdp"``.
    """
    accountant = pld_privacy_accountant.PLDAccountant(neighboring_relation, value_discretization_interval)
    try:
        return accountant.compose(event)
    except privacy_accountant.UnsupportedEventError as err:
        raise ConfigError(
            "accountant",
            "pld",
            f"'rdp' for this event: the PLD accountant cannot compose it under {neighboring_relation.name} ({err})",
        ) from err


def pld_epsilon(
    event: dp_event.DpEvent,
    delta: float,
    neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """Smallest epsilon with ``event`` (epsilon, delta)-DP by its discretised PLD; +inf if none, never NaN or < 0."""
    epsilon = pld_accountant(event, neighboring_relation, value_discretization_interval).get_epsilon(delta)
    return math.inf if math.isnan(epsilon) else max(0.0, float(epsilon))


def pld_delta(
    event: dp_event.DpEvent,
    epsilon: float,
    neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """Smallest delta with ``event`` (epsilon, delta)-DP by its discretised PLD, in [0, 1]."""
    delta = pld_accountant(event, neighboring_relation, value_discretization_interval).get_delta(epsilon)
    return 1.0 if math.isnan(delta) else min(1.0, max(0.0, float(delta)))


__all__ = ["VALUE_DISCRETIZATION_INTERVAL", "pld_accountant", "pld_epsilon", "pld_delta"]
