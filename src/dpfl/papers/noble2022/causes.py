"""Why dpfl's DP-SCAFFOLD accuracies differ from Noble, Bellet, Dieuleveut (2022)'s Tables 1 and 4: the paper's
size, a tuned step size, then each of the authors' implementation choices switched on alone, then all together.

    python -m dpfl.papers.noble2022.causes --out results/noble2022-causes [--configs baseline,data]
        [--seeds 2] [--lrs 0.3,1,3]
    python -m dpfl.papers.noble2022.causes --out results/noble2022-causes --configs baseline,all \
        --fixed-eta0 0.1,0.3 [--seeds 2]
    python -m dpfl.papers.noble2022.causes --out results/noble2022-causes --report

Regime: Table 1's, synthetic (alpha, beta) = (5, 5) at the paper's size (M = 100 users of R = 5,000 records, 80/20
split), l = 0.05, s = 0.2, DP-SCAFFOLD (no warm start: Table 1's K = 40 runs fewer rounds than the round(4/l) = 80 warm
ones), eta_g = 1, no weight decay (the authors' optimiser never applies the one it is given), each cell (sigma_g, K)
trained for the paper accountant's largest T within eps = 3 (``dpfl.papers.noble2022.privacy.TABLE_1``). The baseline is
dpfl as the reproduction item runs it: the clip C = 1 fixed, each client's own independent noise, features only scaled
to unit L2 norm.

The switches (``SWITCHES``), each the authors' public code's choice (docs/experiments/noble2022.md cites the lines):

* ``data``: their preprocessing, ``data.standardize = 'noble2022-minmax'`` (``dpfl.data.preprocess``: a per-client
  min-max whose bounds come from training records where features were meant), then the unit L2 norm;
* ``data-text``: the paper's words instead ("standardised, then each point scaled to unit L2 norm"): each client
  standardises with its own training split's moments (``data.standardize = 'client'``);
* ``median``: the clip at the batch's median per-example norm (``algorithm.clip_heuristic = 'median-nonprivate'``);
* ``per-tensor``: clipping and noise per parameter tensor (the weight matrix and the bias: P = 2), each at the clip
  C with noise sigma_g 2C / b. On records of unit norm, logistic regression's per-example weight gradient
  x (p - e_y)^T and bias gradient p - e_y have the same norm ||p - e_y||, so clipping each at C is clipping the
  whole at C sqrt(P), and noise sigma_g 2C / b per tensor is the multiplier sigma_g / sqrt(P) at that clip: the
  switch runs that (``per_tensor_equivalent``), and is charged at sigma_g / sqrt(P), what it is;
* ``shared-noise``: every client of a round draws the same noise (``algorithm.noise_sharing = 'cohort-nonprivate'``);
* ``all``: data, median, per-tensor and shared noise together.

The metric of Tables 1 and 4 is App. D.3.2's, the mean test accuracy (over all users' test records) of the evaluations
in the last 10% of the rounds, as the authors' code computes it; the final iterate's is reported beside it.

eta0 is tuned per configuration and cell over ``LRS`` on seed 0 by the final TRAIN loss: NOT private (the paper tunes
by 5-fold cross-validation, on the training data too). The paper, though, tuned eta0 once per data set, algorithm and
version "with the lowest level of heterogeneity" and "kept the same eta0" elsewhere (App. D.1), with the authors'
local step eta0 / max(round(s K), 1) (their code) rather than the paper's eta0 / (s K): the two differ at K = 1 only
(s K = 0.2 rounds to 0, so their step is eta0, not 5 eta0). ``--fixed-eta0`` runs every cell at one eta0 with their
step (``authors_lr``), no tuning. The switches median and shared-noise, and all, are not
private either (epsilon = inf): they reproduce what the paper's numbers were measured with.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from dpfl.papers.noble2022.utility import ACCURACY, LOCAL_STEPS, _common, _run, last_fraction_accuracy

#: M users of R records: the paper's size (Sec. 5)
PAPER_SIZE = (100, 5000)
#: (M, R_train, l, s) of the paper's accountant, and its eps (Table 1)
ACCOUNTANT = (100, 4000, 0.05, 0.2)
EPSILON = 3.0
HETEROGENEITY = (5, 5)
#: (sigma_g, K) cells of Table 1 measured
CELLS = ((10, 1), (10, 5), (10, 20), (10, 40), (40, 10))
#: the eta0 grid of the (non-private) tuning
LRS = (0.3, 1.0, 3.0)
#: the parameter tensors of logistic regression with bias: the weight matrix and the bias
TENSORS = 2
FIXED_CLIP = 1.0
LAST_FRACTION = 0.1

SWITCHES = {
    "baseline": (),
    "data": ("data",),
    "data-text": ("data-text",),
    "median": ("median",),
    "per-tensor": ("per-tensor",),
    "shared-noise": ("shared-noise",),
    "all": ("data", "median", "per-tensor", "shared-noise"),
}


def per_tensor_equivalent(sigma: float, clip: float, tensors: int = TENSORS) -> tuple[float, float]:
    """(whole-model clip, noise multiplier) equal to clipping each of ``tensors`` tensors at ``clip`` with noise
    ``sigma`` times each tensor's sensitivity, when every example's tensors have gradients of equal norm (logistic
    regression on unit-norm records): C sqrt(P) and sigma / sqrt(P)."""
    return clip * math.sqrt(tensors), sigma / math.sqrt(tensors)


def authors_lr(eta0: float, k: int) -> float:
    """dpfl's eta0 (its local step is eta0 / (s K)) giving the authors' code's local step eta0 / max(round(s K), 1)."""
    s = ACCOUNTANT[3]
    return eta0 * s * k / max(round(s * k), 1)


def rounds(sigma: float, k: int) -> int:
    """T of a cell: the paper accountant's largest within eps = 3 (Table 1)."""
    from dpfl.accounting.dp_scaffold import max_rounds

    m, r, l, s = ACCOUNTANT
    return max_rounds(m, r, l, s, k, float(sigma), EPSILON, analysis="paper")


def overrides(switches: tuple[str, ...], sigma: float, k: int, lr: float) -> list[str]:
    """The config of one cell under ``switches`` at eta0 = ``lr``."""
    m, r, l, s = ACCOUNTANT
    clip, noise = per_tensor_equivalent(sigma, FIXED_CLIP) if "per-tensor" in switches else (FIXED_CLIP, sigma)
    alpha, beta = HETEROGENEITY
    out = [*_common(PAPER_SIZE, lr, 0.0), f"data.alpha={alpha}", f"data.beta={beta}", "algorithm.name='dp-scaffold'",
           f"algorithm.rounds={rounds(sigma, k)}", f"algorithm.local_steps={k}", f"algorithm.client_rate={l}",
           f"algorithm.sample_rate={s}", f"algorithm.noise_multiplier={noise}", f"algorithm.clip={clip}",
           "privacy.analysis='paper'"]
    choices = {"data": "data.standardize='noble2022-minmax'", "data-text": "data.standardize='client'",
               "median": "algorithm.clip_heuristic='median-nonprivate'",
               "shared-noise": "algorithm.noise_sharing='cohort-nonprivate'"}
    return out + [choices[name] for name in switches if name in choices]


def run_cell(switches: tuple[str, ...], sigma: float, k: int, lr: float, seed: int) -> dict:
    """One run: its last-10% and final test accuracy (%), final train loss, eps towards a third party, wall time."""
    t = rounds(sigma, k)
    start = time.perf_counter()
    result = _run(overrides(switches, sigma, k, lr), seed, max(1, t // 100))
    return {"lr": lr, "seed": seed, "rounds": t,
            "last10": 100 * last_fraction_accuracy(result["rounds"], t, LAST_FRACTION),
            "final_accuracy": 100 * result["final"]["test_accuracy"], "train_loss": result["final"]["train_loss"],
            "epsilon": result["final"]["epsilon"]["third_party"], "wall_s": time.perf_counter() - start}


def tuned_cell(switches: tuple[str, ...], sigma: float, k: int, lrs: tuple[float, ...], seeds: int) -> dict:
    """eta0 picked on seed 0 by the least final train loss (a diverged run's NaN loses), then seeds 1.. at it."""
    tuning = [run_cell(switches, sigma, k, lr, 0) for lr in lrs]
    best = min(tuning, key=lambda r: r["train_loss"] if math.isfinite(r["train_loss"]) else math.inf)
    runs = [best] + [run_cell(switches, sigma, k, best["lr"], seed) for seed in range(1, seeds)]
    summary = {key: statistics.fmean(r[key] for r in runs) for key in ("last10", "final_accuracy", "train_loss")}
    spread = statistics.stdev(r["last10"] for r in runs) if len(runs) > 1 else 0.0
    return {**summary, "last10_std": spread, "lr": best["lr"], "rounds": best["rounds"], "epsilon": best["epsilon"],
            "paper": paper_accuracy(sigma, k), "tuning": tuning, "runs": runs}


def fixed_cell(switches: tuple[str, ...], sigma: float, k: int, eta0: float, seeds: int) -> dict:
    """Seeds 0.. at the authors' local step for one eta0 (``authors_lr``), no tuning."""
    runs = [run_cell(switches, sigma, k, authors_lr(eta0, k), seed) for seed in range(seeds)]
    summary = {key: statistics.fmean(r[key] for r in runs) for key in ("last10", "final_accuracy", "train_loss")}
    spread = statistics.stdev(r["last10"] for r in runs) if len(runs) > 1 else 0.0
    return {**summary, "last10_std": spread, "lr": eta0, "rounds": runs[0]["rounds"], "epsilon": runs[0]["epsilon"],
            "paper": paper_accuracy(sigma, k), "runs": runs}


def paper_accuracy(sigma: float, k: int) -> float:
    """Table 1's mean accuracy (%) of the cell."""
    return ACCURACY[",".join(str(h) for h in HETEROGENEITY)][sigma][LOCAL_STEPS.index(k)][0]


def configuration(name: str, lrs: tuple[float, ...], seeds: int) -> dict:
    """Every cell of ``CELLS`` under the configuration ``name`` (a key of ``SWITCHES``), keyed "sigma_g,K"."""
    return {f"{sigma},{k}": tuned_cell(SWITCHES[name], sigma, k, lrs, seeds) for sigma, k in CELLS}


def fixed_configuration(name: str, eta0: float, seeds: int) -> dict:
    """Every cell under ``name`` at one eta0 with the authors' local step, keyed "sigma_g,K"."""
    return {f"{sigma},{k}": fixed_cell(SWITCHES[name], sigma, k, eta0, seeds) for sigma, k in CELLS}


def report(results: dict[str, dict]) -> str:
    """A markdown table, cell x configuration: the last-10% accuracy (tuned eta0), the paper's value beside."""
    names = list(results)
    lines = ["| sigma_g, K (T) | paper | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for sigma, k in CELLS:
        key = f"{sigma},{k}"
        cells = [f"{results[n][key]['last10']:.1f} (eta0 {results[n][key]['lr']:g})" for n in names]
        t = results[names[0]][key]["rounds"]
        lines.append(f"| {sigma}, {k} ({t}) | {paper_accuracy(sigma, k):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder: one <configuration>.json each")
    parser.add_argument("--configs", default=",".join(SWITCHES), help=f"comma-separated, of {list(SWITCHES)}")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--lrs", default=",".join(f"{lr:g}" for lr in LRS))
    parser.add_argument("--fixed-eta0", default="", help="comma-separated eta0s: every cell at each, with the "
                                                          "authors' local step, no tuning (<config>@eta0=<v>.json)")
    parser.add_argument("--report", action="store_true", help="print the table of the results in --out, run nothing")
    args = parser.parse_args(argv)
    if args.report:
        results = {p.stem: json.loads(p.read_text()) for p in sorted(args.out.glob("*.json"))}
        print(report(results))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    lrs = tuple(float(v) for v in args.lrs.split(","))
    for name in args.configs.split(","):
        if name not in SWITCHES:
            parser.error(f"--configs: {name!r} is not one of {list(SWITCHES)}")
        if not args.fixed_eta0:
            (args.out / f"{name}.json").write_text(json.dumps(configuration(name, lrs, args.seeds), indent=1))
            print(f"{name} done", flush=True)
        for eta0 in (float(v) for v in args.fixed_eta0.split(",") if v):
            result = fixed_configuration(name, eta0, args.seeds)
            (args.out / f"{name}@eta0={eta0:g}.json").write_text(json.dumps(result, indent=1))
            print(f"{name} at eta0 = {eta0:g} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
