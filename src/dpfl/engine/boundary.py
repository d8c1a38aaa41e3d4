"""Trust boundaries: what the server receives of the cohort's messages, and what each observer therefore sees.

A boundary is a stage in the data path that owns both sides of one decision: what it does to the messages
(``collect``) and which observer sees what (``views``, through ``dpfl.accounting.observers``, the one place where
per-observer events are derived). The server's step reads only the ``Delivery`` the boundary hands it.

* ``plain``: the server sees every client's message (and who sent it).
* ``secagg``: secure aggregation; the server sees only the cohort's sum. Simulated by summing, or, given a
  ``SecureAggregation`` (``privacy.secure_aggregation = true``), computed by the real protocol
  (``dpfl.engine.secure_sum``: quantise, mask, sum mod 2^bits, decode; dropouts down to its threshold).
* ``shuffler``: the server sees the messages as an unlabelled multiset (a uniform permutation, drawn from the
  round's own stream). Charged as plain towards the server: one record-level message is no more private for lacking
  its sender unless the messages are local randomisers (the shuffle accountant, ``dpfl.accounting.shuffle``).
* ``trusted``: a trusted aggregator; the server sees every message but is no observer, only released models are.

``released`` (privacy.release) says which models a third party sees: every round's, or only the run's final one
(then an algorithm that declares its rounds as hidden steps is accounted by the last-iterate accountant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import BOUNDARIES, RELEASES, Cohort, Release, observer_events, observers_of
from dpfl.engine import randomness
from dpfl.engine.protocol import Messages
from dpfl.engine.secure_sum import SecureAggregation
from dpfl.errors import ConfigError


@dataclass
class Delivery:
    """What reaches the server's step: the sums of the cohort's messages, their number, the population, and the
    per-client rows where the boundary lets the server see them."""

    sums: Messages
    count: int
    population: int
    messages: Messages | None = None

    def sum(self, name: str) -> torch.Tensor:
        return self.sums[name]

    def rows(self, name: str) -> torch.Tensor:
        if self.messages is None:
            raise ValueError(f"the server cannot see individual messages {name!r} behind this boundary")
        return self.messages[name]


class Boundary:
    """One of ``BOUNDARIES`` (see the module docstring)."""

    def __init__(self, name: str = "plain", secure: SecureAggregation | None = None, released: str = "every_round"):
        if name not in BOUNDARIES:
            raise ConfigError("privacy.boundary", name, f"one of {list(BOUNDARIES)}")
        if secure is not None and name != "secagg":
            raise ConfigError("privacy.boundary", name, "'secagg' with privacy.secure_aggregation = true")
        if released not in RELEASES:
            raise ConfigError("privacy.release", released, f"one of {list(RELEASES)}")
        self.name, self.secure, self.released = name, secure, released

    @property
    def observers(self) -> tuple[str, ...]:
        return observers_of(self.name)

    def views(self, release: Release, cohort: Cohort, analysis: str) -> dict[str, dp_event.DpEvent]:
        """Each observer's event of the round (``dpfl.accounting.observers.observer_events``)."""
        return observer_events(release, cohort, self.name, analysis, self.released)

    def collect(self, chunks: list[Messages], population: int, seed: int, round_index: int,
                clients: torch.Tensor | None = None) -> Delivery:
        """The cohort's messages (one dict per memory chunk, leading client axis; ``clients`` their ids, which the
        real secure aggregation needs) as the server receives them."""
        names = list(chunks[0]) if chunks else []
        rows = {name: torch.cat([chunk[name] for chunk in chunks]) for name in names}
        count = int(next(iter(rows.values())).shape[0]) if rows else 0
        if self.secure is not None and count:
            if clients is None or clients.numel() != count:
                raise ValueError(f"secure aggregation needs the ids of the {count} clients whose messages these are")
            sums, contributors = self.secure.sum(rows, clients, seed, round_index)
            return Delivery(sums, len(contributors), population)
        sums = {name: value.sum(0) for name, value in rows.items()}  # one sum over the cohort: chunking cannot change it
        if self.name in ("secagg", "trusted"):
            return Delivery(sums, count, population)
        if self.name == "shuffler" and count:
            order = torch.randperm(count, generator=randomness.generator(seed, round_index, randomness.SERVER,
                                                                         "shuffle"))
            rows = {name: value[order] for name, value in rows.items()}
        return Delivery(sums, count, population, rows)


__all__ = ["Boundary", "Delivery", "SecureAggregation"]
