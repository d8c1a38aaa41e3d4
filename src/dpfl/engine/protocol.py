"""The seam between the round loop and an algorithm: what an algorithm must provide, and everything the engine, the
runner and the audit may read of it (``Algorithm``; nothing else is looked up by name).

A federated algorithm is five functions of serialisable state and named tensors, so that the same client and server
steps run in this process (clients as a tensor axis) or on other machines (one client per process):

* ``init_state(x0, num_clients)``: the server's state (the global model ``x`` and whatever else it keeps) and each
  client's own state (a leading client axis: a ``dpfl.engine.client_table.ClientTable``, which stores rows only
  for the clients that write one, or a dense tensor), as named tensors (``State``).
* ``release(t, state, counts)``: what one client's participation in round t releases about one of its records, given
  the clients' train record counts (the only thing of the data a declaration may read), declared BEFORE any noise is
  drawn (``dpfl.accounting.observers.Release``: one event per client noise draw, which draws enter the aggregate
  additively with nothing computed after them, and the server's own draws, ``server_events``). The simulator turns it
  into each observer's event with the boundary and the client sampler, and the ledger charges it (a budget stops the
  run here).
* ``client_round(t, server, clients, data, ctx)``: the work of a chunk of the cohort, given the broadcast server state,
  the chunk's rows of client state, its data and its randomness; returns the messages that cross the boundary (named
  tensors with a leading client axis), the chunk's new client state, and the events of the noise actually drawn (the
  simulator checks them against the declaration).
  An algorithm may also accept a server state with a leading row axis (one server state per row, as in
  ``server_update`` below): the empirical audit (``dpfl.audit.trials``) runs independent trials of a run as rows.
* ``server_update(t, server, delivered, ctx)``: the new server state from what the boundary delivers
  (``dpfl.engine.boundary.Delivery``: per-client rows behind a plain boundary, only their sums behind secure
  aggregation); row-wise where the state and the delivered sums carry a leading row axis (one independent trial per
  row, all delivering the same count). Noise the server adds (central DP, DP-FTRL) comes from the ``ServerContext``'s
  own secret streams, and each draw's event is reported there (``ServerContext.drew``): the simulator checks them
  against the release's ``server_events`` as it checks the clients' draws, before the new state is kept.
* ``examples_per_client(counts)``: the largest minibatch a client's round holds (what memory chunking plans for).

The other members have defaults on ``Algorithm`` (documented there with who reads them); a family overrides those it
needs, as a field, a property or a method.

The engine imports no algorithm; algorithms register themselves (``dpfl.algorithms.registry``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Mapping, Protocol

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import Release
from dpfl.accounting.units import RECORD_LEVEL
from dpfl.engine.client_table import ClientTable, is_table
from dpfl.engine.grads import CohortGradients
from dpfl.engine.randomness import ClientStreams, ServerStreams

Messages = dict[str, torch.Tensor]


@dataclass
class State:
    """An algorithm's state as named tensors: the server's, and each client's (leading axis: all M clients)."""

    server: dict[str, torch.Tensor]
    clients: dict[str, torch.Tensor | ClientTable] = field(default_factory=dict)

    def state_dict(self) -> dict:
        """Tensors and plain data only (a ``ClientTable`` as its own ``state_dict``)."""
        return {"server": dict(self.server), "clients": {name: value.state_dict() if isinstance(value, ClientTable)
                                                         else value for name, value in self.clients.items()}}

    @classmethod
    def from_state_dict(cls, data: Mapping) -> "State":
        return cls(dict(data["server"]), {name: ClientTable.from_state_dict(value) if is_table(value) else value
                                          for name, value in data["clients"].items()})

    def rows(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The client state of the clients ``ids``."""
        return {name: value[ids] for name, value in self.clients.items()}


@dataclass
class ClientData:
    """The train split of a chunk of the cohort: x [clients, max_records, ...], y [clients, max_records], counts."""

    x: torch.Tensor
    y: torch.Tensor
    counts: torch.Tensor

    def batch(self, indices: torch.Tensor):
        """Each client's records at ``indices`` [clients, b]: one index_select on the flattened arrays."""
        clients, width = self.x.shape[0], self.x.shape[1]
        flat = (indices + width * torch.arange(clients).unsqueeze(1)).reshape(-1)
        xb = self.x.reshape(clients * width, *self.x.shape[2:]).index_select(0, flat)
        yb = self.y.reshape(-1).index_select(0, flat)
        return xb.reshape(*indices.shape, *self.x.shape[2:]), yb.reshape(indices.shape)


@dataclass
class ClientContext:
    """What a chunk's client work may use besides its state and data: the model's gradient oracle and the chunk's
    random streams (one per client, named by (noise key ``seed``, round, client id, purpose):
    ``dpfl.engine.randomness``; the key is secret, ``dpfl.engine.keys``).

    ``ids`` are the rows' clients (what per-client parameters are indexed by); ``stream_ids`` name their streams
    (default: ``ids``). The empirical audit runs many independent copies of one client as rows: the same client id,
    each with streams of its own, or with ``batched`` one stream for the chunk's rows (independent draws, not each
    row's reproducible stream: ``randomness.batch_generator``)."""

    grads: CohortGradients
    seed: int
    round: int
    ids: torch.Tensor
    stream_ids: torch.Tensor | None = None
    batched: bool = False

    def streams(self, purpose: str) -> ClientStreams:
        return ClientStreams(self.seed, self.round, self.ids if self.stream_ids is None else self.stream_ids, purpose,
                             self.batched)


@dataclass
class ClientOutput:
    """What a chunk's client work returns: ``messages`` cross the boundary; ``state`` stays with the clients."""

    messages: Messages
    state: dict[str, torch.Tensor]
    events: list[dp_event.DpEvent]


@dataclass
class ServerContext:
    """What the server's step may use besides its state and the delivery: its own random streams and the events of the
    noise it draws from them.

    The streams (``streams``) are named like the clients' (``dpfl.engine.randomness``: noise key ``seed``, round, the
    server's id ``randomness.SERVER``, a purpose of ``randomness.SERVER_PURPOSES``), so they are as secret as the
    clients' and a resumed round draws the same noise; no engine stage and no client draws from them, so an algorithm
    that draws nothing here leaves every other stream as it was. A draw's event goes to ``drew``; the simulator checks
    ``events`` against the release's ``server_events`` (``dpfl.engine.cohort_round.check_drawn``).

    ``stream_ids``: None for the run's one server state; the empirical audit's independent trials (a server state with
    a leading row axis) give one id per row, and every row draws from streams of its own (``batched``: from one
    stream for all rows, ``randomness.batch_generator``)."""

    seed: int
    round: int
    stream_ids: torch.Tensor | None = None
    batched: bool = False
    #: the events of the noise drawn in this step, in order (one per draw, as ``ClientOutput.events``)
    events: list[dp_event.DpEvent] = field(default_factory=list)
    _streams: dict[str, ServerStreams] = field(default_factory=dict, repr=False)

    def streams(self, purpose: str = "server_noise") -> ServerStreams:
        """The server's stream ``purpose`` (one of ``randomness.SERVER_PURPOSES``) of this round, or each row's:
        ``.normal(shape)`` draws N(0, 1) of ``shape`` ([rows, *shape] with ``stream_ids``); successive draws continue
        the stream."""
        if purpose not in self._streams:
            self._streams[purpose] = ServerStreams(self.seed, self.round, self.stream_ids, purpose, self.batched)
        return self._streams[purpose]

    def drew(self, event: dp_event.DpEvent) -> None:
        """Reports the event of one noise draw (e.g. the one a ``dpfl.noise`` mechanism returns)."""
        self.events.append(event)


class ProximalTerm(Protocol):
    """The non-smooth part f1 of a composite objective, as the simulator reads it (``Algorithm.composite``)."""

    def gradient_mapping(self, x: torch.Tensor, gradient: torch.Tensor, eta: float) -> torch.Tensor: ...


class Algorithm(ABC):
    """A federated algorithm (see the module docstring): the five abstract methods, ``neighboring``, and every other
    member the engine, the runner and the audit read, with its default. A family subclasses it (a frozen dataclass is
    fine: these defaults are class attributes, not dataclass fields) and overrides what it needs."""

    #: the record-level relation the release is accounted under ("replace_one", "zero_out" or "add_remove"); no
    #: default. Read by the ledger (``assembly.build_ledger``) and the audit (the canary's neighbour).
    neighboring: str

    #: the ledger's accountant: one name for every observer, {observer: name} for some (``PrivacyLedger``'s
    #: ``accountant``); None: the analysis's default. Read by ``assembly.build_ledger``.
    accountant: str | dict[str, str] | None = None
    #: what two neighbouring data sets differ in (``dpfl.accounting.units``): results.json's privacy.unit, and the
    #: size of the audit's canary (``dpfl.audit.runs.user_level``).
    privacy_unit: str = RECORD_LEVEL
    #: what the accounting relies on besides the paper's assumptions, {name: statement}: results.json's
    #: privacy.assumptions; None: no such section.
    assumptions: dict[str, str] | None = None
    #: the first rounds that leave the model unchanged (SCAFFOLD-warm's fit of c_i): a run must be longer
    #: (``validate.check_warm_rounds``, the fewest rounds ``calibration`` considers).
    warm_rounds: int = 0
    #: t, the fewest clients whose messages secure aggregation must sum (its threshold); None: the whole cohort.
    #: Read by ``assembly.build_boundary`` with ``privacy.secure_aggregation``.
    min_clients: int | None = None
    #: (f1, eta) of a server prox step on a composite objective F0 + f1: the simulator reports the squared norm of
    #: the gradient mapping at each evaluation (``Simulation.gradient_mapping``); None: no prox step.
    composite: tuple[ProximalTerm, float] | None = None
    #: the multipliers the run's noise is drawn at, {name: value}, solved for privacy.epsilon or given: results.json's
    #: privacy.noise_multipliers (``results_file.results_of``); None: not reported.
    noise_multipliers: dict[str, float] | None = None

    @abstractmethod
    def init_state(self, x0: torch.Tensor, num_clients: int) -> State: ...

    @abstractmethod
    def release(self, round_index: int, state: State | None, counts: torch.Tensor) -> Release:
        """Round ``round_index``'s declared draws; ``counts`` [M]: each client's train records. ``state`` may be
        None (a declaration that does not read it) or hold meta tensors (``dpfl.experiments.memory``)."""

    @abstractmethod
    def client_round(self, round_index: int, server: dict[str, torch.Tensor], clients: dict[str, torch.Tensor],
                     data: ClientData, ctx: ClientContext) -> ClientOutput: ...

    @abstractmethod
    def server_update(self, round_index: int, server: dict[str, torch.Tensor], delivered,
                      ctx: ServerContext) -> dict[str, torch.Tensor]: ...

    @abstractmethod
    def examples_per_client(self, counts: torch.Tensor) -> int: ...

    def message_bound(self, counts: torch.Tensor) -> dict[str, float] | None:
        """{message: a bound on each coordinate's magnitude} that secure aggregation encodes into its ring
        (``dpfl.engine.secure_sum``); None: the messages are unbounded, and ``assembly.build_boundary`` refuses
        ``privacy.secure_aggregation``."""
        return None

    def clip_of(self, server: dict[str, torch.Tensor]) -> float | None:
        """The l2 clip of the round that starts from the server state ``server``, for a family whose clip is server
        state (dp-fedavg-user's C_t, adaptive under Andrew et al. 2021): the simulator reads it before each round and
        results.json reports it in the round's row ("clip", ``RoundMetrics.clip``); None: not reported."""
        return None

    def regulariser(self, x: torch.Tensor) -> float:
        """The term the train objective adds to the mean loss at the model ``x`` (what the runs report as
        train_loss; ``Simulation.evaluate``)."""
        return 0.0

    def noise_to_signal(self, dimension: int) -> tuple[float, float] | None:
        """(E||xi|| / the largest norm of the rest of the server's step, the expected cohort at which that ratio is 1)
        for a family whose step on a model of ``dimension`` parameters is a noisy mean (xi its Gaussian noise): above 1
        the model moves mostly by noise, and ``dpfl.experiments.doubtful`` warns, naming that cohort. None: not
        measured."""
        return None

    def noise_encoder(self, rounds: int) -> torch.Tensor | None:
        """For a family whose rounds' noise is correlated (a matrix-factorization mechanism), the lower-triangular
        [rounds, rounds] encoder C of its first ``rounds`` rounds: the model's moves are g + C^-1 nu, with g the rounds'
        summed updates and nu independent draws, so C applied to the moves recovers C g + nu, the draws' Gaussian
        mechanism (the audit's likelihood ratio reads the moves through it: ``dpfl.audit.likelihood_ratio``). None:
        each round's noise is its own."""
        return None

    def divergence_hint(self, counts: torch.Tensor) -> str:
        """What to change when the model diverges (``TrainingDivergedError``'s message), for clients with ``counts``
        train records."""
        return "lower the learning rate"


__all__ = ["Messages", "State", "ClientData", "ClientContext", "ClientOutput", "ServerContext", "ProximalTerm",
           "Algorithm"]
