"""How much memory a run takes beyond its data, estimated before its model or any state is built, and a refusal
(``ConfigError`` naming the keys to turn) when that exceeds what this process can still take once the data is built.
``dpfl.data.footprint`` guards the data itself, before building it; this guard runs once the data exists, against
the memory then available (``footprint.available_memory``: the least of the machine's, the cgroup's and RLIMIT_AS's,
of which it takes at most ``footprint.HEADROOM``).

Nothing of the model's size is allocated for the estimate: the model is built on torch's meta device (tensors with
shapes and no storage), and the algorithm's initial state is read from its own ``init_state`` for a model of one and
of two parameters (``initial_state_shapes``), so every family's state is counted as that family builds it
(SCAFFOLD's control variates, M x d; an SVRG snapshot and its full gradient; ...). In bytes, with d the
model's parameters (float32), M clients and L the cohort's size:

* the model: its parameters and the flat vector the state starts from, 2 x 4d;
* the state: the server's tensors (x, and for SCAFFOLD c) and the rows of the clients that hold state: a
  ``ClientTable`` keeps a row only for a client that has written one, at most min(M, L T) over T rounds (a dense
  client tensor: M rows);
* a round: its cohort's messages, held per chunk and then concatenated for the server's sum: 2 L (4d + a client's
  state row) (one model-sized update per client and one more per vector of client state: SCAFFOLD's dy and dc); and
  one chunk of client work, at most run.memory_mb (``simulator.client_work_bytes`` per client, its model-sized noise
  draws and working vectors included).

Measured (peak resident memory of a build and one round, above the interpreter's with torch imported; one thread,
K = 2 local steps, synthetic clients of 10 records, client_rate 0.2): DP-SCAFFOLD with an MLP of d = 51,010
parameters, M = 2,000: 1,213 MB estimated, 1,129 MB measured; M = 4,000: 1,913 MB, 1,711 MB; M = 4,000 with
run.memory_mb = 64: 1,466 MB, 1,737 MB (20 chunks fragment the heap: 1,510 MB with a fixed mmap threshold,
MALLOC_MMAP_THRESHOLD_=131072). An MLP of d = 9,156,010, M = 100: DP-FedAvg 1,816 MB, 1,697 MB; DP-SCAFFOLD 6,706 MB,
6,692 MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dpfl.data import footprint
from dpfl.data.footprint import HEADROOM, size
from dpfl.data.memory_limit import MemoryLimit
from dpfl.engine.client_table import ClientTable
from dpfl.engine.grads import CohortGradients
from dpfl.engine.protocol import State
from dpfl.engine.simulator import client_work_bytes
from dpfl.errors import ConfigError


@dataclass(frozen=True)
class RunFootprint:
    """The estimate's parts (bytes), and what they are made of (for the message)."""

    parameters: int  # d
    clients: int  # M
    holders: int  # the clients whose state rows are kept: min(M, L T) in ClientTables, M in dense tensors
    cohort: int  # L, the expected cohort
    batch: int  # records in one client's largest minibatch
    model_bytes: int  # the parameters and the initial vector
    server_bytes: int  # the server's state
    client_state_bytes: int  # one client's state row
    messages_bytes: int  # a round's messages, chunks and their concatenation
    one_client_bytes: int  # one client's work in a round (simulator.client_work_bytes)
    chunk_bytes: int  # the largest chunk of client work

    @property
    def clients_bytes(self) -> int:
        return self.holders * self.client_state_bytes

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.server_bytes + self.clients_bytes + self.messages_bytes + self.chunk_bytes

    def describe(self) -> str:
        clients = (f"the clients' state {self.holders:,} x {size(self.client_state_bytes)} = "
                   f"{size(self.clients_bytes)}; ") if self.client_state_bytes else ""
        return (f"about {size(self.total_bytes)}: the model ({self.parameters:,} parameters) and the server's state "
                f"{size(self.model_bytes + self.server_bytes)}; {clients}a round's messages from {self.cohort:,} "
                f"clients {size(self.messages_bytes)} and a chunk of their work {size(self.chunk_bytes)}")


def initial_state_shapes(algorithm, d: int, num_clients: int) -> State:
    """``algorithm.init_state`` for a model of d parameters and ``num_clients`` clients as meta tensors (shapes and
    dtypes, no storage), read from the states it builds for a model of one and of two parameters and one client:
    each dimension of a state tensor is affine in the model's size (d for a model-sized vector, fixed otherwise), and
    a client tensor's leading axis is the clients'. (Running ``init_state`` on meta tensors would say the same, but
    torch's meta kernels of zeros_like and norm import sympy first: 1 to 4 s.)"""
    one, two = algorithm.init_state(torch.zeros(1), 1), algorithm.init_state(torch.zeros(2), 1)

    def meta(a: torch.Tensor | ClientTable, b: torch.Tensor | ClientTable, clients: bool):
        shape = [x + (y - x) * (d - 1) for x, y in zip(a.shape, b.shape)]
        if isinstance(a, ClientTable):  # kept a table: its rows are those of the clients that write one
            return ClientTable(num_clients, torch.empty(shape[1:], dtype=a.dtype, device="meta"))
        return torch.empty([num_clients, *shape[1:]] if clients else shape, dtype=a.dtype, device="meta")

    return State({k: meta(v, two.server[k], False) for k, v in one.server.items()},
                 {k: meta(v, two.clients[k], True) for k, v in one.clients.items()})


def run_footprint(algorithm, model: torch.nn.Module, train, cohort: int, memory_budget_bytes: int,
                  rounds: int) -> RunFootprint:
    """The estimate for ``algorithm`` with ``model`` (built on the meta device) on the training split ``train``
    (``ClientArrays``) over ``rounds`` rounds of cohorts of ``cohort`` clients and chunks of
    ``memory_budget_bytes``."""
    grads = CohortGradients(model)
    d = grads.num_params
    state = initial_state_shapes(algorithm, d, train.num_clients)
    server = sum(t.numel() * t.element_size() for t in state.server.values())
    row = sum(math.prod(t.shape[1:]) * t.dtype.itemsize for t in state.clients.values() if t.shape[0])
    one_client = client_work_bytes(algorithm, grads, train, state)
    chunk = min(max(cohort, 1), max(1, memory_budget_bytes // max(one_client, 1))) * one_client  # at least one client
    sparse = all(isinstance(t, ClientTable) for t in state.clients.values())
    holders = min(train.num_clients, max(cohort, 1) * rounds) if sparse else train.num_clients
    return RunFootprint(d, train.num_clients, holders, cohort, algorithm.examples_per_client(train.counts), 2 * 4 * d,
                        server, row, 2 * cohort * (4 * d + row), one_client, chunk)


def check_run_memory(config: dict, estimate: RunFootprint, limit: MemoryLimit | None = None) -> RunFootprint:
    """Refuses a run whose estimate exceeds HEADROOM of the memory ``limit`` leaves (default
    ``footprint.available_memory()``: what is left once the data is built), naming the keys to turn and the limit that
    applied, or whose one client's work exceeds run.memory_mb (naming the smallest value that works); returns the
    estimate otherwise."""
    limit = footprint.available_memory() if limit is None else limit
    if estimate.total_bytes > HEADROOM * limit.available:
        raise _too_large(config, estimate, limit)
    memory_mb = config["run"]["memory_mb"]
    if estimate.one_client_bytes > memory_mb * 2**20:
        raise ConfigError("run.memory_mb", memory_mb,
                          f"at least {math.ceil(estimate.one_client_bytes / 2**20)}: the cohort is worked through in "
                          f"chunks of run.memory_mb, and one client's work (its largest minibatch, {estimate.batch} "
                          f"records, and its model-sized vectors) takes {size(estimate.one_client_bytes)}")
    return estimate


def _too_large(config: dict, estimate: RunFootprint, limit: MemoryLimit) -> ConfigError:
    """The refusal of a run that does not fit: naming the number of clients, and how many would fit, when fewer
    clients (their state and the round's messages) would make it fit; naming the model otherwise."""
    need = (f"beyond the data, {config['algorithm']['name']} with this model needs {estimate.describe()}, and this "
            f"process has {footprint.limit_text(limit)} once the data is built, {HEADROOM:.0%} of it for the run")
    model_key = "model.hidden" if config["model"]["name"] == "mlp" else "model.name"
    per_client = estimate.client_state_bytes + estimate.messages_bytes / max(estimate.clients, 1)
    rest = estimate.total_bytes - estimate.clients_bytes - estimate.messages_bytes
    # conservative: a smaller cohort may take a smaller chunk
    fit = int((HEADROOM * limit.available - rest) // per_client)
    if fit >= 1:
        data = config["data"]
        field, value = (("data.num_clients", data["num_clients"]) if data["name"] == "synthetic" else
                        ("data.path", data["path"]) if data["path"] else ("data.name", data["name"]))
        return ConfigError(field, value, f"at most about {fit:,} clients ({need}); lower data.num_clients or "
                                         f"algorithm.client_rate, use a smaller model ({model_key}) or an algorithm "
                                         "without per-client state")
    return ConfigError(model_key, config["model"].get("hidden", config["model"]["name"]),
                       f"a model that fits in memory ({need}); use a smaller model ({model_key}), or lower "
                       "run.memory_mb (the round's chunk of client work) or the noise draws of a client's round "
                       "(algorithm.local_steps)")


__all__ = ["RunFootprint", "initial_state_shapes", "run_footprint", "check_run_memory"]
