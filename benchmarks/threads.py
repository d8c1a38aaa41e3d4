"""Seconds per round at different torch thread counts, alternated in the same run (so that both meet the same load).

Workloads: the demo's DP-FedAvg (synthetic (5,5), M = 40, K = 50, l = s = 0.2; the `dpfl demo` setting) and the
seed-000 workload of ``seed000_throughput.py`` (M = 100, R = 5000, K = 50). Each measurement is a fresh interpreter
that builds the run, does one warm-up round, then times ``--rounds`` rounds with ``run.threads`` set; the thread
counts alternate, ``--repeats`` times, and the medians are reported with every value and the load average at the
start. The default of ``run.threads`` (``dpfl.experiments.resolved.DEFAULT_THREADS``) was chosen with it.

    python benchmarks/threads.py [--threads 1 2] [--repeats 3] [--rounds 10] [--workload demo seed000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _timed(workload: str, threads: int, rounds: int) -> float:
    """Seconds per round of ``workload`` at ``threads``, in a fresh interpreter."""
    code = f"""
import sys, time
sys.path.insert(0, {str(HERE)!r})
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
if {workload!r} == "demo":
    from dpfl.experiments.demo import DEMO_SETTINGS as settings
    settings = [*settings, "algorithm.name='dp-fedavg'"]
else:
    from seed000_throughput import WORKLOAD as settings
sim = build_simulation(load_config(None, [*settings, "run.threads={threads}"]))
sim.run(1)
start = time.perf_counter()
sim.run(1 + {rounds})
print((time.perf_counter() - start) / {rounds})
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent / "src"),
                                                                    os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workload", nargs="+", default=["demo", "seed000"], choices=["demo", "seed000"])
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start")
    figures = {}
    for workload in args.workload:
        times = {t: [] for t in args.threads}
        for _ in range(args.repeats):
            for threads in args.threads:
                times[threads].append(_timed(workload, threads, args.rounds))
        figures[workload] = {str(t): {"median": statistics.median(v), "all": v} for t, v in times.items()}
        for threads, values in times.items():
            print(f"{workload:<8} threads={threads:<3} {statistics.median(values):.4f} s/round "
                  f"({', '.join(f'{v:.4f}' for v in values)})", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
