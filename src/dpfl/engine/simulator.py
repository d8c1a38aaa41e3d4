"""The round loop: sampling, the cohort's client work in chunks, the trust boundary, the server step, the privacy
ledger, metrics, checkpoints. It knows algorithms only through ``dpfl.engine.protocol.Algorithm``.

The path of round t: the cohort (``ClientSampler.sample(t, seed)``) -> the algorithm declares what a client's
participation releases (``release``) -> the boundary turns it into each observer's event with the sampler's
participation (``Boundary.views``) -> the ledger charges it and is saved (a budget stops the run here, before the
round releases anything) -> the cohort's client work, chunked to ``run.memory_mb`` (clients are a tensor axis; each
client draws from its own streams, so chunking changes nothing) -> the drawn noise is checked against the declaration
-> the boundary delivers the messages -> the server step (its own draws, from the server's streams, checked against
the declaration before its state is kept) -> evaluate -> checkpoint.

The ledger before the release: the round's record and its durable save run on the ledger's recorder thread
(``PrivacyLedger.record_later``) while this thread computes the first chunk of the round's client work in memory;
that chunk goes on (its new client state written, its messages to the boundary) only once the round is on record and
on disk (``once_recorded``), so the ledger's work costs the round nothing where the chunk takes longer. A budget stop
raises there and the chunk is dropped: nothing of the refused round leaves memory. Work done outside this process
(``workers``: Flower nodes, other ranks) starts only after the record, since its messages leave it.

Crash safety: the ledger is written (atomically) before a round releases anything, and before the first entry the
secret noise key (``dpfl.engine.keys``: noise.key beside the ledger); a crash between the two loses only work nobody
saw, and the resumed round draws the same noise on the same state. A resume (``load_checkpoint``, in a Simulation
built with that key: ``dpfl.experiments.run_directory.run_key``) keeps that ledger and replays rounds from the last
checkpoint, or from the first round without one. A replayed round is free only if its fingerprint (the release config,
the noise key, the round index and the round-start state: together they fix every draw) equals the one recorded, i.e.
only if it releases exactly what was released before. Ctrl-C or SIGTERM during ``run`` stops after
the current round and checkpoints; a second one aborts at once (``dpfl.engine.stop_signal``).

Round numbers: internally round t is an index from 0 (``next_round`` is the index of the round to run next, which is
also the number of rounds done); wherever a user reads a round (metrics, progress lines, ledger.json's journal, stop,
divergence and checkpoint messages) it is numbered from 1, "round r of T": round r is the r-th round, the one with
index r - 1.

Wall time: ``wall_seconds`` is the time spent in ``run`` over the whole run, across resumes (it is saved in the
checkpoint and restored with it, so a resumed run adds its own time to the time its checkpoint had taken);
``session_seconds`` is the time spent in ``run`` by this process.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import numbers
import time
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol

import torch
from dp_accounting import dp_event

from dpfl.accounting.events import DiscreteGaussianDpEvent, innermost
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import Release
from dpfl.engine import checkpoint, keys
from dpfl.engine.boundary import Boundary
from dpfl.engine.cohort_round import CohortRows, Records, client_work, run_cohort
from dpfl.engine.device import on_device, stream_identity
from dpfl.engine.epsilon_schedule import epsilon_due
from dpfl.engine.grads import CohortGradients, memory_per_example
from dpfl.engine.progress import Progress
from dpfl.engine.ranks import Ranks, all_reduced
from dpfl.engine.protocol import Algorithm, ClientOutput, State
from dpfl.engine.sampling import ClientSampler
from dpfl.engine.stop_signal import STOP_SIGNALS, StopOnSignal
from dpfl.errors import BudgetExceededError, RunDirectoryError, TrainingDivergedError, check_range

#: A mean train cross-entropy above this stops a run as diverged, as a non-finite one does: a uniform guess among K
#: classes scores ln K (< 10 for up to 22,000 classes), so such a loss means logits thousands of units wrong, a
#: model that only grows worse (a learning rate of 1e6 reached 1e47 in 5 rounds with exit status 0).
DIVERGED_LOSS = 1e4


@dataclass
class RoundMetrics:
    """One evaluation: the train objective (loss plus the algorithm's regulariser), the test accuracy, epsilon per
    observer (None, for the whole dict, where the evaluation does not report it: ``dpfl.engine.epsilon_schedule``;
    {observer: None} is an infinite epsilon), and for a composite objective F0 + f1 with a prox step (an algorithm
    with ``composite`` = (f1, eta)) the squared norm of the gradient mapping G_eta(w) = (w - prox_{eta f1}(w - eta
    grad F0(w))) / eta, Lowy et al.'s (2023, Sec. 1) stationarity measure (``Regularizer.gradient_mapping``), on the
    pooled train data. Like the train loss it reads the data: an evaluation metric of the simulation, never sent to
    a client nor released. ``nonfinite_examples``: how many real examples the clipped sums of the rounds since the
    previous evaluation gave weight 0 because their gradient norm was not finite (``dpfl.engine.clipping``: each
    contributed the zero vector, inside the clip's ball, so the privacy argument is unchanged); None where the
    client work ran elsewhere (``Simulation.workers``), the sum of the ranks' counts where it was split across
    ranks (``Simulation.ranks``). ``clip``: the l2 clip the round used, for an algorithm whose clip is server state
    (``Algorithm.clip_of``: dp-fedavg-user's C_t); None where it reports none."""

    round: int
    train_loss: float | None  # None: not measured (an ``Evaluator`` without training records)
    test_accuracy: float | None
    epsilon: dict | None
    gradient_mapping: float | None = None
    nonfinite_examples: int | None = None
    clip: float | None = None

    def to_dict(self) -> dict:
        metrics = {"round": self.round, "test_accuracy": self.test_accuracy, "train_loss": self.train_loss,
                   "epsilon": self.epsilon}
        if self.gradient_mapping is not None:
            metrics["gradient_mapping"] = self.gradient_mapping
        if self.nonfinite_examples is not None:
            metrics["nonfinite_examples"] = self.nonfinite_examples
        if self.clip is not None:
            metrics["clip"] = self.clip
        return metrics


class Evaluator(Protocol):
    """Where a run's model is evaluated when not on the Simulation's own ``train`` and ``test`` records, e.g. a Flower
    deployment whose server holds no training records (``dpfl.flower.evaluation``)."""

    #: results.json's "evaluation": where the metrics come from and whether epsilon covers them; its "not_covered"
    #: is results.json's privacy.not_covered
    description: dict

    def __call__(self, sim: "Simulation", x: torch.Tensor) -> tuple[float | None, float | None]:
        """(train loss, test accuracy) of the model ``x``; None for a metric not measured."""


@dataclass
class Simulation:
    """Everything one run needs; ``run`` executes rounds and returns the metrics history."""

    train: object  # ClientArrays (x, y, counts, flat())
    test: object
    grads: CohortGradients
    algorithm: Algorithm
    clients: ClientSampler
    ledger: PrivacyLedger
    #: the noise key (``dpfl.engine.keys``): a secret that names every random stream of the run's DP randomness
    #: (cohorts, minibatches, noise, rounding, shuffles); whoever knows it can remove the noise
    seed: int = 0
    #: whether the key is a secret (not run.noise_seed's research mode): then it is saved to the checkpoint
    #: directory's noise.key before the first ledger entry, so that a resume replays the same noise
    secret: bool = False
    boundary: Boundary = field(default_factory=Boundary)
    eval_every: int = 1
    memory_budget_bytes: int = 512 * 2**20
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 10
    #: which evaluations ``run`` reports epsilon at (run.epsilon_every, ``dpfl.engine.epsilon_schedule``); the bare
    #: Simulation's default, 1, reports it at every evaluation (a config's default is "auto")
    epsilon_every: int | str = 1
    release: str = ""  # sha256 of the run's release config (see dpfl.experiments.run_directory.release_config)
    data: dict = field(default_factory=dict)  # the data's provenance (FederatedDataset.info), for results.json
    #: where the cohort's client work runs: None, in this process (``in_process``); otherwise a callable with its
    #: signature (simulation, round index, cohort ids) yielding (client ids, ClientOutput), e.g. one client per Flower
    #: SuperNode (``dpfl.flower``). The round's ledger entry is saved before it is called, its draws checked after.
    workers: Callable | None = None
    #: the ranks the cohort's client work is split across (``dpfl.engine.ranks``; ``workers`` is then their
    #: ``RankWorkers``): None, this process alone. With them a stop signal any rank receives stops every rank after the
    #: same round, and a world size above 1 enters each round's fingerprint (``_fingerprint``)
    ranks: Ranks | None = None
    #: the run's public identity (run.json's run_id): with the release config, what a silo's own noise key is derived
    #: for on Flower (``dpfl.flower.silo_state``), so that two runs never share noise
    run_id: str = ""
    #: where the model is evaluated: None, here, on ``train`` and ``test`` (``evaluate``); otherwise an ``Evaluator``
    evaluator: Evaluator | None = None
    #: where the run's tensors live (run.device, ``dpfl.engine.device``): its data, model, state and draws
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: what privacy.epsilon set the noise for, for results.json (``experiments.noise_level.calibration_report``:
    #: the target, the observers it bounds, their boundary, the level solved); None: the noise was not calibrated
    calibration: dict | None = None
    #: the clients ``evaluate`` measures (run.eval_clients: a fixed public sample, for a federation too large to
    #: evaluate in full each time); None: every client
    eval_clients: torch.Tensor | None = None
    history: list = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.boundary, str):
            self.boundary = Boundary(self.boundary)
        with on_device(self.device):
            self.state = self.algorithm.init_state(self.grads.initial_params(), self.train.num_clients)
        self.next_round = 0
        self.stopped_reason = None
        self.stopped_by = None  # what stopped the run early: "budget", "diverged", "interrupted" (None: it did not)
        self.interrupted = False
        self.stop_signal: int | None = None  # the signal that interrupted the run (``stop_signal.STOP_SIGNALS``)
        self.wall_seconds = 0.0  # in run, over the whole run (restored from a checkpoint by load_checkpoint)
        self.session_seconds = 0.0  # in run, by this process
        self._key_saved = False
        self._ledger_summarised = True  # whether ledger.json holds the epsilon of every round recorded (``run``)
        self._round_clip: float | None = None  # the clip of the last round run here (``Algorithm.clip_of``)
        self._reads: list = []  # (metrics, the Future of its epsilon) of evaluations not settled (``settle_epsilon``)
        #: the last round ``run`` means to take (numbered from 1): the ledger prepares budget checks up to it
        #: (``PrivacyLedger.record``); None outside ``run``
        self.horizon: int | None = None

    @property
    def model(self) -> torch.Tensor:
        """The global model's parameters."""
        return self.state.server["x"]

    # -- privacy ------------------------------------------------------------------------------------------------
    def round_privacy(self, round_index: int | None = None) -> dict[str, dp_event.DpEvent]:
        """Each observer's event of a round (default: the next), from the algorithm's declared release, the
        boundary and the client sampler's participation (or the release's own cohort, when it fixes one)."""
        t = self.next_round if round_index is None else round_index
        return declare_round(self.algorithm, self.boundary, self.clients, self.ledger.analysis, t, self.state,
                             self.train.counts)[1]

    # -- one round ----------------------------------------------------------------------------------------------
    def client_bytes(self) -> int:
        """Bytes one client takes in a call of ``client_round`` (``client_work_bytes``)."""
        return client_work_bytes(self.algorithm, self.grads, self.train, self.state)

    def chunk_size(self, cohort_size: int) -> int:
        """How many clients of the cohort one call of ``client_round`` takes within ``memory_budget_bytes`` (at least
        one, even past it: the runner refuses a run.memory_mb below ``client_bytes``)."""
        return max(1, min(cohort_size, self.memory_budget_bytes // max(self.client_bytes(), 1)))

    def step(self) -> None:
        """One round, on the run's device (also when called outside ``run``)."""
        with on_device(self.device):
            self._step()

    def _step(self) -> None:
        t = self.next_round
        cohort = self.clients.sample(t, self.seed)
        release, views = declare_round(self.algorithm, self.boundary, self.clients, self.ledger.analysis, t,
                                       self.state, self.train.counts)
        journal = None
        if self.checkpoint_dir is not None:
            Path(self.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            if self.secret and not self._key_saved:  # the key the recorded rounds' noise is drawn from
                keys.save_key(Path(self.checkpoint_dir) / keys.KEY_FILE, self.seed)
                self._key_saved = True
            journal = Path(self.checkpoint_dir) / "ledger.json"  # the journal, saved without accounting
        # the journal numbers rounds from 1; the record and its durable save run beside the client work (module
        # docstring, "The ledger before the release")
        recorded = self.ledger.record_later(t + 1, views, self._fingerprint(t, cohort), journal, self.horizon)
        try:
            self._round_clip = self.algorithm.clip_of(self.state.server)
            if self.workers is None:
                work = once_recorded(recorded, self.in_process(t, cohort))
            else:  # work done elsewhere leaves this process: it starts once the round is on record
                recorded.result()
                work = self.workers(self, t, cohort)
            with self.grads.counted_if_completed():  # a dropped round's zeroed examples are not reported either
                across = self.ranks.summed if self.ranks is not None and all_reduced(self.boundary) else None
                server = run_cohort(self.algorithm, self.boundary, release, t, self.seed, self.train.num_clients,
                                    self.state.server, self.state.clients, CohortRows(cohort), work=work,
                                    across=across).server
        finally:
            futures.wait([recorded])  # the ledger is nobody's but this thread's again, whatever stopped the round
        if journal is not None:
            self._ledger_summarised = False
        self.state.server = server
        self.next_round = t + 1
        if not bool(torch.isfinite(self.model).all()):
            raise TrainingDivergedError(f"round {t + 1}: the global model has non-finite parameters (diverged); "
                                        f"{self._divergence_hint()}")

    def in_process(self, t: int, cohort: torch.Tensor) -> Iterator[tuple[torch.Tensor, ClientOutput]]:
        """The cohort's client work in this process: clients as a tensor axis, in chunks of ``memory_budget_bytes``;
        yields (the chunk's client ids, its ``ClientOutput``)."""
        return client_work(self.algorithm, t, self.seed, self.state.server, self.state.clients, CohortRows(cohort),
                           Records(self.train.x, self.train.y, self.train.counts, self.grads),
                           self.chunk_size(max(cohort.numel(), 1)))

    def _fingerprint(self, round_index: int, cohort: torch.Tensor) -> str:
        """What round t releases is fixed by the run's release config, its noise key (which names every random stream;
        the fingerprint commits to it, and SHA-256 does not reveal it), the round index and the state the round
        starts from: the server's and the rows of client state of its ``cohort`` (drawn from the key and t; no other
        client's row enters the round, so a population of 10^5 costs no more than its cohort). A replay with the
        same fingerprint releases the same thing (no new privacy loss), any other is a new release. Split across N > 1
        ranks (``dpfl.engine.ranks``) the order the messages are added up in and the cohort's memory chunks depend on
        N (with several threads a chunk's rows may round differently), so N is part of it: a round replayed with
        another N is charged again; and each rank holds only its own clients' rows, so each hashes its own clients of
        the cohort and the digests of every rank, in rank order, enter the fingerprint (a gather: every rank calls it
        in every round)."""
        digest = hashlib.sha256()

        def update(*pieces, into=digest) -> None:  # one part: its length, then its bytes (an unambiguous concatenation)
            into.update(sum(piece.nbytes for piece in pieces).to_bytes(8, "little"))
            for piece in pieces:
                into.update(piece)

        def tensors(part_state: dict, into=digest) -> None:
            for name, value in sorted(part_state.items()):  # the tensor's own memory where it is one on the CPU
                update(memoryview(name.encode()), value.detach().cpu().contiguous().numpy(), into=into)

        device = stream_identity(self.device)  # "" on the CPU: its fingerprints are those of runs before run.device
        world = self.ranks.world_size if self.ranks is not None else 1  # 1: the fingerprints of one process
        for part in (self.release.encode(), str(self.seed).encode(), str(round_index).encode(),
                     *((device.encode(),) if device else ()), *((f"ranks {world}".encode(),) if world > 1 else ())):
            update(memoryview(part))
        tensors(self.state.server)
        if world == 1:
            tensors(self.state.rows(cohort))
        else:  # each rank's own clients of the cohort, hashed where they are held
            own = hashlib.sha256()
            tensors(self.state.rows(cohort[self.ranks.owns(cohort)]), into=own)
            for rank_digest in self.ranks.everyones(own.digest()):
                update(memoryview(rank_digest))
        return digest.hexdigest()

    def _divergence_hint(self) -> str:
        return self.algorithm.divergence_hint(self.train.counts)

    def evaluate(self, epsilon: bool = True, wait: bool = True) -> RoundMetrics:
        """The metrics of the model after the rounds done, with epsilon as it stood after the last of them (a round
        replayed after a resume reports its own epsilon, not that of rounds the ledger recorded after it; with
        ``epsilon`` False, None: no accounting), and the examples the clip zeroed since the previous evaluation and
        the clip of the last round (when run in this process; ``RoundMetrics``). With ``wait`` False the epsilon is
        computed on the ledger's background thread (``PrivacyLedger.epsilon_through_later``) and the metrics' epsilon
        is None until ``settle_epsilon`` fills it in (``run`` does at every checkpoint, the last round and any
        stop). Split across ranks, every rank calls it at the same round (the zeroed examples are summed across
        them); rank 0, which writes the results, alone measures the model (every rank holds the same one) and gives
        the others its loss, accuracy and gradient mapping, and alone reads epsilon (the others' rows carry none)."""
        if self.ranks is None or self.ranks.world_size == 1:
            loss, accuracy, mapping = self._measured(self.model)
        else:
            loss, accuracy, mapping = self.ranks.decided_by_first(lambda: self._measured(self.model))
        epsilon = epsilon and (self.ranks is None or self.ranks.is_first)  # the other ranks report nothing
        eps = _reported(self.ledger.epsilon_through(self.next_round)) if epsilon and wait else None
        if self.ranks is not None:  # each rank counts its own share's
            zeroed = self.ranks.total(self.grads.take_nonfinite_examples())
        else:
            zeroed = self.grads.take_nonfinite_examples() if self.workers is None else None  # one read a round
        metrics = RoundMetrics(self.next_round, loss, accuracy, eps, mapping, zeroed, self._round_clip)
        if epsilon and not wait:
            self._reads.append((metrics, self.ledger.epsilon_through_later(self.next_round)))
        return metrics

    def _measured(self, x: torch.Tensor) -> tuple[float | None, float | None, float | None]:
        """(train loss with the regulariser, test accuracy, gradient mapping) of the model ``x``."""
        if self.evaluator is None:
            train, test = self.evaluated()
            loss, _ = self.grads.mean_loss_and_accuracy(x, train.flat_chunks())  # a piece at a time: 10^5 clients'
            _, accuracy = self.grads.mean_loss_and_accuracy(x, test.flat_chunks())  # records are memory-mapped
            mapping = self.gradient_mapping(x, train)
        else:
            (loss, accuracy), mapping = self.evaluator(self, x), None
        if loss is not None:
            loss += self.algorithm.regulariser(x)
        return loss, accuracy, mapping

    @property
    def settled(self) -> int:
        """How many of ``history``'s first rows are final: those before the first whose epsilon is still being read
        (``settle_epsilon``)."""
        if self._reads:
            for position in range(len(self.history) - 1, -1, -1):  # the unsettled rows are the latest
                if self.history[position] is self._reads[0][0]:
                    return position
        return len(self.history)

    def settle_epsilon(self, wait: bool = True) -> None:
        """Fills in the epsilon of the evaluations whose read ``evaluate(wait=False)`` left to the background: every
        one (``wait``), or those already computed."""
        while self._reads and (wait or self._reads[0][1].done()):
            metrics, read = self._reads.pop(0)
            metrics.epsilon = _reported(read.result())

    def evaluated(self):
        """(train, test) splits ``evaluate`` measures: those of ``eval_clients`` (the test split's too where it has
        one row per client, else all of it), or the whole splits."""
        if self.eval_clients is None:
            return self.train, self.test
        per_client = self.test.num_clients == self.train.num_clients
        return (self.train.clients(self.eval_clients),
                self.test.clients(self.eval_clients) if per_client else self.test)

    def gradient_mapping(self, x: torch.Tensor, train=None) -> float | None:
        """||G_eta(x)||^2 on the pooled train data of the evaluated clients (``RoundMetrics``; ``train``: their split,
        as ``evaluated`` gives it, default gathered here), or None for an algorithm without a prox step."""
        if self.algorithm.composite is None:
            return None
        f1, eta = self.algorithm.composite
        train = self.evaluated()[0] if train is None else train
        mapping = f1.gradient_mapping(x, self.grads.mean_loss_gradient(x, train.flat_chunks()), eta)
        return float(mapping.double().square().sum())

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self, rounds: int, progress: bool = False,
            on_evaluated: Callable[["Simulation"], None] | None = None) -> list[RoundMetrics]:
        """Runs until ``rounds`` rounds are done (counting rounds done before a resume), a budget stops it (before the
        round that would exceed it), the model or the train loss diverges (non-finite, or a train loss above
        ``DIVERGED_LOSS``), or Ctrl-C or SIGTERM does: then the round in progress completes, the run checkpoints (with a
        checkpoint_dir) and returns with ``interrupted`` and ``stop_signal`` set and ``stopped_reason`` saying so (a
        second one raises ``RunAborted`` at once: ``stop_signal.StopOnSignal``).
        ``on_evaluated(self)`` is called after each evaluated round, once its metrics are in ``history`` and its
        checkpoint (if due) is written (the runner writes results.json there). An evaluation reports epsilon where
        ``epsilon_every`` schedules it (``epsilon_schedule.epsilon_due``), else None; the epsilon is read on the
        ledger's background thread (``evaluate(wait=False)``) and filled in once read, at the latest before the next
        checkpoint, after the last round and at any stop (``settle_epsilon``): rows ``history[settled:]`` still wait
        for theirs. A negative or fractional
        ``rounds`` is refused (``ConfigError``); one at most the rounds done returns [] at once."""
        if isinstance(rounds, numbers.Integral) and not isinstance(rounds, bool):
            rounds = int(rounds)  # a numpy integer too
        rounds = check_range("rounds", rounds, 0, integer=True)
        bar = Progress(rounds, self.next_round, progress)
        started, wall, session = time.perf_counter(), self.wall_seconds, self.session_seconds

        def clock() -> None:
            elapsed = time.perf_counter() - started
            self.wall_seconds, self.session_seconds = wall + elapsed, session + elapsed

        self.interrupted, self.stop_signal, self.horizon = False, None, rounds
        checkpoints = self.checkpoint_dir is not None  # rank 0's run directory: the other ranks learn whether it has one
        if self.ranks is not None and self.ranks.world_size > 1:
            checkpoints = self.ranks.from_first(checkpoints)
        try:
            with StopOnSignal() as signalled, on_device(self.device):
                while self.next_round < rounds:
                    try:
                        self.step()
                    except (BudgetExceededError, TrainingDivergedError) as err:
                        self.stopped_reason = str(err)
                        self.stopped_by = "budget" if isinstance(err, BudgetExceededError) else "diverged"
                        break
                    metrics = None
                    if self.next_round % self.eval_every == 0 or self.next_round == rounds:
                        metrics = self.evaluate(epsilon_due(self.next_round, rounds, self.epsilon_every,
                                                            self.checkpoint_every), wait=False)
                        if metrics.train_loss is not None and not metrics.train_loss <= DIVERGED_LOSS:  # NaN too
                            what = ("is not finite" if not math.isfinite(metrics.train_loss) else
                                    f"is {metrics.train_loss:.3g}, above {DIVERGED_LOSS:g} (a uniform guess scores "
                                    "ln K)")
                            self.stopped_reason = (f"round {self.next_round}: the train loss {what} (diverged); "
                                                   f"{self._divergence_hint()}")
                            self.stopped_by = "diverged"
                            break
                        self.history.append(metrics)
                    last = self.next_round == rounds
                    due = self.next_round % self.checkpoint_every == 0 or last
                    requested = (signalled.requested if self.ranks is None else
                                 self.ranks.agreed_signal(signalled.requested))
                    stop = requested is not None and self.next_round < rounds
                    self.settle_epsilon(wait=last or stop)  # a mid-run checkpoint takes the reads done so far
                    read = next((m for m in reversed(self.history[: self.settled]) if m.epsilon is not None), None)
                    bar.update(self.next_round, metrics and metrics.test_accuracy, read and read.epsilon,
                               read and read.round)
                    clock()
                    if checkpoints and (due or stop):  # rank 0 saves every rank's clients (a gather)
                        whole = self.state if self.ranks is None else self.ranks.whole_state(self.state)
                        if self.checkpoint_dir is not None:
                            self.save_checkpoint(final=last or stop, state=whole)
                    if metrics is not None and on_evaluated is not None:
                        on_evaluated(self)
                    if stop:
                        self.interrupted, self.stop_signal = True, requested
                        self.stopped_reason = (f"interrupted ({STOP_SIGNALS[self.stop_signal]}) after round "
                                               f"{self.next_round} of {rounds}")
                        self.stopped_by = "interrupted"
                        break
                self.settle_epsilon()  # a budget or divergence stop
                if self.checkpoint_dir is not None and not self._ledger_summarised:  # a budget or divergence stop
                    self.ledger.save(Path(self.checkpoint_dir) / "ledger.json")
                    self._ledger_summarised = True
        except Exception:  # an error ends the run: no read of it left running (a read's own error aside)
            with contextlib.suppress(Exception):
                self.settle_epsilon()
            raise
        finally:
            bar.close()
            clock()
            self.horizon = None
        return self.history

    # -- checkpoints --------------------------------------------------------------------------------------------
    def save_checkpoint(self, final: bool = True, state: State | None = None) -> None:
        """The algorithm's state (``state``, default this process's: split across ranks, ``run`` passes the whole
        run's, ``Ranks.whole_state``), the next round, the history and the wall time so far
        (``dpfl.engine.checkpoint``), then the ledger: with each observer's epsilon (ledger.json's summary) where
        ``final`` or where it costs no accounting. A mid-run checkpoint (``final`` False, as ``run`` takes one) waits
        for no accounting: rows whose epsilon is still being read are saved without it, and a resume reads them again
        (``load_checkpoint``)."""
        directory = Path(self.checkpoint_dir)
        checkpoint.save(directory / "checkpoint.pt", self.next_round, self.release,
                        self.state if state is None else state,
                        [m.to_dict() for m in self.history], self.wall_seconds)
        summary = final or self.ledger.spent_is_known()
        self.ledger.save(directory / "ledger.json", summary=summary)
        self._ledger_summarised = summary

    def load_checkpoint(self, directory: Path) -> None:
        """Resumes the run saved in ``directory``: adopts its ledger.json (which may be ahead of the checkpoint; it is
        kept, never rewound) and restores checkpoint.pt (with the wall time so far), or, when the run was stopped
        before its first checkpoint, starts from the first round (the replayed rounds carry the fingerprints already
        recorded and are not charged twice).
        RunDirectoryError, before anything is run or recorded, if the files are missing, corrupt or from another run."""
        directory = Path(directory)
        ledger_path, checkpoint_path = directory / "ledger.json", directory / "checkpoint.pt"
        if not ledger_path.exists():
            if checkpoint_path.exists():
                raise RunDirectoryError(
                    f"cannot resume: {checkpoint_path} has no ledger.json beside it, so the privacy that run spent is "
                    "not on record; restore the ledger, or start a new run directory")
            raise RunDirectoryError(f"cannot resume: {directory} holds no ledger.json or checkpoint.pt (no round of a "
                                    "run was started there); drop --resume to start a new run")
        spent = _numbered_from_one(PrivacyLedger.load(ledger_path))
        for setting in ("delta", "conversion", "analysis", "neighboring", "observers"):
            if getattr(spent, setting) != getattr(self.ledger, setting):
                raise RunDirectoryError(f"cannot resume: the run directory's ledger has {setting} = "
                                        f"{getattr(spent, setting)!r}, the config {getattr(self.ledger, setting)!r}")
        if checkpoint_path.exists():
            recorded = max((e["round"] for e in spent.to_dict()["journal"]), default=0)
            saved = checkpoint.load(checkpoint_path, self.release, self.state, recorded)
            try:
                history = [RoundMetrics(**m) for m in saved.history]
            except TypeError as err:
                raise RunDirectoryError(f"{checkpoint_path} is not a valid checkpoint of this run ({err})") from None
            self.next_round, self.state, self.history = saved.next_round, saved.state, history
            self.wall_seconds = saved.wall_seconds
        spent.budget = self.ledger.budget  # the budget is the config's (it may have been raised or lowered)
        self.ledger = spent
        for metrics in self.history:  # rows a mid-run checkpoint saved while their epsilon was being read
            if metrics.epsilon is None and epsilon_due(metrics.round, math.inf, self.epsilon_every,
                                                       self.checkpoint_every):
                self._reads.append((metrics, self.ledger.epsilon_through_later(metrics.round)))


def once_recorded(recorded: Future, work: Iterator[tuple[torch.Tensor, ClientOutput]]
                  ) -> Iterator[tuple[torch.Tensor, ClientOutput]]:
    """The chunks of ``work``, the first computed before ``recorded`` (the round's ledger record and save) completes
    and yielded only after it has: a round's client work overlaps its record, and nothing it computed reaches the
    round's state, the boundary or the server before the round is on record (a budget stop raises here, before the
    first chunk is yielded). An empty cohort's round waits for the record too."""
    chunks = iter(work)
    first = next(chunks, None)
    recorded.result()
    if first is not None:
        yield first
        yield from chunks


#: Model-sized float32 vectors one client's round holds besides its noise draws (its model copy, gradient sums, the
#: control-variate correction, its messages and their temporaries). Measured (peak resident memory of a round, a
#: 51,010-parameter MLP, one chunk of 400 clients, K = 1 and 8): DP-SCAFFOLD 5, DP-FedAvg 3 to 4.5 vectors a client
#: besides its K draws and its messages.
ROUND_VECTORS = 6


def client_work_bytes(algorithm: Algorithm, grads: CohortGradients, train, state) -> int:
    """Bytes one client takes in a call of ``client_round``: its largest minibatch's per-example work, its (padded)
    records, and its model-sized vectors (4 d bytes each): one per noise draw of the round it declares (K local
    steps: K draws of d coordinates; 8 d bytes for the int64 draws of run.secure_noise's discrete Gaussian) and
    ``ROUND_VECTORS`` more. ``state`` may hold meta tensors (only its shapes are read: ``dpfl.experiments.memory``),
    so the runner can refuse a run before its state is built."""
    batch = algorithm.examples_per_client(train.counts)
    draws = sum(8 if isinstance(innermost(e), DiscreteGaussianDpEvent) else 4
                for e in algorithm.release(0, state, train.counts).step_events)
    return (batch * memory_per_example(grads, tuple(train.x.shape[2:])) + 4 * train.x[0].numel()
            + grads.num_params * (draws + 4 * ROUND_VECTORS))


def declare_round(algorithm: Algorithm, boundary: Boundary, clients: ClientSampler, analysis: str, round_index: int,
                  state, counts: torch.Tensor) -> tuple[Release, dict[str, dp_event.DpEvent]]:
    """Round ``round_index``'s release (the algorithm's declared draws, before any noise) and each observer's event of
    it (the boundary's views under the client sampler's participation, or the release's own cohort when it fixes
    one), for clients with ``counts`` train records: what the ledger records before the round, and
    what calibration composes without training (``dpfl.experiments.calibration``)."""
    release = algorithm.release(round_index, state, counts)
    return release, boundary.views(release, release.cohort or clients.cohort(round_index), analysis)


def _reported(epsilon: dict[str, float]) -> dict[str, float | None]:
    """Epsilon per observer as metrics report it: None for an infinite one (JSON has no infinity)."""
    return {o: (None if e == float("inf") else e) for o, e in epsilon.items()}


def _numbered_from_one(ledger: PrivacyLedger) -> PrivacyLedger:
    """``ledger`` with its journal numbered from 1; a ledger written before rounds were numbered from 1 for users has
    a round 0 (every run's journal starts at its first round) and is renumbered, so its rounds keep their privacy."""
    data = ledger.to_dict(summary=False)  # the journal: no accounting
    if all(entry["round"] != 0 for entry in data["journal"]):
        return ledger
    for entry in data["journal"]:
        entry["round"] += 1
    return PrivacyLedger.from_dict(data)


__all__ = ["Simulation", "RoundMetrics", "ROUND_VECTORS", "client_work_bytes", "declare_round"]
