"""User-level DP on digits: fixed against adaptive clipping at equal epsilon (Andrew, Thakkar, McMahan, Ramaswamy
2021), and DP-FTRL against DP-FedAvg without amplification (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu 2021).

    python examples/user_level_experiment.py --out user-level-results          # 2 eps x 3 seeds, ~5 min on 2 cores
    python examples/user_level_experiment.py --seeds 1 --epsilons 8            # one eps, one seed (~1 min)

Data: scikit-learn's digits in 300 clients (about 5 training records each; the unit of privacy is a client's whole
data), a linear model. Every private run calibrates its noise to privacy.epsilon towards the third party and the
other silos behind a trusted server (noise added once to the cohort's sum, by the server), over the same 30 rounds:

* ``dp-fedavg-user``, Poisson cohorts of q = 0.2, each client's update clipped at a fixed C in ``CLIPS``, or at the
  adaptive clip that tracks the median update norm from C_0 = 0.1 or 1 (``algorithm.target_quantile = 0.5``, the
  count's noise sigma_b = m / 20 = 3 as Andrew et al.'s, and the update's both in the ledger);
* ``dp-ftrl``, clients in disjoint cohorts of the same size (each in one round of every 5-round epoch, a tree per
  epoch), C = 1.

dpfl charges every observer as if it knew who took part (``dpfl.accounting.observers``): Poisson sampling of clients
lowers delta, never epsilon, so DP-FedAvg here gets no amplification by sampling, the setting of Kairouz et al.'s
comparison. Research mode (run.noise_seed = the seed) makes the repeats reproducible. Writes results.json (every run),
table.md (mean test accuracy and train loss over the seeds) and user_level.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path

import dpfl

CLIPS = (0.1, 0.3, 1.0, 3.0, 10.0)
#: sigma_b of the adaptive runs: Andrew et al.'s m / 20 for the expected cohort of 60 (dpfl's default raises it to
#: s_b z / sqrt(0.1) where that is larger: 4.95 at eps = 4, docs/user-level.md)
ANDREW_COUNT_NOISE = 60 / 20
COMMON = {"data": {"name": "digits", "num_clients": 300},
          "algorithm": {"rounds": 30, "client_rate": 0.2, "lr": 0.5, "sample_rate": 0.5},
          "privacy": {"boundary": "trusted"}, "run": {"threads": 1, "eval_every": 30, "checkpoint_every": 30}}


def variants() -> dict[str, dict]:
    """label -> the [algorithm] keys of one variant."""
    user = {"name": "dp-fedavg-user", "client_sampling": "poisson", "noise_at": "server"}
    found = {f"DP-FedAvg, C = {c:g}": {**user, "clip": c} for c in CLIPS}
    for start in (0.1, 1.0):
        found[f"DP-FedAvg, adaptive C (median), C_0 = {start:g}"] = {**user, "clip": start, "target_quantile": 0.5,
                                                                   "count_noise": ANDREW_COUNT_NOISE}
    found["DP-FTRL, C = 1"] = {"name": "dp-ftrl", "client_sampling": "disjoint", "clip": 1.0, "global_lr": 1.0}
    return found


def run(label: str, epsilon: float, seed: int) -> dict:
    """One run's final test accuracy, train loss and epsilon per observer."""
    config = {section: dict(keys) for section, keys in COMMON.items()}
    config["algorithm"].update(variants()[label])
    config["privacy"]["epsilon"] = epsilon
    config["run"].update({"seed": seed, "noise_seed": seed})
    config["data"]["seed"] = seed
    final = dpfl.run(config).final
    return {"variant": label, "epsilon_target": epsilon, "seed": seed, "test_accuracy": final["test_accuracy"],
            "train_loss": final["train_loss"], "epsilon": final["epsilon"]}


def mean(rows: list[dict], label: str, epsilon: float, key: str) -> float:
    return statistics.mean(r[key] for r in rows if (r["variant"], r["epsilon_target"]) == (label, epsilon))


def table(rows: list[dict], epsilons) -> str:
    seeds = len({r["seed"] for r in rows})
    lines = [f"Mean test accuracy (train loss) over {seeds} seeds, digits in 300 clients, 30 rounds, cohorts of 60", "",
             "| variant | " + " | ".join(f"eps = {e:g}" for e in epsilons) + " |",
             "|---|" + "---|" * len(epsilons)]
    for label in variants():
        cells = [f"{mean(rows, label, e, 'test_accuracy'):.3f} ({mean(rows, label, e, 'train_loss'):.3f})"
                 for e in epsilons]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], epsilons, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for epsilon, color in zip(epsilons, ("tab:blue", "tab:orange", "tab:green")):
        fixed = [mean(rows, f"DP-FedAvg, C = {c:g}", epsilon, "test_accuracy") for c in CLIPS]
        ax.plot(CLIPS, fixed, "o-", color=color, label=f"fixed clip, eps = {epsilon:g}")
        ax.axhline(mean(rows, "DP-FedAvg, adaptive C (median), C_0 = 0.1", epsilon, "test_accuracy"), color=color,
                   linestyle="--", label=f"adaptive clip (median, C_0 = 0.1), eps = {epsilon:g}")
        ax.axhline(mean(rows, "DP-FTRL, C = 1", epsilon, "test_accuracy"), color=color, linestyle=":",
                   label=f"DP-FTRL, C = 1, eps = {epsilon:g}")
    ax.set_xscale("log")
    ax.set_xlabel("clip C of each client's update")
    ax.set_ylabel("test accuracy")
    ax.set_title("User-level DP on digits (300 clients)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[4.0, 8.0])
    parser.add_argument("--out", default="user-level-results")
    args = parser.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)
    rows = [run(label, e, s) for e in args.epsilons for label in variants() for s in range(args.seeds)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    text = table(rows, args.epsilons)
    (out / "table.md").write_text(text)
    plot(rows, args.epsilons, out / "user_level.png")
    print(text)


if __name__ == "__main__":
    main()
