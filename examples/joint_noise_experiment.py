"""Heikkilä et al.'s comparison on small data: 1 local epoch vs 1 local step vs local DP, at equal epsilon, under the
paper's and the sound analysis (dp-fedavg-joint; ``docs/accounting.md``, "Joint noise").

    python examples/joint_noise_experiment.py --out joint-results            # digits, breast_cancer, synthetic
    python examples/joint_noise_experiment.py --data digits --seeds 1        # one data set, one seed (~1 min)

For every data set, analysis and variant the noise is calibrated to privacy.epsilon (the same epsilon for all)
towards the observer the trust setting protects against: honest-but-curious clients (shares sigma / sqrt(N - 1), the
coalition of one other client) for the joint variants, the server that sees each message for local DP (every client
adds sigma). All clients take part in every round; q = 0.1, so one epoch is 10 local steps. Writes results.json
(every run's final accuracy, loss, sigma and epsilon per observer) and table.md (mean test accuracy over the seeds).
Runs single-threaded (a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path

import torch

from dpfl.experiments.config import load_config
from dpfl.experiments.runner import run_experiment

DATA = {"digits": ["data.name='digits'", "data.num_clients=10"],
        "breast_cancer": ["data.name='breast_cancer'", "data.num_clients=5"],
        "synthetic": ["data.name='synthetic'", "data.num_clients=10", "data.samples_per_client=200"]}
#: variant -> its [algorithm] / [privacy] keys
VARIANTS = {"1 local epoch": ["algorithm.local_steps=10"],
            "1 local step": ["algorithm.local_steps=1"],
            "local DP, 1 epoch": ["algorithm.local_steps=10", "algorithm.trust='local'", "privacy.boundary='plain'"]}
ANALYSES = ("paper", "sound")


def run(data: str, variant: str, analysis: str, seed: int, epsilon: float, rounds: int, lr: float) -> dict:
    overrides = ["algorithm.name='dp-fedavg-joint'", f"algorithm.rounds={rounds}", "algorithm.sample_rate=0.1",
                 f"algorithm.lr={lr}", f"privacy.epsilon={epsilon}", f"privacy.analysis='{analysis}'",
                 "privacy.boundary='secagg'", "data.standardize='pooled'", f"run.seed={seed}", f"data.seed={seed}",
                 f"run.noise_seed={seed}",  # research mode: reproducible repeats
                 "run.threads=1", f"run.eval_every={rounds}", *DATA[data], *VARIANTS[variant]]
    config = load_config(None, overrides)
    results = run_experiment(config)
    events = results["privacy"]["events_per_round"]
    return {"data": data, "variant": variant, "analysis": analysis, "seed": seed,
            "test_accuracy": results["final"]["test_accuracy"], "train_loss": results["final"]["train_loss"],
            "epsilon": results["final"]["epsilon"], "events_per_round": events,
            "wall_seconds": results["wall_seconds"]}


def table(rows: list[dict], epsilon: float) -> str:
    lines = [f"Mean test accuracy over seeds at epsilon = {epsilon} (each analysis calibrates its own noise)", "",
             "| data | variant | paper's analysis | sound analysis |", "|---|---|---|---|"]
    for data in dict.fromkeys(r["data"] for r in rows):
        for variant in VARIANTS:
            cells = []
            for analysis in ANALYSES:
                accs = [r["test_accuracy"] for r in rows
                        if (r["data"], r["variant"], r["analysis"]) == (data, variant, analysis)]
                cells.append(f"{statistics.mean(accs):.3f}" if accs else "-")
            lines.append(f"| {data} | {variant} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="*", default=list(DATA), choices=list(DATA))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--out", default="joint-noise-results")
    args = parser.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    rows = [run(d, v, a, s, args.epsilon, args.rounds, args.lr)
            for d in args.data for v in VARIANTS for a in ANALYSES for s in range(args.seeds)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    (out / "table.md").write_text(table(rows, args.epsilon))
    print(table(rows, args.epsilon))


if __name__ == "__main__":
    main()
