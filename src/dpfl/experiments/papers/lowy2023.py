"""Lowy, Ghafelebashi, Razaviyayn (2023), "Private non-convex federated learning without a trusted server", Sec. 4:
test error against eps of ISRL-DP FedProx-SPIDER, ISRL-DP MB-SGD and ISRL-DP Local SGD on breast cancer (WBCD).

    python -m dpfl.experiments.papers.lowy2023 --out results/lowy2023 [--repeats 3] [--quick]

Setting (``Setup``): breast cancer (569 records, 30 features) in N = 2 silos, one all malignant and one all benign
(``data.partition = 'one_class'``), 80/20 split per silo; the paper's MLP 30 -> 5 -> 2 (``model.name = 'mlp'``,
``hidden = [5]``); every silo in every round (M = N); R rounds, minibatches of floor(s n_i) records with the paper's
code's s = sqrt(24) / (2 sqrt(R)); delta = 1 / n^2 with n the smaller silo's training records; eps in
{0.75, 1, 1.5, 3, 6, 12, 18}. SPIDER takes a checkpoint gradient every q rounds (q tuned in {2, 5}); Local SGD K local steps per round.

Private algorithms (their noise calibrated to privacy.epsilon): ``isrl-spider``, ``isrl-mb-sgd``,
``isrl-local-sgd``. Their non-private versions, one test error each (no eps): ``fedsgd`` (MB-SGD without noise nor
clipping), ``fedavg`` (Local SGD without noise nor clipping, its lr set so that the local step is eta) and SPIDER
without privacy, which dpfl has no name for: ``isrl-spider`` at eps = 1e6 (its noise negligible, its
clip kept).

NOT PRIVATE, and said in the outputs: (1) features are standardised with the pooled training data's mean and
standard deviation (``data.standardize = 'pooled'``; the paper standardises per silo, which with one class per silo
would erase the class signal from the features' means); (2) every point reports the step size eta and clip C of a small
grid with the least mean TEST error over the repeats (the paper also tuned non-privately). The digits / MNIST experiment
is skipped: its PCA projection is fitted on the data (non-private preprocessing) and dpfl has no public projection.

Each (algorithm, eps, eta, C) runs ``--repeats`` times, repeat r with data.seed = run.seed = r (a different 80/20
split, initialisation, minibatches and noise: the paper's 5-fold cross validation, approximately). Outputs in ``--out``:
runs.csv (one row per run), results.json (setup, runs, tuned summary, the claim's check), table.md and lowy2023.png
(tuned test error against eps, the non-private errors as horizontal lines).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_data, build_simulation

EPSILONS = (0.75, 1.0, 1.5, 3.0, 6.0, 12.0, 18.0)
PRIVATE = ("isrl-spider", "isrl-mb-sgd", "isrl-local-sgd")
#: the non-private version of each private algorithm: (dpfl name, its privacy.epsilon or None)
NONPRIVATE = {"isrl-spider": ("isrl-spider", 1e6), "isrl-mb-sgd": ("fedsgd", None),
              "isrl-local-sgd": ("fedavg", None)}
NONPRIVATE_NOTE = ("features standardised with the pooled training data (non-private preprocessing); every point's "
                   "step size and clip chosen by the least mean TEST error (non-private tuning)")
LRS = (0.01, 0.03, 0.1, 0.3, 1.0)
CLIPS = (0.1, 1.0, 5.0)
PERIODS = (2, 5)  # SPIDER's q (q = 1 would be MB-SGD)


@dataclass(frozen=True)
class Setup:
    """What every run shares (module docstring)."""

    rounds: int = 50
    local_steps: int = 5  # K of Local SGD

    @property
    def sample_rate(self) -> float:
        """s = sqrt(24) / (2 sqrt(R)), capped at 1 (the paper's code's batch K = n sqrt(24) / (2 sqrt(R)))."""
        return min(1.0, math.sqrt(24) / (2 * math.sqrt(self.rounds)))

    def data(self) -> list[str]:
        return ["data.name='breast_cancer'", "data.num_clients=2", "data.partition='one_class'",
                "data.standardize='pooled'", "model.name='mlp'", "model.hidden=[5]", "run.threads=1"]

    def delta(self) -> float:
        """1 / n^2, n the smaller silo's training records."""
        n = int(build_data(load_config(None, self.data())).train.counts.min())
        return 1.0 / n ** 2


def run_one(setup: Setup, delta: float, name: str, epsilon: float | None, lr: float, clip: float | None,
            period: int | None, seed: int) -> dict:
    """One run; its final test error and training loss."""
    local_steps = setup.local_steps if name in ("isrl-local-sgd", "fedavg") else 1
    step_lr = lr * setup.sample_rate * local_steps if name in ("fedsgd", "fedavg") else lr  # their step: lr / (s K)
    overrides = [*setup.data(), f"data.seed={seed}", f"run.seed={seed}", f"algorithm.name='{name}'",
                 f"algorithm.rounds={setup.rounds}", "algorithm.client_rate=1.0", f"algorithm.lr={step_lr!r}",
                 f"algorithm.sample_rate={setup.sample_rate!r}", f"privacy.delta={delta!r}",
                 f"run.eval_every={setup.rounds}", f"run.checkpoint_every={setup.rounds}"]
    if name in ("fedsgd", "fedavg"):
        overrides += ["algorithm.weight_decay=0.0", f"algorithm.local_steps={local_steps}"]
    else:
        overrides += [f"algorithm.clip={clip!r}", f"privacy.epsilon={epsilon!r}"]
    if name == "isrl-spider":
        overrides += [f"algorithm.period={period}"]
    if name == "isrl-local-sgd":
        overrides += [f"algorithm.local_steps={local_steps}"]
    started = time.perf_counter()
    final = build_simulation(load_config(None, overrides)).run(setup.rounds)[-1]
    spent = max((e for e in final.epsilon.values() if e is not None), default=None)
    loss = final.train_loss if math.isfinite(final.train_loss) else float("inf")
    return {"algorithm": name, "epsilon": epsilon, "lr": lr, "clip": clip, "period": period, "seed": seed,
            "test_error": 1.0 - final.test_accuracy, "train_loss": loss, "epsilon_spent": spent,
            "seconds": round(time.perf_counter() - started, 3)}


def tuned(runs: list[dict]) -> list[dict]:
    """Per (algorithm, eps): the (eta, C, q) of least mean test error over seeds (non-private tuning), with its mean and
    standard deviation."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["algorithm"], r["epsilon"], r["lr"], r["clip"], r["period"]), []).append(r)
    best: dict[tuple, dict] = {}
    for (name, eps, lr, clip, period), rs in groups.items():
        errors = [r["test_error"] for r in rs]
        row = {"algorithm": name, "epsilon": eps, "lr": lr, "clip": clip, "period": period, "repeats": len(rs),
               "test_error": statistics.fmean(errors),
               "test_error_std": statistics.stdev(errors) if len(errors) > 1 else 0.0}
        if (name, eps) not in best or row["test_error"] < best[(name, eps)]["test_error"]:
            best[(name, eps)] = row
    return list(best.values())


def _find(summary: list[dict], name: str, eps) -> dict:
    return next(r for r in summary if r["algorithm"] == name and r["epsilon"] == eps)


def claim(summary: list[dict], epsilons) -> dict:
    """Lowy et al.'s "ISRL-DP MB-SGD never outperformed ISRL-DP SPIDER": per eps, SPIDER's tuned error <= MB-SGD's."""
    per_eps = {f"{eps:g}": _find(summary, "isrl-spider", eps)["test_error"]
               <= _find(summary, "isrl-mb-sgd", eps)["test_error"] + 1e-12 for eps in epsilons}
    return {"spider_never_worse_than_mb_sgd": all(per_eps.values()), "per_epsilon": per_eps}


def table(summary: list[dict], epsilons) -> str:
    """Tuned test error (mean ± std, with its eta / C) per eps and algorithm; the non-private versions last."""
    lines = ["| eps | " + " | ".join(PRIVATE) + " |", "|---|" + "---|" * len(PRIVATE)]

    def cell(row: dict) -> str:
        clip = "no clip" if row["clip"] is None else f"C {row['clip']:g}"
        period = "" if row["period"] is None else f", q {row['period']}"
        return f"{row['test_error']:.3f} ± {row['test_error_std']:.3f} (eta {row['lr']:g}, {clip}{period})"

    for eps in epsilons:
        lines.append(f"| {eps:g} | " + " | ".join(cell(_find(summary, n, eps)) for n in PRIVATE) + " |")
    lines.append("| non-private | " + " | ".join(
        f"{NONPRIVATE[n][0]}: " + cell(_find(summary, *NONPRIVATE[n])) for n in PRIVATE) + " |")
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], epsilons, path: Path) -> None:
    """Tuned test error against eps per private algorithm (mean ± std), the non-private versions dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for k, name in enumerate(PRIVATE):
        rows = [_find(summary, name, eps) for eps in epsilons]
        ax.errorbar(epsilons, [r["test_error"] for r in rows], [r["test_error_std"] for r in rows], color=f"C{k}",
                    marker="o", ms=4, capsize=2, label=name)
        base = _find(summary, *NONPRIVATE[name])
        ax.axhline(base["test_error"], color=f"C{k}", ls="--", lw=1, label=f"non-private ({NONPRIVATE[name][0]})")
    ax.set_xscale("log")
    ax.set_xlabel("eps (ISRL-DP, per silo)")
    ax.set_ylabel("test error (tuned on test: non-private)")
    ax.set_title("breast cancer, 2 one-class silos, MLP 30-5-2")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _numbers(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpfl.experiments.papers.lowy2023", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for runs.csv, results.json, table.md, lowy2023.png")
    p.add_argument("--repeats", type=int, default=3, help="seeds (splits) per point (default 3)")
    p.add_argument("--quick", action="store_true", help="a smoke test: eps 1 and 18, two step sizes, one clip, "
                                                        "10 rounds, one repeat")
    p.add_argument("--epsilons", type=_numbers, default=EPSILONS, help="eps (0.75,1,1.5,3,6,12,18)")
    p.add_argument("--lrs", type=_numbers, default=LRS, help="the step-size grid (0.01,0.03,0.1,0.3,1)")
    p.add_argument("--clips", type=_numbers, default=CLIPS, help="the clip grid (0.1,1,5)")
    p.add_argument("--periods", type=lambda t: tuple(int(v) for v in t.split(",")), default=PERIODS,
                   help="SPIDER's q grid (2,5)")
    for f in dataclasses.fields(Setup):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=f.default, help=f"(default {f.default})")
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    if args.quick:
        args.epsilons, args.lrs, args.clips, args.periods, args.repeats, args.rounds = (1.0, 18.0), (0.1, 1.0), (1.0,), \
            (5,), 1, 10
    setup = Setup(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Setup)})
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    delta = setup.delta()
    def grid(name: str, eps) -> list[tuple]:
        """(name, eps, eta, C, q): no C for the unclipped fedsgd / fedavg, q for SPIDER only."""
        clips = args.clips if name.startswith("isrl-") else (None,)
        periods = args.periods if name == "isrl-spider" else (None,)
        return [(name, eps, lr, clip, q) for lr in args.lrs for clip in clips for q in periods]

    todo = [point for name in PRIVATE for eps in args.epsilons for point in grid(name, eps)]
    todo += [point for name in PRIVATE for point in grid(*NONPRIVATE[name])]
    total = len(todo) * args.repeats
    print(f"{len(todo)} points x {args.repeats} seeds, delta = {delta:.3g}", file=sys.stderr)
    runs = []
    for seed in range(args.repeats):
        for name, eps, lr, clip, period in todo:
            runs.append(run_one(setup, delta, name, eps, lr, clip, period, seed))
            r, elapsed = runs[-1], time.perf_counter() - started
            print(f"[{len(runs)}/{total}] {name} eps={eps} eta={lr:g} C={clip} q={period} seed={seed}: error "
                  f"{r['test_error']:.3f} ({elapsed:.0f}s elapsed, about {elapsed / len(runs) * (total - len(runs)):.0f}s"
                  " left)", file=sys.stderr, flush=True)
    summary = tuned(runs)
    check = claim(summary, args.epsilons)
    result = {"setup": {**dataclasses.asdict(setup), "sample_rate": setup.sample_rate, "delta": delta,
                        "lrs": list(args.lrs), "clips": list(args.clips),
                        "periods": list(args.periods), "repeats": args.repeats},
              "nonprivate": NONPRIVATE_NOTE, "nonprivate_versions": NONPRIVATE,
              "command": "python -m dpfl.experiments.papers.lowy2023 " + " ".join(argv if argv is not None
                                                                                  else sys.argv[1:]),
              "runs": runs, "summary": summary, "claim": check, "wall_seconds": round(time.perf_counter() - started, 1)}
    with open(out / "runs.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(runs[0]))
        writer.writeheader()
        writer.writerows(runs)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    text = table(summary, args.epsilons)
    (out / "table.md").write_text(text)
    plot(summary, args.epsilons, out / "lowy2023.png")
    print(text)
    print(f"SPIDER never worse than ISRL-DP MB-SGD: {check['spider_never_worse_than_mb_sgd']} {check['per_epsilon']}")
    return result


if __name__ == "__main__":
    main()
