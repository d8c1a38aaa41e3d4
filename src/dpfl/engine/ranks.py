"""A round's cohort split across processes (ranks) on torch.distributed: gloo on CPUs, NCCL on GPUs.

``Ranks`` is this process's place in the group (rank, world size, local rank), read from the variables torchrun sets
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; `dpfl run --nproc N` sets the same for
the processes it starts).

Each client has one owner: rank i mod N holds client i's state and runs its client work (``Ranks.owns``), so a
client's state never leaves its rank during a run and each rank's client tables hold only its own clients' rows (an
N-th of the population's, on average). ``RankWorkers`` is a ``Simulation.workers``: in round t each rank runs
``client_work`` on the cohort's rows it owns (in chunks of the simulation's memory budget), checks their draws against
the declaration and writes their new state rows to its own tables (``run_cohort``). Then the messages meet in one of
two ways (``all_reduced``):

* behind every simulated stage (plain, simulated secure aggregation, trusted, the simulated shuffler) the server's
  step reads only the cohort's sums and their count, so each rank sums its own clients' messages and an all_reduce
  in each message's dtype adds up the ranks' sums (``Ranks.summed``): a round moves one model-sized vector per
  message between the ranks, whatever the cohort;
* a real stage (secure aggregation by the protocol, the real shuffler) runs over every client's row, so the ranks
  all_gather every chunk's client ids, messages and drawn events (``exchange``; not the state), ``run_cohort`` puts
  the rows back in cohort order, and every rank runs the stage on identical rows with the same streams.

Either way every rank runs the same server step on identical sums: all ranks hold the same server state, bit for
bit, without a broadcast. Records are read where they are used: a rank reads only its own clients' (with a
memory-mapped client folder, ``dpfl.data.library``, only their pages are loaded).

What changes with N: the order in which the cohort's messages are added up (each rank's own clients first, then the
ranks' sums) and which rows share a memory chunk (with more than one torch thread a batched product may round a row
differently in another chunk: tests/algorithms/test_contract.py, "results do not depend on the memory chunking"); so
the model equals the one-process run's within float rounding. A client's draws come from its own keyed streams
(``dpfl.engine.randomness``), whichever rank draws them, so the ledger does not change at all. The world size enters
a round's fingerprint when it is above 1 (``Simulation._fingerprint``, which hashes each rank's own clients' rows of
the cohort and combines the ranks' digests): a round replayed with another N is charged again, as one replayed with
another run.memory_mb is refused.

What is saved: a checkpoint is the whole run's. At each checkpoint every rank sends its own clients' rows to rank 0
(``whole_state``), which saves them with the server state; on a resume (with any N) rank 0 hands the saved state to
the others and each keeps only its own clients' rows (``own_state``).

The ledger comes first: the round's ledger entry is saved by rank 0 (the only rank with the run directory) before
it calls the workers, and every rank's first act in the round is to wait for rank 0's word that it is on record
(``RankWorkers.__call__``: a broadcast from rank 0). So no rank draws noise, and no rank's messages leave it, before
the round is on record, as in one process.

What each rank sees: its own clients' messages and the other ranks' sums (behind a simulated stage), or every
client's messages of the round (the rows before a real stage), as the one simulation process does. What the stages
deliver to the server, and hence every observer's event, is unchanged; the network between the ranks carries rows or
partial sums unencrypted, so it must be as trusted as the simulation's own memory (one machine, or a private cluster
network).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import torch
import torch.distributed as dist

from dpfl.engine.client_table import ClientTable
from dpfl.engine.cohort_round import CohortRows, Records, client_work
from dpfl.engine.boundary import Boundary
from dpfl.engine.protocol import ClientOutput, Messages, State
from dpfl.errors import ConfigError, DpflError

T = TypeVar("T")


class RankZeroError(DpflError):
    """Rank 0 refused the run (a bad run directory, a config it rejected): what the other ranks raise, with rank 0's
    message, so that every rank stops with the same error (`dpfl run` prints it once, on rank 0)."""


@dataclass
class Ranks:
    """This process's place among the ranks of a run: its ``rank``, the ``world_size`` and its ``local_rank`` on its
    node, and the device its collectives run on (the CPU for gloo; cuda:LOCAL_RANK for NCCL)."""

    rank: int
    world_size: int
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @classmethod
    def from_environment(cls, environ: dict | None = None) -> "Ranks | None":
        """The place torchrun's variables give (None: ``WORLD_SIZE`` is not set, a process on its own); a
        ConfigError naming the variable when one is missing or out of range."""
        environ = os.environ if environ is None else environ
        if "WORLD_SIZE" not in environ:
            return None
        values = {}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            text = environ.get(name, "0" if name == "LOCAL_RANK" else None)
            if text is None or not text.strip().isdigit():
                raise ConfigError(name, text, "a whole number (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, "
                                               "MASTER_ADDR and MASTER_PORT)")
            values[name] = int(text)
        if values["WORLD_SIZE"] < 1 or values["RANK"] >= values["WORLD_SIZE"]:
            raise ConfigError("RANK", values["RANK"], f"0 .. WORLD_SIZE - 1 = {values['WORLD_SIZE'] - 1}")
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if not environ.get(name):
                raise ConfigError(name, environ.get(name), "the address and port of rank 0 (torchrun sets them)")
        return cls(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])

    def join(self, device: torch.device) -> torch.device:
        """Joins the process group (NCCL when the run is on CUDA, gloo otherwise, from the environment's
        MASTER_ADDR and MASTER_PORT) and returns the run's device on this rank: cuda:LOCAL_RANK for a CUDA run, else
        ``device``."""
        if device.type == "cuda":
            device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)
        self.device = device
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=self.rank,
                                    world_size=self.world_size, init_method="env://")
        return device

    def leave(self) -> None:
        """Leaves the process group (if this process joined one)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    @property
    def is_first(self) -> bool:
        """Whether this is rank 0, the rank that owns the run directory and prints the run's output."""
        return self.rank == 0

    def owns(self, clients: torch.Tensor) -> torch.Tensor:
        """[len(clients)] whether this rank owns each client: client i is rank i mod N's (module docstring)."""
        return clients % self.world_size == self.rank

    # -- the client state: each rank its own clients', the whole at a checkpoint ------------------------------------
    def own_state(self, state: State) -> State:
        """``state`` with only this rank's clients' rows held (a resumed run's whole state, cut to this rank's
        part): a ``ClientTable`` keeps its own clients' rows; a dense tensor is kept whole (it holds every client's
        row anyway; the others' rows are never read)."""
        return State(state.server, {name: _own_table(self, value) if isinstance(value, ClientTable) else value
                                    for name, value in state.clients.items()})

    def whole_state(self, state: State) -> State | None:
        """On rank 0, ``state`` with every rank's own clients' rows in its client state (what a checkpoint saves);
        None on the others. Every rank must call it at the same point (a gather)."""
        mine = {name: _own_rows(self, value) for name, value in state.clients.items()}
        parts = [None] * self.world_size if self.is_first else None
        dist.gather_object(mine, parts, dst=0)
        if not self.is_first:
            return None
        clients = {}
        for name, value in state.clients.items():
            whole = ClientTable.from_state_dict(value.state_dict()) if isinstance(value, ClientTable) else value.clone()
            for part in parts:
                ids, rows = part[name]
                if ids.numel():
                    whole[ids.to(whole.device)] = rows.to(whole.device)
            clients[name] = whole
        return State(state.server, clients)

    # -- collectives ----------------------------------------------------------------------------------------------
    def from_first(self, value: T | None = None) -> T:
        """Rank 0's ``value``, on every rank (pickled; the other ranks' arguments are ignored)."""
        box = [value]
        dist.broadcast_object_list(box, src=0, device=self._object_device())
        return box[0]

    def decided_by_first(self, decide: Callable[[], T]) -> T:
        """``decide()`` run on rank 0 alone, its result given to every rank; if it raises a DpflError, the other
        ranks raise a ``RankZeroError`` with its message (and rank 0 the error itself), so that no rank waits for
        a rank that stopped."""
        if not self.is_first:
            outcome = self.from_first()
            if isinstance(outcome, _Refused):
                raise RankZeroError(f"rank 0 stopped: {outcome.message}")
            return outcome
        try:
            value = decide()
        except DpflError as err:
            self.from_first(_Refused(str(err)))
            raise
        return self.from_first(value)

    def agreed_signal(self, requested: int | None) -> int | None:
        """The stop signal any rank received (the largest number, if several), on every rank; None when none did:
        so that every rank leaves the round loop after the same round."""
        return self._reduced(requested or 0, dist.ReduceOp.MAX) or None

    def everyones(self, value: T) -> list[T]:
        """Every rank's ``value`` (pickled), in rank order, on every rank."""
        values = [None] * self.world_size
        dist.all_gather_object(values, value)  # on NCCL through the current GPU (``join`` sets it)
        return values

    def summed(self, sums: Messages, count: int) -> tuple[Messages, int]:
        """Every rank's ``sums`` of its own clients' messages (none where it has no client in the cohort), added up by
        an all_reduce in each message's dtype, and their ``count``s: the cohort's sums and size, on every rank (each
        element reduced once and sent to every rank, so every rank holds the same bits)."""
        layouts = self.everyones(({name: (tuple(value.shape), value.dtype) for name, value in sums.items()}, count))
        layout = next((shapes for shapes, _ in layouts if shapes), {})
        total = {}
        for name, (shape, dtype) in layout.items():
            value = sums[name].to(self.device) if name in sums else torch.zeros(shape, dtype=dtype, device=self.device)
            dist.all_reduce(value)
            total[name] = value
        return total, sum(n for _, n in layouts)

    def total(self, count: int) -> int:
        """The sum of every rank's ``count``, on every rank."""
        return self._reduced(count, dist.ReduceOp.SUM)

    def _reduced(self, number: int, op) -> int:
        """Every rank's integer ``number`` reduced by ``op``, on every rank."""
        value = torch.tensor([number], dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=op)
        return int(value.item())

    def exchange(self, chunks: list[tuple[torch.Tensor, ClientOutput]]) -> list[tuple[torch.Tensor, ClientOutput]]:
        """Every rank's ``chunks`` (its client work: (client ids, output) per memory chunk), in rank order, on every
        rank, without their new client state (it stays with its owner: this rank's own chunks keep theirs, the
        others' arrive with none). The chunks' sizes, tensor layouts and drawn events go by all_gather_object; the
        ids and each message by one all_gather of this rank's chunks concatenated, padded to the largest share's
        rows, and cut back into the chunks."""
        mine = (_layout(chunks), [out.events for _, out in chunks])
        plans = [None] * self.world_size
        dist.all_gather_object(plans, mine)  # on NCCL through the current GPU (``join`` sets it)
        layout = next((plan[0] for plan in plans if plan[0].sizes), None)
        if layout is None:  # nobody has a row (an empty cohort)
            return []
        totals = [sum(plan[0].sizes) for plan in plans]
        rows = self._gathered([r for r, _ in chunks], (), torch.int64, totals)
        messages = {name: self._gathered([out.messages[name] for _, out in chunks], shape, dtype, totals)
                    for name, (shape, dtype) in layout.messages.items()}
        everyone = []
        for rank, (plan, events) in enumerate(plans):
            start = 0
            for j, (size, drawn) in enumerate(zip(plan.sizes, events)):
                cut = slice(start, start + size)
                state = chunks[j][1].state if rank == self.rank else {}
                everyone.append((rows[rank][cut], ClientOutput({n: v[rank][cut] for n, v in messages.items()}, state,
                                                               drawn)))
                start += size
        return everyone

    def _gathered(self, pieces: list[torch.Tensor], shape: tuple, dtype: torch.dtype,
                  totals: list[int]) -> list[torch.Tensor]:
        """Each rank's rows of one tensor (its ``pieces`` concatenated), gathered: [rank] -> [its total, *shape]."""
        wire = torch.uint8 if dtype == torch.bool else dtype  # gloo has no boolean all_gather
        padded = torch.zeros(max(totals), *shape, dtype=wire, device=self.device)
        if pieces:
            local = torch.cat([p.to(self.device, wire) for p in pieces])
            padded[:local.shape[0]] = local
        received = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(received, padded)
        return [r[:total].to(dtype) for r, total in zip(received, totals)]

    def _object_device(self) -> torch.device | None:
        return self.device if self.device.type == "cuda" else None


@dataclass(frozen=True)
class _Refused:
    """What rank 0 broadcasts in place of its decision when it refused the run."""

    message: str


@dataclass(frozen=True)
class _Layout:
    """A rank's part of a round: its chunks' row counts and each message's per-row shape and dtype."""

    sizes: tuple[int, ...]
    messages: dict


def _layout(chunks: list[tuple[torch.Tensor, ClientOutput]]) -> _Layout:
    def shapes(tensors: dict) -> dict:
        return {name: (tuple(value.shape[1:]), value.dtype) for name, value in tensors.items()}

    first = chunks[0][1] if chunks else ClientOutput({}, {}, [])
    return _Layout(tuple(int(rows.numel()) for rows, _ in chunks), shapes(first.messages))


def _own_rows(ranks: Ranks, value: torch.Tensor | ClientTable) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's clients that hold a row in ``value``, their rows), on the CPU: a table's written rows, a dense
    tensor's every row of this rank's clients."""
    if isinstance(value, ClientTable):
        table = value.state_dict()
        ids, rows = table["clients"], table["rows"]
    else:
        ids = torch.arange(value.shape[0])
        rows = value.detach().cpu()
    mine = ranks.owns(ids)
    return ids[mine], rows[mine]


def _own_table(ranks: Ranks, table: ClientTable) -> ClientTable:
    """``table`` with only this rank's clients' rows."""
    data = table.state_dict()
    mine = ranks.owns(data["clients"])
    own = ClientTable.from_state_dict({**data, "clients": data["clients"][mine], "rows": data["rows"][mine]})
    return own.to(table.device)


@dataclass
class RankWorkers:
    """``Simulation.workers`` for the ranks of one run (module docstring): the client work of this rank's clients in
    the cohort; behind a real stage exchanged with the other ranks' so that every rank yields every chunk (rank by
    rank; ``run_cohort`` puts the rows back in cohort order)."""

    ranks: Ranks

    def __call__(self, sim, t: int, cohort: torch.Tensor) -> Iterator[tuple[torch.Tensor, ClientOutput]]:
        recorded = self.ranks.from_first(t)  # rank 0 has saved round t's ledger entry: no draw before it
        if recorded != t:
            raise DpflError(f"rank {self.ranks.rank} is at round {t + 1}, rank 0 at round {recorded + 1}: the ranks "
                            "are out of step (resumed from different run directories?)")
        share = CohortRows(cohort[self.ranks.owns(cohort)])
        mine = client_work(sim.algorithm, t, sim.seed, sim.state.server, sim.state.clients, share,
                           Records(sim.train.x, sim.train.y, sim.train.counts, sim.grads),
                           sim.chunk_size(max(share.size, 1))) if share.size else iter(())
        if all_reduced(sim.boundary):  # this rank's own chunks; their sums meet in ``Ranks.summed``
            return mine
        return ((rows.to(cohort.device), out) for rows, out in self.ranks.exchange(list(mine)))


def all_reduced(boundary: Boundary) -> bool:
    """Whether the ranks add up the cohort's messages by an all_reduce of each rank's sums (every simulated stage:
    what it delivers to the server's step is the cohort's sums and their count, ``Boundary.summed``) rather than
    all_gather the rows (a real stage, secure aggregation by the protocol or the real shuffler, runs over every
    client's row)."""
    return not boundary.real


__all__ = ["Ranks", "RankWorkers", "RankZeroError", "all_reduced"]
