"""Why the planned (b*, T*) of Zhou, Liu, Fu, Wu, Li, Yu (2021) does not end best where the plan is b* = 1: one
experiment per suspected cause, in a regime where b* = 1 comes with real learning.

    python -m dpfl.papers.zhou2021.causes --out results/zhou2021-causes [--repeats 3]

Regime (``zhou2021.B_STAR_ONE``): scikit-learn's breast cancer (569 records, 30 features, 2 classes) over N = 10
clients, each standardising its features with its own training statistics, logistic regression without bias (p = 60),
weight decay w = 2 (gamma = 2 lambda / mu ~ 8.5), xi_1 = 2, round-robin cohorts. The non-private optimum theta* has
F* = 0.41 against ln 2 = 0.69 at chance, and 95% test accuracy; the planner's joint optimum is b* = 1 at eps 5 and 10.

Theorem 3 bounds Y_T = E||theta_T - theta*||^2 by U(T, b) = (C1 / b + C3) / (T + gamma) + C2 b T^2 / (T + gamma):
an optimisation term and a noise term. Each experiment measures Y_T (mean over seeds of the final squared distance
to theta*, which ``zhou2021.optimum`` finds WITHOUT privacy) at the same (b, T) and sets it against one piece:

* ``shape``: the measured Y_T at each T against U(T, b), for b = 1 and b = N: does the measured Y_T have its least
  value near the bound's T*(b), and which b is better at each T? (the bound's looseness, and its constants, as the
  plan uses them);
* ``terms``: the same points without noise (eps = 1e6, the largest a config takes: each reply's Laplace scale is
  m Delta / 1e6) with the clip xi_1 = 2 (the run's optimisation error, clipping bias included) and with no clipping
  (xi_1 = 1,000 against per-sample l1 norms up to 84: what Theorem 3 assumes, xi_1 bounds every per-sample
  gradient): the clipping bias is their difference, the noise's share is the noisy Y_T less the noise-free one, set
  against the bound's two terms;
* ``constants``: T*(1) re-planned (no runs) with G measured at theta* (sqrt of max_i ||grad F_i(theta*)||^2) instead
  of the worst over the estimation's path (Assumption 5 bounds it everywhere), and then also with Y0 = 0: which of
  the optimisation term's constants sets the plan's T;
* ``replies``: the planned (b*, T*) with random cohorts (calibrated to the most replies any client makes) against
  round robin (calibrated to ceil(b T / N), the count the plan uses).

NOT PRIVATE, on purpose: theta*, the constants and the regime were chosen from non-private runs (docs/experiments/
zhou2021.md lists the probes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from dpfl.papers.zhou2021.experiment import B_STAR_ONE, JOINT, Point, Setup, constants, estimate, laplace_plans, \
    optimum, regularised_risk, replies, run_point
from dpfl.planning.queries_replies import LaplaceBound, plan

#: eps at which the regime's joint plan is b* = 1, and the queries measured at every b
EPSILONS = (5.0, 10.0)
ROUNDS = (10, 25, 50, 100, 250, 500)
#: eps whose noise is negligible (the Laplace scale is m Delta / eps), and a clip no per-sample gradient reaches
NOISELESS = 1e6
UNCLIPPED = 1e3  # the largest per-sample l1 norm along the estimation's run is 84; the noise scales with the clip


def measure(setup: Setup, eps: float, b: int, T: int, repeats: int, lam: float, target: torch.Tensor) -> dict:
    """Mean and standard deviation over seeds of the final ||theta_T - theta*||^2 and F(theta_T) at (b, T)."""
    runs = [run_point(setup, Point("laplace", eps, b, T, ()), seed, lam, target=target) for seed in range(repeats)]
    out = {"clients_per_round": b, "rounds": T, "epsilon": eps, "clip": setup.clip_laplace}
    for key in ("distance", "train_loss", "test_accuracy"):
        values = [r[key] for r in runs]
        out[key], out[f"{key}_std"] = statistics.fmean(values), statistics.stdev(values) if repeats > 1 else 0.0
    return out


def shape_and_terms(setup: Setup, est, target: torch.Tensor, eps: float, rounds: tuple[int, ...], repeats: int,
                    noiseless: dict) -> dict:
    """``shape`` and ``terms`` at one eps (module docstring): per b in {1, N} and T, U(T, b) and its two terms, the
    measured Y_T with noise, without noise at the clip, and without noise or clipping (one seed each, kept in
    ``noiseless`` by (clip, b, T) for the next eps)."""

    def free(clip: float, b: int, T: int) -> float:
        if (clip, b, T) not in noiseless:
            noiseless[(clip, b, T)] = measure(dataclasses.replace(setup, clip_laplace=clip), NOISELESS, b, T, 1,
                                              est.lam, target)["distance"]
        return noiseless[(clip, b, T)]

    bound = LaplaceBound(constants(est, setup, "laplace", eps), replies(setup))
    plans = laplace_plans(est, setup, eps, (1, setup.num_clients))
    rows = []
    for b in (1, setup.num_clients):
        planned = plans[f"T*(b={b})"].rounds
        for T in sorted({*rounds, planned}):
            optimisation = (bound.C1 / b + bound.C3) / (T + bound.c.gamma)
            noisy = measure(setup, eps, b, T, repeats, est.lam, target)
            rows.append({"clients_per_round": b, "rounds": T, "planned": T == planned, "bound": bound(T, b),
                         "bound_optimisation": optimisation, "bound_noise": bound(T, b) - optimisation,
                         "measured": noisy["distance"], "measured_std": noisy["distance_std"],
                         "train_loss": noisy["train_loss"], "train_loss_std": noisy["train_loss_std"],
                         "test_accuracy": noisy["test_accuracy"], "noiseless_clipped": free(setup.clip_laplace, b, T),
                         "noiseless_unclipped": free(UNCLIPPED, b, T)})
    return {"epsilon": eps, "joint": plans[JOINT].to_dict(), "rows": rows}


def replanned(setup: Setup, est, target: torch.Tensor, eps: float) -> dict:
    """``constants``: T*(1) as planned, with G at theta*, and with G at theta* and Y0 = 0."""
    at_optimum = float(regularised_risk(setup).client_gradients(target).square().sum(1).max().sqrt())
    c = constants(est, setup, "laplace", eps)
    variants = {"as estimated": c, "G at theta*": dataclasses.replace(c, G=at_optimum),
                "G at theta*, Y0 = 0": dataclasses.replace(c, G=at_optimum, Y0=0.0)}
    return {"epsilon": eps, "G": est.G, "G_at_optimum": at_optimum,
            "rounds": {name: plan(v, "laplace", "rounds", clients_per_round=1, replies=replies(setup)).rounds
                       for name, v in variants.items()}}


def reply_counting(setup: Setup, est, target: torch.Tensor, eps: float, repeats: int) -> dict:
    """``replies``: the joint plan run with random cohorts and with round robin."""
    joint = laplace_plans(est, setup, eps, (1, setup.num_clients))[JOINT]
    out = {"epsilon": eps, "clients_per_round": joint.clients_per_round, "rounds": joint.rounds}
    for selection in ("random", "round-robin"):
        out[selection] = measure(dataclasses.replace(setup, selection=selection), eps, joint.clients_per_round,
                                 joint.rounds, repeats, est.lam, target)
    return out


def tables(result: dict) -> str:
    """The markdown tables of docs/experiments/zhou2021.md's causes section."""
    lines = []
    for part in result["shape"]:
        joint = part["joint"]
        lines += [f"eps = {part['epsilon']:g}, joint plan (b*, T*) = ({joint['clients_per_round']}, "
                  f"{joint['rounds']}):", "",
                  "| b | T | U(T, b) | its optimisation / noise terms | measured Y_T | noise-free, clip 2 | "
                  "noise-free, unclipped | F(theta_T) | accuracy |", "|---|---|---|---|---|---|---|---|---|"]
        for r in part["rows"]:
            star = " (T*)" if r["planned"] else ""
            lines.append(f"| {r['clients_per_round']} | {r['rounds']}{star} | {r['bound']:.3g} | "
                         f"{r['bound_optimisation']:.3g} / {r['bound_noise']:.3g} | {r['measured']:.3g} ± "
                         f"{r['measured_std']:.2g} | {r['noiseless_clipped']:.3g} | {r['noiseless_unclipped']:.3g} | "
                         f"{r['train_loss']:.3f} ± {r['train_loss_std']:.3f} | {r['test_accuracy']:.3f} |")
        lines.append("")
    lines += ["| eps | T*(1) as planned | G at theta* | G at theta*, Y0 = 0 |", "|---|---|---|---|"]
    for r in result["constants"]:
        lines.append(f"| {r['epsilon']:g} | " + " | ".join(str(t) for t in r["rounds"].values()) + " |")
    lines += ["", "| eps | planned (b*, T*) | cohorts | measured Y_T | F(theta_T) | accuracy |",
              "|---|---|---|---|---|---|"]
    for r in result["replies"]:
        for selection in ("random", "round-robin"):
            m = r[selection]
            lines.append(f"| {r['epsilon']:g} | ({r['clients_per_round']}, {r['rounds']}) | {selection} | "
                         f"{m['distance']:.3g} ± {m['distance_std']:.2g} | {m['train_loss']:.3f} ± "
                         f"{m['train_loss_std']:.3f} | {m['test_accuracy']:.3f} |")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpfl.papers.zhou2021.causes",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for results.json and table.md")
    p.add_argument("--repeats", type=int, default=3, help="seeds per noisy point (default 3)")
    p.add_argument("--epsilons", type=lambda t: tuple(float(v) for v in t.split(",")), default=EPSILONS,
                   help="eps_i (5,10)")
    p.add_argument("--rounds", type=lambda t: tuple(int(v) for v in t.split(",")), default=ROUNDS,
                   help="T measured at every b (10,25,50,100,250,500), beside T*(b)")
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    setup = B_STAR_ONE
    est, target = estimate(setup), optimum(setup)
    noiseless: dict = {}
    result = {"setup": dataclasses.asdict(setup), "constants": est.to_dict(),
              "shape": [shape_and_terms(setup, est, target, eps, args.rounds, args.repeats, noiseless)
                        for eps in args.epsilons],
              "constants": [replanned(setup, est, target, eps) for eps in args.epsilons],
              "replies": [reply_counting(setup, est, target, eps, args.repeats) for eps in args.epsilons]}
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "table.md").write_text(tables(result))
    print(tables(result))
    print(f"{result['wall_seconds']} s", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
