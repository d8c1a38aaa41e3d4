"""The seam between the round loop and an algorithm: what an algorithm must provide, and nothing more.

A federated algorithm is four pure functions of serialisable state and named tensors, so that the same client and
server steps run in this process (clients as a tensor axis) or on other machines (one client per process):

* ``init_state(x0, num_clients)``: the server's state (the global model ``x`` and whatever else it keeps) and each
  client's own state (stacked, a leading client axis), as named tensors (``State``).
* ``release(t, state, train)``: what one client's participation in round t releases about one of its records,
  declared BEFORE any noise is drawn (``dpfl.accounting.observers.Release``: one event per noise draw, and which draws
  enter the aggregate additively with nothing computed after them). The simulator turns it into each observer's event
  with the boundary and the client sampler, and the ledger charges it (a budget stops the run here).
* ``client_round(t, server, clients, data, ctx)``: the work of a chunk of the cohort, given the broadcast server state,
  the chunk's rows of client state, its data and its randomness; returns the messages that cross the boundary (named
  tensors with a leading client axis), the chunk's new client state, and the events of the noise actually drawn (the
  simulator checks them against the declaration).
  An algorithm may also accept a server state with a leading row axis (one server state per row, as in
  ``server_update`` below): the empirical audit (``dpfl.audit.trials``) runs independent trials of a run as rows.
* ``server_update(t, server, delivered)``: the new server state from what the boundary delivers
  (``dpfl.engine.boundary.Delivery``: per-client rows behind a plain boundary, only their sums behind secure
  aggregation); row-wise where the state and the delivered sums carry a leading row axis (one independent trial per
  row, all delivering the same count).

An algorithm whose objective is composite, F0 + f1 with a prox step on f1, may expose ``composite`` = (f1, eta) (a
``dpfl.algorithms.prox.Regularizer`` and its step): the simulator then reports the squared norm of the gradient
mapping at each evaluation (``dpfl.engine.simulator.RoundMetrics``).

The engine imports no algorithm; algorithms register themselves (``dpfl.algorithms.registry``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import Release
from dpfl.engine.grads import CohortGradients
from dpfl.engine.randomness import ClientStreams

Messages = dict[str, torch.Tensor]


@dataclass
class State:
    """An algorithm's state as named tensors: the server's, and each client's (leading axis: all M clients)."""

    server: dict[str, torch.Tensor]
    clients: dict[str, torch.Tensor] = field(default_factory=dict)

    def state_dict(self) -> dict:
        return {"server": dict(self.server), "clients": dict(self.clients)}

    @classmethod
    def from_state_dict(cls, data: Mapping) -> "State":
        return cls(dict(data["server"]), dict(data["clients"]))

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
    each with streams of its own."""

    grads: CohortGradients
    seed: int
    round: int
    ids: torch.Tensor
    stream_ids: torch.Tensor | None = None

    def streams(self, purpose: str) -> ClientStreams:
        return ClientStreams(self.seed, self.round, self.ids if self.stream_ids is None else self.stream_ids, purpose)


@dataclass
class ClientOutput:
    """What a chunk's client work returns: ``messages`` cross the boundary; ``state`` stays with the clients."""

    messages: Messages
    state: dict[str, torch.Tensor]
    events: list[dp_event.DpEvent]


@runtime_checkable
class Algorithm(Protocol):
    """A federated algorithm (see the module docstring). ``neighboring`` names the record-level relation its release
    is accounted under ("replace_one", "zero_out" or "add_remove")."""

    neighboring: str

    def init_state(self, x0: torch.Tensor, num_clients: int) -> State: ...

    def release(self, round_index: int, state: State, train) -> Release: ...

    def client_round(self, round_index: int, server: dict[str, torch.Tensor], clients: dict[str, torch.Tensor],
                     data: ClientData, ctx: ClientContext) -> ClientOutput: ...

    def server_update(self, round_index: int, server: dict[str, torch.Tensor], delivered) -> dict[str, torch.Tensor]:
        ...

    def examples_per_client(self, counts: torch.Tensor) -> int: ...


__all__ = ["Messages", "State", "ClientData", "ClientContext", "ClientOutput", "Algorithm"]
