"""Cross-device user-level DP at equal epsilon: DP-FedAvg (Poisson cohorts, noise on the server's sum; McMahan et al.
2018), DP-FTRL (tree aggregation, no sampling; Kairouz et al. 2021) and BandMF (the banded square root, round robin
and amplified by Poisson sampling within b partitions; Choquette-Choo et al. 2023, Kalinin and Lampert 2024), on a
next-word task and a next-character task, each run calibrated to privacy.epsilon.

    python examples/cross_device_comparison.py --out cross-device-results          # quick: ~15 min CPU, 1 thread
    python examples/cross_device_comparison.py --size full --out cross-device-full  # see FULL's comment for its time

Data (both synthetic and seeded, written into ``--out``): next-word's JSON lines from ``dpfl.data.next_word.
synthetic_users`` (a Zipf vocabulary, per-user topic mixtures), one client per user; and LEAF's Shakespeare layout
(all_data/*.json, one "role" per user, next-character records over LEAF's alphabet) of the same kind of text, its
word ids spelt as seeded letter strings. Every run: the same population, rounds, expected cohort l M, client work
(K local steps), clip C = 1, a trusted server that adds the noise once to the cohort's sum, and its noise calibrated
to privacy.epsilon towards the third party and another silo (``dpfl.experiments.noise_level``, the run's own
ledger). Cohorts are secret from those observers (privacy.cohort = "secret", the default), so DP-FedAvg's Poisson
cohorts and amplified BandMF's coins are credited with amplification; DP-FTRL and round-robin BandMF get none.
Writes results.json (every run: test accuracy, epsilon per observer, the calibrated noise), table.md and
cross_device.png (test accuracy against epsilon, one line per algorithm, a panel per task, FedAvg without DP on the
same cohorts dashed).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

import dpfl
from dpfl.data.next_word import synthetic_users, write_jsonl

#: the quick size: minutes of CPU on one thread (docs/experiments/cross_device.md has its measured time)
QUICK = {"users": 1000, "client_rate": 0.05, "rounds": 50, "vocabulary": 200, "words": 200, "sequence_length": 8,
         "characters": 16, "d_model": 8, "sentences": (2, 4)}
#: the full size: 10 times the users and their cohorts, 100 rounds, a wider model (about 40 times the quick size's
#: client work per round and 2.5 times its rounds: several hours of CPU on one thread)
FULL = {"users": 6000, "client_rate": 0.05, "rounds": 100, "vocabulary": 1000, "words": 2000, "sequence_length": 20,
        "characters": 40, "d_model": 32, "sentences": (2, 6)}
SIZES = {"quick": QUICK, "full": FULL}
EPSILONS = (2.0, 4.0, 8.0)
#: BandMF's bands under round robin: the separation M / n (every client once per b rounds); amplified: b partitions,
#: each client of the round's partition in with q = l b (the b of Choquette-Choo et al.'s trade: fewer bands, more
#: amplification)
AMPLIFIED_BANDS = 4
CLIENT = {"local_steps": 2, "lr": 0.5, "sample_rate": 0.5, "clip": 1.0}
#: the non-private reference: FedAvg on the same cohorts (fixed size l M) and client work, no clip and no noise
REFERENCE = "FedAvg (no DP)"


def algorithms() -> dict[str, dict]:
    """label -> the [algorithm] keys of one algorithm (beyond rounds, client_rate and CLIENT)."""
    return {
        "DP-FedAvg (Poisson)": {"name": "dp-fedavg-user", "client_sampling": "poisson", "noise_at": "server"},
        "DP-FTRL (disjoint)": {"name": "dp-ftrl", "client_sampling": "disjoint", "global_lr": 1.0},
        "BandMF (round robin)": {"name": "bandmf", "client_sampling": "round_robin", "global_lr": 1.0},
        f"BandMF (amplified, b = {AMPLIFIED_BANDS})": {"name": "bandmf", "client_sampling": "partitioned_poisson",
                                                       "bands": AMPLIFIED_BANDS, "global_lr": 1.0},
    }


def spelling(words: int, seed: int) -> list[str]:
    """A seeded lower-case spelling (2 to 7 letters) of each word id, distinct: the text of the character task."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    spelt: dict[str, None] = {}
    while len(spelt) < words:
        spelt.setdefault("".join(rng.choice(letters, int(rng.integers(2, 8)))), None)
    return list(spelt)


def write_next_word(folder: Path, size: dict, seed: int) -> Path:
    """The users' JSON lines (``synthetic_users``), one client per user."""
    return write_jsonl(folder / "next_word" / "users.jsonl",
                       synthetic_users(size["users"], words=size["words"], sentences=size["sentences"],
                                       mean_length=12.0, seed=seed))


def write_characters(folder: Path, size: dict, seed: int) -> Path:
    """LEAF's Shakespeare layout (all_data/all_data.json): each user a role whose text is its sentences spelt out
    (capitalised, ending in '.'), its records the windows of ``size["characters"]`` characters of the text prefixed
    with as many spaces, each labelled with the character after it (LEAF writes 80-character windows)."""
    spelt = spelling(size["words"], seed)
    length, document = size["characters"], {"users": [], "num_samples": [], "user_data": {}}
    for user, sentences in synthetic_users(size["users"], words=size["words"], sentences=size["sentences"],
                                           mean_length=12.0, seed=seed + 1):
        text = " ".join(" ".join(spelt[int(w[1:])] for w in s.split()).capitalize() + "." for s in sentences)
        padded = " " * length + text
        x = [padded[i:i + length] for i in range(len(text))]
        y = [padded[i + length] for i in range(len(text))]
        document["users"].append(user)
        document["num_samples"].append(len(y))
        document["user_data"][user] = {"x": x, "y": y}
    path = folder / "characters" / "all_data" / "all_data.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path.parent.parent


def tasks(folder: Path, size: dict, seed: int) -> dict[str, dict]:
    """task -> its [data] and [model] sections, the data written into ``folder``."""
    model = {"name": "transformer", "d_model": size["d_model"], "layers": 1, "heads": 2}
    return {
        "next-word": {"data": {"name": "next-word", "path": str(write_next_word(folder, size, seed)),
                               "vocabulary": size["vocabulary"], "sequence_length": size["sequence_length"],
                               "seed": seed},
                      "model": model},
        "next-character": {"data": {"name": "shakespeare", "path": str(write_characters(folder, size, seed)),
                                    "seed": seed},
                           "model": model},
    }


def run(task: dict, label: str, epsilon: float | None, size: dict, seed: int) -> dict:
    """One run's final test accuracy, train loss, epsilon per observer and calibrated noise level (the reference,
    ``label`` REFERENCE and ``epsilon`` None: no privacy)."""
    private = label != REFERENCE
    keys = {**CLIENT, **algorithms()[label]} if private else \
        {"name": "fedavg", **{k: CLIENT[k] for k in ("local_steps", "lr", "sample_rate")}}
    config = {"data": dict(task["data"]), "model": dict(task["model"]),
              "algorithm": {"rounds": size["rounds"], "client_rate": size["client_rate"], **keys},
              "privacy": {"boundary": "trusted", **({"epsilon": epsilon} if private else {})},
              "run": {"seed": seed, "noise_seed": seed, "threads": 1, "eval_every": size["rounds"],
                      "checkpoint_every": size["rounds"]}}
    started = time.process_time()
    results = dpfl.run(config)
    final = results.final
    return {"algorithm": label, "epsilon_target": epsilon, "seed": seed, "test_accuracy": final["test_accuracy"],
            "train_loss": final["train_loss"], "epsilon": final["epsilon"],
            "noise_level": results.privacy["calibration"]["noise_level"] if private else 0.0,
            "cpu_s": time.process_time() - started}


def table(rows: list[dict], epsilons) -> str:
    """Mean test accuracy (calibrated noise level) per task, algorithm and epsilon."""
    lines = []
    for task in dict.fromkeys(r["task"] for r in rows):
        lines += [f"**{task}** (test accuracy; the calibrated noise level in brackets)", "",
                  "| algorithm | " + " | ".join(f"eps = {e:g}" for e in epsilons) + " |",
                  "|---|" + "---:|" * len(epsilons)]
        for label in algorithms():
            cells = []
            for e in epsilons:
                found = [r for r in rows if (r["task"], r["algorithm"], r["epsilon_target"]) == (task, label, e)]
                cells.append(f"{np.mean([r['test_accuracy'] for r in found]):.3f} "
                             f"({np.mean([r['noise_level'] for r in found]):.3g})" if found else "")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        reference = [r["test_accuracy"] for r in rows if (r["task"], r["algorithm"]) == (task, REFERENCE)]
        if reference:
            lines.append(f"| {REFERENCE} | " + " | ".join([f"{np.mean(reference):.3f}"] * len(epsilons)) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict], epsilons, path: Path) -> None:
    """Test accuracy against epsilon, one line per algorithm, a panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.8), squeeze=False)
    for ax, task in zip(axes[0], names):
        for label in algorithms():
            accuracy = [np.mean([r["test_accuracy"] for r in rows
                                 if (r["task"], r["algorithm"], r["epsilon_target"]) == (task, label, e)])
                        for e in epsilons]
            ax.plot(epsilons, accuracy, "o-", label=label)
        reference = [r["test_accuracy"] for r in rows if (r["task"], r["algorithm"]) == (task, REFERENCE)]
        if reference:
            ax.axhline(np.mean(reference), color="grey", linestyle="--", label=REFERENCE)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(epsilons), [f"{e:g}" for e in epsilons])
        ax.set_xlabel("epsilon (third party and other silos)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{task} (synthetic)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--users", type=int, help="override the size's users (a smoke test)")
    parser.add_argument("--rounds", type=int, help="override the size's rounds (a smoke test)")
    parser.add_argument("--out", default="cross-device-results")
    args = parser.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)
    size = dict(SIZES[args.size])
    size.update({k: v for k, v in (("users", args.users), ("rounds", args.rounds)) if v is not None})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in range(args.seeds):
        for task_name, task in tasks(out / f"data-{seed}", size, seed).items():
            rows.append({"task": task_name, **run(task, REFERENCE, None, size, seed)})
            for epsilon in args.epsilons:
                for label in algorithms():
                    rows.append({"task": task_name, **run(task, label, epsilon, size, seed)})
                    print(json.dumps(rows[-1]), flush=True)
    (out / "results.json").write_text(json.dumps({"size": {**size, "sentences": list(size["sentences"])},
                                                  "rows": rows}, indent=1))
    text = table(rows, args.epsilons)
    (out / "table.md").write_text(text)
    plot(rows, args.epsilons, out / "cross_device.png")
    print(text)
    return rows


if __name__ == "__main__":
    main()
