"""Lowy, Ghafelebashi, Razaviyayn (2023), "Private non-convex federated learning without a trusted server", Sec. 4:
test error against eps of the ISRL-DP (and shuffle-DP) algorithms on breast cancer (WBCD) and on digits in 25 silos.

    python -m dpfl.papers.lowy2023.experiment --out results/lowy2023 [--setting breast_cancer|digits|both]
        [--algorithms isrl-spider,isrl-mb-sgd,...] [--repeats 3] [--quick]

Settings (``SETTINGS``, one ``Setup`` per (R, M)):

* ``breast_cancer``: 569 records, 30 features, in N = 2 silos, one all malignant and one all benign
  (``data.partition = 'one_class'``); the paper's MLP 30 -> 5 -> 2; every silo every round (M = N = 2); R = 50.
* ``digits`` (the paper's MNIST experiment on scikit-learn's 8x8 digits: 1,797 records, 64 features): N = 25 silos,
  one per (even, odd) digit pair, each digit's records divided equally among the 5 silos holding it
  (``data.partition = 'parity_pairs'``), label even = 1 / odd = 0 (``data.labels = 'parity'``); pixels 0..16 times the
  PUBLIC constant 1/16 (``data.scale``, private by construction); the paper's hidden width, MLP 64 -> 64 -> 2; a cohort
  of M = 12 or 25 silos per round, R in {25, 50}. No PCA: the paper's PCA 784 -> 50 is fitted on the data (not
  private), and digits has only 64 features.

Both: 80/20 split per silo; minibatches of floor(s n_i) records with the paper's code's s = sqrt(24) / (2 sqrt(R));
delta = 1 / n^2 with n the smallest silo's training records; eps in {0.75, 1, 1.5, 3, 6, 12, 18}.

Algorithms (``--algorithms``, default every name of ``ALGORITHMS`` that ``dpfl.algorithms.registry`` has; the others
are skipped with a note): each private one calibrates its noise to privacy.epsilon and is tuned over the step size
eta, the clip C and its own keys in ``ALGORITHMS`` (e.g. SPIDER's checkpoint period q; a key its registered spec
lacks is dropped with a note). Each has a non-private version, one test error (no eps): ``fedsgd`` for MB-SGD,
``fedavg`` for Local SGD (K local steps of size eta), and the algorithm itself at eps = 1e6 where dpfl has no name
for it (noise negligible, clip kept).

NOT PRIVATE, and said in the outputs: every point reports the (eta, C, ...) of a small grid with the least mean TEST
error over the repeats (the paper also tuned non-privately); breast cancer's features are standardised with the
pooled training data's mean and standard deviation (``data.standardize = 'pooled'``; the paper standardises per silo,
which with one class per silo would erase the class signal from the features' means). Digits needs no such step.

Each (setup, algorithm, eps, grid point) runs ``--repeats`` times, repeat r with data.seed = run.seed = r (a different
split, initialisation, minibatches and noise). Outputs in ``--out``: runs.csv (one row per run, with every observer's
spent epsilon), results.json (setups, runs, tuned summary, the budget check, the claim's check), table.md and one
figure per setting, ``<setting>.png`` (tuned test error against eps, the non-private errors as horizontal lines).
``--merge a,b`` writes the same outputs for the runs of earlier output folders together (e.g. one per (R, M), run side
by side).
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
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from dpfl.algorithms import registry
from dpfl.experiments.assembly import build_data, build_simulation
from dpfl.experiments.config import load_config

EPSILONS = (0.75, 1.0, 1.5, 3.0, 6.0, 12.0, 18.0)
NO_NOISE_EPSILON = 1e6  # a private algorithm's "non-private version" where dpfl has no name for it


@dataclass(frozen=True)
class Plan:
    """How one algorithm is run: its non-private version (dpfl name, privacy.epsilon or None) and the values of its
    own [algorithm] keys tuned beside eta and C."""

    nonprivate: tuple[str, float | None]
    tuned: dict[str, tuple] = field(default_factory=dict)


def _itself(name: str, **tuned) -> Plan:
    return Plan((name, NO_NOISE_EPSILON), tuned)


#: The algorithms of the experiment and their grids (beside ``--lrs`` and ``--clips``); ``--periods`` replaces every
#: "period" grid. SPIDER's includes q = 1, where FedProx-SPIDER is MB-SGD (the paper, Sec. 4: "FedProx-SPIDER
#: generalizes MB-SGD (take q = 1)"; dpfl's isrl-spider at period 1 gives isrl-mb-sgd's test error run for run).
ALGORITHMS: dict[str, Plan] = {
    "isrl-spider": _itself("isrl-spider", period=(1, 2, 5)),
    "isrl-spider-alt": _itself("isrl-spider-alt"),  # its period is 2 (Alg. 11 in communication rounds)
    "isrl-mb-sgd": Plan(("fedsgd", None)),
    "isrl-local-sgd": Plan(("fedavg", None)),
    "isrl-prox-sgd": _itself("isrl-prox-sgd"),
    "isrl-prox-svrg": _itself("isrl-prox-svrg", period=(5,)),
    "isrl-prox-pl-svrg": _itself("isrl-prox-pl-svrg", period=(5,)),
    "sdp-prox-sgd": _itself("sdp-prox-sgd"),
    "sdp-spider": _itself("sdp-spider", period=(2, 5)),
}
LOCAL_STEPS = ("isrl-local-sgd", "fedavg")  # the names that take K local steps per round
UNCLIPPED = ("fedsgd", "fedavg")  # non-private names without clip (nor noise)


@dataclass(frozen=True)
class Setup:
    """One experiment: the data and model (config overrides), N silos of which M per round, R rounds."""

    setting: str
    data: tuple[str, ...]
    num_clients: int
    cohort: int  # M
    rounds: int  # R
    local_steps: int = 5  # K of Local SGD

    @property
    def label(self) -> str:
        return f"{self.setting} R={self.rounds} M={self.cohort}"

    @property
    def sample_rate(self) -> float:
        """s = sqrt(24) / (2 sqrt(R)), capped at 1 (the paper's code's batch K = n sqrt(24) / (2 sqrt(R)))."""
        return min(1.0, math.sqrt(24) / (2 * math.sqrt(self.rounds)))

    def overrides(self) -> list[str]:
        return [*self.data, f"data.num_clients={self.num_clients}", "run.threads=1",
                f"algorithm.client_rate={self.cohort / self.num_clients!r}"]

    def delta(self) -> float:
        """1 / n^2, n the smallest silo's training records."""
        n = int(build_data(load_config(None, self.overrides())["data"]).train.counts.min())
        return 1.0 / n ** 2


#: Per setting: the data and model, N, the default (rounds, cohorts), step sizes, clips and periods (None: those of
#: ``ALGORITHMS``), and its non-private steps. Digits' grid is the one whose run takes <= 25 min on one core.
SETTINGS = {
    "breast_cancer": dict(
        data=("data.name='breast_cancer'", "data.partition='one_class'", "data.standardize='pooled'",
              "model.name='mlp'", "model.hidden=[5]"),
        num_clients=2, rounds=(50,), cohorts=(2,), lrs=(0.01, 0.03, 0.1, 0.3, 1.0), clips=(0.1, 1.0, 5.0),
        periods=None,
        nonprivate="features standardised with the pooled training data (non-private preprocessing); every point's "
                   "step size and clip chosen by the least mean TEST error (non-private tuning)"),
    "digits": dict(
        data=("data.name='digits'", "data.partition='parity_pairs'", "data.labels='parity'", "data.scale=0.0625",
              "model.name='mlp'", "model.hidden=[64]"),
        num_clients=25, rounds=(25, 50), cohorts=(12, 25), lrs=(0.1, 0.3, 1.0), clips=(0.3, 1.0), periods=(1, 2),
        nonprivate="every point's step size and clip chosen by the least mean TEST error (non-private tuning); pixels "
                   "scaled by the public constant 1/16 (private); no PCA (the paper's is fitted on the data: not "
                   "private)"),
}


#: SPIDER's noise streams: composed (dpfl: the run spends eps), or each given the whole budget as the authors' code
#: does (UNSOUND: the run spends more than eps; the ablation ``dpfl reproduce lowy2023-wbcd-ablation`` only)
COMPOSED, EACH_STREAM_WHOLE_BUDGET = "composed", "each-stream-whole-budget (the authors' code: UNSOUND)"
SPIDERS = ("isrl-spider", "isrl-spider-alt", "sdp-spider")


def each_stream_epsilon(epsilon: float, delta: float) -> float:
    """The privacy.epsilon that gives each of SPIDER's two streams the whole (eps, delta), as the authors' code does.

    dpfl splits the budget between the streams in equal zCDP halves (``dpfl.algorithms.isrl_spider``); by the zCDP
    arithmetic of the paper's derivation a stream alone spending (eps, delta) is rho = (sqrt(ln(1/delta) + eps) -
    sqrt(ln(1/delta)))^2-zCDP (Bun & Steinke 2016, Prop. 1.3), and the two streams compose to 2 rho-zCDP, i.e.
    eps' = 2 rho + 2 sqrt(2 rho ln(1/delta)). A run calibrated to eps' (by dpfl's tighter accountant: each stream gets
    about, not exactly, the whole budget) spends eps' > eps, which its ledger reports."""
    from dpfl.accounting.theory import dp_to_zcdp_rho, zcdp_to_dp_epsilon

    return zcdp_to_dp_epsilon(2.0 * dp_to_zcdp_rho(epsilon, delta), delta)


def run_one(setup: Setup, delta: float, name: str, epsilon: float | None, lr: float, clip: float | None,
            params: dict, seed: int, stream_budget: str = COMPOSED, every_round: bool = False) -> dict:
    """One run; its final test error, training loss and every observer's spent epsilon. ``stream_budget``
    EACH_STREAM_WHOLE_BUDGET (SPIDER only, UNSOUND) calibrates to ``each_stream_epsilon``. ``every_round`` evaluates
    every round and adds the round of least training loss and the test error there (a DATA-DEPENDENT choice of the
    iterate: the training loss reads the private data without noise)."""
    if stream_budget not in (COMPOSED, EACH_STREAM_WHOLE_BUDGET):
        raise ValueError(f"stream_budget: {stream_budget!r} is not one of {(COMPOSED, EACH_STREAM_WHOLE_BUDGET)}")
    target, whole = epsilon, stream_budget == EACH_STREAM_WHOLE_BUDGET and name in SPIDERS
    if whole:
        epsilon = each_stream_epsilon(epsilon, delta)
    local_steps = setup.local_steps if name in LOCAL_STEPS else 1
    step_lr = lr * setup.sample_rate * local_steps if name in UNCLIPPED else lr  # their step: lr / (s K)
    overrides = [*setup.overrides(), f"data.seed={seed}", f"run.seed={seed}", f"run.noise_seed={seed}",
                 f"algorithm.name='{name}'",
                 f"algorithm.rounds={setup.rounds}", f"algorithm.lr={step_lr!r}",
                 f"algorithm.sample_rate={setup.sample_rate!r}", f"privacy.delta={delta!r}",
                 f"run.eval_every={1 if every_round else setup.rounds}", f"run.checkpoint_every={setup.rounds}",
                 *(f"algorithm.{key}={value!r}" for key, value in params.items())]
    if name in UNCLIPPED:
        overrides += ["algorithm.weight_decay=0.0"]
    else:
        overrides += [f"algorithm.clip={clip!r}", f"privacy.epsilon={epsilon!r}"]
    if name in LOCAL_STEPS:
        overrides += [f"algorithm.local_steps={local_steps}"]
    started = time.perf_counter()
    sim = build_simulation(load_config(None, overrides))
    history = sim.run(setup.rounds)
    # every round's spend (the last evaluation reports epsilon only where run.epsilon_every schedules it); finite only
    spent = {observer: e for observer, e in sim.ledger.epsilon().items() if math.isfinite(e)}
    # diverged before its first evaluation: the grid point's error is the worst, 1
    final = history[-1] if history else SimpleNamespace(test_accuracy=0.0, train_loss=math.inf)
    loss = final.train_loss if math.isfinite(final.train_loss) else float("inf")
    row = {"setup": setup.label, "algorithm": name, "epsilon": target, "lr": lr, "clip": clip,
           "params": _params_text(params), "seed": seed, "test_error": 1.0 - final.test_accuracy, "train_loss": loss,
           "diverged": sim.stopped_by == "diverged",
           "epsilon_spent": max(spent.values(), default=None), "spent": json.dumps(spent, sort_keys=True),
           "seconds": round(time.perf_counter() - started, 3)}
    if whole:
        row.update(stream_budget=stream_budget, epsilon_calibrated=epsilon)
    if every_round:
        best = (min(history, key=lambda m: m.train_loss if math.isfinite(m.train_loss) else math.inf) if history
                else SimpleNamespace(round=0, **vars(final)))
        row.update(least_train_loss_round=best.round, test_error_at_least_train_loss=1.0 - best.test_accuracy)
    return row


def _params_text(params: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in params.items())


def tuned(runs: list[dict]) -> list[dict]:
    """Per (setup, algorithm, eps): the grid point of least mean test error over seeds (non-private tuning), with its
    mean and standard deviation."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["setup"], r["algorithm"], r["epsilon"], r["lr"], r["clip"], r["params"]), []).append(r)
    best: dict[tuple, dict] = {}
    for (label, name, eps, lr, clip, params), rs in groups.items():
        errors = [r["test_error"] for r in rs]
        row = {"setup": label, "algorithm": name, "epsilon": eps, "lr": lr, "clip": clip, "params": params,
               "repeats": len(rs), "test_error": statistics.fmean(errors),
               "test_error_std": statistics.stdev(errors) if len(errors) > 1 else 0.0}
        if (label, name, eps) not in best or row["test_error"] < best[(label, name, eps)]["test_error"]:
            best[(label, name, eps)] = row
    return list(best.values())


def _find(summary: list[dict], label: str, name: str, eps) -> dict | None:
    return next((r for r in summary if r["setup"] == label and r["algorithm"] == name and r["epsilon"] == eps), None)


def claim(summary: list[dict], labels, epsilons) -> dict | None:
    """Lowy et al.'s "ISRL-DP MB-SGD never outperformed ISRL-DP SPIDER": per setup and eps, SPIDER's tuned error <=
    MB-SGD's (None when either was not run)."""
    per = {}
    for label in labels:
        for eps in epsilons:
            spider, mb_sgd = _find(summary, label, "isrl-spider", eps), _find(summary, label, "isrl-mb-sgd", eps)
            if spider is None or mb_sgd is None:
                return None
            per[f"{label} eps={eps:g}"] = {"isrl-spider": spider["test_error"], "isrl-mb-sgd": mb_sgd["test_error"],
                                           "holds": spider["test_error"] <= mb_sgd["test_error"] + 1e-12}
    return {"spider_never_worse_than_mb_sgd": all(v["holds"] for v in per.values()), "per_point": per}


def budget_check(runs: list[dict]) -> dict:
    """Every private run's spent epsilon, for every observer of its ledger, at most its target eps."""
    private = [r for r in runs if r["epsilon"] is not None and r["epsilon"] < NO_NOISE_EPSILON]
    ratios = [r["epsilon_spent"] / r["epsilon"] for r in private]
    observers = sorted({o for r in private for o in json.loads(r["spent"])})
    return {"private_runs": len(private), "observers": observers, "all_within": all(q <= 1 + 1e-9 for q in ratios),
            "spent_over_target_min": min(ratios, default=None), "spent_over_target_max": max(ratios, default=None)}


def table(summary: list[dict], label: str, names, epsilons) -> str:
    """Tuned test error (mean ± std, with its grid point) per eps and algorithm; the non-private versions last."""
    lines = [f"{label}", "", "| eps | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]

    def cell(row: dict) -> str:
        clip = "no clip" if row["clip"] is None else f"C {row['clip']:g}"
        params = f", {row['params']}" if row["params"] else ""
        return f"{row['test_error']:.3f} ± {row['test_error_std']:.3f} (eta {row['lr']:g}, {clip}{params})"

    for eps in epsilons:
        lines.append(f"| {eps:g} | " + " | ".join(cell(_find(summary, label, n, eps)) for n in names) + " |")
    versions = [ALGORITHMS[n].nonprivate for n in names]
    lines.append("| non-private | " + " | ".join(f"{v[0]}: " + cell(_find(summary, label, *v)) for v in versions)
                 + " |")
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], setups: list[Setup], names, epsilons, path: Path) -> None:
    """Tuned test error against eps per private algorithm (mean ± std), the non-private versions dashed; one panel
    per (R, M)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(2, len(setups))
    rows = math.ceil(len(setups) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4 * rows), squeeze=False)
    for ax, setup in zip(axes.flat, setups):
        for k, name in enumerate(names):
            points = [_find(summary, setup.label, name, eps) for eps in epsilons]
            ax.errorbar(epsilons, [r["test_error"] for r in points], [r["test_error_std"] for r in points],
                        color=f"C{k}", marker="o", ms=4, capsize=2, label=name)
            base = _find(summary, setup.label, *ALGORITHMS[name].nonprivate)
            ax.axhline(base["test_error"], color=f"C{k}", ls="--", lw=1,
                       label=f"non-private ({ALGORITHMS[name].nonprivate[0]})")
        ax.set_xscale("log")
        ax.set_xlabel("eps (per silo)")
        ax.set_ylabel("test error (tuned on test: non-private)")
        ax.set_title(f"{setup.label} of N={setup.num_clients}", fontsize=9)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(setups):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def available(names) -> tuple[list[str], list[str]]:
    """The requested names dpfl has registered, and a note for each one skipped (or each tuned key dropped)."""
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown:
        raise SystemExit(f"--algorithms: {unknown} not in {list(ALGORITHMS)}")
    registered = set(registry.names())
    present = [n for n in names if n in registered]
    notes = [f"{n}: not registered in dpfl.algorithms.registry, skipped" for n in names if n not in registered]
    for n in present:
        keys = registry.spec_of(n).keys(n)
        notes += [f"{n}: no key {key!r}, not tuned" for key in ALGORITHMS[n].tuned if key not in keys]
    return present, notes


def grid(name: str, eps, lrs, clips, tuned_keys: dict) -> list[tuple]:
    """(name, eps, eta, C, params): no C for the unclipped fedsgd / fedavg."""
    points = [{}]
    for key, values in tuned_keys.items():
        points = [{**p, key: v} for p in points for v in values]
    return [(name, eps, lr, clip, p) for lr in lrs for clip in (clips if name not in UNCLIPPED else (None,))
            for p in points]


def _numbers(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip())


def _integers(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpfl.papers.lowy2023.experiment", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for runs.csv, results.json, table.md, <setting>.png")
    p.add_argument("--setting", choices=("breast_cancer", "digits", "both"), default="breast_cancer")
    p.add_argument("--algorithms", type=lambda t: tuple(v.strip() for v in t.split(",") if v.strip()),
                   default=tuple(ALGORITHMS), help="comma-separated (default: every registered one of "
                                                   f"{','.join(ALGORITHMS)})")
    p.add_argument("--repeats", type=int, default=3, help="seeds (splits) per point (default 3)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: eps 0.75 and 1.5 (large noise: fast to calibrate), the setting's first clip "
                        "and last step size, q = 5, 10 rounds, M = N or 12, one repeat")
    p.add_argument("--epsilons", type=_numbers, default=EPSILONS, help="eps (0.75,1,1.5,3,6,12,18)")
    p.add_argument("--lrs", type=_numbers, help="the step-size grid (default: the setting's)")
    p.add_argument("--clips", type=_numbers, help="the clip grid (default: the setting's)")
    p.add_argument("--periods", type=_integers, help="every 'period' grid (default: the setting's: breast cancer "
                                                     "ALGORITHMS', digits 1,2)")
    p.add_argument("--rounds", type=_integers, help="R (default: the setting's, breast cancer 50, digits 25,50)")
    p.add_argument("--cohorts", type=_integers, help="digits' M (default 12,25)")
    p.add_argument("--local-steps", type=int, default=5, help="K of Local SGD (default 5)")
    p.add_argument("--merge", type=lambda t: tuple(v for v in t.split(",") if v), help="comma-separated folders of "
                   "earlier outputs: write the outputs of all their runs together (no new run)")
    return p


def setups_of(setting: str, args) -> list[Setup]:
    spec = SETTINGS[setting]
    cohorts = spec["cohorts"] if setting == "breast_cancer" or args.cohorts is None else args.cohorts
    return [Setup(setting, spec["data"], spec["num_clients"], m, r, args.local_steps)
            for r in (args.rounds or spec["rounds"]) for m in cohorts]


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    if args.merge:
        return merge(Path(args.out), args.merge, argv)
    settings = ("breast_cancer", "digits") if args.setting == "both" else (args.setting,)
    if args.quick:
        args.epsilons, args.periods, args.repeats, args.rounds, args.cohorts = (0.75, 1.5), (5,), 1, (10,), (12,)
    names, notes = available(args.algorithms)
    for note in notes:
        print(note, file=sys.stderr)
    torch.set_num_threads(1)
    out = Path(args.out)
    started = time.perf_counter()
    plans = {}  # per setting: per algorithm, its tuned keys' values
    work = []  # (setup, delta, grid points)
    for setting in settings:
        spec = SETTINGS[setting]
        lrs, clips = args.lrs or spec["lrs"], args.clips or spec["clips"]
        if args.quick:
            lrs, clips = lrs[-1:], clips[:1]
        periods = args.periods or spec["periods"]
        plans[setting] = {name: {key: (periods if key == "period" and periods else values)
                                 for key, values in ALGORITHMS[name].tuned.items()
                                 if key in registry.spec_of(name).keys(name)} for name in names}
        for setup in setups_of(setting, args):
            todo = [point for name in names for eps in args.epsilons
                    for point in grid(name, eps, lrs, clips, plans[setting][name])]
            nonprivate = dict.fromkeys(ALGORITHMS[name].nonprivate for name in names)  # fedsgd once, in order
            todo += [point for version, eps in nonprivate for point in grid(
                version, eps, lrs, clips, plans[setting].get(version, {}))]
            work.append((setup, setup.delta(), todo))
    total = sum(len(todo) for _, _, todo in work) * args.repeats
    print(f"{total} runs: {len(work)} setups, {len(names)} algorithms, {args.repeats} seeds", file=sys.stderr)
    runs = []
    for setup, delta, todo in work:
        for name, eps, lr, clip, params in todo:
            for seed in range(args.repeats):  # innermost: the noise calibrated for an eps is cached (accounting.pld)
                runs.append(run_one(setup, delta, name, eps, lr, clip, params, seed))
                r, elapsed = runs[-1], time.perf_counter() - started
                print(f"[{len(runs)}/{total}] {setup.label} {name} eps={eps} eta={lr:g} C={clip} "
                      f"{_params_text(params)} seed={seed}: error {r['test_error']:.3f} ({elapsed:.0f}s elapsed, "
                      f"about {elapsed / len(runs) * (total - len(runs)):.0f}s left)", file=sys.stderr, flush=True)
    setup_rows = [{**dataclasses.asdict(s), "label": s.label, "sample_rate": s.sample_rate, "delta": d}
                  for s, d, _ in work]
    grid_info = {"epsilons": list(args.epsilons), "algorithms": plans, "repeats": args.repeats,
                 **{s: {"lrs": list(args.lrs or SETTINGS[s]["lrs"]), "clips": list(args.clips or SETTINGS[s]["clips"])}
                    for s in settings}}
    return report(out, runs, setup_rows, grid_info, notes, _command(argv), round(time.perf_counter() - started, 1))


def _command(argv) -> str:
    return "python -m dpfl.papers.lowy2023.experiment " + " ".join(argv if argv is not None else sys.argv[1:])


def merge(out: Path, folders, argv) -> dict:
    """The outputs of one invocation over every setup of earlier ones (their results.json), e.g. one per (R, M) run
    side by side: each run is seeded, so the merge equals the invocation that makes them all."""
    results = [json.loads((Path(folder) / "results.json").read_text()) for folder in folders]
    algorithms = {k: v for res in results for k, v in res["grid"]["algorithms"].items()}
    grid_info = {**results[0]["grid"], "algorithms": algorithms}
    setups = list({json.dumps(s, sort_keys=True): s for res in results for s in res["setups"]}.values())  # once each
    return report(out, [r for res in results for r in res["runs"]], setups,
                  grid_info, results[0]["skipped"], _command(argv), sum(res["wall_seconds"] for res in results),
                  merged_from=[str(folder) for folder in folders])


def report(out: Path, runs: list[dict], setup_rows: list[dict], grid_info: dict, notes: list[str], command: str,
           wall_seconds: float, **extra) -> dict:
    """Writes runs.csv, results.json (with the tuned summary, the budget check and the claim's check), table.md and
    one figure per setting; prints the tables."""
    fields = {f.name for f in dataclasses.fields(Setup)}
    setups = [Setup(**{**{k: v for k, v in row.items() if k in fields}, "data": tuple(row["data"])})
              for row in setup_rows]
    settings = list(dict.fromkeys(s.setting for s in setups))
    names = [n for n in ALGORITHMS if any(r["algorithm"] == n for r in runs)]
    epsilons = grid_info["epsilons"]
    summary = tuned(runs)
    labels = [s.label for s in setups]
    check = claim(summary, labels, epsilons)
    budget = budget_check(runs)
    result = {"setups": setup_rows, "grid": grid_info, "skipped": notes,
              "nonprivate": {s: SETTINGS[s]["nonprivate"] for s in settings},
              "nonprivate_versions": {n: ALGORITHMS[n].nonprivate for n in names}, "command": command, **extra,
              "runs": runs, "summary": summary, "budget_check": budget, "claim": check, "wall_seconds": wall_seconds}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "runs.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(runs[0]))
        writer.writeheader()
        writer.writerows(runs)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    text = "\n".join(table(summary, label, names, epsilons) for label in labels)
    text += "\nNOT PRIVATE: " + "; ".join(f"{s}: {SETTINGS[s]['nonprivate']}" for s in settings) + "\n"
    (out / "table.md").write_text(text)
    for setting in settings:
        plot(summary, [s for s in setups if s.setting == setting], names, epsilons, out / f"{setting}.png")
    print(text)
    print(f"budget: {budget}")
    if check is not None:
        print(f"SPIDER never worse than ISRL-DP MB-SGD: {check['spider_never_worse_than_mb_sgd']}")
    return result


if __name__ == "__main__":
    main()
