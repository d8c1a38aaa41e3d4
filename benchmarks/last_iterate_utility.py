"""Utility of hiding the iterates: projected noisy SGD (Asoodeh et al. 2021) at equal epsilon, with the noise
calibrated by the last-iterate accountant (privacy.release = "final") or by composition over every iterate
("every_round"), on breast cancer and synthetic data (L2-regularised logistic regression). Prints a markdown table
(docs/last-iterate.md holds one run of it).

    python benchmarks/last_iterate_utility.py [--seeds 3] [--epsilons 1,4] [--radii 0.5,8]

Setting: every client (user) holds about 5 records (4 train, 1 test); m = 1 user per step (T = n steps) or a large
batch (m = n/5, T = 5 steps), one pass;
features standardised (pooled: non-private preprocessing, as dpfl's data.standardize) and scaled to norm <= 1 on the
client (algorithm.feature_clip = 1), so convexity is verified and Theorem 2's diameter is 2 rho; clip L = 1 (2 for
the 10 classes of the synthetic data, where the clip must never bind), lambda = 0.01, eta = 1 <= 2/beta. delta =
1e-5. Each cell: mean test accuracy over the seeds, and the noise multiplier z each accountant needs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dpfl.experiments.config import load_config
from dpfl.experiments.runner import run_experiment

DATA = {
    "breast_cancer": ("data.name='breast_cancer'", "data.num_clients=110", "data.standardize='pooled'",
                      "algorithm.clip=1.0"),
    "synthetic": ("data.name='synthetic'", "data.num_clients=200", "data.samples_per_client=5",
                  "data.standardize='pooled'", "algorithm.clip=2.0"),
}
COMMON = ("algorithm.name='projected-noisy-sgd'", "algorithm.lr=1.0",
          "algorithm.weight_decay=0.01", "algorithm.convex=true", "algorithm.feature_clip=1.0", "privacy.delta=1e-5",
          "run.threads=1")


def run(data: str, batch: int, epsilon: float | None, radius: float, release: str, seed: int) -> tuple[float, float]:
    """(test accuracy, noise multiplier) of one run; epsilon None: a reference run with almost no noise."""
    rounds = int(DATA[data][1].split("=")[1]) // batch
    noise = "algorithm.noise_multiplier=1e-6" if epsilon is None else f"privacy.epsilon={epsilon}"
    config = load_config(None, [*COMMON, *DATA[data], f"algorithm.clients_per_round={batch}",
                                f"algorithm.rounds={rounds}", f"algorithm.radius={radius}",
                                noise, f"privacy.release='{release}'", f"run.seed={seed}",
                                f"run.noise_seed={seed}",  # research mode: reproducible repeats
                                f"data.seed={seed}", f"run.eval_every={rounds}"])
    results = run_experiment(config)
    return results["final"]["test_accuracy"], results["privacy"]["assumptions"]["noise_multiplier"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", default="1,4")
    parser.add_argument("--radii", default="0.5,8")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    print("| data | m | rho | epsilon | accuracy, last iterate | accuracy, composition | z, last iterate | "
          "z, composition | accuracy, no noise |")
    print("|---|---|---|---|---|---|---|---|---|")
    for data in DATA:
        users = int(DATA[data][1].split("=")[1])
        for batch in (1, users // 5):
            for radius in (float(r) for r in args.radii.split(",")):
                reference = statistics.mean(run(data, batch, None, radius, "final", seed)[0]
                                            for seed in range(args.seeds))
                for epsilon in (float(e) for e in args.epsilons.split(",")):
                    cells = {}
                    for release in ("final", "every_round"):
                        runs = [run(data, batch, epsilon, radius, release, seed) for seed in range(args.seeds)]
                        cells[release] = statistics.mean(a for a, _ in runs), runs[0][1]
                    (acc_f, z_f), (acc_c, z_c) = cells["final"], cells["every_round"]
                    print(f"| {data} | {batch} | {radius:g} | {epsilon:g} | {acc_f:.3f} | {acc_c:.3f} | {z_f:.3g} | "
                          f"{z_c:.3g} | {reference:.3f} |", flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
