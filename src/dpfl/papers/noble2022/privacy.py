"""Noble, Bellet, Dieuleveut (2022), "Differentially private federated learning on heterogeneous data" (DP-SCAFFOLD):
the epsilon of its experiments, Table 1's largest T within eps = 3, and the accuracy of DP-SCAFFOLD-warm against
DP-FedAvg on synthetic data (Fig. 1)."""

from __future__ import annotations

import math
from pathlib import Path

from dpfl.reproduction.item import DIFFERS, REPRODUCED, Item, Row, about

PAPER = "Noble, Bellet, Dieuleveut (2022)"
UNPROVEN = ("the paper's accountant is unproven for general losses (a record-level subsampling bound applied to "
            "client sampling; the cohort's noise credited to every local step): the sound analysis is dpfl's default")

SOUND = "sound: two steps of the paper's accountant are unproven (item noble2022-epsilon)"
#: The tolerance (points of test accuracy) of every accuracy gap the paper states as "about x" (read off its curves)
GAP_TOLERANCE = 5.0
#: App. D.3.1 on Fig. 3: "an average difference of 10% in the accuracy for these two algorithms [DP-SCAFFOLD-warm,
#: DP-FedAvg] over the various heterogeneity settings"
STATED_GAP = 10.0

#: (label, (M, R_train, l, s, sigma_g, T, K), the paper's third-party epsilon as printed)
EPSILONS = [
    ("synthetic, K = 50", (100, 4000, 0.2, 0.2, 60.0, 400, 50), "13"),
    ("synthetic, K = 100", (100, 4000, 0.2, 0.2, 60.0, 400, 100), "13"),
    ("synthetic, l = 0.05, K = 50", (100, 4000, 0.05, 0.2, 60.0, 400, 50), "4.2"),
    ("FEMNIST, K = 50", (40, 2000, 0.2, 0.2, 30.0, 400, 50), "11.4"),
    ("FEMNIST, K = 100", (40, 2000, 0.2, 0.2, 30.0, 400, 100), "11.5"),
    ("MNIST, K = 50", (60, 800, 0.2, 0.2, 30.0, 100, 50), "7.2"),
]


def _digits(printed: str) -> int:
    return len(printed.split(".")[1]) if "." in printed else 0


def rounded_up(value: float, digits: int) -> float:
    """``value`` rounded up at its ``digits``-th decimal: how the paper prints its epsilons (all six printed values
    are the paper's accountant rounded up, a bound's safe side; rounded to nearest, 11.43 and 7.15 would print as
    11.4 and 7.1, not the paper's 11.5 and 7.2)."""
    scale = 10 ** digits
    return math.ceil(round(value * scale, 6)) / scale


def _epsilon_settings(quick: bool) -> dict:
    return {"settings": [[label, list(s), printed] for label, s, printed in EPSILONS]}


def _epsilon(settings: dict, folder: Path) -> dict:
    from dpfl.accounting.dp_scaffold import dp_scaffold_epsilon

    rows = []
    for label, (m, r, l, s, sigma, t, k), printed in settings["settings"]:
        sound = dp_scaffold_epsilon(m, r, l, s, k, t, sigma)["epsilon"]["third_party"]
        paper = dp_scaffold_epsilon(m, r, l, s, k, t, sigma, analysis="paper")["epsilon"]["third_party"]
        digits = _digits(printed)
        ok = float(printed) == rounded_up(paper, digits)
        nearest = round(paper, digits)
        if not ok:
            note = f"{paper - float(printed):+.2f} from the printed value, not explained; sound: "
        elif nearest != float(printed):
            note = (f"the paper rounds epsilon up at its last printed digit, as in all six rows (to nearest, "
                    f"{paper:.4f} would print as {nearest:.{digits}f}); sound: ")
        else:
            note = ""
        rows.append(Row(f"{label} (M = {m}, R = {r}, l = {l:g}, s = {s:g}, sigma_g = {sigma:g}, T = {t}): eps towards "
                        f"a third party, delta = 1/(M R)", printed, f"{sound:.4f}", f"{paper:.4f}", ok,
                        note + UNPROVEN))
    return {"rows": rows}


#: Table 1 (synthetic (5, 5), eps = 3, l = 0.05, s = 0.2, R_train = 4000, M = 100): sigma_g -> T at K = 1, 5, 10, 20, 40
TABLE_1 = {10: (542, 488, 428, 324, 72), 20: (545, 502, 451, 352, 83), 40: (546, 505, 457, 360, 86),
           80: (546, 506, 458, 362, 87), 160: (546, 506, 458, 362, 87)}
LOCAL_STEPS = (1, 5, 10, 20, 40)


def _table1_settings(quick: bool) -> dict:
    return {"table": {str(k): list(v) for k, v in TABLE_1.items()}, "local_steps": list(LOCAL_STEPS),
            "setting": [100, 4000, 0.05, 0.2], "target_epsilon": 3.0}


def _table1(settings: dict, folder: Path) -> dict:
    from dpfl.accounting.dp_scaffold import dp_scaffold_epsilon, max_rounds

    m, r, l, s = settings["setting"]
    target, table, steps = settings["target_epsilon"], settings["table"], settings["local_steps"]

    def epsilon(k: int, sigma: str, rounds: int) -> float:
        return dp_scaffold_epsilon(m, r, l, s, k, rounds, float(sigma), analysis="paper")["epsilon"]["third_party"]

    # The largest epsilon of a printed T: a search that stops short of eps <= target would have to stop below it.
    highest = max((epsilon(k, sigma, t), sigma, k) for sigma, column in table.items() for k, t in zip(steps, column))
    rows = []
    for sigma, column in table.items():
        for k, printed in zip(steps, column):
            paper = max_rounds(m, r, l, s, k, float(sigma), target, analysis="paper")
            sound = max_rounds(m, r, l, s, k, float(sigma), target)
            ok = paper == printed
            note = SOUND if ok else _table1_off(sigma, column, table, printed, paper, highest, 1 / (m * r),
                                                lambda sig, t, k=k: epsilon(k, sig, t))
            rows.append(Row(f"sigma_g = {sigma}, K = {k}: largest T with eps <= 3", printed, sound, paper, ok, note))
    return {"rows": rows}


def _table1_off(sigma: str, column: list, table: dict, printed: int, paper: int, highest: tuple, delta: float,
                epsilon) -> str:
    """Why a Table 1 entry is not dpfl's: the authors' own script (get_epsilon_bound.py in their repository; its
    integer orders give dpfl's paper-analysis epsilon to 5 decimals) gives dpfl's T too, and the printed row repeats
    another sigma_g's row, where dpfl's T exceeds the target. Neither the order grid nor delta explains it: delta =
    1/(M R) gives the other 22 entries exactly (1/(M x 5,000 records, test ones included) = 2e-6 changes all 25). No
    stopping rule of the search gives every entry: a printed T reaches ``highest`` (epsilon, sigma_g, K) while the
    rejected T here stays below it."""
    here = epsilon(sigma, paper)
    note = (f"off by {paper - printed:+d}: the authors' own script (get_epsilon_bound.py) gives {paper} too, with "
            f"eps({paper}) = {here:.5f} <= 3 at delta = 1/(M R) = {delta:.2g}, the delta of the 22 exact entries")
    repeated = [other for other, col in table.items() if other != sigma and col == column]
    if repeated:
        other = repeated[0]
        note += (f"; the paper's sigma_g = {sigma} row repeats its sigma_g = {other} row, where eps({paper}) = "
                 f"{epsilon(other, paper):.5f} > 3")
    if here < highest[0]:
        note += (f"; no stopping rule of a search gives all 25 entries: the printed T at sigma_g = {highest[1]}, "
                 f"K = {highest[2]} has eps = {highest[0]:.5f}, more than this rejected one")
    return note + "; " + SOUND


def _fig1_settings(quick: bool) -> dict:
    from dpfl.experiments.demo import DEMO_SETTINGS

    if quick:  # dpfl demo's scaled-down workload: M = 40 clients of 1,000 records, 100 rounds, sigma_g = 20
        overrides = [o for o in DEMO_SETTINGS if not o.startswith("run.")]
    else:  # examples/dp_scaffold_synthetic.toml: the paper's M = 100 of 5,000, T = 400, K = 50, sigma_g = 60
        overrides = ["data.name='synthetic'", "data.alpha=5", "data.beta=5", "data.num_clients=100",
                     "data.samples_per_client=5000", "algorithm.rounds=400", "algorithm.local_steps=50",
                     "algorithm.client_rate=0.2", "algorithm.sample_rate=0.2", "algorithm.lr=1.0",
                     "algorithm.global_lr=1.0", "algorithm.clip=1.0", "algorithm.noise_multiplier=60.0",
                     "algorithm.weight_decay=0.005", "privacy.delta=2.5e-6", "privacy.boundary='plain'"]
    return {"overrides": overrides, "algorithms": ["dp-scaffold-warm", "dp-fedavg"], "noise_seed": 0,
            "eval_every": 5 if quick else 10}


def _fig1(settings: dict, folder: Path) -> dict:
    from dpfl.experiments.config import load_config
    from dpfl.experiments.plots import plot_runs
    from dpfl.experiments.runner import run_experiment

    results = {}
    for name in settings["algorithms"]:
        rounds = next(int(o.split("=")[1]) for o in settings["overrides"] if o.startswith("algorithm.rounds="))
        config = load_config(None, [*settings["overrides"], f"algorithm.name='{name}'", "run.threads=1",
                                    f"run.noise_seed={settings['noise_seed']}", "run.seed=0",
                                    f"run.eval_every={settings['eval_every']}", f"run.checkpoint_every={rounds}"])
        results[name] = run_experiment(config, folder / name, progress=False)
    plot_runs(results, folder / "figure.png", title="DP-SCAFFOLD-warm vs DP-FedAvg, synthetic (5, 5)")
    scaffold, fedavg = (results[n]["final"] for n in settings["algorithms"])
    gap = 100 * (scaffold["test_accuracy"] - fedavg["test_accuracy"])
    rows = [Row("final test accuracy, DP-SCAFFOLD-warm", None, f"{scaffold['test_accuracy']:.3f}", None, None,
                "the paper plots curves (Fig. 1) without printing the final values"),
            Row("final test accuracy, DP-FedAvg", None, f"{fedavg['test_accuracy']:.3f}", None, None,
                "as above"),
            Row("DP-SCAFFOLD-warm ahead of DP-FedAvg under heterogeneity", "holds", gap > 0, None, gap > 0,
                "the same noise in both runs (research mode), so the gap is paired"),
            Row(f"the accuracy gap of DP-SCAFFOLD-warm over DP-FedAvg (points; within {GAP_TOLERANCE:g})",
                f"about {STATED_GAP:g}", f"{gap:+.1f}", None, about(STATED_GAP, gap, GAP_TOLERANCE),
                "the paper's 10 points average Fig. 3's three heterogeneity levels (App. D.3.1); this run is (5, 5) "
                "only, the most heterogeneous (noble2022-fig1-grid averages all three)")]
    for observer in ("third_party", "server", "other_silo"):
        rows.append(Row(f"eps towards the {observer.replace('_', ' ')}, DP-SCAFFOLD-warm (delta "
                        f"{scaffold['delta']:.2g})", None, f"{scaffold['epsilon'][observer]:.4f}", None, None,
                        "the epsilon of this run's own setting; the paper's setting is item noble2022-epsilon"))
    return {"rows": rows, "final": {n: results[n]["final"] for n in settings["algorithms"]}}


ITEMS = [
    Item("noble2022-epsilon", PAPER, "the epsilon of the experiments (Sec. 5, App. B): synthetic, FEMNIST, MNIST",
         "Sec. 5 and App. B (printed to 2 or 3 digits)", REPRODUCED,
         "the paper's accountant (privacy.analysis = 'paper') gives all 6 printed epsilons, rounded up as the paper "
         "rounds them (11.43 and 7.15 print as 11.5 and 7.2); the sound analysis, dpfl's default, differs because two "
         "of its steps are unproven",
         _epsilon_settings, _epsilon),
    Item("noble2022-table1", PAPER, "Table 1: the largest T within eps = 3 (synthetic (5, 5), l = 0.05, s = 0.2)",
         "Table 1, the T in brackets", DIFFERS,
         "22 of 25 entries exact under the paper's accountant; at sigma_g = 160 three are one round larger, as the "
         "authors' own script also gives: the paper's sigma_g = 160 row repeats its sigma_g = 80 row; the test "
         "accuracies of Table 1 are not rerun", _table1_settings, _table1),
    Item("noble2022-fig1", PAPER, "Fig. 1: DP-SCAFFOLD-warm against DP-FedAvg on synthetic (5, 5) data",
         "Fig. 1 and App. D.3.1 (curves; the gap of about 10 points is stated in the text)", DIFFERS,
         "DP-SCAFFOLD-warm ends ahead of DP-FedAvg under heterogeneity, with the same noise, as the paper says, but "
         "by 19.8 points at (5, 5), not about 10 (within 5; the paper's 10 average three heterogeneity levels); "
         "quick: dpfl demo's scaled-down workload (full: the paper's M = 100 x 5,000, T = 400)", _fig1_settings, _fig1,
         substitute="40 clients of 1,000 records, 100 rounds, sigma_g = 20", research_mode=True),
]
