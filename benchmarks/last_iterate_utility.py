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
1e-5. Each cell: mean test accuracy over the seeds, and the noise multiplier z each accountant needs. The runs are
``dpfl.papers.asoodeh2021.experiment.utility_run`` (also `dpfl reproduce asoodeh2021-utility`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dpfl.papers.asoodeh2021.experiment import UTILITY_DATA, users, utility_run

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
    for data in UTILITY_DATA:
        for batch in (1, users(data) // 5):
            for radius in (float(r) for r in args.radii.split(",")):
                reference = statistics.mean(utility_run(data, batch, None, radius, "final", seed)[0]
                                            for seed in range(args.seeds))
                for epsilon in (float(e) for e in args.epsilons.split(",")):
                    cells = {}
                    for release in ("final", "every_round"):
                        runs = [utility_run(data, batch, epsilon, radius, release, seed) for seed in range(args.seeds)]
                        cells[release] = statistics.mean(a for a, _ in runs), runs[0][1]
                    (acc_f, z_f), (acc_c, z_c) = cells["final"], cells["every_round"]
                    print(f"| {data} | {batch} | {radius:g} | {epsilon:g} | {acc_f:.3f} | {acc_c:.3f} | {z_f:.3g} | "
                          f"{z_c:.3g} | {reference:.3f} |", flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
