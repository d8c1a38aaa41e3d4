"""The round loop: sampling, the cohort's local work in chunks, aggregation, privacy ledger, metrics, checkpoints.

The path of one round (ARCHITECTURE "hot path"): sample the cohort -> declare the round's privacy events per observer
and compose them in the ledger (a budget stops the run here, before any noise is drawn) -> gather the cohort's data
-> the algorithm's local steps for the cohort, chunked to bound memory (clients are a tensor axis: the only Python
loops are over rounds, local steps and memory chunks) -> check that the noise drawn is the noise declared -> server
update -> evaluate -> checkpoint.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from dp_accounting import dp_event

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import Release, observer_events
from dpfl.algorithms.local_sgd import CohortData, LocalSGD
from dpfl.engine.grads import CohortGradients, memory_per_example
from dpfl.engine.sampling import ClientSampler
from dpfl.errors import BudgetExceededError, DpflError, TrainingDivergedError


@dataclass
class RoundMetrics:
    round: int
    train_loss: float
    test_accuracy: float
    epsilon: dict

    def to_dict(self) -> dict:
        return {"round": self.round, "test_accuracy": self.test_accuracy, "train_loss": self.train_loss,
                "epsilon": self.epsilon}


@dataclass
class Simulation:
    """Everything one run needs; ``run`` executes rounds and returns the metrics history."""

    train: object  # ClientArrays (x, y, counts, flat())
    test: object
    grads: CohortGradients
    algorithm: LocalSGD
    clients: ClientSampler
    ledger: PrivacyLedger
    seed: int = 0
    boundary: str = "plain"
    eval_every: int = 1
    memory_budget_bytes: int = 512 * 2**20
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 10
    history: list = field(default_factory=list)

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.seed)
        x0 = self.grads.initial_params()
        self.state = self.algorithm.init_state(x0, self.train.num_clients)
        self.next_round = 0
        self._train_flat = self.train.flat()
        self._test_flat = self.test.flat()
        self.stopped_reason = None

    # -- privacy ------------------------------------------------------------------------------------------------
    def round_privacy(self) -> dict[str, dp_event.DpEvent]:
        """Each observer's event of one round, from the algorithm's noise and the samplers' real sampling."""
        sampler = self.algorithm.sampler
        step = sampler.event(self.algorithm.step_noise_event, self.train.counts)
        divisors = sampler.divisor(self.train.counts)  # sensitivity_j is proportional to 1 / divisor_j
        ratio = float(divisors.min() / divisors.max())
        release = Release((step,) * self.algorithm.local_steps, self.algorithm.additive_steps, ratio)
        return observer_events(release, self.clients.num_clients, self.clients.cohort_size, self.boundary,
                               self.clients.scheme, self.ledger.analysis, client_rate=self.clients.rate)

    # -- one round ----------------------------------------------------------------------------------------------
    def _chunk_size(self, cohort_size: int) -> int:
        batch = int(self.algorithm.sampler.batch_sizes(self.train.counts).max())
        per_client = batch * memory_per_example(self.grads, self.train.x[0, 0].numel()) + 4 * self.train.x[0].numel()
        return max(1, min(cohort_size, self.memory_budget_bytes // max(per_client, 1)))

    def step(self) -> None:
        t = self.next_round
        cohort = self.clients.sample(self.generator)
        chunk = self._chunk_size(max(cohort.numel(), 1))
        # What this round will release is fixed by the generator's state and the chunking: a replay with the same
        # fingerprint releases the same thing (no new privacy loss), any other is a new release.
        fingerprint = hashlib.sha256(self.generator.get_state().numpy().tobytes() + str(chunk).encode()).hexdigest()
        self.ledger.record(t, self.round_privacy(), fingerprint)
        if self.checkpoint_dir is not None:  # spent before any noise is drawn: persist it first
            Path(self.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            self.ledger.save(Path(self.checkpoint_dir) / "ledger.json")
        warm = t < self.algorithm.warm_rounds
        dys, dcs = [], []
        declared = self.algorithm.step_noise_event
        covered = isinstance(declared, dp_event.NonPrivateDpEvent)  # "not private" covers any noise
        for start in range(0, cohort.numel(), chunk):
            ids = cohort[start : start + chunk]
            data = CohortData(self.train.x[ids], self.train.y[ids], self.train.counts[ids])
            dy, dc, events = self.algorithm.client_round(self.state, ids, data, self.grads, self.generator, warm)
            if len(events) != self.algorithm.local_steps or not (covered or all(e == declared for e in events)):
                raise DpflError(f"round {t}: noise drawn {events[:1]} x{len(events)} differs from the declared "
                                f"{declared} x{self.algorithm.local_steps}; the ledger would be wrong")
            dys.append(dy)
            dcs.append(dc)
        if cohort.numel():
            self.algorithm.server_update(self.state, cohort, torch.cat(dys),
                                         torch.cat(dcs) if self.algorithm.control_variates else None)
        self.next_round = t + 1
        if not bool(torch.isfinite(self.state.x).all()):
            raise TrainingDivergedError(
                f"round {t}: the global model has non-finite parameters (diverged); lower algorithm.lr or "
                f"algorithm.global_lr, or raise the batch size (noise std is noise_multiplier * 2C / batch)")

    def evaluate(self) -> RoundMetrics:
        x = self.state.x
        loss, _ = self.grads.loss_and_accuracy(x, *self._train_flat)
        loss += 0.5 * self.algorithm.weight_decay * float(x.double().square().sum())
        _, accuracy = self.grads.loss_and_accuracy(x, *self._test_flat)
        eps = {o: (None if e == float("inf") else e) for o, e in self.ledger.epsilon().items()}
        return RoundMetrics(self.next_round, loss, accuracy, eps)

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self, rounds: int, progress: bool = False) -> list[RoundMetrics]:
        """Runs until ``rounds`` rounds are done (counting rounds done before a resume), or a budget stops it."""
        bar = _progress(rounds, self.next_round, progress)
        started = time.perf_counter()
        while self.next_round < rounds:
            try:
                self.step()
            except (BudgetExceededError, TrainingDivergedError) as err:
                self.stopped_reason = str(err)
                break
            if self.next_round % self.eval_every == 0 or self.next_round == rounds:
                metrics = self.evaluate()
                if not math.isfinite(metrics.train_loss):
                    self.stopped_reason = (f"round {self.next_round - 1}: the train loss is not finite (diverged); "
                                           "lower algorithm.lr or algorithm.global_lr, or raise the batch size")
                    break
                self.history.append(metrics)
                if bar is not None:
                    bar.set_postfix(acc=f"{metrics.test_accuracy:.3f}",
                                    eps=_fmt_eps(metrics.epsilon.get("third_party")))
            if bar is not None:
                bar.update(1)
            if self.checkpoint_dir is not None and (self.next_round % self.checkpoint_every == 0
                                                     or self.next_round == rounds):
                self.save_checkpoint()
        if bar is not None:
            bar.close()
        self.wall_seconds = time.perf_counter() - started
        return self.history

    # -- checkpoints --------------------------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Model state, samplers' randomness, history and ledger; the ledger itself is written at every round."""
        directory = Path(self.checkpoint_dir)
        directory.mkdir(parents=True, exist_ok=True)
        state = {"next_round": self.next_round, "x": self.state.x, "c": self.state.c,
                 "client_c": self.state.client_c, "generator": self.generator.get_state(),
                 "history": [m.to_dict() for m in self.history]}
        tmp = directory / "checkpoint.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(directory / "checkpoint.pt")
        self.ledger.save(directory / "ledger.json")

    def load_checkpoint(self, directory: Path) -> None:
        """Restores a run; the ledger on disk (which may be ahead of the checkpoint) is kept, never rewound."""
        state = torch.load(Path(directory) / "checkpoint.pt", weights_only=False)
        self.next_round = state["next_round"]
        self.state.x, self.state.c, self.state.client_c = state["x"], state["c"], state["client_c"]
        self.generator.set_state(state["generator"])
        self.history = [RoundMetrics(**m) for m in state["history"]]
        ledger_path = Path(directory) / "ledger.json"
        if ledger_path.exists():
            spent = PrivacyLedger.load(ledger_path)
            for setting in ("delta", "conversion", "analysis", "neighboring", "observers"):
                if getattr(spent, setting) != getattr(self.ledger, setting):
                    raise DpflError(f"cannot resume: the run directory's ledger has {setting} = "
                                    f"{getattr(spent, setting)!r}, the config {getattr(self.ledger, setting)!r}")
            spent.budget = self.ledger.budget  # the budget is the config's (it may have been raised or lowered)
            self.ledger = spent


def _fmt_eps(eps):
    return "inf" if eps is None else f"{eps:.3g}"


def _progress(total: int, done: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, unit="round", dynamic_ncols=True)


__all__ = ["Simulation", "RoundMetrics"]
