"""Independent trials of R rounds of a run, batched as rows of the real ``client_round`` and ``server_update``.

The pattern of ``tests/helpers/worst_case.py``, extended over rounds: every trial keeps its own server state (a
leading trial axis: ``dpfl.engine.protocol`` lets an algorithm take one server state per row) and its own client
states (one per (trial, client)); in round t every trial draws its own cohort with the run's client sampler's law
(all trials in one draw from the world's cohort key, ``ClientSampler.independent_cohorts``, so client sampling is
audited too; an algorithm whose release fixes the cohort schedule, ``Release.cohort``, is accounted conditionally on
the run's schedule, which every trial then follows), and every cohort member of every trial becomes one row of ONE
batched ``client_round`` call (chunked to ``run.memory_mb``) with its client id and the stream id (world * N +
trial) * M + client (``ClientContext.stream_ids``). A chunk's rows draw each purpose from one batched stream
(``ClientContext.batched``: named by the chunk's first stream id, ``dpfl.engine.randomness.batch_generator``), so
every row's records and noise are independent of every other row's and of every other round's at the cost of one
generator per chunk, not one per row. The round is the simulator's own cohort loop
(``dpfl.engine.cohort_round.run_cohort``): the noise actually drawn is checked against the declared release, each
trial's messages are delivered through the run's boundary (a real stage, such as secure aggregation computed by the
protocol, collects each trial's rows on its own), and the server step runs once per delivered count (all trials of
a fixed cohort at once).

A round that raises anything but a ConfigError (the audited code broke under the canary: a shape its ghost clipping
did not expect, a NaN it refuses) becomes a ``TrialFailure`` naming the round, the world and the error, which the
audit reports as a failed audit rather than crashing on.

After each round the caller's ``observe`` gets a ``RoundView`` (each trial's server state before and after, and the
round's message rows) and reads from it what its observer sees (``dpfl.audit.distinguisher``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from dpfl.engine.cohort_round import CohortRows, Records, run_cohort
from dpfl.errors import ConfigError

class TrialFailure(RuntimeError):
    """A trial's round raised (not a ConfigError: the configuration was accepted): the audited code cannot run with
    the canary, which the audit reports as a failure naming the round, the world and the error, not a crash."""


#: Spawn-key tag of the trials' cohort seeds (distinct from the run's own streams).
_COHORT_KEY = 0xA0D17


@dataclass(frozen=True)
class World:
    """One side of the audit: the training records as they are in this world, and the gradient oracle."""

    x: torch.Tensor
    y: torch.Tensor
    grads: object


@dataclass
class RoundView:
    """Round ``round`` of every trial: server states [trials, ...] before and after it, its message rows (one row
    per (trial, cohort member): ``trial_of_row``, ``client_of_row``) and what the boundary delivered to each trial's
    server (``delivered``: each trial's sums [trials, ...]; None: the sums of its rows)."""

    round: int
    before: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]
    messages: dict[str, torch.Tensor]
    trial_of_row: torch.Tensor
    client_of_row: torch.Tensor
    counts: torch.Tensor
    trials: int
    delivered: dict[str, torch.Tensor] | None = None

    def sums(self, name: str) -> torch.Tensor:
        """[trials, ...]: each trial's sum of the message ``name`` over its cohort, as the boundary delivered it
        (behind real secure aggregation: the protocol's decoded sum)."""
        if self.delivered is not None:
            return self.delivered[name]
        value = self.messages[name]
        return torch.zeros(self.trials, *value.shape[1:], dtype=value.dtype).index_add_(0, self.trial_of_row, value)

    def holds(self, client: int) -> torch.Tensor:
        """[trials] bools: whether client ``client`` is in each trial's cohort of this round."""
        inside = torch.zeros(self.trials, dtype=torch.bool)
        inside[self.trial_of_row[self.client_of_row == client]] = True
        return inside

    def own(self, name: str, client: int) -> torch.Tensor:
        """[trials, ...]: client ``client``'s message ``name`` in each trial (0 where it is not in the cohort)."""
        value = self.messages[name]
        rows = self.client_of_row == client
        return torch.zeros(self.trials, *value.shape[1:], dtype=value.dtype).index_add_(
            0, self.trial_of_row[rows], value[rows])


def cohorts(sim, world: int, round_index: int, trials: int, scheduled: bool = False) -> torch.Tensor:
    """[trials, M] bools: each trial's cohort of round ``round_index``, drawn with the run's client sampler's law for
    every trial at once from the world's own cohort key (``ClientSampler.independent_cohorts``), or, when the release
    fixes the schedule (``scheduled``), the run's own cohort in every trial."""
    if scheduled:
        inside = torch.zeros(trials, sim.train.num_clients, dtype=torch.bool)
        inside[:, sim.clients.sample(round_index, sim.seed)] = True
        return inside
    key = int(np.random.SeedSequence(sim.seed, spawn_key=(_COHORT_KEY, world)).generate_state(1, np.uint64)[0] >> 1)
    return sim.clients.independent_cohorts(round_index, trials, key)


def run_world(sim, world: World, index: int, trials: int, rounds: int, observe: Callable[[RoundView], None],
              progress: bool = False) -> dict[str, torch.Tensor]:
    """Runs ``trials`` independent trials of rounds 0..``rounds`` - 1 in ``world`` (number ``index``, which names
    its streams), calling ``observe`` after each round; returns each trial's final server state."""
    algorithm, train = sim.algorithm, sim.train
    population = train.num_clients
    x0 = world.grads.initial_params()
    initial = algorithm.init_state(x0, trials * population)
    server = {name: value.unsqueeze(0).repeat(trials, *([1] * value.dim())) for name, value in initial.server.items()}
    states = initial.clients  # row trial * M + client
    records = Records(world.x, world.y, train.counts, world.grads)
    started = time.perf_counter()
    for t in range(rounds):
        release = algorithm.release(t, initial, train.counts)  # this world's model (the Dirac canary adds a coordinate)
        trial_of_row, clients = cohorts(sim, index, t, trials, scheduled=release.cohort is not None).nonzero(
            as_tuple=True)  # rows by trial, each trial's cohort in id order
        rows = CohortRows(clients, trial_of_row * population + clients, (index * trials + trial_of_row) * population
                          + clients, trials, trial_of_row, index * trials + torch.arange(trials))
        try:
            outcome = run_cohort(algorithm, sim.boundary, release, t, sim.seed, population, server, states, rows,
                                 records, sim.chunk_size(max(rows.size, 1)))
        except ConfigError:
            raise
        except Exception as error:  # the algorithm broke under the canary: the audit reports it (``TrialFailure``)
            raise TrialFailure(f"round {t} of world {index} ({'canary' if index else 'neighbour'}): "
                               f"{type(error).__name__}: {error}") from error
        observe(RoundView(t, server, outcome.server, outcome.messages, trial_of_row, clients,
                          torch.bincount(trial_of_row, minlength=trials), trials, outcome.sums))
        server = outcome.server
        if progress:
            print(f"audit: world {index + 1}/2, round {t + 1}/{rounds}, {trials} trials "
                  f"({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    return server


__all__ = ["TrialFailure", "World", "RoundView", "cohorts", "run_world"]
