"""Heikkilä et al.'s comparison on small data: 1 local epoch vs 1 local step vs local DP, at equal epsilon, under the
paper's and the sound analysis (dp-fedavg-joint; ``docs/accounting.md``, "Joint noise").

    python examples/joint_noise_experiment.py --out joint-results            # digits, breast_cancer, synthetic
    python examples/joint_noise_experiment.py --data digits --seeds 1        # one data set, one seed (~1 min)

The runs are ``dpfl.papers.heikkila2024.experiment.run`` (its docstring: the calibration and the observers); `dpfl
reproduce heikkila2024-local-steps` runs the same comparison with the paper's numbers beside. Writes results.json
(every run's final accuracy, loss, sigma and epsilon per observer) and table.md (mean test accuracy over the seeds).
Runs single-threaded (a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch

from dpfl.papers.heikkila2024.experiment import ANALYSES, DATA, VARIANTS, run, table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="*", default=["digits", "breast_cancer", "synthetic"], choices=list(DATA))
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
