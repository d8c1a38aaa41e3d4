"""``run_experiment``: a loaded config run in a run directory, start to end (``dpfl run``, ``dpfl.run``, the Flower
ServerApp). The config is resolved once (``resolved.resolve``: typed, its ranges checked), the run built from it
(``assembly``: ``build_simulation`` is its entry point for a run without a directory), its directory checked and
recorded (``run_directory``), its results written (``results_file``, which lists results.json's keys) and, with
run.tensorboard, each evaluated round's metrics to TensorBoard (``tensorboard_log``).

Rounds are numbered from 1 wherever a user reads them: round r of T is the r-th round (the progress line "round r/T",
results.json's "round", ledger.json's journal, the stop and resume messages, `dpfl plot`'s axis).
"""

from __future__ import annotations

import contextlib
import secrets
import sys
from pathlib import Path

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import FederatedDataset
from dpfl.engine.device import resolve_device
from dpfl.engine.protocol import State
from dpfl.engine.ranks import Ranks
from dpfl.engine.simulator import RoundMetrics
from dpfl.errors import ConfigError, RunInterrupted
from dpfl.experiments.archive import archive_run, archived_spend
from dpfl.experiments.assembly import assemble, build_simulation
from dpfl.experiments.resolved import RunConfig, resolve, with_threads
from dpfl.experiments.results_file import ResultsFile, results_of
from dpfl.experiments.run_directory import (check_free, check_resumable, check_writable, recorded_threads, run_key,
                                            write_run_record)
from dpfl.experiments.run_lock import run_lock
from dpfl.experiments.supplied import NOTHING, Supplied
from dpfl.experiments.tensorboard_log import TensorBoardLog


def run_experiment(config: dict, out_dir: str | Path | None = None, progress: bool = False,
                   resume: bool = False, restart: bool = False, workers=None, supplied: Supplied = NOTHING,
                   dataset: FederatedDataset | None = None, evaluator=None, ranks: Ranks | None = None) -> dict:
    """``run_with_ledger``'s results alone."""
    return run_with_ledger(config, out_dir, progress, resume, restart, workers, supplied, dataset, evaluator,
                           ranks)[0]


def run_with_ledger(config: dict, out_dir: str | Path | None = None, progress: bool = False,
                    resume: bool = False, restart: bool = False, workers=None, supplied: Supplied = NOTHING,
                    dataset: FederatedDataset | None = None, evaluator=None,
                    ranks: Ranks | None = None) -> tuple[dict, PrivacyLedger]:
    """Runs ``config`` and returns its results (also written to out_dir/results.json after every evaluated round and
    at the end, when out_dir is given) and its privacy ledger (whose journal gives epsilon after any round:
    ``PrivacyLedger.epsilon_curve``).

    out_dir (``check_writable``, then, holding its lock for the whole run, ``run_lock.run_lock``: refused if another
    run holds it, ``check_resumable`` or ``check_free``) and then the config's ranges (``resolve``) are checked before
    any data is built. ``workers``, ``dataset``, ``evaluator``: as in
    ``build_simulation``.
    ``resume`` continues the run in out_dir (refused unless its run.json has the same release config); otherwise a
    directory that already holds a run is refused, unless ``restart`` archives that run first (``archive_run``). On
    Ctrl-C or SIGTERM the run stops after its current round, checkpoints, writes results.json and raises
    RunInterrupted (``dpfl.engine.stop_signal``).
    ``supplied``: a caller's module, loss or records (``build_simulation``).
    ``ranks``: this process's place among the ranks the cohort is split across (``dpfl.engine.ranks``). Rank 0 is
    the run above; it alone reads and writes out_dir (the other ranks' ``out_dir``, ``resume`` and ``restart`` are
    not read), and gives the others what its checks decided (the config with its recorded run.threads, the run's
    identity and noise key) and, on a resume, the state, history and ledger it resumed from (``_adopt``). Every rank
    returns the same results."""
    out = Path(out_dir) if out_dir is not None else None
    if ranks is not None:
        ranks.join(resolve_device(config["run"]["device"]))
        if not ranks.is_first:
            out, resume, restart = None, False, False
    with contextlib.ExitStack() as held:  # the run directory's lock, held until the last file is written

        def checked() -> tuple[dict, str, int | None, RunConfig]:
            """The directory's and the config's checks: (the config to run, the run's identity, its noise key, the
            config resolved)."""
            resolved_config = with_threads(config, recorded_threads(out) if resume and out is not None else None)
            if resume and restart:
                raise ConfigError("--restart", True, "either --resume (continue the run) or --restart (archive it "
                                                     "and start over), not both")
            if resume and out is None:
                raise ConfigError("--resume", None, "a run directory (--out DIR) to continue")
            if out is not None:
                check_writable(out)
                held.enter_context(run_lock(out))
            run_id = secrets.token_hex(16)
            if resume:
                run_id = check_resumable(out, resolved_config).get("run_id", "")
            elif out is not None and not restart:
                check_free(out)
            resolved = resolve(resolved_config, supplied)  # the config's ranges, after the directory's checks
            # None: the run directory's key, or a fresh one (``run_key``); a restart never reuses the archived run's
            # key (its noise on another computation would cancel); the ranks share rank 0's
            noise_seed = resolved.run.noise_seed
            key = run_key(noise_seed) if restart else run_key(noise_seed, out) if ranks is not None else None
            return resolved_config, run_id, key, resolved

        if ranks is None:
            config, run_id, key, resolved = checked()
        else:  # rank 0's decision, resolved again on each rank (a resolved config holds what a caller supplied)
            config, run_id, key = ranks.decided_by_first(lambda: checked()[:3])
            resolved = resolve(config, supplied)
        writes = ranks is None or ranks.is_first  # the run's files and events are rank 0's
        board = None if resolved.run.tensorboard is None or not writes else TensorBoardLog(resolved.run.tensorboard)
        sim = assemble(resolved, out, workers, key, run_id, supplied, dataset, evaluator, ranks)  # data: only now
        rounds = resolved.algorithm.rounds

        def prepared() -> dict | None:
            """The run directory's run resumed, or archived on a restart; what the other ranks take of it."""
            if resume:
                sim.load_checkpoint(out)
                where = f"after round {sim.next_round}" if sim.next_round else "from round 1"
                print(f"resuming the run in {out} {where} of {rounds}"
                      + ("" if sim.next_round else " (no checkpoint yet)"), file=sys.stderr)
                return _resumed(sim) if ranks is not None else None
            if out is not None and restart:
                archived = archive_run(out)
                if archived is not None:
                    print(f"archived the previous run in {out} to {archived}", file=sys.stderr)
            return None

        resumed = prepared() if ranks is None else ranks.decided_by_first(prepared)
        if ranks is not None:
            if not ranks.is_first:
                _adopt(sim, resumed)
            sim.state = ranks.own_state(sim.state)  # a resumed run's whole client state, cut to this rank's clients
        if out is not None:
            write_run_record(out, config, sim.release, run_id)
        results_file = None if out is None else ResultsFile(out / "results.json")
        archived = archived_spend(out)  # a restart archives the run, not the privacy it spent

        logged = len(sim.history)  # TensorBoard holds the rows before it (a resumed run's, from the process before)

        def log(rows: list) -> None:  # TensorBoard's events of the rows whose epsilon is read (or not scheduled)
            nonlocal logged
            for row in rows[logged:]:
                board.write(row.to_dict())
            logged = max(logged, len(rows))

        def evaluated(s) -> None:  # after each evaluated round: results.json, TensorBoard's events
            if results_file is not None:
                results_file.write(results_of(s, resolved, archived, exact=False))
            if board is not None:
                log(s.history[: s.settled])

        try:
            sim.run(rounds, progress=progress and writes, on_evaluated=evaluated)
            if board is not None:
                log(sim.history)  # run settles every read before it returns
        finally:
            if board is not None:
                board.close()
        results = results_of(sim, resolved, archived)
        if results_file is not None:
            results_file.write(results)
        if sim.interrupted:
            raise RunInterrupted(sim.next_round, sim.stop_signal)
        return results, sim.ledger


def _resumed(sim) -> dict:
    """What a resumed rank 0 gives the other ranks: the state, round, history, wall time and ledger it resumed
    from (its tensors on the CPU)."""
    state = {part: {name: value.cpu() if isinstance(value, torch.Tensor) else value for name, value in values.items()}
             for part, values in sim.state.state_dict().items()}
    return {"state": state, "next_round": sim.next_round, "history": [m.to_dict() for m in sim.history],
            "wall_seconds": sim.wall_seconds, "ledger": sim.ledger.to_dict(summary=False)}


def _adopt(sim, resumed: dict | None) -> None:
    """Takes rank 0's ``_resumed`` (None: a fresh run, whose state every rank built alike from run.seed)."""
    if resumed is None:
        return
    state = State.from_state_dict(resumed["state"])
    for part in (state.server, state.clients):
        for name, value in part.items():
            part[name] = value.to(sim.device)
    sim.state, sim.next_round = state, resumed["next_round"]
    sim.history = [RoundMetrics(**m) for m in resumed["history"]]
    sim.wall_seconds = resumed["wall_seconds"]
    budget, sim.ledger = sim.ledger.budget, PrivacyLedger.from_dict(resumed["ledger"])
    sim.ledger.budget = budget


__all__ = ["run_experiment", "run_with_ledger", "build_simulation"]
