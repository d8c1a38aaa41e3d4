"""The round loop: sampling, the cohort's local work in chunks, aggregation, privacy ledger, metrics, checkpoints.

The path of one round (ARCHITECTURE "hot path"): sample the cohort -> declare the round's privacy events per observer
and compose them in the ledger (a budget stops the run here, before any noise is drawn) -> gather the cohort's data
-> the algorithm's local steps for the cohort, chunked to bound memory (clients are a tensor axis: the only Python
loops are over rounds, local steps and memory chunks) -> check that the noise drawn is the noise declared -> server
update -> evaluate -> checkpoint.

Crash safety: the ledger is written (atomically) before a round draws any noise, so privacy spent is on disk before
anything is released; a resume (``load_checkpoint``) keeps that ledger and replays rounds from the last checkpoint, or
from round 0 without one. A replayed round is free only if its fingerprint (``_fingerprint``: the release config, the
generator state, the chunking and the round-start model state) equals the one recorded, i.e. only if it releases
exactly what was released before. Ctrl-C during ``run`` stops after the current round and checkpoints; a second
Ctrl-C aborts at once.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import signal
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from dp_accounting import dp_event

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import Release, observer_events
from dpfl.algorithms.local_sgd import CohortData, LocalSGD
from dpfl.engine.grads import CohortGradients, memory_per_example
from dpfl.engine.sampling import ClientSampler
from dpfl.errors import BudgetExceededError, DpflError, RunDirectoryError, TrainingDivergedError


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
    release: str = ""  # sha256 of the run's release config (see dpfl.experiments.runner.release_config)
    history: list = field(default_factory=list)

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.seed)
        x0 = self.grads.initial_params()
        self.state = self.algorithm.init_state(x0, self.train.num_clients)
        self.next_round = 0
        self._train_flat = self.train.flat()
        self._test_flat = self.test.flat()
        self.stopped_reason = None
        self.interrupted = False

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
        self.ledger.record(t, self.round_privacy(), self._fingerprint(chunk))
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
            raise TrainingDivergedError(f"round {t}: the global model has non-finite parameters (diverged); "
                                        f"{self._divergence_hint()}")

    def _fingerprint(self, chunk: int) -> str:
        """What the round about to run will release is fixed by the run's release config, the generator's state (the
        cohort is drawn; the minibatches and the noise are to come), the chunking (it orders the generator's draws)
        and the model state the round starts from: a replay with the same fingerprint releases the same thing (no new
        privacy loss), any other is a new release."""
        digest = hashlib.sha256()
        parts = [self.release.encode(), self.generator.get_state().numpy(), str(chunk).encode()]
        parts += [b"none" if v is None else v.detach().contiguous().numpy()
                  for v in (self.state.x, self.state.c, self.state.client_c)]
        for part in parts:
            digest.update(len(memoryview(part).cast("B")).to_bytes(8, "little"))  # unambiguous concatenation
            digest.update(part)
        return digest.hexdigest()

    def _divergence_hint(self) -> str:
        """What to change when the model diverges, with the noise of the sampler actually in use."""
        hint = "lower algorithm.lr or algorithm.global_lr"
        algorithm = self.algorithm
        if not algorithm.mechanism.is_private:
            return hint
        sampler = algorithm.sampler
        if sampler.scheme == "fixed":
            formula = "noise_multiplier * 2C / floor(s n_i), with fixed-size batches of floor(s n_i) records at s = "
        else:
            formula = "noise_multiplier * C / (q n_i), q n_i the expected batch size of Poisson record sampling at q = "
        hint += (f", or raise algorithm.sample_rate (the noise on a client's mean gradient has std {formula}"
                 f"{sampler.rate:g}")
        if algorithm.clip_heuristic == "fixed":
            worst = algorithm.mechanism.noise_multiplier * sampler.mean_sensitivity(algorithm.clip, self.train.counts)
            hint += f"; up to {float(worst.max()):.3g} here"
        return hint + ")"

    def evaluate(self) -> RoundMetrics:
        x = self.state.x
        loss, _ = self.grads.loss_and_accuracy(x, *self._train_flat)
        loss += 0.5 * self.algorithm.weight_decay * float(x.double().square().sum())
        _, accuracy = self.grads.loss_and_accuracy(x, *self._test_flat)
        eps = {o: (None if e == float("inf") else e) for o, e in self.ledger.epsilon().items()}
        return RoundMetrics(self.next_round, loss, accuracy, eps)

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self, rounds: int, progress: bool = False) -> list[RoundMetrics]:
        """Runs until ``rounds`` rounds are done (counting rounds done before a resume), a budget stops it, or Ctrl-C
        does: then the round in progress completes, the run checkpoints (with a checkpoint_dir) and returns with
        ``interrupted`` set and ``stopped_reason`` saying so (a second Ctrl-C raises KeyboardInterrupt at once)."""
        bar = _progress(rounds, self.next_round, progress)
        started = time.perf_counter()
        self.interrupted = False
        try:
            with _StopOnCtrlC() as ctrl_c:
                while self.next_round < rounds:
                    try:
                        self.step()
                    except (BudgetExceededError, TrainingDivergedError) as err:
                        self.stopped_reason = str(err)
                        break
                    if self.next_round % self.eval_every == 0 or self.next_round == rounds:
                        metrics = self.evaluate()
                        if not math.isfinite(metrics.train_loss):
                            self.stopped_reason = (f"round {self.next_round - 1}: the train loss is not finite "
                                                   f"(diverged); {self._divergence_hint()}")
                            break
                        self.history.append(metrics)
                        if bar is not None:
                            bar.set_postfix(acc=f"{metrics.test_accuracy:.3f}",
                                            eps=_fmt_eps(metrics.epsilon.get("third_party")))
                    if bar is not None:
                        bar.update(1)
                    due = self.next_round % self.checkpoint_every == 0 or self.next_round == rounds
                    stop = ctrl_c.requested and self.next_round < rounds
                    if self.checkpoint_dir is not None and (due or stop):
                        self.save_checkpoint()
                    if stop:
                        self.interrupted = True
                        self.stopped_reason = f"interrupted (Ctrl-C) after round {self.next_round} of {rounds}"
                        break
        finally:
            if bar is not None:
                bar.close()
        self.wall_seconds = time.perf_counter() - started
        return self.history

    # -- checkpoints --------------------------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Model state, samplers' randomness, history and ledger (atomically, flushed to disk); the ledger itself is
        also written at every round, before the round draws noise."""
        directory = Path(self.checkpoint_dir)
        path = directory / "checkpoint.pt"
        state = {"next_round": self.next_round, "release": self.release, "x": self.state.x, "c": self.state.c,
                 "client_c": self.state.client_c, "generator": self.generator.get_state(),
                 "history": [m.to_dict() for m in self.history]}
        tmp = directory / "checkpoint.pt.tmp"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as file:
                torch.save(state, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, path)
        except OSError as err:
            raise RunDirectoryError(f"cannot write the checkpoint {path}: {err.strerror or err}") from None
        self.ledger.save(directory / "ledger.json")

    def load_checkpoint(self, directory: Path) -> None:
        """Resumes the run saved in ``directory``: adopts its ledger.json (which may be ahead of the checkpoint; it is
        kept, never rewound) and restores checkpoint.pt, or, when the run was stopped before its first checkpoint,
        starts from round 0 (the replayed rounds carry the fingerprints already recorded and are not charged twice).
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
        spent = PrivacyLedger.load(ledger_path)
        for setting in ("delta", "conversion", "analysis", "neighboring", "observers"):
            if getattr(spent, setting) != getattr(self.ledger, setting):
                raise RunDirectoryError(f"cannot resume: the run directory's ledger has {setting} = "
                                        f"{getattr(spent, setting)!r}, the config {getattr(self.ledger, setting)!r}")
        if checkpoint_path.exists():
            self._restore(checkpoint_path, recorded=max((e["round"] for e in spent.to_dict()["journal"]), default=-1))
        spent.budget = self.ledger.budget  # the budget is the config's (it may have been raised or lowered)
        self.ledger = spent

    def _restore(self, path: Path, recorded: int) -> None:
        """Loads checkpoint.pt after checking that it is readable, of this run and shape, and not ahead of the ledger
        (whose last recorded round index is ``recorded``); nothing is changed unless every check passes."""

        def invalid(problem: str) -> RunDirectoryError:
            return RunDirectoryError(
                f"{path} is not a valid checkpoint of this run ({problem}); restore it, or move it away to resume from "
                "round 0 with the ledger kept (rounds replayed identically are not charged again)")

        try:  # torch.save writes a zip archive: a truncated one has no central directory, a damaged one bad CRCs
            with zipfile.ZipFile(path) as archive:
                damaged = archive.testzip()
        except (zipfile.BadZipFile, OSError):
            raise invalid("empty file" if path.stat().st_size == 0 else "truncated, or not written by torch.save") \
                from None
        if damaged is not None:
            raise invalid(f"damaged: its entry {damaged} fails its CRC check")
        try:  # weights_only: tensors and plain data, no code from the file is run
            state = torch.load(path, weights_only=True)
        except pickle.UnpicklingError:
            raise invalid("it holds objects other than tensors and plain data") from None
        except Exception as err:  # anything else torch fails on inside a well-formed zip: report its first line
            raise invalid(f"unreadable by torch: {(str(err).strip().splitlines() or [type(err).__name__])[0]}") \
                from None
        if not isinstance(state, dict):
            raise invalid(f"a {type(state).__name__}, not a dict")
        missing = [k for k in ("next_round", "release", "x", "c", "client_c", "generator", "history") if k not in state]
        if missing:
            raise invalid(f"no {', '.join(missing)}")
        if state["release"] != self.release:
            raise invalid("it was written by a run with another release config (its run.json differs)")
        for name in ("x", "c", "client_c"):
            current, stored = getattr(self.state, name), state[name]
            shape = None if current is None else tuple(current.shape)
            if (None if not isinstance(stored, torch.Tensor) else tuple(stored.shape)) != shape:
                raise invalid(f"{name} has shape {getattr(stored, 'shape', stored)}, this config's {shape}")
        next_round = state["next_round"]
        if not isinstance(next_round, int) or next_round < 0:
            raise invalid(f"next_round = {next_round!r}")
        if next_round > recorded + 1:
            raise RunDirectoryError(
                f"cannot resume: {path} is at round {next_round} but the ledger beside it records rounds only up to "
                f"index {recorded}, so privacy spent is missing from it (an older ledger.json?); restore the newer "
                "ledger")
        generator = torch.Generator()
        try:
            generator.set_state(state["generator"])
            history = [RoundMetrics(**m) for m in state["history"]]
        except (RuntimeError, TypeError) as err:
            raise invalid(f"{type(err).__name__}: {err}") from None
        self.next_round, self.generator, self.history = next_round, generator, history
        self.state.x, self.state.c, self.state.client_c = state["x"], state["c"], state["client_c"]


class _StopOnCtrlC:
    """Within ``with``: the first SIGINT (Ctrl-C) only sets ``requested`` (the run finishes its round, checkpoints
    and stops); a second one raises KeyboardInterrupt at once (the ledger is already on disk). The handler is
    installed only in the main thread (the only one Python delivers signals to) and only where SIGINT is not ignored;
    the previous handler is restored on exit."""

    def __init__(self):
        self.requested = False
        self._previous = None
        self._installed = False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: stopping after this round (press Ctrl-C again to abort now)", file=sys.stderr, flush=True)

    def __exit__(self, *exc_info):
        if self._installed:
            signal.signal(signal.SIGINT, signal.default_int_handler if self._previous is None else self._previous)
        return False


def _fmt_eps(eps):
    return "inf" if eps is None else f"{eps:.3g}"


def _progress(total: int, done: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, unit="round", dynamic_ncols=True)


__all__ = ["Simulation", "RoundMetrics"]
