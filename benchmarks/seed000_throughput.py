"""Throughput of the seed-000 workload: dpfl's cohort-vectorised engine against a one-client-at-a-time baseline.

Workload (DP-SCAFFOLD paper, synthetic): M=100 clients, R=5000 records each (4000 train), d=40, 10 classes, l=s=0.2,
K=50 local steps, sigma_g=60, logistic regression, train loss and test accuracy evaluated every round.

Three engines run the same rounds with the same code (dpfl.engine.simulator), differing only in how per-example
gradients are computed and how many clients are processed per call:
  * vectorised   — the whole cohort in one call, exact "ghost" per-example norms (the default);
  * vmap cohort  — the whole cohort in one call, torch.func per-example gradients (any model);
  * baseline     — one client at a time, torch.func per-example gradients for that client (how per-client DP-SGD
                   loops are usually written; the authors' public code is slower still, ~46 s/round on 2 cores).
Prints seconds per round, the ratio to the baseline, and the peak resident memory after the vectorised run.

    python benchmarks/seed000_throughput.py [--rounds 20] [--baseline-rounds 3] [--json out.json]
    python benchmarks/seed000_throughput.py --against REV [--repeats 3] [--rounds 10]

``--against REV`` times the vectorised engine of this checkout and of git revision REV (checked out in a temporary
worktree) in alternation, in one run, and reports each one's median seconds per round and their ratio: the check that
a change made the engine no slower.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dpfl.engine.grads import CohortGradients
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

WORKLOAD = [
    "data.name='synthetic'", "data.alpha=1", "data.beta=1", "data.num_clients=100", "data.samples_per_client=5000",
    "algorithm.name='dp-scaffold'", "algorithm.local_steps=50", "algorithm.client_rate=0.2",
    "algorithm.sample_rate=0.2", "algorithm.noise_multiplier=60", "algorithm.clip=1.0", "algorithm.lr=1.0",
    "run.eval_every=1", "run.memory_mb=512",
]


def seconds_per_round(strategy: str, one_client_at_a_time: bool, rounds: int) -> float:
    sim = build_simulation(load_config(None, WORKLOAD))
    sim.grads = CohortGradients(sim.grads.model, strategy)
    if one_client_at_a_time:
        sim.memory_budget_bytes = 1  # the chunk size becomes one client
    sim.run(1)  # warm-up: first-call overheads and the accountant's curve cache
    start = time.perf_counter()
    sim.run(1 + rounds)
    return (time.perf_counter() - start) / rounds


def peak_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed_in(checkout: Path, rounds: int) -> float:
    """seconds_per_round("ghost", False, rounds) of the code in ``checkout``, in a fresh interpreter."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import seed000_throughput as b; "
            f"print(b.seconds_per_round('ghost', False, {rounds}))")
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    out = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=env, check=True, capture_output=True,
                         text=True)
    return float(out.stdout.strip().splitlines()[-1])


def compare(revision: str, repeats: int, rounds: int) -> dict:
    """Median s/round of this checkout and of ``revision``, timed alternately in the same run."""
    here = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "rev"
        subprocess.run(["git", "worktree", "add", "--detach", str(other), revision], cwd=here, check=True,
                       capture_output=True)
        try:
            times = {"this checkout": [], revision: []}
            checkouts = [("this checkout", here), (revision, other)]
            for repeat in range(repeats):  # each goes first in every other repeat: the order is no bias
                for name, checkout in checkouts[:: 1 if repeat % 2 == 0 else -1]:
                    times[name].append(_timed_in(checkout, rounds))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=here, check=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"seconds_per_round": medians, "all": times,
            "ratio_this_over_revision": medians["this checkout"] / medians[revision]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--baseline-rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--against", default=None, metavar="REV", help="compare with git revision REV (see above)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations for --against")
    args = parser.parse_args()
    if args.against:
        figures = compare(args.against, args.repeats, args.rounds)
        for name, seconds in figures["seconds_per_round"].items():
            print(f"{name:<16} {seconds:.4f} s/round (median of {args.repeats}: "
                  f"{', '.join(f'{t:.4f}' for t in figures['all'][name])})")
        print(f"ratio this / {args.against}: {figures['ratio_this_over_revision']:.3f}")
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    vectorised = seconds_per_round("ghost", False, args.rounds)
    peak = peak_memory_mb()
    vmap_cohort = seconds_per_round("vmap", False, args.baseline_rounds)
    baseline = seconds_per_round("vmap", True, args.baseline_rounds)
    figures = {
        "seconds_per_round": {"vectorised": vectorised, "vmap_cohort": vmap_cohort, "baseline": baseline},
        "speedup_vs_baseline": {"vectorised": baseline / vectorised, "vmap_cohort": baseline / vmap_cohort},
        "peak_memory_mb_vectorised": peak,
    }
    print(f"{'engine':<14} {'s/round':>9} {'x baseline':>11}")
    for name, seconds in figures["seconds_per_round"].items():
        print(f"{name:<14} {seconds:>9.4f} {baseline / seconds:>11.1f}")
    print(f"peak resident memory after the vectorised run: {peak:.0f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
