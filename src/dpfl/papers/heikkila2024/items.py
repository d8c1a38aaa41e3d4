"""Heikkilä et al. (2024), "Differentially private federated learning with several local steps and secure
aggregation" (joint noise): Table 1 (averaging independently trained models) and the utility of local steps (1 local
epoch against 1 local step and local DP, at equal epsilon). ``dpfl.papers.heikkila2024.experiment`` computes both."""

from __future__ import annotations

from pathlib import Path

from dpfl.reproduction.item import DIFFERS, REPRODUCED, Item, Row, agrees

PAPER = "Heikkilä et al. (2024)"
UNPROVEN = ("for more than one local step the paper's Lemma 4.6 does not hold for general losses (another client's "
            "later steps can cancel its earlier noise shares): the sound analysis credits the joint noise to the "
            "last step only")

SKELLAM = ("Table 1 is labelled 'Skellam mechanism, no quantization', but its numbers are the Gaussian column above: "
           "dpfl's Skellam accountant bounds Poisson sampling by Zhu & Wang's Thm 6 with its factor 3 (it covers "
           "adding and removing a record), which costs more noise; the Skellam curve at this scale with the factor "
           "dropped, as the authors' code does (proven for the removal direction only), gives all 24 numbers "
           "(tests/algorithms/test_joint_skellam.py)")


def _table1_settings(quick: bool) -> dict:
    from dpfl.papers.heikkila2024.experiment import TABLE_1

    return {"table": {str(k): v for k, v in TABLE_1.items()}, "records": 100, "q": 0.1, "delta": 1e-5}


def _table1(settings: dict, folder: Path) -> dict:
    from dpfl.papers.heikkila2024.experiment import skellam_sigma_ldp, table_1

    rows, computed = [], {}
    names = {"1": "1 step", "10": "1 epoch (10 steps)", "50": "5 epochs (50 steps)"}
    for steps, column in settings["table"].items():
        got = table_1(int(steps), tuple(p for p, _, _ in column), settings["records"])
        computed[steps] = got
        for (parties, sigma_total, eps), ours in zip(column, got["rows"]):
            who = f"N = {parties} {'party' if parties == 1 else 'parties'}"
            rows.append(Row(f"{names[steps]}, {who}: sigma total", f"{sigma_total:.2f}",
                            f"{ours['sigma_total']:.4f}", None, agrees(sigma_total, ours["sigma_total"], 2)))
            same = abs(ours["sound"] - ours["paper"]) < 5e-3
            rows.append(Row(f"{names[steps]}, {who}: eps of the averaged model", f"{eps:.2f}",
                            f"{ours['sound']:.2f}", f"{ours['paper']:.2f}", agrees(eps, ours["paper"], 2),
                            "" if same else UNPROVEN))
    for steps, column in settings["table"].items():  # the column the caption names: Skellam shares
        sigma_ldp = skellam_sigma_ldp(int(steps), settings["records"])
        rows.append(Row(f"{names[steps]}: sigma_LDP (sigma total at N = 1) under dpfl's Skellam accountant "
                        "(algorithm.noise = 'skellam', d = 10,250, 2^20 units per sensitivity)", f"{column[0][1]:.2f}",
                        f"{sigma_ldp:.4f}", None, agrees(column[0][1], sigma_ldp, 2), SKELLAM))
    return {"rows": rows, "computed": computed}


def _steps_settings(quick: bool) -> dict:
    if quick:  # digits for the paper's Fashion-MNIST: 10 clients, 10 rounds, one seed
        return {"data": "digits", "seeds": 1, "epsilon": 2.0, "rounds": 10, "lr": 0.5}
    return {"data": "fashion_mnist", "seeds": 5, "epsilon": 1.0, "rounds": 20, "lr": 0.5}


def _steps(settings: dict, folder: Path) -> dict:
    import logging

    from dpfl.papers.heikkila2024.experiment import ANALYSES, VARIANTS, mean_accuracy, run, table

    logging.getLogger("absl").setLevel(logging.ERROR)
    data = settings["data"]
    runs = [run(data, v, a, s, settings["epsilon"], settings["rounds"], settings["lr"])
            for v in VARIANTS for a in ANALYSES for s in range(settings["seeds"])]
    (folder / "accuracy.md").write_text(table(runs, settings["epsilon"]))
    _plot(runs, data, settings["epsilon"], folder / "figure.png")
    acc = {(v, a): mean_accuracy(runs, data, v, a) for v in VARIANTS for a in ANALYSES}
    epoch, step, local = VARIANTS
    rows = []
    for v in VARIANTS:
        rows.append(Row(f"{data}, eps = {settings['epsilon']:g}: test accuracy, {v}", None, f"{acc[(v, 'sound')]:.3f}",
                        f"{acc[(v, 'paper')]:.3f}", None, "the paper plots curves on Fashion-MNIST and CIFAR-10 "
                                                          "features without printing values"))
    for analysis in ANALYSES:
        ahead = acc[(epoch, analysis)] - acc[(step, analysis)]
        rows.append(Row(f"1 local epoch beats 1 local step ({analysis} analysis's noise)", "holds",
                        f"{ahead:+.3f}", None, ahead > 0))
    joint_gain = {a: acc[(epoch, a)] - acc[(local, a)] for a in ANALYSES}
    rows.append(Row("dpfl's extension: joint noise (secure aggregation) against local DP, 1 local epoch (accuracy "
                    "gain)", None, f"{joint_gain['sound']:+.3f}", f"{joint_gain['paper']:+.3f}", None,
                    "not the paper's claim (its experiments run no local-DP baseline); " + UNPROVEN + ": the first "
                    "S - 1 steps keep each client's own share, which costs about what local DP costs"))
    return {"rows": rows, "runs": runs}


def _plot(runs: list[dict], data: str, epsilon: float, path: Path) -> None:
    """Test accuracy of each variant under each analysis (the paper's panels compare the variants' accuracy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpfl.papers.heikkila2024.experiment import ANALYSES, VARIANTS, mean_accuracy

    fig, ax = plt.subplots(figsize=(6, 3.6))
    width = 0.38
    for k, analysis in enumerate(ANALYSES):
        values = [mean_accuracy(runs, data, v, analysis) for v in VARIANTS]
        ax.bar([i + (k - 0.5) * width for i in range(len(VARIANTS))], values, width, label=f"{analysis} analysis")
    ax.set_xticks(range(len(VARIANTS)), list(VARIANTS))
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{data}, eps = {epsilon:g} (each analysis calibrates its own noise)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)



#: Fig. 2's variants: 1 local step against 1 local epoch (10 steps at q = 0.1), all clients in every round
ROUNDS_VARIANTS = ("1 local step", "1 local epoch")


#: R of each variant: a local step up to 10 times a local epoch's rounds. 30 epochs are left out: with Skellam shares
#: under the paper's analysis no noise meets eps = 1 over 300 steps on digits (sigma = 1000 still spends eps = 1.34)
SWEEP = {"1 local step": [1, 3, 10, 30, 100], "1 local epoch": [1, 3, 10]}


def _rounds_settings(quick: bool) -> dict:
    if quick:  # digits for the paper's CIFAR-10 features (linear model in both), 1 seed
        return {"data": "digits", "seeds": 1, "epsilon": 1.0, "lr": 0.5, "noises": ["skellam", "gaussian"],
                "rounds": SWEEP}
    return {"data": "fashion_mnist", "seeds": 5, "epsilon": 1.0, "lr": 0.5, "noises": ["skellam", "gaussian"],
            "rounds": SWEEP}


def rounds_to_match(values: dict[str, dict[int, float]], higher: bool = False) -> list[tuple[int, int | None]]:
    """For each R of 1 local epoch, the fewest rounds of 1 local step (None: none of the grid) whose value is at
    least as good as the epoch's after R rounds: at most its loss, or with ``higher`` at least its accuracy."""
    step, epoch = (values[v] for v in ROUNDS_VARIANTS)
    sign = -1.0 if higher else 1.0
    return [(r, next((s for s in sorted(step) if sign * step[s] <= sign * value), None))
            for r, value in sorted(epoch.items())]


def _rounds(settings: dict, folder: Path) -> dict:
    import logging

    from dpfl.papers.heikkila2024.experiment import ANALYSES, run, skellam_sigma_ldp

    logging.getLogger("absl").setLevel(logging.ERROR)
    runs = [run(settings["data"], v, a, s, settings["epsilon"], r, settings["lr"], noise, every_round=True)
            for noise in settings["noises"] for a in ANALYSES for v in ROUNDS_VARIANTS
            for r in settings["rounds"][v] for s in range(settings["seeds"])]
    losses, accuracies = _seed_means(runs, "train_loss"), _seed_means(runs, "best_test_accuracy")
    rows = []
    for noise in settings["noises"]:
        for measure, by, higher in (("best test accuracy (the paper's Fig. 2)", accuracies, True),
                                    ("least final training loss (dpfl's measure)", losses, False)):
            shown, ratio = {}, {}
            for analysis in ANALYSES:
                shown[analysis], ratio[analysis] = _step_rounds(by[noise][analysis], settings["rounds"], higher)
            rows.append(Row(f"{noise} shares: rounds of 1 local step to reach 1 local epoch's {measure}",
                            "about 10 x (\"roughly an order of magnitude more FL rounds\")", shown["sound"],
                            shown["paper"], ratio["sound"] >= 3, "1 local step needs several times the rounds"
                            if ratio["sound"] >= 3 else "1 local step needs about as many rounds"))
        least = {a: {v: min(losses[noise][a][v].values()) for v in ROUNDS_VARIANTS} for a in ANALYSES}
        rows.append(Row(f"{noise} shares: least final loss over the grid, 1 local epoch / 1 local step", None,
                        *(f"{least[a][ROUNDS_VARIANTS[1]]:.3f} / {least[a][ROUNDS_VARIANTS[0]]:.3f}"
                          for a in ("sound", "paper")), None,
                        "the paper trains with Skellam shares only (32-bit gradients: no quantisation)"
                        if noise == "skellam" else "beside Skellam, for comparison"))
    for steps, variant in ((1, ROUNDS_VARIANTS[0]), (10, ROUNDS_VARIANTS[1])):
        printed = TABLE_1_SIGMA_LDP[steps]
        ours = skellam_sigma_ldp(steps)
        rows.append(Row(f"{variant}: Table 1's sigma_LDP (eps = 5) under dpfl's Skellam accountant", f"{printed:.2f}",
                        f"{ours:.4f}", None, agrees(printed, ours, 2), SKELLAM))
    plot_rounds(accuracies, settings, folder / "figure.png")

    def jsonable(means: dict) -> dict:
        return {n: {a: {v: {str(t): x for t, x in by.items()} for v, by in per.items()} for a, per in by_a.items()}
                for n, by_a in means.items()}

    return {"rows": rows, "losses": jsonable(losses), "best_test_accuracy": jsonable(accuracies), "runs": runs}


def _seed_means(runs: list[dict], key: str) -> dict:
    """noise -> analysis -> variant -> R -> the mean of ``key`` over the seeds."""
    import statistics

    cells: dict = {}
    for r in runs:
        cell = cells.setdefault(r["noise"], {}).setdefault(r["analysis"], {}).setdefault(r["variant"], {})
        cell.setdefault(r["rounds"], []).append(r[key])
    return {n: {a: {v: {t: statistics.fmean(x) for t, x in by.items()} for v, by in per.items()}
                for a, per in by_a.items()} for n, by_a in cells.items()}


def _step_rounds(by: dict, rounds: dict, higher: bool = False) -> tuple[str, float]:
    """How many times 1 local epoch's rounds 1 local step needs to reach the epoch's best value (least loss, or with
    ``higher`` greatest accuracy; the ratio, a lower bound when the grid's longest run of 1 step does not reach it),
    and the sentence that says so."""
    best = max if higher else min
    R, value = best(by[ROUNDS_VARIANTS[1]].items(), key=lambda tv: tv[1])
    reached = dict(rounds_to_match(by, higher))[R]
    longest = max(rounds[ROUNDS_VARIANTS[0]])
    ratio = (reached or longest) / R
    head = f"1 epoch: {value:.3f} at R = {R}; 1 step: "
    if reached:
        return head + f"at R = {reached} ({ratio:.0f} x)", ratio
    return head + f"not in {longest} rounds (> {ratio:.0f} x; best {best(by[ROUNDS_VARIANTS[0]].values()):.3f})", ratio


#: Table 1's sigma_LDP (N = 1 party) per local steps: the Gaussian column's (see SKELLAM)
TABLE_1_SIGMA_LDP = {1: 0.69, 10: 0.90, 50: 1.18}


#: What ``plot_rounds`` draws: the paper's Fig. 2 measure, or the final training loss (log scale)
BEST_ACCURACY, FINAL_LOSS = "best test accuracy over the run", "final training loss"


def plot_rounds(values: dict, settings: dict, path: Path, measure: str = BEST_ACCURACY) -> None:
    """The layout of the paper's Fig. 2: ``measure`` (mean over the seeds; the paper's is the best test accuracy
    over each training run) against the number of FL rounds, 1 local step and 1 local epoch; one panel per analysis,
    Skellam solid and Gaussian dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpfl.papers.heikkila2024.experiment import ANALYSES

    fig, axes = plt.subplots(1, len(ANALYSES), figsize=(9, 3.6), squeeze=False, sharey=True)
    for ax, analysis in zip(axes[0], ANALYSES):
        for noise, style in zip(settings["noises"], ("-", "--")):
            for k, variant in enumerate(ROUNDS_VARIANTS):
                by = values[noise][analysis][variant]
                ax.plot(sorted(by), [by[t] for t in sorted(by)], style, color=f"C{k}", marker="o", ms=3,
                        label=f"{variant}, {noise}")
        ax.set_xscale("log")
        if measure == FINAL_LOSS:
            ax.set_yscale("log")
        ax.set_xlabel("FL rounds")
        ax.set_title(f"{settings['data']}, eps = {settings['epsilon']:g}, {analysis} analysis", fontsize=9)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(measure)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


ITEMS = [
    Item("heikkila2024-table1", PAPER, "Table 1: the epsilon of averaging N independently trained (5, 1e-5)-DP models",
         "Table 1", REPRODUCED,
         "the paper's analysis gives all 24 numbers to their two decimals; the sound analysis differs for 10 and 50 "
         "local steps, where the paper's Lemma 4.6 is unproven; the numbers are Gaussian noise's: with the Skellam "
         "shares the caption names, dpfl's accountant needs 5%, 11% and 19% more noise (its Poisson bound's factor "
         "3)", _table1_settings, _table1),
    Item("heikkila2024-local-steps", PAPER, "Sec. 5: 1 local epoch against 1 local step and local DP at equal eps",
         "Sec. 5 (curves; the conclusions are stated in the text)", DIFFERS,
         "1 local epoch beats 1 local step, as in the paper; dpfl's extension (not the paper's claim): under the "
         "sound analysis joint noise gains little over local DP (the paper's credit for S > 1 steps is unproven); "
         "quick: digits for Fashion-MNIST, 1 seed",
         _steps_settings, _steps,
         data="fashion_mnist", substitute="scikit-learn's digits, eps = 2, 1 seed", research_mode=True),
    Item("heikkila2024-rounds", PAPER, "Fig. 2: 1 local step against 1 local epoch over the number of FL rounds, "
         "Skellam shares beside Gaussian, eps = 1", "Sec. 5 and Fig. 2 (curves; \"roughly an order of magnitude more "
         "FL rounds\" is stated in the text); Table 1's sigma_LDP", DIFFERS,
         "1 local step needs several times the rounds of 1 local epoch to reach the epoch's best test accuracy over "
         "the run (the paper's Fig. 2 measure) and its least training loss, as the paper says (\"roughly an order of "
         "magnitude\"; sound analysis, Skellam and Gaussian shares); Skellam shares train worse than Gaussian over "
         "many steps (dpfl's Skellam accountant's factor 3: a loss of 1.23 against 0.36 after 100 single steps), and "
         "Table 1's "
         "sigma_LDP is the Gaussian column's; quick: digits, 1 seed", _rounds_settings, _rounds,
         data="fashion_mnist", substitute="scikit-learn's digits (a linear model, as Fig. 2's), 1 seed",
         research_mode=True),
]
