"""Noble, Bellet, Dieuleveut (2022)'s utility results, rerun by dpfl: the test accuracies of Tables 1 and 4
(DP-SCAFFOLD at eps = 3 towards a third party, each (sigma_g, K) trained for the largest T the paper's accountant
allows) and the train-loss curves of Figs. 1 and 3 (three heterogeneity levels x K in {50, 100} x the private
algorithms), whose log10(F(x_t) - F(x*)) needs F(x*) from a centralised non-private fit (``centralised_optimum``).

The items' ids are noble2022-table4 and noble2022-fig1-grid; their settings and helpers live here so that the
privacy-only items of ``privacy`` keep their own cache keys."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from dpfl.reproduction.item import DIFFERS, Item, Row, about
from dpfl.papers.noble2022.privacy import GAP_TOLERANCE, PAPER, STATED_GAP, TABLE_1

#: Test accuracy (%, mean and std over 3 runs) of DP-SCAFFOLD, sigma_g -> (K = 1, 5, 10, 20, 40), eps = 3, l = 0.05,
#: s = 0.2: Table 1 at (alpha, beta) = (5, 5), Table 4 (App. D.3.2) at (0, 0). The T of each cell is ``TABLE_1``'s.
ACCURACY = {
    "5,5": {10: ((27.41, 0.71), (45.53, 0.99), (43.52, 1.52), (42.51, 0.80), (21.80, 3.28)),
            20: ((27.34, 1.31), (44.39, 0.46), (43.47, 1.74), (42.33, 0.77), (20.14, 2.67)),
            40: ((21.05, 2.27), (34.50, 0.65), (36.85, 0.85), (33.24, 0.41), (14.85, 0.95)),
            80: ((17.61, 2.62), (24.41, 0.81), (27.33, 0.37), (19.42, 0.51), (14.08, 0.14)),
            160: ((13.97, 1.70), (15.99, 0.30), (19.27, 1.65), (14.86, 0.75), (14.17, 0.06))},
    "0,0": {10: ((31.29, 0.50), (44.37, 0.15), (44.17, 0.56), (41.71, 0.36), (25.92, 0.90)),
            20: ((28.31, 1.15), (41.97, 0.77), (43.27, 0.90), (41.13, 0.55), (28.20, 2.23)),
            40: ((21.07, 0.41), (33.01, 1.20), (35.96, 0.84), (32.82, 1.11), (23.49, 1.70)),
            80: ((17.09, 1.31), (21.84, 0.96), (25.92, 0.59), (24.02, 1.27), (17.95, 1.14)),
            160: ((15.24, 1.63), (15.37, 0.28), (20.09, 1.51), (18.09, 1.86), (15.38, 0.87))},
}
TABLE_OF = {"5,5": "Table 1", "0,0": "Table 4"}
LOCAL_STEPS = (1, 5, 10, 20, 40)
#: Sec. 5 on its lowest heterogeneity level, where the claims hold as at the others
STILL_HETEROGENEOUS = ("the paper: '(alpha, beta) = (0, 0) still creates heterogeneity and does not lead to i.i.d. "
                       "data across users' (Sec. 5); its gap is 'over the various heterogeneity settings' (App. D.3.1)")
SCALED = ("scaled-down data (fewer records per user: the same noise weighs more against each gradient), one seed, "
          "eta0 = 1 untuned (the paper tunes eta0 per algorithm by 5-fold CV), a fixed clip C = 1 (the paper clips at "
          "the batch's median norm, not private)")


def _common(data: tuple[int, int], lr: float, weight_decay: float) -> list[str]:
    return ["data.name='synthetic'", f"data.num_clients={data[0]}", f"data.samples_per_client={data[1]}",
            f"algorithm.lr={lr}", "algorithm.global_lr=1.0", "algorithm.clip=1.0",
            f"algorithm.weight_decay={weight_decay}", "privacy.boundary='plain'", "run.threads=1", "run.seed=0",
            f"run.checkpoint_every={10 ** 6}"]


def _run(overrides: list[str], noise_seed: int, eval_every: int) -> dict:
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import run_experiment

    config = load_config(None, [*overrides, f"run.noise_seed={noise_seed}", f"run.eval_every={eval_every}"])
    return run_experiment(config, None, progress=False)


# -- Tables 1 and 4: test accuracy at the largest T within eps = 3 --------------------------------------------------

def _table4_settings(quick: bool) -> dict:
    return {"heterogeneity": ["5,5", "0,0"], "sigmas": [10, 40] if quick else sorted(TABLE_1),
            "local_steps": list(LOCAL_STEPS), "accountant": [100, 4000, 0.05, 0.2], "target_epsilon": 3.0,
            "data": [100, 500] if quick else [100, 5000], "lr": 1.0, "weight_decay": 0.0, "seeds": 1 if quick else 3,
            "last_fraction": 0.1}


def last_fraction_accuracy(rounds: list[dict], total: int, fraction: float) -> float:
    """The mean test accuracy of the evaluations in the last ``fraction`` of ``total`` rounds (App. D.3.2: "the
    average test accuracy over the last 10% of the iterations")."""
    tail = [r["test_accuracy"] for r in rounds if r["round"] > (1 - fraction) * total]
    return statistics.fmean(tail)


def _table4(settings: dict, folder: Path) -> dict:
    from dpfl.accounting.dp_scaffold import max_rounds

    m, r, l, s = settings["accountant"]
    target = settings["target_epsilon"]
    accuracy: dict = {}
    rows = []
    for het in settings["heterogeneity"]:
        alpha, beta = het.split(",")
        for sigma in settings["sigmas"]:
            for j, k in enumerate(settings["local_steps"]):
                t = max_rounds(m, r, l, s, k, float(sigma), target, analysis="paper")
                sound_t = max_rounds(m, r, l, s, k, float(sigma), target)
                overrides = [*_common(tuple(settings["data"]), settings["lr"], settings["weight_decay"]),
                             f"data.alpha={alpha}", f"data.beta={beta}", "algorithm.name='dp-scaffold'",
                             f"algorithm.rounds={t}", f"algorithm.local_steps={k}", f"algorithm.client_rate={l}",
                             f"algorithm.sample_rate={s}", f"algorithm.noise_multiplier={sigma}",
                             "privacy.analysis='paper'"]
                per_seed = []
                for seed in range(settings["seeds"]):
                    result = _run(overrides, seed, max(1, t // 50))
                    per_seed.append(100 * last_fraction_accuracy(result["rounds"], t, settings["last_fraction"]))
                ours = statistics.fmean(per_seed)
                accuracy.setdefault(het, {}).setdefault(str(sigma), []).append(ours)
                paper, std = ACCURACY[het][sigma][j]
                rows.append(Row(f"{TABLE_OF[het]}, (alpha, beta) = ({alpha}, {beta}), sigma_g = {sigma}, K = {k}, "
                                f"T = {t}: test accuracy (%)", f"{paper:.2f} ± {std:.2f}", None, f"{ours:.2f}", None,
                                f"T: the paper's accountant's (the sound analysis allows T = {sound_t})"))
    for het, by_sigma in accuracy.items():
        table = TABLE_OF[het]
        for sigma, values in by_sigma.items():
            best = settings["local_steps"][int(np.argmax(values))]
            paper_best = LOCAL_STEPS[int(np.argmax([a for a, _ in ACCURACY[het][int(sigma)]]))]
            rows.append(Row(f"{table}, sigma_g = {sigma}: the most accurate K (the trade-off between T and K: "
                            "neither K = 1 nor K = 40)", f"K = {paper_best}", None, f"K = {best}",
                            best not in (1, 40), "the paper's claim is the interior optimum; its exact K is not "
                                                 "matched at one seed"))
        low, high = (max(by_sigma[str(x)]) for x in (min(settings["sigmas"]), max(settings["sigmas"])))
        rows.append(Row(f"{table}: sigma_g = {min(settings['sigmas'])} beats sigma_g = {max(settings['sigmas'])} at "
                        "their best K (a larger T does not make up for more noise)", "holds", None,
                        f"{low:.2f} vs {high:.2f}", low > high))
    rows.append(Row("every cell's accuracy beside the paper's", "mean of 3 runs", None,
                    f"{settings['seeds']} seed{'s' if settings['seeds'] > 1 else ''}", None,
                    f"{settings['data'][0]} users of {settings['data'][1]} records; " + SCALED))
    _plot_table4(accuracy, settings, folder / "figure.png")
    return {"rows": rows, "accuracy": accuracy}


def _plot_table4(accuracy: dict, settings: dict, path: Path) -> None:
    """Test accuracy against K, one line per sigma_g, dpfl solid and the paper dashed; one panel per table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = settings["local_steps"]
    fig, axes = plt.subplots(1, len(accuracy), figsize=(10, 3.8), squeeze=False, sharey=True)
    for ax, (het, by_sigma) in zip(axes[0], accuracy.items()):
        for i, (sigma, values) in enumerate(by_sigma.items()):
            ax.plot(range(len(ks)), values, "-o", color=f"C{i}", ms=4, label=f"dpfl, sigma_g = {sigma}")
            ax.plot(range(len(ks)), [a for a, _ in ACCURACY[het][int(sigma)]], "--", color=f"C{i}", alpha=0.6,
                    label=f"paper, sigma_g = {sigma}")
        ax.set_xticks(range(len(ks)), [str(k) for k in ks])
        ax.set_xlabel("K (local steps); T: the largest within eps = 3")
        ax.set_title(f"{TABLE_OF[het]}: (alpha, beta) = ({het.replace(',', ', ')})", fontsize=9)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- Figs. 1 and 3: log10(F(x_t) - F(x*)) on three heterogeneity levels -------------------------------------------

def centralised_optimum(loss_and_gradient: Callable[[np.ndarray], tuple[float, np.ndarray]], x0: np.ndarray,
                        gtol: float = 1e-7, max_iterations: int = 5000) -> tuple[np.ndarray, float, float]:
    """x* = argmin F, F(x*) and ||grad F(x*)|| by L-BFGS (float64) from ``x0``: the non-private centralised fit of
    the paper's train-loss axis, log10(F(x_t) - F(x*)) (Fig. 1; App. D.1). ``loss_and_gradient(x)`` returns F(x)
    and its gradient."""
    from scipy.optimize import minimize

    fit = minimize(loss_and_gradient, np.asarray(x0, dtype=np.float64), jac=True, method="L-BFGS-B",
                   options={"gtol": gtol, "ftol": 0.0, "maxiter": max_iterations, "maxcor": 30})
    value, gradient = loss_and_gradient(fit.x)
    return fit.x, float(value), float(np.linalg.norm(gradient))


def pooled_objective(overrides: list[str]) -> tuple[Callable[[np.ndarray], tuple[float, np.ndarray]], np.ndarray]:
    """F of a run's config on its pooled train data in float64, the loss the run reports as train_loss (the mean
    cross-entropy of its model plus its L2 term 0.5 lambda ||x||^2), and the run's initial model."""
    from dpfl.experiments.assembly import build_simulation
    from dpfl.experiments.config import load_config

    sim = build_simulation(load_config(None, [*overrides, "run.noise_seed=0"]))
    x, y = sim.train.flat()
    x = x.double()
    decay = sim.algorithm.weight_decay

    def loss_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        t = torch.from_numpy(np.ascontiguousarray(theta, dtype=np.float64))
        loss, _ = sim.grads.loss_and_accuracy(t, x, y)
        gradient = sim.grads.loss_gradient(t, x, y) + decay * t
        return loss + 0.5 * decay * float(t.square().sum()), gradient.numpy()

    return loss_and_gradient, sim.grads.initial_params().double().numpy()


#: The private algorithms of Fig. 1, in its legend's order.
PRIVATE = ("dp-fedavg", "dp-fedsgd", "dp-scaffold", "dp-scaffold-warm")
LABELS = {"dp-fedavg": "DP-FedAvg", "dp-fedsgd": "DP-FedSGD", "dp-scaffold": "DP-SCAFFOLD",
          "dp-scaffold-warm": "DP-SCAFFOLD-warm"}


def _grid_settings(quick: bool) -> dict:
    sizes = ({"data": [40, 1000], "rounds": 100, "noise_multiplier": 20.0, "eval_every": 5} if quick else
             {"data": [100, 5000], "rounds": 400, "noise_multiplier": 60.0, "eval_every": 10})
    return {**sizes, "heterogeneity": ["0,0", "1,1", "5,5"], "local_steps": [50, 100], "algorithms": list(PRIVATE),
            "client_rate": 0.2, "sample_rate": 0.2, "lr": 1.0, "weight_decay": 0.005, "seeds": 1 if quick else 3}


def grid_runs(settings: dict) -> list[tuple[str, int, str]]:
    """The grid's cells: (heterogeneity "alpha,beta", K, algorithm), in the figure's order."""
    return [(het, k, name) for het in settings["heterogeneity"] for k in settings["local_steps"]
            for name in settings["algorithms"]]


def _grid(settings: dict, folder: Path) -> dict:
    common = _common(tuple(settings["data"]), settings["lr"], settings["weight_decay"])
    optimum, curves, final, accuracy, epsilon = {}, {}, {}, {}, {}
    for het in settings["heterogeneity"]:
        alpha, beta = het.split(",")
        data = [*common, f"data.alpha={alpha}", f"data.beta={beta}"]
        objective, x0 = pooled_objective([*data, "algorithm.name='dp-scaffold'"])
        _, f_star, norm = centralised_optimum(objective, x0)
        optimum[het] = {"F*": f_star, "gradient_norm": norm}
        for _, k, name in (c for c in grid_runs(settings) if c[0] == het):
            overrides = [*data, f"algorithm.name='{name}'", f"algorithm.rounds={settings['rounds']}",
                         f"algorithm.local_steps={k}", f"algorithm.client_rate={settings['client_rate']}",
                         f"algorithm.sample_rate={settings['sample_rate']}",
                         f"algorithm.noise_multiplier={settings['noise_multiplier']}"]
            runs = [_run(overrides, seed, settings["eval_every"]) for seed in range(settings["seeds"])]
            by_round: dict[int, list[float]] = {}
            for result in runs:
                for r in result["rounds"]:
                    by_round.setdefault(r["round"], []).append(r["train_loss"])
            key = f"{het}|{k}|{name}"
            curves[key] = {t: math.log10(max(statistics.fmean(v) - f_star, 1e-12)) for t, v in sorted(by_round.items())}
            final[key] = curves[key][max(curves[key])]
            accuracy[key] = statistics.fmean(result["final"]["test_accuracy"] for result in runs)
            epsilon[key] = runs[0]["final"]["epsilon"]
    _plot_grid(curves, settings, folder / "figure.png")
    rows = []
    for het in settings["heterogeneity"]:
        rows.append(Row(f"({het.replace(',', ', ')}): F(x*) of the centralised non-private fit (L-BFGS on the pooled "
                        f"train data; ||grad F(x*)|| = {optimum[het]['gradient_norm']:.1e})", None,
                        f"{optimum[het]['F*']:.6f}", None, None, "the paper does not print F(x*)"))
    for het in settings["heterogeneity"]:
        for k in settings["local_steps"]:
            cells = [f"{het}|{k}|{name}" for name in settings["algorithms"]]
            rows.append(Row(f"({het.replace(',', ', ')}), K = {k}: final log10(F(x_T) - F(x*)), "
                            + " / ".join(LABELS[n] for n in settings["algorithms"]), None,
                            " / ".join(f"{final[c]:.2f}" for c in cells), None, None,
                            "the paper plots curves (Fig. 1) without printing values"))
            gap = final[f"{het}|{k}|dp-fedavg"] - final[f"{het}|{k}|dp-scaffold-warm"]
            acc = accuracy[f"{het}|{k}|dp-scaffold-warm"] - accuracy[f"{het}|{k}|dp-fedavg"]
            rows.append(Row(f"({het.replace(',', ', ')}), K = {k}: DP-SCAFFOLD-warm below DP-FedAvg (log10 train-loss "
                            "gap; test accuracy gap, Fig. 3)", "holds", f"{gap:+.2f}; {acc:+.3f}", None, gap > 0,
                            STILL_HETEROGENEOUS if het == "0,0" else ""))
    gaps = [100 * (accuracy[f"{h}|{k}|dp-scaffold-warm"] - accuracy[f"{h}|{k}|dp-fedavg"])
            for h in settings["heterogeneity"] for k in settings["local_steps"]]
    mean = statistics.fmean(gaps)
    rows.append(Row(f"the test accuracy gap of DP-SCAFFOLD-warm over DP-FedAvg, mean over the heterogeneity levels and "
                    f"K (points; within {GAP_TOLERANCE:g})", f"about {STATED_GAP:g}", f"{mean:+.1f}", None,
                    about(STATED_GAP, mean, GAP_TOLERANCE), "App. D.3.1: 'an average difference of 10% in the "
                                                            "accuracy ... over the various heterogeneity settings'"))
    first = f"{settings['heterogeneity'][0]}|{settings['local_steps'][0]}|dp-scaffold-warm"
    rows.append(Row(f"eps towards a third party of every run (delta = {runs[0]['final']['delta']:.2g}; sigma_g = "
                    f"{settings['noise_multiplier']:g}, T = {settings['rounds']}, K = {settings['local_steps'][0]})",
                    "13 (M = 100 x 4,000 train records, sigma_g = 60, T = 400)", f"{epsilon[first]['third_party']:.4f}",
                    None, None, "this run's own setting; the paper's setting is item noble2022-epsilon"))
    return {"rows": rows, "optimum": optimum, "curves": curves, "test_accuracy": accuracy}


def _plot_grid(curves: dict, settings: dict, path: Path) -> None:
    """Fig. 1's layout: a row per K (50, then 100), a column per heterogeneity level; log10(F(x_t) - F(x*)) against
    the rounds, the algorithms in the legend's order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hets, ks = settings["heterogeneity"], settings["local_steps"]
    fig, axes = plt.subplots(len(ks), len(hets), figsize=(4 * len(hets), 3.2 * len(ks)), squeeze=False,
                             sharex=True)
    for i, k in enumerate(ks):
        for j, het in enumerate(hets):
            ax = axes[i][j]
            for n, name in enumerate(settings["algorithms"]):
                curve = curves[f"{het}|{k}|{name}"]
                ax.plot(list(curve), list(curve.values()), color=f"C{n}", label=LABELS[name])
            ax.set_title(f"(alpha, beta) = ({het.replace(',', ', ')}), K = {k}", fontsize=9)
            if i == len(ks) - 1:
                ax.set_xlabel("rounds")
            if j == 0:
                ax.set_ylabel("log10(F(x_t) - F(x*))")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


ITEMS = [
    Item("noble2022-table4", PAPER, "Tables 1 and 4: DP-SCAFFOLD's test accuracy at the largest T within eps = 3 "
         "(synthetic (5, 5) and (0, 0), l = 0.05, s = 0.2)", "Table 1 and App. D.3.2's Table 4 (mean ± std of 3 runs)",
         DIFFERS,
         "the trade-off between T and K holds (the most accurate K is interior in every row; sigma_g = 10 beats "
         "sigma_g = 40), but the accuracies differ by up to 23 points and the best K at sigma_g = 10 is 20, not 5: "
         "scaled-down data, one seed, untuned eta0 = 1, fixed clip; each cell runs the paper accountant's T (the "
         "sound analysis allows far more rounds at sigma_g = 40, where the paper's bound saturates). At the paper's "
         "size dpfl is 32-48 points above Table 1 with eta0 tuned; the cause is the authors' code: its per-user "
         "min-max preprocessing (bounds read from a record, not a feature) together with one untuned eta0 through "
         "its local step; with both, 5 cells land within 4.8 points of Table 1 and K = 5 is best "
         "(docs/experiments/noble2022.md)",
         _table4_settings, _table4,
         substitute="100 users of 500 records (not 5,000), sigma_g in {10, 40}, one seed; T is the paper's",
         research_mode=True),
    Item("noble2022-fig1-grid", PAPER, "Figs. 1 and 3: log10(F(x_t) - F(x*)) of the private algorithms on synthetic "
         "(0, 0), (1, 1), (5, 5) data, K = 50 and 100", "Figs. 1 and 3 (curves), Sec. 5 and App. D.3.1 (the gap is "
         "stated in the text)", DIFFERS,
         "DP-SCAFFOLD-warm ends below DP-FedAvg in train loss and above it in test accuracy at every heterogeneity "
         "and K, (0, 0) included, and the train-loss gap grows with K, as the paper says; but the accuracy gap "
         "averages 16.3 points, not about 10 (within 5); F(x*) from an L-BFGS fit (gradient norm below 1e-6); "
         "quick: one seed", _grid_settings, _grid,
         substitute="40 users of 1,000 records, T = 100, sigma_g = 20, one seed", research_mode=True),
]
