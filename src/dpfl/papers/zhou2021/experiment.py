"""Zhou, Liu, Fu, Wu, Li, Yu (2021), "Optimizing the numbers of queries and replies in federated learning with
differential privacy", Sec. VI, scaled down to scikit-learn's digits: FedSGD-DPC at the paper's grid of (b, T) against
the (b*, T*) that ``dpfl.planning.queries_replies`` plans, and the Gaussian mechanism's preference over b.

    python -m dpfl.papers.zhou2021.experiment --out results/zhou2021 [--repeats 3]

Setting (``Setup``): digits (1,797 records, 8 x 8 pixels 0..16, times the public constant 1/16, ``data.scale``) over
N = 10 clients holding two digits each (``k_labels`` with k = 2: each digit split between two clients), 80/20 split
per client; logistic regression without bias (640 parameters, as the paper's 7,840 on MNIST); weight decay w, so that
F is mu-strongly convex with mu = w exactly (``planning.constants``); the step size of the paper's Theorem 3,
eta_t = 2 / (mu (t + gamma)), gamma = 2 lambda / mu, the rate the planned bound is a bound for.

* Laplace (Table I / Fig. 2 of the paper): eps_i in ``--epsilons`` (1, 5, 10), q = 1, the l1 clip xi_1; every (b, T)
  of the grid b in {1, 5, 10} x T in {10, 50, ..., 500}, the planner's joint (b*, T*) and its T* for each b.
* Gaussian (Sec. VI-B): eps_i in (0.1, 0.5, 1.0), delta = 1e-5, the l2 clip xi_2, q = 0.01 (one record per reply on
  ~144 training records per client: the smallest q with one is 1/142), T = 100, b in {1, 5, 10}; and the planner's
  choice (b = N with T as large as allowed, or T = 0).

Each point runs ``--repeats`` times (run.seed = 0, 1, ...: model initialisation, cohorts and noise; the partition is
fixed), evaluated once, after its last round: the regularised training loss F(theta_T) (the quantity the plan
bounds, through ||theta_T - theta*||^2) and the test accuracy. A planned T = 0 is the initial model, evaluated.

NOT PRIVATE, and said in the outputs: the planner's constants (mu = w is public; lambda, G, Gamma, Y0, Lambda_i) are
estimated from the training data without noise (``planning.constants``), and lambda also sets the step size. The clip
values and the weight decay were chosen by looking at a few runs' test accuracy and training loss.

Outputs in ``--out``: runs.csv (one row per run), results.json (setup, constants, plans, runs, summary), table.md (the
markdown tables of docs/experiments/zhou2021.md) and zhou2021.png (final loss against T per b, one panel per eps,
the plans marked).
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

from dpfl.experiments.assembly import build_data, build_initial_model, build_simulation
from dpfl.experiments.config import load_config
from dpfl.experiments.resolved import RunConfig
from dpfl.planning.constants import NONPRIVATE_NOTE, Estimates, RegularisedRisk, estimate_constants
from dpfl.planning.queries_replies import Constants, Plan, effective_c2, plan

PAPER_ROUNDS = (10, 50, 100, 150, 200, 250, 500)
PAPER_CLIENTS = (1, 5, 10)
LAPLACE_EPSILONS = (1.0, 5.0, 10.0)
GAUSSIAN_EPSILONS = (0.1, 0.5, 1.0)
GRID = "grid"
JOINT = "planned (b*, T*)"


@dataclass(frozen=True)
class Setup:
    """What every run shares (module docstring)."""

    data: str = "digits"  # or "mnist", the paper's (read from its published files, ``dpfl.data.public``)
    num_clients: int = 10
    scale: float = 1 / 16
    standardize: str = "none"  # or "client": each client standardises with its own training statistics
    labels_per_client: int = 2  # k of the k_labels partition
    selection: str = "round-robin"  # Alg. 1, l. 3: "The PS choose b clients with a round robin manner"
    weight_decay: float = 0.01
    clip_laplace: float = 2.0  # xi_1; the data's largest per-sample l1 norm is about 48 (non-private)
    clip_gaussian: float = 1.0  # xi_2; the largest l2 norm is about 4.5 (non-private)
    sample_rate: float = 0.01  # q of the Gaussian mechanism
    delta: float = 1e-5
    samples_per_client: int = 0  # records each client keeps (train and test; 0: all), the paper's Figs. 7-8 portion

    def overrides(self) -> list[str]:
        trimmed = [f"data.samples_per_client={self.samples_per_client}"] if self.samples_per_client else []
        return [f"data.name='{self.data}'", f"data.num_clients={self.num_clients}", "data.partition='k_labels'",
                f"data.partition_param={self.labels_per_client}", f"data.scale={self.scale!r}",
                f"data.standardize='{self.standardize}'", "model.bias=false",
                "algorithm.name='fedsgd-dpc'", f"algorithm.selection='{self.selection}'",
                f"algorithm.weight_decay={self.weight_decay!r}",
                f"privacy.delta={self.delta!r}", "run.threads=1", *trimmed]


#: Where the planner's joint optimum is b* = 1 with real learning (docs/experiments/zhou2021.md, "A regime where
#: b* = 1 learns"): breast cancer (569 records, 30 features, 2 classes), each client standardising with its own
#: training statistics, every client both classes, weight decay 2 (gamma = 2 lambda / mu ~ 8.5, as Table I's fitted
#: 2.7 to 4.8), xi_1 = 2. F* = 0.41 against ln 2 = 0.69 at chance, 95% test accuracy at theta* (non-private); the
#: joint plan is b* = 1 at eps 5 and 10 (b* = N at eps 1).
B_STAR_ONE = Setup(data="breast_cancer", scale=1.0, standardize="client", weight_decay=2.0, clip_laplace=2.0)


@dataclass(frozen=True)
class Point:
    """One (mechanism, eps, b, T) to run, and why: the grid, a plan, or both."""

    mechanism: str
    epsilon: float
    clients_per_round: int
    rounds: int
    sources: tuple[str, ...]


def smallest_client(setup: Setup) -> int:
    """The records (train and test) of the smallest client of the untrimmed partition: the most
    ``samples_per_client`` can keep."""
    config = load_config(None, dataclasses.replace(setup, samples_per_client=0).overrides())
    dataset = build_data(config["data"])
    return int((dataset.train.counts + dataset.test.counts).min())


def estimate(setup: Setup) -> Estimates:
    """The constants of Theorems 3-4 for this setting, from the training data WITHOUT privacy."""
    config = load_config(None, setup.overrides())
    dataset = build_data(config["data"])
    return estimate_constants(dataset, build_initial_model(RunConfig.of(config), dataset), setup.weight_decay)


def constants(est: Estimates, setup: Setup, mechanism: str, epsilon: float, rounds: int = 0) -> Constants:
    """Constants at the algorithm's own clip (xi_1 or xi_2), for one budget eps_i shared by every client; the Gaussian
    ones with c2 from the calibrated noise of ``rounds`` rounds at b = N (as `dpfl plan queries-replies` does)."""
    common = dict(mu=est.mu, lam=est.lam, G=est.G, Gamma=est.Gamma, Y0=est.Y0, p=est.p, d=est.d, epsilon=(epsilon,))
    if mechanism == "laplace":
        return Constants(xi=setup.clip_laplace, **common)
    c2 = effective_c2(setup.sample_rate, rounds, (epsilon,), (setup.delta,))
    return Constants(xi=setup.clip_gaussian, delta=(setup.delta,), Lambda=est.Lambda, q=setup.sample_rate, c2=c2,
                     **common)


def replies(setup: Setup) -> str:
    """The reply count the plans use: the ledger's under round robin (ceil(bT/N)); the paper's bT/N under random
    selection, where the ledger charges the most replies of the drawn schedule instead (``fedsgd_dpc``)."""
    return "round_robin" if setup.selection == "round-robin" else "expected"


def laplace_plans(est: Estimates, setup: Setup, epsilon: float, clients: tuple[int, ...]) -> dict[str, Plan]:
    """The joint (b*, T*) and T* for each b (Theorem 3, Eq. 6), counting replies as the run's selection does."""
    c = constants(est, setup, "laplace", epsilon)
    plans = {JOINT: plan(c, "laplace", "joint", replies=replies(setup))}
    plans.update({f"T*(b={b})": plan(c, "laplace", "rounds", clients_per_round=b, replies=replies(setup))
                  for b in clients})
    return plans


def gaussian_plan(est: Estimates, setup: Setup, epsilon: float, rounds: int) -> Plan:
    """Theorem 4's choice with T at most ``rounds``: b = N and T = rounds, or T = 0."""
    return plan(constants(est, setup, "gaussian", epsilon, rounds), "gaussian", "joint", max_rounds=rounds)


def points(args, plans: dict[float, dict[str, Plan]]) -> list[Point]:
    """Every distinct (mechanism, eps, b, T) of the grid and the plans, each with the reasons it is run."""
    reasons: dict[tuple, list[str]] = {}
    for eps in args.epsilons:
        for b in args.clients:
            for T in args.rounds:
                reasons.setdefault(("laplace", eps, b, T), []).append(GRID)
        for name, p in plans[("laplace", eps)].items():
            reasons.setdefault(("laplace", eps, p.clients_per_round, p.rounds), []).append(name)
    for eps in args.gaussian_epsilons:
        for b in args.clients:
            reasons.setdefault(("gaussian", eps, b, args.gaussian_rounds), []).append(GRID)
        p = plans[("gaussian", eps)]
        reasons.setdefault(("gaussian", eps, p.clients_per_round, p.rounds), []).append(JOINT)
    return [Point(*key, tuple(why)) for key, why in reasons.items()]


def regularised_risk(setup: Setup) -> RegularisedRisk:
    """F and the F_i of this setting's training data (WITHOUT privacy, as ``estimate``)."""
    config = load_config(None, setup.overrides())
    dataset = build_data(config["data"])
    return RegularisedRisk(dataset, build_initial_model(RunConfig.of(config), dataset), setup.weight_decay)


def optimum(setup: Setup) -> torch.Tensor:
    """theta*, the minimiser of the regularised training loss F (L-BFGS-B, from theta_0)."""
    risk = regularised_risk(setup)
    return risk.minimise(risk.grads.initial_params(), risk.loss)[0]


def run_point(setup: Setup, point: Point, seed: int, lam: float, eval_every: int | None = None,
              target: torch.Tensor | None = None) -> dict:
    """One run of FedSGD-DPC at ``point`` (T = 0: the initial model, evaluated); its final metrics and, with
    ``eval_every``, its "curve": [round, training loss] after every ``eval_every`` rounds and the last, from round 0
    (the paper's Fig. 1); with ``target`` (theta*), its "distance" ||theta_T - theta*||^2, what Theorem 3 bounds."""
    clip = setup.clip_laplace if point.mechanism == "laplace" else setup.clip_gaussian
    rate = 1.0 if point.mechanism == "laplace" else setup.sample_rate
    rounds = max(1, point.rounds)
    config = load_config(None, [
        *setup.overrides(), f"algorithm.mechanism='{point.mechanism}'", f"privacy.epsilon={point.epsilon!r}",
        f"algorithm.clients_per_round={point.clients_per_round}", f"algorithm.rounds={rounds}",
        f"algorithm.clip={clip!r}", f"algorithm.sample_rate={rate!r}", "algorithm.lr_schedule='inverse'",
        f"algorithm.mu={setup.weight_decay!r}", f"algorithm.smoothness={lam!r}", f"run.seed={seed}",
        f"run.noise_seed={seed}",  # research mode: each repeat reproducible
        f"run.eval_every={eval_every or rounds}", f"run.checkpoint_every={rounds}"])
    started = time.perf_counter()
    sim = build_simulation(config)
    start = [sim.evaluate()] if eval_every or not point.rounds else []
    history = start + (sim.run(rounds) if point.rounds else [])
    final = history[-1]
    spent = max((e for e in final.epsilon.values() if e is not None), default=0.0) if point.rounds else 0.0
    curve = {"curve": [[m.round, m.train_loss] for m in history]} if eval_every else {}
    if target is not None:
        curve["distance"] = float((sim.model.double().cpu() - target).square().sum())
    return {"mechanism": point.mechanism, "epsilon": point.epsilon, "clients_per_round": point.clients_per_round,
            "rounds": point.rounds, "sources": ";".join(point.sources), "seed": seed, "train_loss": final.train_loss,
            "test_accuracy": final.test_accuracy, "epsilon_spent": spent,
            "seconds": round(time.perf_counter() - started, 3), **curve}


def summarise(runs: list[dict]) -> list[dict]:
    """Mean and standard deviation (over seeds) of the final loss and accuracy of every point."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["mechanism"], r["epsilon"], r["clients_per_round"], r["rounds"], r["sources"]),
                          []).append(r)
    out = []
    for (mechanism, eps, b, T, sources), rs in groups.items():
        row = {"mechanism": mechanism, "epsilon": eps, "clients_per_round": b, "rounds": T, "sources": sources,
               "repeats": len(rs)}
        for key in ("train_loss", "test_accuracy"):
            values = [r[key] for r in rs]
            row[key] = statistics.fmean(values)
            row[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append(row)
    return out


def _cell(row: dict, key: str, digits: int = 3) -> str:
    return f"{row[key]:.{digits}f} ± {row[f'{key}_std']:.{digits}f}"


def tables(summary: list[dict], plans: dict) -> str:
    """The markdown tables: planned vs grid-best per Laplace eps; the Gaussian b comparison."""
    laplace = {eps: named for (mechanism, eps), named in plans.items() if mechanism == "laplace"}
    per_b = [k for k in next(iter(laplace.values()), {}) if k.startswith("T*")]
    lines = ["| eps | planned (b*, T*) | loss | accuracy | grid-best (b, T) by loss | loss | accuracy | "
             f"grid-best (b, T) by accuracy | loss | accuracy | {', '.join(per_b)} |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for eps, named in laplace.items():
        rows = [r for r in summary if r["mechanism"] == "laplace" and r["epsilon"] == eps]
        joint = named[JOINT]
        planned = next(r for r in rows if r["clients_per_round"] == joint.clients_per_round
                       and r["rounds"] == joint.rounds)
        grid = [r for r in rows if GRID in r["sources"].split(";")]
        by_loss, by_accuracy = min(grid, key=lambda r: r["train_loss"]), max(grid, key=lambda r: r["test_accuracy"])
        planned_rounds = ", ".join(str(named[k].rounds) for k in per_b)
        lines.append(f"| {eps:g} | ({joint.clients_per_round}, {joint.rounds}) | {_cell(planned, 'train_loss')} | "
                     f"{_cell(planned, 'test_accuracy')} | ({by_loss['clients_per_round']}, {by_loss['rounds']}) | "
                     f"{_cell(by_loss, 'train_loss')} | {_cell(by_loss, 'test_accuracy')} | "
                     f"({by_accuracy['clients_per_round']}, {by_accuracy['rounds']}) | "
                     f"{_cell(by_accuracy, 'train_loss')} | {_cell(by_accuracy, 'test_accuracy')} | {planned_rounds} |")
    gaussian = [r for r in summary if r["mechanism"] == "gaussian"]
    if gaussian:
        lines += ["", "| eps (Gaussian) | b | T | loss | accuracy | why |", "|---|---|---|---|---|---|"]
        for r in sorted(gaussian, key=lambda r: (r["epsilon"], r["clients_per_round"], r["rounds"])):
            lines.append(f"| {r['epsilon']:g} | {r['clients_per_round']} | {r['rounds']} | "
                         f"{_cell(r, 'train_loss')} | {_cell(r, 'test_accuracy')} | {r['sources']} |")
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], plans: dict, path: Path) -> None:
    """Final loss against T per b (mean ± std over seeds), one panel per Laplace eps; T*(b) as stars of b's colour,
    the joint plan as a black cross."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epsilons = [eps for (mechanism, eps) in plans if mechanism == "laplace"]
    fig, axes = plt.subplots(1, len(epsilons), figsize=(4.5 * len(epsilons), 3.8), squeeze=False)
    for ax, eps in zip(axes[0], epsilons):
        rows = [r for r in summary if r["mechanism"] == "laplace" and r["epsilon"] == eps]
        for k, b in enumerate(sorted({r["clients_per_round"] for r in rows})):
            colour = f"C{k}"
            grid = sorted((r for r in rows if r["clients_per_round"] == b and GRID in r["sources"].split(";")),
                          key=lambda r: r["rounds"])
            if grid:
                ax.errorbar([r["rounds"] for r in grid], [r["train_loss"] for r in grid],
                            [r["train_loss_std"] for r in grid], color=colour, marker="o", ms=4, capsize=2,
                            label=f"b = {b}")
            for r in rows:
                if r["clients_per_round"] == b and f"T*(b={b})" in r["sources"].split(";"):
                    ax.plot(r["rounds"], r["train_loss"], "*", color=colour, ms=14, mec="k")
            for r in rows:
                if r["clients_per_round"] == b and JOINT in r["sources"].split(";"):
                    ax.plot(r["rounds"], r["train_loss"], "X", color="k", ms=10,
                            label=f"planned (b*, T*) = ({b}, {r['rounds']})")
        ax.set_yscale("log")
        ax.set_xscale("symlog", linthresh=10)  # linear on [0, 10], where the plans often fall; log above
        ax.set_xlim(left=-0.5)
        ax.set_xlabel("T (queries)")
        ax.set_title(f"Laplace, eps = {eps:g} (stars: T*(b))")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("final training loss F(theta_T)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: Table I of the paper (Laplace, N = 10): per data set, T* at b = 5, T* at b = 10, b* at T = 50 and the joint T* (at
#: b* = 1), each for eps = 1, 5, 10.
TABLE_I = {
    "MNIST": ((5, 32, 67), (2, 20, 42), (1, 3, 5), (22, 121, 244)),
    "FEMNIST": ((2, 22, 48), (1, 14, 31), (1, 2, 3), (11, 70, 145)),
}
#: (gamma, U, V) that reproduce Table I (the paper does not state its constants; these are fitted to the table).
#: MNIST's V is 197: T*(b = 10, eps = 1) = sqrt(gamma^2 + V / 10) - gamma must stay within 2 +- 0.5, which needs
#: V in [194.6, 197.5], and the b = 1 column needs U + V in [606.8, 611.0].
TABLE_I_FITS = {"MNIST": (2.70, 412.0, 197.0), "FEMNIST": (4.82, 96.6, 127.0)}


def table_constants(dataset: str, gamma: float, U: float, V: float, eps: float, gamma_share: float = 0.0) -> Constants:
    """Constants of Theorem 3 that realise a fitted (gamma, U, V) of a data set of Table I.

    With N clients of d/N samples and one budget eps, sum_i 1/eps_i^2 = N / eps^2 and Eq. 6 reads
    T*(b) = sqrt(gamma^2 + (A1 + gamma Y0) / A2) - gamma with

        (A1 + gamma Y0) / A2 = [ (N - b) / ((N - 1) b) 8 G^2 / mu^2 + 8 lambda Gamma / mu^2 + gamma Y0 ]
                               * mu^2 d^2 eps^2 / (32 p xi_1^2 b)
                             = ( U (N - b) / ((N - 1) b) + V ) eps^2 / b,

        U = G^2 d^2 / (4 p xi_1^2),   V = (8 lambda Gamma + gamma mu^2 Y0) d^2 / (32 p xi_1^2).

    And b* = sqrt(B1 / B2) = G N d / (2 T xi_1 sqrt(p (N - 1) N / eps^2)) = sqrt(N U / (N - 1)) eps / T. So Table I
    pins gamma, U and V only: mu scales out (we take mu = 1, lambda = gamma / 2), the paper's p, xi_1 and d fix G, and
    V is split between Gamma (share ``gamma_share``) and Y0 (the rest) in any proportion.
    """
    N, d = 10, {"MNIST": 60000, "FEMNIST": 70037}[dataset]
    p, xi = {"MNIST": (7840, 300.0), "FEMNIST": (110526, 200.0)}[dataset]
    mu, lam = 1.0, gamma / 2
    G = math.sqrt(4 * p * xi**2 * U) / d
    rest = V * 32 * p * xi**2 / d**2  # 8 lambda Gamma + gamma mu^2 Y0
    return Constants(mu=mu, lam=lam, G=G, Gamma=gamma_share * rest / (8 * lam),
                     Y0=(1 - gamma_share) * rest / (gamma * mu**2), p=p, xi=xi, d=(d / N,) * N, epsilon=(eps,))


def _numbers(kind):
    """A comma-separated list of ``kind`` ("" is the empty list)."""
    return lambda text: tuple(kind(v) for v in text.split(",") if v.strip())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpfl.papers.zhou2021.experiment", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for runs.csv, results.json, table.md, zhou2021.png")
    p.add_argument("--repeats", type=int, default=3, help="seeds per point (default 3)")
    p.add_argument("--epsilons", type=_numbers(float), default=LAPLACE_EPSILONS, help="Laplace eps_i (1,5,10)")
    p.add_argument("--rounds", type=_numbers(int), default=PAPER_ROUNDS, help="the grid's T (10,50,...,500)")
    p.add_argument("--clients", type=_numbers(int), default=PAPER_CLIENTS, help="the grid's b (1,5,10)")
    p.add_argument("--gaussian-epsilons", type=_numbers(float), default=GAUSSIAN_EPSILONS,
                   help="Gaussian eps_i (0.1,0.5,1.0); empty string: no Gaussian runs")
    p.add_argument("--gaussian-rounds", type=int, default=100, help="Gaussian T (100)")
    for f in dataclasses.fields(Setup):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                       help=f"(default {f.default})")
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    setup = Setup(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Setup)})
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    est = estimate(setup)
    print(f"constants ({NONPRIVATE_NOTE}): mu={est.mu:.4g} lambda={est.lam:.4g} G={est.G:.4g} Gamma={est.Gamma:.4g} "
          f"Y0={est.Y0:.4g} ({time.perf_counter() - started:.1f}s)", file=sys.stderr)
    plans = {("laplace", eps): laplace_plans(est, setup, eps, args.clients) for eps in args.epsilons}
    plans.update({("gaussian", eps): gaussian_plan(est, setup, eps, args.gaussian_rounds)
                  for eps in args.gaussian_epsilons})
    for (mechanism, eps), named in plans.items():
        shown = named if isinstance(named, dict) else {JOINT: named}
        print(f"plan {mechanism} eps={eps:g}: " + ", ".join(f"{k} -> (b={p.clients_per_round}, T={p.rounds})"
                                                          for k, p in shown.items()), file=sys.stderr)
    todo = points(args, plans)
    work = sum(max(1, p.rounds) * p.clients_per_round for p in todo) * args.repeats
    print(f"{len(todo)} points x {args.repeats} seeds, {work} client replies in all", file=sys.stderr)
    runs, done, running = [], 0, time.perf_counter()
    for seed in range(args.repeats):
        for point in todo:
            runs.append(run_point(setup, point, seed, est.lam))
            done += max(1, point.rounds) * point.clients_per_round
            r, elapsed = runs[-1], time.perf_counter() - running
            print(f"[{len(runs)}/{len(todo) * args.repeats}] {r['mechanism']} eps={r['epsilon']:g} "
                  f"b={r['clients_per_round']} T={r['rounds']} seed={seed}: loss {r['train_loss']:.4g} acc "
                  f"{r['test_accuracy']:.3f} ({r['seconds']:.1f}s; {elapsed:.0f}s elapsed, about "
                  f"{elapsed / done * (work - done):.0f}s left)", file=sys.stderr, flush=True)
    summary = summarise(runs)
    serial = {f"{m} eps={eps:g}": ({k: p.to_dict() for k, p in named.items()} if isinstance(named, dict)
                                   else named.to_dict()) for (m, eps), named in plans.items()}
    result = {"setup": dataclasses.asdict(setup), "constants": est.to_dict(), "nonprivate": NONPRIVATE_NOTE,
              "command": "python -m dpfl.papers.zhou2021.experiment " + " ".join(argv if argv is not None
                                                                                  else sys.argv[1:]),
              "plans": serial, "runs": runs, "summary": summary,
              "wall_seconds": round(time.perf_counter() - started, 1)}
    with open(out / "runs.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(runs[0]))
        writer.writeheader()
        writer.writerows(runs)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "table.md").write_text(tables(summary, plans))
    if args.epsilons:  # the figure's panels are the Laplace budgets
        plot(summary, plans, out / "zhou2021.png")
    print(tables(summary, plans))
    return result


if __name__ == "__main__":
    main()
