"""`dpfl demo`: DP-SCAFFOLD-warm against DP-FedAvg on heterogeneous synthetic data (Noble et al.'s main experiment, scaled
down to run in well under a minute on 2 cores): same data, same noise, same privacy, different drift handling.

"Same noise" is the research mode (``run.noise_seed``, ``dpfl.engine.keys``): both runs draw from the same public
seed, so the table is reproducible and the comparison paired; the table says that its epsilons then hold only against
observers who do not know the seed. A run of one's own data keeps the default, a secret key."""

from __future__ import annotations

from pathlib import Path

from dpfl.experiments.config import load_config
from dpfl.experiments.plots import plot_runs
from dpfl.experiments.runner import run_experiment

DEMO_SETTINGS = [
    "data.name='synthetic'", "data.alpha=5", "data.beta=5", "data.num_clients=40", "data.samples_per_client=1000",
    "algorithm.rounds=100", "algorithm.local_steps=50", "algorithm.client_rate=0.2", "algorithm.sample_rate=0.2",
    "algorithm.lr=1.0", "algorithm.clip=1.0", "algorithm.noise_multiplier=20", "algorithm.weight_decay=0.005",
    "run.checkpoint_every=1000",
    "run.noise_seed=0",  # research mode: the same (reproducible) noise for both algorithms, on synthetic data
]
DEMO_ALGORITHMS = ("dp-scaffold-warm", "dp-fedavg")


def run_demo(out_dir: str | Path = "dpfl-demo", progress: bool = True, overrides=()) -> dict[str, dict]:
    out = Path(out_dir)
    results = {}
    for name in DEMO_ALGORITHMS:
        config = load_config(None, [*DEMO_SETTINGS, f"algorithm.name='{name}'", *overrides])
        # a rerun of the demo archives the previous one (out/<algorithm>/archive/) rather than overwrite its ledger
        results[name] = run_experiment(config, out / name, progress=progress, restart=True)
    plot_runs(results, out / "demo.png",
              title="DP-SCAFFOLD-warm vs DP-FedAvg, synthetic (5,5), M=40, K=50, l=s=0.2, sigma_g=20")
    return results


def table(results: dict[str, dict]) -> str:
    rows = [f"{'algorithm':<18} {'test acc':>8} {'train loss':>10} {'eps 3rd party':>13} {'eps server':>10} "
            f"{'eps other silo':>14} {'seconds':>8}"]
    for name, result in results.items():
        final, eps = result["final"], result["final"]["epsilon"]
        rows.append(f"{name:<18} {final['test_accuracy']:>8.3f} {final['train_loss']:>10.4f} "
                    f"{_e(eps['third_party']):>13} {_e(eps['server']):>10} {_e(eps['other_silo']):>14} "
                    f"{result['wall_seconds']:>8.1f}")
    first = next(iter(results.values()))
    privacy = first["privacy"]
    accountants = "/".join(sorted(set(privacy["accountant"].values())))
    conversion = f", {privacy['conversion']} conversion" if "rdp" in accountants else ""
    rows.append(f"delta = {first['final']['delta']:.3g}; {privacy['analysis']} analysis, {accountants.upper()} "
                f"accountant{conversion}; record-level DP")
    noise_seed = first["config"]["run"]["noise_seed"]
    if noise_seed is not None:
        rows.append(f"noise: research mode (run.noise_seed = {noise_seed}, the same for both runs): the epsilons hold "
                    "against observers who do not know that seed")
    return "\n".join(rows)


def _e(value) -> str:
    return "inf" if value is None else f"{value:.2f}"
