"""The worst owner: epsilon for a record of every client, when clients' releases differ.

A record lives on one client, its owner, and a federated round releases about it what that owner's participation
releases: its own sampling ratio and noise, and (towards an observer of the aggregate) the other clients' noise in
the units of the released sum. When clients differ (record counts, weights, per-client noise), a single event per
round must hold for every owner at once; taking the worst owner's noise together with another owner's largest
sampling ratio bounds each of them, but is no owner's release, and can be far above every one of them
(``dpfl.algorithms.fedsgd_dpc``: 1.2x-1.7x).

``WorstOwnerDpEvent(events, bound)`` declares instead, per client id o, what a round releases about a record of
client o (``events[o]``), beside ``bound``, one event that dominates every part (the single-event bound above). The
guarantee is for the worst owner: a record of client o is charged the composition of the o-th parts of every round
(the same client id in every round: a client's records stay on it), so after rounds 1..T

    epsilon = max_o epsilon(E_{1,o} x ... x E_{T,o}),

each owner's composition accounted as any other (PLD or RDP), which is the exact worst case whenever each part is
(the record's owner is one client, and only its parts depend on the record). ``owner_compositions`` returns those
compositions for a ledger to account, one per distinct owner, leaving out an owner whose every part is dominated by
another owner's (``dominated``: the same mechanism with no larger sampling or participation probability and no
smaller noise multiplier, a post-processing of it, so its epsilon is no larger). Beyond ``MAX_OWNERS`` compositions
left, every ``WorstOwnerDpEvent`` is read as its ``bound`` (sound, one composition; a run of many distinct clients
then costs no more accounting than before).

An accountant that meets a ``WorstOwnerDpEvent`` outside a ledger charges its ``bound`` (``dpfl.accounting.rdp``).

The algorithms' side is ``declare_owners``: a round's single-bound ``Release`` with one release per owner beside it
(``Release.owners``), each the bound's with the owner's own draws and the shares credited for that owner alone.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import attr
from dp_accounting import dp_event

from dpfl.accounting.events import ParticipationDpEvent, WorstOwnerDpEvent

if TYPE_CHECKING:
    from dpfl.accounting.observers import Release

#: The most distinct, undominated owners whose compositions are accounted one by one (``owner_compositions``).
MAX_OWNERS = 16
#: The most clients whose releases an algorithm declares per owner (``observers.Release.owners``: each owner's release
#: holds every client's share, so the declaration grows with the square of the clients; the ledger reads at most
#: ``MAX_OWNERS`` distinct ones); beyond, the single bound.
PER_OWNER_CLIENTS = 64


def part(event: dp_event.DpEvent, owner: int | None) -> dp_event.DpEvent:
    """``event`` for a record of client ``owner``: every ``WorstOwnerDpEvent`` inside it replaced by its part
    ``owner``, or by its ``bound`` for ``owner`` = None."""
    if isinstance(event, WorstOwnerDpEvent):
        return event.bound if owner is None else event.events[owner]
    children = {f.name: getattr(event, f.name) for f in attr.fields(type(event))
                if isinstance(getattr(event, f.name), dp_event.DpEvent)}
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([part(e, owner) for e in event.events])
    if not children:
        return event
    return attr.evolve(event, **{name: part(child, owner) for name, child in children.items()})


def owners_in(event: dp_event.DpEvent) -> int | None:
    """The number of clients of the ``WorstOwnerDpEvent``s inside ``event`` (None: it holds none). A ValueError if
    two disagree: their parts must be indexed by the same client ids."""
    found = set()

    def walk(e):
        if isinstance(e, WorstOwnerDpEvent):
            found.add(len(e.events))
            return
        for child in (e.events if isinstance(e, dp_event.ComposedDpEvent) else
                      [getattr(e, f.name) for f in attr.fields(type(e))]):
            if isinstance(child, dp_event.DpEvent):
                walk(child)

    walk(event)
    if len(found) > 1:
        raise ValueError(f"per-owner events of {sorted(found)} clients composed together: one run has one population")
    return found.pop() if found else None


def dominated(a: dp_event.DpEvent, b: dp_event.DpEvent) -> bool:
    """Whether ``a`` is ``b`` with no larger sampling or participation probability and no smaller Gaussian noise
    multiplier, part by part (then every pair of neighbours of ``a`` is a post-processing of a pair of ``b``: more
    noise is added noise, and a smaller rate is a further subsample; so epsilon(a) <= epsilon(b) at every delta)."""
    if a == b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dp_event.GaussianDpEvent):
        return a.noise_multiplier >= b.noise_multiplier
    if isinstance(a, dp_event.PoissonSampledDpEvent):
        return a.sampling_probability <= b.sampling_probability and dominated(a.event, b.event)
    if isinstance(a, dp_event.SampledWithoutReplacementDpEvent):
        return (a.sample_size * b.source_dataset_size <= b.sample_size * a.source_dataset_size
                and dominated(a.event, b.event))
    if isinstance(a, ParticipationDpEvent):
        return a.probability <= b.probability and dominated(a.event, b.event)
    if isinstance(a, dp_event.SelfComposedDpEvent):
        return a.count == b.count and dominated(a.event, b.event)
    if isinstance(a, dp_event.ComposedDpEvent):
        return len(a.events) == len(b.events) and all(dominated(x, y) for x, y in zip(a.events, b.events))
    return False


def owner_compositions(composed: list[tuple[dp_event.DpEvent, int]]) -> list[list[tuple[dp_event.DpEvent, int]]]:
    """The compositions (event, count) whose largest epsilon is the worst owner's (module docstring): ``composed``
    itself when it holds no ``WorstOwnerDpEvent``; else one per distinct, undominated owner, or, beyond
    ``MAX_OWNERS`` of them, the bounds' one."""
    clients = owners_in(dp_event.ComposedDpEvent([e for e, _ in composed]))
    if not clients:
        return [composed]
    distinct = {}
    for owner in range(clients):
        parts = [(part(e, owner), count) for e, count in composed]
        distinct.setdefault(repr(parts), parts)
    candidates = list(distinct.values())
    kept = [c for i, c in enumerate(candidates)
            if not any(j != i and _dominates(other, c) and (not _dominates(c, other) or j < i)
                       for j, other in enumerate(candidates))]
    if len(kept) > MAX_OWNERS:
        return [[(part(e, None), count) for e, count in composed]]
    return kept


def declare_owners(bound: "Release", own_steps: Callable[[int], tuple], shares: tuple) -> "Release":
    """``bound`` with each owner's release (``Release.owners``): client o's is ``bound``'s with ``own_steps(o)``
    (its draws at its own noise and sampling ratio) and ``shares`` (every client's (noise std, sensitivity) of an
    additive draw, in the units of the released aggregate) credited for owner o alone (``Release.owner``). ``bound``
    alone when it holds for every owner (every owner's draws are its draws and every share is the same) or beyond
    ``PER_OWNER_CLIENTS`` = ``len(shares)`` clients (each owner's release holds every share: quadratic in the
    clients). Sound whenever ``bound`` dominates every owner's release, which the ledger then charges for the
    owner's records (module docstring)."""
    if len(shares) > PER_OWNER_CLIENTS:
        return bound
    steps = [tuple(own_steps(o)) for o in range(len(shares))]
    if all(s == bound.step_events for s in steps) and len(set(shares)) == 1:
        return bound
    owners = tuple(dataclasses.replace(bound, step_events=s, sensitivity_ratio=1.0, shares=shares, owner=o, owners=())
                   for o, s in enumerate(steps))
    return dataclasses.replace(bound, owners=owners)


def _dominates(b: list, a: list) -> bool:
    """Whether composition ``b`` dominates composition ``a`` part by part (the same counts)."""
    return all(ca == cb and dominated(ea, eb) for (ea, ca), (eb, cb) in zip(a, b))


__all__ = ["MAX_OWNERS", "PER_OWNER_CLIENTS", "WorstOwnerDpEvent", "declare_owners", "dominated", "owner_compositions",
           "owners_in", "part"]
