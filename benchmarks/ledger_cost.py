"""The privacy ledger's share of a dpfl round, and the peak memory, on examples/budgeted_digits.toml, a user-level
DP-FedAvg workload and every registered family's minimal config (tests/algorithms/test_contract.py's tiny run).

    python benchmarks/ledger_cost.py                     # every case, one process each, a table
    python benchmarks/ledger_cost.py user budgeted       # cases whose name contains any of these words
    python benchmarks/ledger_cost.py --before /tmp/old/src user   # each case also with another checkout's dpfl

A round is what ``dpfl run`` does per round at the default run.eval_every = 1: ``Simulation.step`` (the ledger's record
and ledger.json's save, beside the first chunk of the cohort's work in a checkout with ``record_later``, before it in
one without; the cohort's work), ``Simulation.evaluate`` (the metrics, with epsilon towards every observer where
run.epsilon_every schedules it: every round in a checkout before that key; read on the ledger's background thread,
``Simulation.settle_epsilon``, and joined at the last round, and at each checkpoint in a checkout whose checkpoints
wait for the reads), the checkpoint where due and results.json, in a run directory, on one CPU thread (and the
ledger's threads). The ledger's time is the time the round's thread spends in the ``PrivacyLedger`` methods the
simulator calls (outermost calls only), waiting for its round's record and waiting for the background reads; the
ledger's own threads' time is not in it (it runs beside the round: the CPU column has it). Columns: the ledger's share
of the first round (the round events' PLDs or RDP curves are built there), of rounds 2 .. T-1, its milliseconds in
the last round T (where the run waits for every read still in flight: the cost of the epsilons the results report),
its share of all rounds, the mean round with and without the ledger's time, the whole run's milliseconds, the
process's CPU time per round (every thread), its resident memory after the build and at its peak (``ru_maxrss``).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

USER_LEVEL = ["algorithm.name='dp-fedavg-user'", "data.name='synthetic'", "data.num_clients=1000",
              "data.samples_per_client=50", "model.name='logreg'", "algorithm.client_sampling='poisson'",
              "algorithm.client_rate=0.1", "algorithm.clip=1.0", "algorithm.noise_multiplier=1.0",
              "algorithm.noise_at='server'", "privacy.delta=1e-6"]
#: name -> (config file or None, overrides, rounds)
CASES = {
    "budgeted_digits": ("examples/budgeted_digits.toml", [], 20),
    "user-level 1000 users": (None, USER_LEVEL, 30),
    "user-level 200 users": (None, [*USER_LEVEL[:2], "data.num_clients=200", *USER_LEVEL[3:]], 30),
}
#: tests/algorithms/test_contract.py's tiny run: these [algorithm] keys where the family has them
TINY = {"local_steps": 2, "client_rate": 0.5, "rounds": 12, "noise_multiplier": 1.0, "lr": 0.5}
LEDGER_METHODS = ("record", "epsilon", "epsilon_through", "epsilon_after", "save", "to_dict", "accountants",
                  "charged", "hides_iterates", "epsilon_composition")


def minimal(name: str) -> tuple[None, list[str], int]:
    """The contract's tiny run of family ``name`` (rounds capped for a one-pass family)."""
    from dataclasses import fields

    from dpfl.algorithms import registry
    from dpfl.experiments.config import key_schema

    spec, keys = registry.spec_of(name), key_schema(name, "logreg")["algorithm"]
    values = dict(TINY)
    if spec.max_rounds is not None:
        known = {f.name for f in fields(spec.config)}
        values["rounds"] = min(12, spec.max_rounds(spec.config(**{k: v for k, v in values.items() if k in known}), 6))
    calibrated = spec.private(name) and "noise_multiplier" not in keys
    shuffler = ["privacy.shuffler='simulated'"] if spec.privacy_defaults.get("shuffler") == "real" else []
    return None, [f"algorithm.name='{name}'", "data.num_clients=6", "data.samples_per_client=30", "run.seed=1",
                  *(f"algorithm.{k}={v!r}" for k, v in values.items() if k in keys),
                  *(["privacy.epsilon=2.0"] if calibrated else []), *shuffler], values["rounds"]


def case_names() -> list[str]:
    from dpfl.algorithms import registry

    return [*CASES, *(f"minimal {n}" for n in registry.names())]


def measure(case: str) -> dict:
    """One case in this process: per-round seconds, the ledger's seconds, memory."""
    import torch

    from dpfl.accounting.ledger import PrivacyLedger
    from dpfl.experiments.config import load_config
    from dpfl.experiments.resolved import resolve
    from dpfl.experiments.results_file import ResultsFile, results_of
    from dpfl.experiments.runner import build_simulation

    torch.set_num_threads(1)
    path, overrides, rounds = CASES[case] if case in CASES else minimal(case.removeprefix("minimal "))
    spent, depth = [0.0], [0]

    def timed(method):
        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():  # the ledger's own threads: beside the round
                return method(*args, **kwargs)
            depth[0] += 1
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[0] += time.perf_counter() - started
        return wrapper

    for name in LEDGER_METHODS:
        if hasattr(PrivacyLedger, name):
            setattr(PrivacyLedger, name, timed(getattr(PrivacyLedger, name)))
    if hasattr(PrivacyLedger, "record_later"):  # the round's wait for its record on the ledger's recorder thread
        record_later = PrivacyLedger.record_later

        def timed_record_later(self, *args, **kwargs):
            recorded = record_later(self, *args, **kwargs)
            recorded.result = timed(recorded.result)
            return recorded

        PrivacyLedger.record_later = timed(timed_record_later)
    from dpfl.engine.simulator import Simulation

    background = hasattr(Simulation, "settle_epsilon")
    if background:  # the round's wait for the reads on the ledger's thread
        Simulation.settle_epsilon = timed(Simulation.settle_epsilon)
    with tempfile.TemporaryDirectory() as out:
        config = load_config(path, [*overrides, f"algorithm.rounds={rounds}", "run.threads=1"])
        sim, resolved = build_simulation(config, out), resolve(config)
        results_file, mid_run = ResultsFile(Path(out) / "results.json"), _mid_run(results_of)
        built_mb = _rss_mb()
        round_s, ledger_s, cpu_started = [], [], _cpu_s()
        quick = "final" in inspect.signature(sim.save_checkpoint).parameters  # mid-run checkpoints wait for nothing
        sim.horizon = rounds  # as run sets it (budget checks prepared ahead, where the checkout has them)
        for _ in range(rounds):
            spent[0], started = 0.0, time.perf_counter()
            try:
                sim.step()
            except Exception as err:  # a budget stop ends the run (BudgetExceededError)
                if type(err).__name__ != "BudgetExceededError":
                    raise
                break
            sim.history.append(_evaluate(sim, rounds, background))
            last = sim.next_round == rounds
            due = sim.next_round % sim.checkpoint_every == 0 or last
            if background:
                sim.settle_epsilon(wait=last if quick else due)
            if due:
                sim.save_checkpoint(final=last) if quick else sim.save_checkpoint()
            results_file.write(results_of(sim, resolved, **mid_run))
            round_s.append(time.perf_counter() - started)
            ledger_s.append(spent[0])
        if background:  # a budget stop: run joins the reads after its loop
            started = time.perf_counter()
            sim.settle_epsilon()
            round_s[-1] += time.perf_counter() - started
            ledger_s[-1] += time.perf_counter() - started
    return {"case": case, "rounds": len(round_s), "round_s": round_s, "ledger_s": ledger_s, "built_mb": built_mb,
            "cpu_s": _cpu_s() - cpu_started, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _evaluate(sim, rounds: int, background: bool):
    """``Simulation.run``'s evaluation: epsilon where run.epsilon_every schedules it (every round before that key),
    read in the background where the checkout can."""
    try:
        from dpfl.engine.epsilon_schedule import epsilon_due
    except ImportError:
        return sim.evaluate()
    due = epsilon_due(sim.next_round, rounds, sim.epsilon_every, sim.checkpoint_every)
    return sim.evaluate(due, wait=False) if background else sim.evaluate(due)


def _cpu_s() -> float:
    """The process's CPU seconds so far, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _mid_run(results_of) -> dict:
    """The runner's keywords for results.json written after an evaluated round (none before ``exact``)."""
    return {"exact": False} if "exact" in inspect.signature(results_of).parameters else {}


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def row(result: dict) -> str:
    rounds, ledger = result["round_s"], result["ledger_s"]
    if not rounds:
        return f"| {result['case']} | 0 | | | | | | | | | | |"
    total, spent = sum(rounds), sum(ledger)
    middle = 100 * sum(ledger[1:-1]) / sum(rounds[1:-1]) if len(rounds) > 2 else float("nan")
    return (f"| {result['case']} | {len(rounds)} | {100 * ledger[0] / rounds[0]:.0f}% | {middle:.1f}% | "
            f"{1000 * ledger[-1]:.0f} | {100 * spent / total:.1f}% | "
            f"{1000 * total / len(rounds):.1f} | {1000 * (total - spent) / len(rounds):.1f} | {1000 * total:.0f} | "
            f"{1000 * result['cpu_s'] / len(rounds):.1f} | {result['built_mb']:.0f} | {result['peak_mb']:.0f} |")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--case"]:
        print(json.dumps(measure(argv[1])))
        return
    checkouts = {"": None}
    if argv[:1] == ["--before"]:
        checkouts, argv = {" (before)": argv[1], "": None}, argv[2:]
    chosen = [c for c in case_names() if not argv or any(word in c for word in argv)]
    print("| case | rounds | ledger, round 1 | ledger, rounds 2 .. T-1 | ledger ms, round T (the reads' wait) | "
          "ledger, all rounds | ms/round | ms/round without ledger | run ms | CPU ms/round | MB after build | MB peak |"
          "\n|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for case in chosen:
        for label, source in checkouts.items():  # interleaved: both see the same load
            env = None if source is None else {**os.environ, "PYTHONPATH": source}
            done = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True, text=True, env=env)
            if done.returncode:
                print(f"| {case}{label} | failed: {done.stderr.strip().splitlines()[-1][:100]} |", flush=True)
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(row({**result, "case": case + label}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
