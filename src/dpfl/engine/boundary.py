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
  With ``shuffle="real"`` (privacy.shuffler) the stage is the real shuffler of labelled bits
  (``dpfl.protocols.shuffler``, Cheu et al. 2021): every client sends messages ``ones`` [clients, d] (its 1-bits
  per coordinate) and ``slots`` [clients] (its messages per coordinate), the stage expands them into (label, bit)
  messages, permutes ALL of them uniformly (the server's "shuffle" stream) and hands the server only what the
  shuffled multiset says: the 1-bits per label and the messages per label. That is a function of the cohort's sums
  alone, so every observer is charged as behind secure aggregation (the aggregate).
* ``trusted``: a trusted aggregator; the server sees every message but is no observer, only released models are.

``released`` (privacy.release) says which models a third party sees: every round's, or only the run's final one
(then an algorithm that declares its rounds as hidden steps is accounted by the last-iterate accountant).
``cohort`` (privacy.cohort) says who besides the server learns who takes part (``observers.cohort_known_to``: behind
secure aggregation the members do, whatever it says).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import (BOUNDARIES, RELEASES, Cohort, Release, cohort_known_to, observer_events,
                                       observers_of)
from dpfl.engine import randomness
from dpfl.engine.protocol import Messages
from dpfl.engine.secure_sum import SecureAggregation
from dpfl.errors import ConfigError
from dpfl.protocols.shuffler import shuffled_sum

#: privacy.shuffler: the simulated permutation of whole messages, or the real shuffler of labelled bits
SHUFFLES = ("simulated", "real")


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

    def __init__(self, name: str = "plain", secure: SecureAggregation | None = None, released: str = "every_round",
                 shuffle: str = "simulated", cohort: str = "secret"):
        if name not in BOUNDARIES:
            raise ConfigError("privacy.boundary", name, f"one of {list(BOUNDARIES)}")
        if secure is not None and name != "secagg":
            raise ConfigError("privacy.boundary", name, "'secagg' with privacy.secure_aggregation = true")
        if released not in RELEASES:
            raise ConfigError("privacy.release", released, f"one of {list(RELEASES)}")
        if shuffle not in SHUFFLES:
            raise ConfigError("privacy.shuffler", shuffle, f"one of {list(SHUFFLES)}")
        if shuffle == "real" and name != "shuffler":
            raise ConfigError("privacy.boundary", name, "'shuffler' with privacy.shuffler = 'real'")
        self.name, self.secure, self.released, self.shuffle = name, secure, released, shuffle
        self.cohort = cohort
        cohort_known_to(self.seen_as, cohort)  # a bad privacy.cohort is refused here, naming the key

    @property
    def observers(self) -> tuple[str, ...]:
        return observers_of(self.name)

    @property
    def enforcement(self) -> str:
        """How this run enforces what the ledger charges the server (results.json's ``privacy.enforced``)."""
        if self.name == "secagg":
            return ("the secure aggregation protocol computes each sum (Bonawitz et al. 2017)" if self.secure else
                    "simulated: the ledger charges the server only the sum, which a deployment must enforce with "
                    "privacy.secure_aggregation = true")
        if self.name == "shuffler":
            return ("the shuffle stage runs for real in this process; in a deployment the shuffler must be a party "
                    "other than the server" if self.shuffle == "real" else
                    "simulated: the ledger charges the server the shuffled messages, which a deployment must enforce "
                    "with a shuffler that is not the server")
        if self.name == "trusted":
            return "declared: the server is trusted (no server epsilon), it receives every message in the clear"
        return "nothing to enforce: the server is charged every message it receives"

    @property
    def knows_cohort(self) -> frozenset[str]:
        """The observers that know who takes part in each round (``observers.cohort_known_to``)."""
        return cohort_known_to(self.seen_as, self.cohort)

    @property
    def seen_as(self) -> str:
        """The boundary the observers' events are derived for: the real shuffler delivers sums only (as secagg)."""
        return "secagg" if self.shuffle == "real" else self.name

    def views(self, release: Release, cohort: Cohort, analysis: str) -> dict[str, dp_event.DpEvent]:
        """Each observer's event of the round (``dpfl.accounting.observers.observer_events``)."""
        return observer_events(release, cohort, self.seen_as, analysis, self.released, self.knows_cohort)

    @property
    def real(self) -> bool:
        """Whether ``collect`` runs a real stage (secure aggregation by the protocol, the real shuffler), rather than
        delivering the cohort's sum, or its rows, as a simulated one does."""
        return self.secure is not None or self.shuffle == "real"

    def collect(self, chunks: list[Messages], population: int, seed: int, round_index: int,
                clients: torch.Tensor | None = None, stream_ids: torch.Tensor | None = None) -> Delivery:
        """The cohort's messages (one dict per memory chunk, leading client axis; ``clients`` their ids, which the
        real secure aggregation needs, and ``stream_ids`` the names of their streams when they are not the ids, as
        for the audit's trials: ``dpfl.engine.protocol.ClientContext``) as the server receives them."""
        rows = concatenated(chunks)
        count = int(next(iter(rows.values())).shape[0]) if rows else 0
        if self.secure is not None and count:
            if clients is None or clients.numel() != count:
                raise ValueError(f"secure aggregation needs the ids of the {count} clients whose messages these are")
            sums, contributors = self.secure.sum(rows, clients, seed, round_index, stream_ids)
            return Delivery(sums, len(contributors), population)
        if self.shuffle == "real" and count:
            return self._shuffled(rows, count, population, seed, round_index)
        sums = {name: value.sum(0) for name, value in rows.items()}  # one sum over the cohort: chunking cannot change it
        if self.name in ("secagg", "trusted"):
            return Delivery(sums, count, population)
        if self.name == "shuffler" and count:
            order = torch.randperm(count, generator=randomness.generator(seed, round_index, randomness.SERVER,
                                                                         "shuffle"))
            rows = {name: value[order] for name, value in rows.items()}
        return Delivery(sums, count, population, rows)

    def summed(self, sums: Messages, count: int, population: int) -> Delivery:
        """What a simulated stage delivers of a cohort whose messages were added up elsewhere (the ranks' all_reduce,
        ``dpfl.engine.ranks``): their ``sums`` and ``count``, all that any server step reads. A real stage runs over
        the rows themselves (ValueError)."""
        if self.real:
            raise ValueError("a real secure aggregation or shuffle stage needs the cohort's rows, not their sums")
        return Delivery(sums, count, population)

    @staticmethod
    def _shuffled(rows: Messages, count: int, population: int, seed: int, round_index: int) -> Delivery:
        """The real shuffle stage (module docstring): labelled bits in, what their shuffled multiset says out."""
        if set(rows) != {"ones", "slots"}:
            raise ConfigError("privacy.shuffler", "real", "'simulated' for an algorithm whose messages are not "
                                                          f"labelled bits ('ones', 'slots'; got {sorted(rows)}): "
                                                          "the sdp-* algorithms")
        ones, slots = shuffled_sum(rows["ones"], rows["slots"],
                                   randomness.generator(seed, round_index, randomness.SERVER, "shuffle"))
        return Delivery({"ones": ones, "slots": torch.tensor(slots)}, count, population)


def concatenated(chunks: list[Messages]) -> Messages:
    """The messages of a cohort's memory chunks as one dict of rows (a single chunk's own tensors, uncopied)."""
    if len(chunks) == 1:
        return dict(chunks[0])
    return {name: torch.cat([chunk[name] for chunk in chunks]) for name in (chunks[0] if chunks else [])}


__all__ = ["SHUFFLES", "Boundary", "Delivery", "SecureAggregation", "concatenated"]
