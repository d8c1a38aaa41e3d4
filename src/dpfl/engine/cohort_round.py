"""Round t of a cohort: its client work in memory chunks, every chunk's draws checked against the declaration, the
messages collected through the boundary, the server step with its context, its draws checked. The one loop behind
the simulator's round (``Simulation.step``) and the empirical audit's runs (``dpfl.audit.trials.run_world``, its
independent trials as rows; ``dpfl.audit.runs.one_run_scores``, one run of round 0 with many canaries).

What differs between them is data, not code: the cohort's rows (``CohortRows``: each row's client, its row of client
state, its streams, and for independent trials the trial it belongs to) and the records and gradient oracle its client
work reads (``Records``: the audit's canary worlds have their own). Rows with a trial axis (``CohortRows.trials``) run
as one batched ``client_round`` whose server state carries a leading trial axis (``dpfl.engine.protocol``); each
trial's messages reach the server as its own delivery, and the server step runs once per group of trials delivering
the same count, each trial drawing from server streams of its own (``server_stream_ids``).

The delivery is ``Boundary.collect``'s. With trials (``deliver_trials``), real secure aggregation collects each
trial's rows on its own; any other stage delivers each trial's sums, added up in one pass over the rows, which is
what its ``collect`` delivers (tests/audit/test_real_boundary.py) without a call per trial.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import Release
from dpfl.engine.boundary import Boundary, Delivery, concatenated
from dpfl.engine.grads import CohortGradients
from dpfl.engine.protocol import Algorithm, ClientContext, ClientData, ClientOutput, Messages, ServerContext
from dpfl.errors import DpflError

#: The client work of a round as it arrives: (the rows of client state a chunk's new state goes to, its output).
Work = Iterable[tuple[torch.Tensor, ClientOutput]]
#: Adds up a part of the cohort's sums and count with the other parts' (the ranks': ``dpfl.engine.ranks.Ranks.summed``).
Across = Callable[[Messages, int], tuple[Messages, int]]


@dataclass(frozen=True)
class Records:
    """What a cohort's client work reads: every client's train records x [M, max_records, ...], y [M, max_records],
    counts [M], and the model's gradient oracle."""

    x: torch.Tensor
    y: torch.Tensor
    counts: torch.Tensor
    grads: CohortGradients


@dataclass(frozen=True)
class CohortRows:
    """A round's cohort as the rows of one batched client work, in order.

    ids: [rows] each row's client (its records, its per-client parameters); state_rows: its row of the client state
    (None: its client id); stream_ids: the name of its random streams (None: its client id, ``ClientContext``).
    With ``trials`` > 0 the rows are independent trials' clients: ``trial_of_row`` [rows] (non-decreasing) says whose,
    the server state carries a leading trial axis and ``server_stream_ids`` [trials] name each trial's server streams.
    """

    ids: torch.Tensor
    state_rows: torch.Tensor | None = None
    stream_ids: torch.Tensor | None = None
    trials: int = 0
    trial_of_row: torch.Tensor | None = None
    server_stream_ids: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.ids.numel())

    @property
    def own_rows(self) -> torch.Tensor:
        """Each row's row of client state."""
        return self.ids if self.state_rows is None else self.state_rows

    def part(self, start: int, stop: int) -> "CohortRows":
        """Rows ``start``..``stop`` - 1."""
        def cut(value):
            return None if value is None else value[start:stop]
        return replace(self, ids=self.ids[start:stop], state_rows=cut(self.state_rows),
                       stream_ids=cut(self.stream_ids), trial_of_row=cut(self.trial_of_row))


@dataclass
class RoundOutcome:
    """What a cohort's round produced: every row's messages (in row order), the sums the boundary delivered to the
    server (with trials, each trial's: [trials, ...]), and the server state after it."""

    messages: Messages
    sums: Messages
    server: dict[str, torch.Tensor]


def client_work(algorithm: Algorithm, round_index: int, seed: int, server: dict[str, torch.Tensor],
                states: dict[str, torch.Tensor], cohort: CohortRows, records: Records,
                chunk: int) -> Iterator[tuple[torch.Tensor, ClientOutput]]:
    """The cohort's client work in this process: its rows in chunks of ``chunk`` (one ``client_round`` each, with the
    server state of each row's trial); yields (the chunk's rows of client state, its ``ClientOutput``)."""
    for start in range(0, cohort.size, chunk):
        part = cohort.part(start, start + chunk)
        rows = part.own_rows
        broadcast = server if not cohort.trials else {name: value[part.trial_of_row] for name, value in server.items()}
        yield rows, algorithm.client_round(
            round_index, broadcast, {name: value[rows] for name, value in states.items()},
            ClientData(records.x[part.ids], records.y[part.ids], records.counts[part.ids]),
            ClientContext(records.grads, seed, round_index, part.ids, part.stream_ids, batched=cohort.trials > 0))


def run_cohort(algorithm: Algorithm, boundary: Boundary, release: Release, round_index: int, seed: int,
               population: int, server: dict[str, torch.Tensor], states: dict[str, torch.Tensor],
               cohort: CohortRows, records: Records | None = None, chunk: int = 1,
               work: Work | None = None, across: Across | None = None) -> RoundOutcome:
    """Round ``round_index`` of ``cohort`` (module docstring): the client work (``client_work`` on ``records`` in
    chunks of ``chunk`` rows, or ``work`` done elsewhere, e.g. on Flower nodes), each chunk's draws checked against
    ``release`` and its new client state written to ``states`` (in place); the rows put back in the cohort's order
    (``in_cohort_order``: work done elsewhere may arrive in another); the messages delivered through
    ``boundary`` to the server of a population of ``population`` clients; the server step from ``server``, its draws
    checked against ``release`` before the new state is returned. ``across``: the work is this process's part of the
    cohort (a rank's own clients), whose sums ``across`` adds up with the other parts' (``Ranks.summed``) for the
    boundary to deliver (``Boundary.summed``; the outcome's messages are then this part's)."""
    declared = [noise_of(e) for e in release.step_events]
    arrived = None if work is None else []  # work done elsewhere: the rows in the order they came
    if work is None:
        work = client_work(algorithm, round_index, seed, server, states, cohort, records, chunk)
    chunks = []
    for rows, out in work:
        check_drawn(round_index + 1, out.events, declared)
        chunks.append(out.messages)
        if arrived is not None:
            arrived.append(rows)
        for name, value in out.state.items():
            states[name][rows] = value
    messages = concatenated(chunks)
    del chunks  # the rows are held once (a single chunk's messages are its own tensors)
    server_declared = [noise_of(e) for e in release.server_events]
    if not cohort.trials:
        if across is not None:  # this process's part of the cohort: its sums meet the other parts'
            sums, count = across({name: value.sum(0) for name, value in messages.items()},
                                 int(next(iter(messages.values())).shape[0]) if messages else 0)
            delivery = boundary.summed(sums, count, population)
        else:
            if arrived is not None:
                messages = in_cohort_order(messages, torch.cat(arrived) if arrived else cohort.own_rows[:0],
                                           cohort.own_rows)
            delivery = boundary.collect([messages], population, seed, round_index, cohort.ids)
        ctx = ServerContext(seed, round_index)
        after = algorithm.server_update(round_index, server, delivery, ctx)
        check_drawn(round_index + 1, ctx.events, server_declared, " by the server")
        return RoundOutcome(messages, delivery.sums, after)
    sums, counts = deliver_trials(boundary, messages, cohort, population, seed, round_index)
    after = {name: value.clone() for name, value in server.items()}
    # one server step per delivered count (a row-wise server_update takes one count); a round in which nobody sends
    # (a randomly stopped run past its tau) delivers nothing; each trial draws from server streams of its own
    for count in torch.unique(counts).tolist():
        same = counts == count
        ctx = ServerContext(seed, round_index, cohort.server_stream_ids[same], batched=True)
        updated = algorithm.server_update(round_index, {name: value[same] for name, value in server.items()},
                                          Delivery({name: value[same] for name, value in sums.items()},
                                                   int(count) if sums else 0, population), ctx)
        check_drawn(round_index + 1, ctx.events, server_declared, " by the server")
        for name, value in updated.items():
            after[name][same] = value.to(after[name].dtype)
    return RoundOutcome(messages, sums, after)


def in_cohort_order(messages: Messages, arrived: torch.Tensor, cohort: torch.Tensor) -> Messages:
    """``messages``, whose rows are the clients ``arrived`` (work done elsewhere: the ranks' shares, rank by rank),
    with their rows in ``cohort``'s order, so that every stage adds them up as one process does (the rows
    themselves unchanged; a DpflError if the clients that arrived are not the cohort's, each once)."""
    if torch.equal(arrived, cohort):
        return messages
    refused = DpflError(f"the client work returned the rows of {arrived.numel()} clients, not the cohort's "
                        f"{cohort.numel()}, each once")
    if arrived.numel() != cohort.numel():
        raise refused
    order = torch.argsort(arrived)
    where = order[torch.searchsorted(arrived[order], cohort).clamp(max=arrived.numel() - 1)]
    if not torch.equal(arrived[where], cohort):
        raise refused
    return {name: value[where] for name, value in messages.items()}


def deliver_trials(boundary: Boundary, messages: Messages, cohort: CohortRows, population: int, seed: int,
                   round_index: int) -> tuple[Messages, torch.Tensor]:
    """(each trial's delivered sums [trials, ...], each trial's count [trials]) of the rows ``messages`` of the
    trials' ``cohort``: real secure aggregation collects each trial's rows on its own (the protocol's decoded sum,
    each row rounding from its own streams, less the clients that drop out); any other stage delivers each trial's
    sum of its rows, all trials in one pass. For a simulated stage that is what its ``collect`` delivers; for the real
    shuffler too, exactly (its output is the sums of ``ones`` and ``slots``: ``count_labelled_bits`` of the shuffled
    ``labelled_bits``, tests/algorithms/test_sdp.py), where running the stage per trial would cost seconds a trial
    (5.3 s for 3 silos' 16,600 labelled bits per coordinate at d = 410)."""
    sizes = torch.bincount(cohort.trial_of_row, minlength=cohort.trials)
    if boundary.secure is None or not messages:
        return {name: torch.zeros(cohort.trials, *value.shape[1:], dtype=value.dtype).index_add_(
            0, cohort.trial_of_row, value) for name, value in messages.items()}, sizes
    ends = torch.cumsum(sizes, 0).tolist()
    deliveries = [boundary.collect([{name: value[start:stop] for name, value in messages.items()}], population, seed,
                                   round_index, cohort.ids[start:stop],
                                   None if cohort.stream_ids is None else cohort.stream_ids[start:stop])
                  for start, stop in zip([0, *ends[:-1]], ends)]
    return ({name: torch.stack([d.sums[name] for d in deliveries]) for name in deliveries[0].sums},
            torch.tensor([d.count for d in deliveries]))


def noise_of(event: dp_event.DpEvent) -> dp_event.DpEvent:
    """The noise inside a record-level step event (the sampling around it is the sampler's, not drawn noise)."""
    while isinstance(event, (dp_event.SampledWithoutReplacementDpEvent, dp_event.PoissonSampledDpEvent)):
        event = event.event
    return event


def check_drawn(round_number: int, drawn: list, declared: list, drawer: str = "") -> None:
    """The noise a client (or the server: ``drawer``, as the message says it) drew in round ``round_number`` (from 1)
    must be the noise declared, draw for draw ("not private" covers any noise)."""
    if len(drawn) == len(declared) and all(isinstance(expected, dp_event.NonPrivateDpEvent) or got == expected
                                           for got, expected in zip(drawn, declared)):
        return
    raise DpflError(f"round {round_number}: the noise drawn{drawer} ({len(drawn)} draws, first {drawn[:1]}) differs "
                    f"from the noise declared ({len(declared)} draws, first {declared[:1]}); the ledger would be wrong")


__all__ = ["Work", "Across", "Records", "CohortRows", "RoundOutcome", "client_work", "run_cohort", "in_cohort_order",
           "deliver_trials", "noise_of", "check_drawn"]
