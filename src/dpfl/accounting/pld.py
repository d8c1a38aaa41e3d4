"""Privacy loss distribution (PLD) accounting over dp_accounting's ``PrivacyLossDistribution``.

The PLD accountant (Koskela et al. 2020; Doroshenko et al. 2022, "Connect the dots"; dp_accounting docs,
https://github.com/google/differential-privacy/tree/main/python/dp_accounting) composes discretised privacy loss
distributions by FFT and reads epsilon(delta) off the composition: tight up to the discretisation.

``pld_of(event)`` builds the PLD of an event recursively:

* composition (``ComposedDpEvent``, ``SelfComposedDpEvent``) convolves PLDs;
* ``ParticipationDpEvent(p, inner)`` is the mixture (1 - p) identity + p PLD(inner): with probability 1 - p the
  owner is absent and the privacy loss is 0, else it is the inner event's. This is the exact PLD of the pair where the
  observer learns whether the owner took part, which dominates any observer who does not (joint convexity of the
  hockey-stick divergence);
* every other event is handed to dp_accounting's ``PLDAccountant`` (Gaussian, Laplace, discrete Laplace, randomized
  response, mixtures of Gaussians, Poisson sampling around Gaussian or Laplace).

**Replace-one Gaussians.** dpfl's convention (``dpfl.accounting.events``): ``GaussianDpEvent(z)`` under replace-one
neighbouring has std z times the replace-one sensitivity (the distance between the statistic on the two datasets).
dp_accounting's PLD reads a replace-one Gaussian as two sensitivities apart (its RDP accountant does not), so this
module hands it ``GaussianDpEvent(2 z)``; both accountants then agree (tests check PLD <= RDP on every event both
support).

Discretisation: privacy losses are rounded to a grid of step ``VALUE_DISCRETIZATION_INTERVAL`` = 1e-4 (dp_accounting's
default). At 1e-4 every PLD number of the accounting test vectors comes out within 1e-3 relative (checked by
tests/accounting/test_vectors.py); at 1e-3 they are up to 1.6% too high, at 1e-2 up to 80%. Losses are rounded
*pessimistically* (up), so the epsilon reported is an upper bound on the true one, not merely an estimate.

Not supported: sampling without replacement (use the RDP accountant, ``accountant="rdp"``), dpfl's Skellam and
disjoint-union events.
"""

from __future__ import annotations

import math

import attr
from dp_accounting import dp_event, privacy_accountant
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution

from dpfl.accounting.events import ParticipationDpEvent
from dpfl.errors import ConfigError

NeighborRel = privacy_accountant.NeighboringRelation

#: Grid step of the discretised privacy losses (see the module docstring).
VALUE_DISCRETIZATION_INTERVAL = 1e-4

_CACHE: dict = {}  # (repr(event), relation, interval) -> PLD; PLDs are never modified in place
_CACHE_SIZE = 64


def supports(event: dp_event.DpEvent, neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE) -> bool:
    """Whether ``pld_of`` can build the PLD of ``event`` under ``neighboring_relation``."""
    return _unsupported(event, neighboring_relation) is None


def pld_of(
    event: dp_event.DpEvent,
    neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
) -> privacy_loss_distribution.PrivacyLossDistribution | None:
    """The PLD of ``event`` (see the module docstring); None for an event that is not private at all.

    Raises:
      ConfigError (field ``accountant``) if some part of ``event`` has no PLD here; the message names it and suggests
      ``accountant="rdp"``.
    """
    problem = _unsupported(event, neighboring_relation)
    if problem is not None:
        raise ConfigError(
            "accountant", "pld",
            f"'rdp' for this event: the PLD accountant cannot compose {problem} under {neighboring_relation.name}")
    key = (repr(event), neighboring_relation, value_discretization_interval)
    if key not in _CACHE:  # a run accounts the same round event again and again
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _build(event, neighboring_relation, value_discretization_interval)
    return _CACHE[key]


def pld_epsilon(
    event: dp_event.DpEvent,
    delta: float,
    neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """Smallest epsilon with ``event`` (epsilon, delta)-DP by its discretised PLD; +inf if none, never NaN or < 0."""
    pld = pld_of(event, neighboring_relation, value_discretization_interval)
    if pld is None:
        return math.inf
    epsilon = pld.get_epsilon_for_delta(delta)
    return math.inf if math.isnan(epsilon) else max(0.0, float(epsilon))


def pld_delta(
    event: dp_event.DpEvent,
    epsilon: float,
    neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """Smallest delta with ``event`` (epsilon, delta)-DP by its discretised PLD, in [0, 1]."""
    pld = pld_of(event, neighboring_relation, value_discretization_interval)
    if pld is None:
        return 1.0
    delta = pld.get_delta_for_epsilon(epsilon)
    return 1.0 if math.isnan(delta) else min(1.0, max(0.0, float(delta)))


def _unsupported(event, relation) -> str | None:
    """Why ``event`` has no PLD here (the offending sub-event), or None."""
    if isinstance(event, (dp_event.SelfComposedDpEvent, ParticipationDpEvent)):
        return _unsupported(event.event, relation)
    if isinstance(event, dp_event.ComposedDpEvent):
        return next(filter(None, (_unsupported(e, relation) for e in event.events)), None)
    accountant = pld_privacy_accountant.PLDAccountant(relation)
    return None if accountant.supports(_dp_accounting_reading(event, relation)) else repr(event)


def _build(event, relation, interval):
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return None
    if isinstance(event, dp_event.SelfComposedDpEvent):
        inner = _build(event.event, relation, interval)
        return inner if inner is None or event.count == 1 else (
            privacy_loss_distribution.identity(interval) if event.count == 0 else inner.self_compose(event.count))
    if isinstance(event, dp_event.ComposedDpEvent):
        total = privacy_loss_distribution.identity(interval)
        for part in event.events:
            pld = _build(part, relation, interval)
            if pld is None:
                return None
            total = total.compose(pld)
        return total
    if isinstance(event, ParticipationDpEvent):
        inner = _build(event.event, relation, interval)
        if inner is None:
            return None if event.probability > 0 else privacy_loss_distribution.identity(interval)
        return inner.compute_mixture(privacy_loss_distribution.identity(interval), event.probability)
    accountant = pld_privacy_accountant.PLDAccountant(relation, interval)
    accountant.compose(_dp_accounting_reading(event, relation))
    if accountant._contains_non_dp_event:  # noqa: SLF001 (dp_accounting keeps this flag private)
        return None
    return accountant._pld  # noqa: SLF001


def _dp_accounting_reading(event, relation):
    """``event`` as dp_accounting's PLD reads dpfl's convention: under replace-one, a Gaussian's noise multiplier is
    relative to the replace-one distance, which dp_accounting's PLD takes to be twice its unit."""
    if relation != NeighborRel.REPLACE_ONE:
        return event
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(2 * event.noise_multiplier)
    children = {f.name: getattr(event, f.name) for f in attr.fields(type(event))
                if isinstance(getattr(event, f.name), dp_event.DpEvent)}
    if not children:
        return event
    return attr.evolve(event, **{name: _dp_accounting_reading(child, relation) for name, child in children.items()})


__all__ = ["VALUE_DISCRETIZATION_INTERVAL", "supports", "pld_of", "pld_epsilon", "pld_delta"]
