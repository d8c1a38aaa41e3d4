"""Heikkilä et al. (2024), joint noise with several local steps under secure aggregation (``dp-fedavg-joint``):
Table 1 (averaging independently trained models) under the paper's and the sound analysis, and the comparison of 1
local epoch, 1 local step and local DP at equal epsilon (``examples/joint_noise_experiment.py`` runs it).

For every data set, analysis and variant the noise is calibrated to privacy.epsilon (the same epsilon for all)
towards the observer the trust setting protects against: honest-but-curious clients (shares sigma / sqrt(N - 1), the
coalition of one other client) for the joint variants, the server that sees each message for local DP (every client
adds sigma). All clients take part in every round; q = 0.1, so one epoch is 10 local steps.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import torch

from dpfl.experiments.config import load_config
from dpfl.experiments.runner import run_experiment

DATA = {"digits": ["data.name='digits'", "data.num_clients=10"],
        # the raw features (data.scale's public default for breast_cancer is 1e-3), as docs/accounting.md's table ran
        "breast_cancer": ["data.name='breast_cancer'", "data.num_clients=5", "data.scale=1.0"],
        "synthetic": ["data.name='synthetic'", "data.num_clients=10", "data.samples_per_client=200"],
        # the paper's Fashion-MNIST, iid over 10 clients (its own test split; a linear model, not its CNN)
        "fashion_mnist": ["data.name='fashion_mnist'", "data.num_clients=10"],
        # Fig. 3's stand-in for ACS Income's 51 states: 51 heterogeneous clients (inputs and models differ)
        "synthetic-51": ["data.name='synthetic'", "data.num_clients=51", "data.samples_per_client=400",
                         "data.alpha=1.0", "data.beta=1.0"]}
#: variant -> its [algorithm] / [privacy] keys (an epoch's local steps follow the record sampling rate: ``run``)
VARIANTS = {"1 local epoch": [],
            "1 local step": ["algorithm.local_steps=1"],
            "local DP, 1 epoch": ["algorithm.trust='local'", "privacy.boundary='plain'"]}
ANALYSES = ("paper", "sound")


def run(data: str, variant: str, analysis: str, seed: int, epsilon: float, rounds: int, lr: float,
        noise: str = "gaussian", sample_rate: float = 0.1, every_round: bool = False) -> dict:
    """One run (research mode: run.noise_seed = seed) with real Gaussian or integer Skellam shares
    (``algorithm.noise``) and Poisson record sampling at ``sample_rate`` (a local epoch: 1 / sample_rate steps);
    its final accuracy, loss and epsilon per observer, and the best test accuracy over its evaluations (every round
    with ``every_round``, as the paper's Fig. 2 reports "the best results ... over the training run": a choice on
    the TEST data, not private, as the paper's)."""
    epoch = [f"algorithm.local_steps={round(1 / sample_rate)}"] if "epoch" in variant else []
    overrides = ["algorithm.name='dp-fedavg-joint'", f"algorithm.rounds={rounds}",
                 f"algorithm.sample_rate={sample_rate}",
                 f"algorithm.noise='{noise}'",
                 f"algorithm.lr={lr}", f"privacy.epsilon={epsilon}", f"privacy.analysis='{analysis}'",
                 "privacy.boundary='secagg'", "data.standardize='pooled'", f"run.seed={seed}", f"data.seed={seed}",
                 f"run.noise_seed={seed}",  # research mode: reproducible repeats
                 "run.threads=1", f"run.eval_every={1 if every_round else rounds}", f"run.checkpoint_every={rounds}", *DATA[data],
                 *VARIANTS[variant], *epoch]
    config = load_config(None, overrides)
    results = run_experiment(config)
    events = results["privacy"]["events_per_round"]
    return {"data": data, "variant": variant, "analysis": analysis, "noise": noise, "rounds": rounds, "seed": seed,
            "test_accuracy": results["final"]["test_accuracy"], "train_loss": results["final"]["train_loss"],
            "best_test_accuracy": max(r["test_accuracy"] for r in results["rounds"]),
            "epsilon": results["final"]["epsilon"], "events_per_round": events,
            "wall_seconds": results["wall_seconds"]}


def mean_accuracy(rows: list[dict], data: str, variant: str, analysis: str) -> float | None:
    """The mean test accuracy over the seeds of one cell (None: not run)."""
    accs = [r["test_accuracy"] for r in rows if (r["data"], r["variant"], r["analysis"]) == (data, variant, analysis)]
    return statistics.mean(accs) if accs else None


def table(rows: list[dict], epsilon: float) -> str:
    lines = [f"Mean test accuracy over seeds at epsilon = {epsilon} (each analysis calibrates its own noise)", "",
             "| data | variant | paper's analysis | sound analysis |", "|---|---|---|---|"]
    for data in dict.fromkeys(r["data"] for r in rows):
        for variant in VARIANTS:
            cells = [mean_accuracy(rows, data, variant, analysis) for analysis in ANALYSES]
            cells = [f"{c:.3f}" if c is not None else "-" for c in cells]
            lines.append(f"| {data} | {variant} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


# -- Table 1 ---------------------------------------------------------------------------------------------------------
#: Table 1: local steps -> [(parties, sigma_total, epsilon of the averaged model)], q = 0.1, delta = 1e-5, each
#: party's model (5, 1e-5)-DP. Steps: 1 step, 1 epoch (1 / q = 10), 5 epochs (50).
TABLE_1 = {
    1: [(1, 0.69, 5.0), (2, 0.98, 2.78), (5, 1.54, 1.22), (10, 2.18, 0.64)],
    10: [(1, 0.90, 5.0), (2, 1.28, 2.61), (5, 2.02, 1.19), (10, 2.85, 0.72)],
    50: [(1, 1.18, 5.0), (2, 1.67, 2.85), (5, 2.64, 1.55), (10, 3.73, 1.03)],
}


#: Table 1's model: the linear classifier of the paper's Fig. 2 on 1,024 CIFAR-10 features (d = 1024 x 10 + 10)
TABLE_1_DIMENSION = 10_250
#: Table 1's Skellam scale ("32 bit gradients"): 2^20 integer units per unit of a party's sensitivity C / (q n)
TABLE_1_SKELLAM_UNITS = 2.0**20


def _setting(num_clients: int, records: int, epsilon=None, analysis: str = "sound", delta: float = 1e-5):
    from dpfl.algorithms.registry import Setting

    return Setting(client_rate=1.0, num_clients=num_clients, train_counts=(records,) * num_clients, rounds=1,
                   delta=delta, epsilon=epsilon, analysis=analysis, conversion=None, dimension=TABLE_1_DIMENSION)


def _joint(local_steps: int, num_clients: int, records: int, noise_multiplier=None, epsilon=None, analysis="sound",
           noise: str = "gaussian"):
    from dpfl.algorithms.dp_fedavg_joint import JointNoiseConfig
    from dpfl.experiments.noise_level import build_calibrated

    config = JointNoiseConfig(local_steps=local_steps, trust="aggregator", noise_multiplier=noise_multiplier,
                              noise=noise)
    config = dataclasses.replace(config,
                                 skellam_scale=TABLE_1_SKELLAM_UNITS * config.sample_rate * records / config.clip)
    return build_calibrated("dp-fedavg-joint", config, _setting(num_clients, records, epsilon, analysis))


def third_party_epsilon(algorithm, analysis: str, num_clients: int, records: int, delta: float = 1e-5) -> float:
    """Epsilon towards a third party of one round of ``algorithm`` (all clients, secure aggregation) under
    ``analysis``: RDP at integer orders 2..255 with the classic conversion, the paper's accountant."""
    from dpfl.accounting.ledger import PrivacyLedger
    from dpfl.accounting.observers import observer_events
    from dpfl.engine.sampling import ClientSampler

    release = algorithm.release(0, None, torch.tensor([records] * num_clients))
    event = observer_events(release, ClientSampler(num_clients, 1.0).cohort(0), "secagg", analysis)["third_party"]
    ledger = PrivacyLedger(("third_party",), delta, None, "classic", analysis, algorithm.neighboring, "rdp-integer")
    return ledger.epsilon_after([{"third_party": event}], ["third_party"])["third_party"]


def table_1(local_steps: int, parties: tuple[int, ...], records: int = 100) -> dict:
    """sigma_LDP (one party's noise for eps = 5 under the paper's analysis, calibrated by dp-fedavg-joint itself)
    and, per number of parties N, sigma_total = sqrt(N) sigma_LDP with the averaged model's epsilon under both
    analyses: averaging N models is one round of N clients whose shares, sized for a trusted aggregator, are
    sigma_LDP each."""
    sigma_ldp = _joint(local_steps, 1, records, epsilon=5.0, analysis="paper").mechanism.noise_multiplier
    rows = []
    for n in parties:
        algorithm = _joint(local_steps, n, records, noise_multiplier=math.sqrt(n) * sigma_ldp)
        rows.append({"parties": n, "sigma_total": math.sqrt(n) * sigma_ldp,
                     **{analysis: third_party_epsilon(algorithm, analysis, n, records) for analysis in ANALYSES}})
    return {"sigma_ldp": sigma_ldp, "rows": rows}


def skellam_sigma_ldp(local_steps: int, records: int = 100) -> float:
    """sigma_LDP of Table 1 (one party's noise for eps = 5 under the paper's analysis) calibrated by dp-fedavg-joint's
    Skellam shares (``algorithm.noise = "skellam"``) on Table 1's model and scale: dpfl's Skellam accountant, whose
    Poisson amplification is Zhu & Wang's Thm 6 with its factor 3 (``dpfl.accounting.skellam``)."""
    return _joint(local_steps, 1, records, epsilon=5.0, analysis="paper", noise="skellam").mechanism.noise_multiplier
