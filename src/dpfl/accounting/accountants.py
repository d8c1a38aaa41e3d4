"""Accountants behind dp_accounting's contract (``compose(event)``, ``get_epsilon(delta)``), one per observer.

The ledger gives each observer an accountant by name (``make``), so that RDP, PLD and pure-DP basic composition are
interchangeable per observer (the last-iterate accountant joins them for runs that release only the final model):

* ``rdp``: ``dpfl.accounting.rdp.RdpAccountant`` (any event dpfl emits; a conversion and a record-level subsampling
  bound to choose); ``rdp-integer``: the same at the integer orders 2..255 only (Heikkilä et al.'s Table 1);
* ``pld``: ``PldAccountant``, dpfl's PLDs (``dpfl.accounting.pld``: participation mixtures, replace-one Gaussians in
  dpfl's convention);
* ``pure``: ``PureDpAccountant``, basic composition of pure-DP mechanisms (Laplace), delta-free (Dwork & Roth 2014,
  Thm 3.16);
* ``tightest``: ``TightestAccountant``, PLD while it supports every event composed and their PLD is of a tractable
  size (``pld.tractable``: epsilon below a few hundred), else RDP;
* ``last_iterate``: ``LastIterateDpAccountant``, the last-iterate accountant (``dpfl.accounting.last_iterate``: Asoodeh
  et al. 2021 Theorem 2 / Corollary 3, and amplification by iteration where the step says ``analysis = "sound"``)
  over the steps of a run that releases only its final model (``ProjectedStepDpEvent``). Its answer depends on the
  ORDER of the steps
  (a step's contraction hides only the steps before it), so it is in ``ORDERED``: the ledger feeds it the run's
  steps in order.
"""

from __future__ import annotations

from dp_accounting import dp_event, privacy_accountant

from dpfl.accounting import pld
from dpfl.accounting.accountant import pure_epsilon
from dpfl.accounting.events import ProjectedStepDpEvent, non_private, unsupported_part
from dpfl.accounting.last_iterate import LastIterateAccountant
from dpfl.accounting.rdp import RdpAccountant
from dpfl.errors import ConfigError

NeighborRel = privacy_accountant.NeighboringRelation
ACCOUNTANT_NAMES = ("tightest", "pld", "rdp", "rdp-integer", "pure", "last_iterate")
#: The orders of "rdp-integer": the integers 2..255, as Heikkilä et al. reproduce their Table 1 (any set of orders gives
#: a valid bound; fewer, a looser one).
INTEGER_ORDERS = tuple(range(2, 256))
#: accountants whose answer depends on the order of the events composed
ORDERED = ("last_iterate",)


class _Collecting(privacy_accountant.PrivacyAccountant):
    """Keeps the composed events; subclasses answer epsilon for their composition."""

    def __init__(self, neighboring_relation: NeighborRel):
        super().__init__(neighboring_relation)
        self._events: list[dp_event.DpEvent] = []

    def supports_event(self, event: dp_event.DpEvent) -> bool:
        """Every part of a composition supported (``supports_part``); accountants that read compositions as a whole
        override this instead."""
        if isinstance(event, dp_event.SelfComposedDpEvent):
            return self.supports_event(event.event)
        if isinstance(event, dp_event.ComposedDpEvent):
            return all(self.supports_event(e) for e in event.events)
        return self.supports_part(event)

    def supports_part(self, event: dp_event.DpEvent) -> bool:
        """Whether a single (not composed) event is supported."""
        raise NotImplementedError

    def _maybe_compose(self, event, count, do_compose):
        if not self.supports_event(event):
            part = unsupported_part(event, self.supports_event)
            return self.CompositionErrorDetails(invalid_event=part,
                                                error_message=f"{type(self).__name__} cannot compose {part}")
        if do_compose and count:
            self._events.append(event if count == 1 else dp_event.SelfComposedDpEvent(event, count))
        return None

    def composition(self) -> dp_event.DpEvent:
        if not self._events:
            return dp_event.NoOpDpEvent()
        return self._events[0] if len(self._events) == 1 else dp_event.ComposedDpEvent(list(self._events))


class PldAccountant(_Collecting):
    """dpfl's PLD of everything composed (tight up to a pessimistic 1e-4 grid)."""

    def __init__(self, neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
                 value_discretization_interval: float = pld.VALUE_DISCRETIZATION_INTERVAL):
        super().__init__(neighboring_relation)
        self._interval = value_discretization_interval

    def supports_event(self, event) -> bool:
        return pld.supports(event, self.neighboring_relation)

    def get_epsilon(self, target_delta: float) -> float:
        return pld.pld_epsilon(self.composition(), target_delta, self.neighboring_relation, self._interval)


class PureDpAccountant(_Collecting):
    """Basic composition of pure-DP events (Laplace): epsilon adds up, whatever delta."""

    def supports_part(self, event) -> bool:
        try:
            pure_epsilon(event)
        except ConfigError:
            return isinstance(event, dp_event.NonPrivateDpEvent)
        return True

    def get_epsilon(self, target_delta: float) -> float:
        if any(non_private(e) for e in self._events):
            return float("inf")
        return pure_epsilon(self.composition())


class TightestAccountant(_Collecting):
    """PLD while it supports every event composed and their PLD is tractable (``pld.tractable``), else RDP (with
    ``conversion`` and ``subsampling_bound``)."""

    def __init__(self, neighboring_relation: NeighborRel, conversion: str = "modern", subsampling_bound: str = "tight"):
        super().__init__(neighboring_relation)
        self._rdp_options = dict(conversion=conversion, subsampling_bound=subsampling_bound)

    def supports_event(self, event) -> bool:
        return pld.supports(event, self.neighboring_relation) or RdpAccountant(
            neighboring_relation=self.neighboring_relation).supports(event)

    @property
    def chosen(self) -> str:
        """The accountant that answers for the composition so far."""
        return "pld" if pld.tractable(self.composition(), self.neighboring_relation) else "rdp"

    def get_epsilon(self, target_delta: float) -> float:
        if self.chosen == "pld":
            return pld.pld_epsilon(self.composition(), target_delta, self.neighboring_relation)
        accountant = RdpAccountant(neighboring_relation=self.neighboring_relation, **self._rdp_options)
        return accountant.compose(self.composition()).get_epsilon(target_delta)


class LastIterateDpAccountant(_Collecting):
    """The last-iterate accountant over ``ProjectedStepDpEvent``s composed in the order of the run's steps (one
    run: every step has the same n, m, L, rho, stopping rule and horizon)."""

    def supports_part(self, event) -> bool:
        return isinstance(event, (ProjectedStepDpEvent, dp_event.NoOpDpEvent, dp_event.NonPrivateDpEvent))

    def steps(self) -> list[tuple[ProjectedStepDpEvent, int]]:
        """(step, count) in order."""
        found = []

        def walk(event, count: int) -> None:
            if isinstance(event, dp_event.SelfComposedDpEvent):
                walk(event.event, count * event.count)
            elif isinstance(event, dp_event.ComposedDpEvent):
                for part in event.events:
                    walk(part, count)
            elif isinstance(event, ProjectedStepDpEvent):
                found.append((event, count))

        for event in self._events:
            walk(event, 1)
        return found

    def accountant(self) -> LastIterateAccountant | None:
        """The last-iterate accountant fed the steps composed so far (None before the first)."""
        steps = self.steps()
        if not steps:
            return None
        settings = {step.setting for step, _ in steps}
        if len(settings) > 1:
            raise ValueError(f"steps of different runs composed together: {sorted(settings)}")
        n, m, lipschitz, radius, random_stop, horizon, analysis = settings.pop()
        accountant = LastIterateAccountant(n=n, batch_size=m, lipschitz=lipschitz, radius=radius,
                                           random_stop=random_stop, horizon=horizon, analysis=analysis)
        for step, count in steps:
            accountant.step(step.lr, step.sigma, nonconvex=step.nonconvex, count=count)
        return accountant

    def get_epsilon(self, target_delta: float) -> float:
        if any(non_private(e) for e in self._events):
            return float("inf")
        accountant = self.accountant()
        return 0.0 if accountant is None else accountant.epsilon(target_delta)


def make(name: str, neighboring_relation: NeighborRel, conversion: str = "modern",
         subsampling_bound: str = "tight") -> privacy_accountant.PrivacyAccountant:
    """A fresh accountant by name (one of ``ACCOUNTANT_NAMES``)."""
    if name == "tightest":
        return TightestAccountant(neighboring_relation, conversion, subsampling_bound)
    if name == "pld":
        return PldAccountant(neighboring_relation)
    if name in ("rdp", "rdp-integer"):
        return RdpAccountant(orders=INTEGER_ORDERS if name == "rdp-integer" else None,
                             neighboring_relation=neighboring_relation, conversion=conversion,
                             subsampling_bound=subsampling_bound)
    if name == "pure":
        return PureDpAccountant(neighboring_relation)
    if name == "last_iterate":
        return LastIterateDpAccountant(neighboring_relation)
    raise ConfigError("accountant", name, f"one of {list(ACCOUNTANT_NAMES)}")


def chosen_name(accountant: privacy_accountant.PrivacyAccountant) -> str:
    """The name to report for an accountant (for ``tightest``, the one that answered)."""
    if isinstance(accountant, TightestAccountant):
        return accountant.chosen
    return {PldAccountant: "pld", RdpAccountant: "rdp", PureDpAccountant: "pure",
            LastIterateDpAccountant: "last_iterate"}[type(accountant)]


__all__ = ["ACCOUNTANT_NAMES", "ORDERED", "LastIterateDpAccountant", "PldAccountant", "PureDpAccountant", "TightestAccountant", "make", "chosen_name"]
