"""Seconds per round against the number of ranks N the cohort is split across (``dpfl.engine.ranks``), on the CPU,
alternated in the same run (so that every N meets the same load), with each N's ratio to N = 1.

Workload (W1-like): DP-FedAvg, an MLP (64 hidden units) on scikit-learn's digits over 40 clients, every client in
every round (a cohort of 40: 20 a rank at N = 2), K = 10 local steps of minibatches of 20% of a client's records,
one torch thread a rank (run.threads' default). N = 1 is the plain one-process run; N > 1 launches N ranks on gloo
over 127.0.0.1 (``dpfl.engine.launch``, as `dpfl run --nproc N` does). Each measurement is fresh processes that build
the run, do one warm-up round, then time ``--rounds`` rounds (rank 0's clock; the ranks leave the rounds together);
the N alternate, ``--repeats`` times, and the medians are printed as a table (the README's "Many GPUs and nodes"),
then every value, with the load average at the start and the end.

    python benchmarks/ranks.py [--nproc 1 2] [--repeats 3] [--rounds 10] [--set KEY=VALUE ...] [--json FILE]

``--set`` changes the workload (e.g. ``--set model.hidden=[1024]`` for a model of 76,810 parameters, whose messages
weigh 300 KB a client).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))

WORKLOAD = [
    "data.name='digits'", "data.num_clients=40", "model.name='mlp'", "model.hidden=[64]",
    "algorithm.name='dp-fedavg'", "algorithm.client_rate=1.0", "algorithm.local_steps=10",
    "algorithm.sample_rate=0.2", "algorithm.noise_multiplier=1.0", "algorithm.clip=1.0", "algorithm.lr=0.5",
    "run.eval_every=1000", "run.noise_seed=0",
]

TIMED = """
import sys, time
from dpfl.engine.ranks import Ranks
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
settings, rounds, out = {settings!r}, {rounds}, {out!r}
ranks = Ranks.from_environment()
sim = build_simulation(load_config(None, settings), ranks=ranks)
sim.run(1)
start = time.perf_counter()
sim.run(1 + rounds)
seconds = (time.perf_counter() - start) / rounds
if ranks is None or ranks.is_first:
    open(out, "w").write(repr(seconds))
if ranks is not None:
    ranks.leave()
"""


def _timed(nproc: int, rounds: int, settings: list[str]) -> float:
    """Seconds per round of the workload ``settings`` on ``nproc`` ranks, in fresh processes."""
    from dpfl.engine.launch import launch

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "seconds"
        command = [sys.executable, "-c", TIMED.format(settings=settings, rounds=rounds, out=str(out))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
        if nproc == 1:
            subprocess.run(command, env=env, check=True)
        elif launch(command, nproc) != 0:
            raise RuntimeError(f"the {nproc} ranks failed")
        return float(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override on top of the workload (repeatable)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    settings = [*WORKLOAD, *args.set]
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start; workload overrides: "
          f"{args.set or 'none'}")
    times = {n: [] for n in args.nproc}
    for _ in range(args.repeats):
        for nproc in args.nproc:
            times[nproc].append(_timed(nproc, args.rounds, settings))
    base = statistics.median(times[args.nproc[0]])
    figures = {}
    print(f"| ranks N | s/round | s/round / N = {args.nproc[0]}'s |\n|---|---|---|")
    for nproc, values in times.items():
        median = statistics.median(values)
        figures[str(nproc)] = {"median": median, "all": values, "ratio": median / base}
        print(f"| {nproc} | {median:.3f} | {median / base:.2f} |")
    for nproc, values in times.items():
        print(f"N = {nproc}: {', '.join(f'{v:.4f}' for v in values)} s/round", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
