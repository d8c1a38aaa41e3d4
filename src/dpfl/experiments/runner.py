"""Turns a validated config into a run: builds data, model, algorithm, samplers and ledger, runs, writes results.

results.json holds "config", "rounds" (one entry per evaluated round: round, test_accuracy, train_loss, epsilon per
observer), "final" (the same keys plus delta), "privacy" (accountant, conversion, observers, what each sees),
"wall_seconds", "stopped_reason". A run directory also holds checkpoint.pt and ledger.json; `resume=True` continues
from them and never forgets privacy already spent (see dpfl.accounting.ledger).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import OBSERVERS, PAPER_UNPROVEN, THIRD_PARTY
from dpfl.algorithms.local_sgd import build_local_sgd
from dpfl.data import build_dataset
from dpfl.engine.grads import CohortGradients
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.engine.simulator import Simulation
from dpfl.errors import ConfigError, check_range
from dpfl.models import build_model


def build_simulation(config: dict, out_dir: Path | None = None) -> Simulation:
    data_cfg, model_cfg, algo_cfg = config["data"], config["model"], config["algorithm"]
    privacy_cfg, run_cfg = config["privacy"], config["run"]
    dataset = build_dataset(
        data_cfg["name"], num_clients=data_cfg["num_clients"], samples_per_client=data_cfg["samples_per_client"],
        alpha=data_cfg["alpha"], beta=data_cfg["beta"], partition=data_cfg["partition"],
        partition_param=data_cfg["partition_param"], seed=data_cfg["seed"], test_fraction=data_cfg["test_fraction"],
        standardize=data_cfg["standardize"],
    )
    if int(dataset.test.counts.sum()) == 0:
        raise ConfigError("data.test_fraction", data_cfg["test_fraction"],
                          f"a fraction that leaves test records ({dataset.train.counts.min().item()} training records "
                          "per client and none for testing); raise data.samples_per_client or data.test_fraction")
    torch.manual_seed(run_cfg["seed"])  # model initialisation
    model = build_model(model_cfg["name"], dataset.num_features, dataset.num_classes, model_cfg["hidden"],
                        model_cfg["activation"])
    records = RecordSampler(algo_cfg["sample_rate"], algo_cfg["record_sampling"])
    clients = ClientSampler(dataset.num_clients, algo_cfg["client_rate"], algo_cfg["client_sampling"])
    algorithm = build_local_sgd(
        algo_cfg["name"], local_steps=algo_cfg["local_steps"], lr=algo_cfg["lr"], sampler=records,
        client_rate=algo_cfg["client_rate"], clip=algo_cfg["clip"], noise_multiplier=algo_cfg["noise_multiplier"],
        global_lr=algo_cfg["global_lr"], weight_decay=algo_cfg["weight_decay"],
        clip_heuristic=algo_cfg["clip_heuristic"],
    )
    check_range("algorithm.rounds", algo_cfg["rounds"], 1, integer=True)
    if algorithm.warm_rounds >= algo_cfg["rounds"]:
        raise ConfigError("algorithm.rounds", algo_cfg["rounds"],
                          f"more than the {algorithm.warm_rounds} warm-start rounds (round(4 / client_rate)) of "
                          f"{algo_cfg['name']}")
    delta = privacy_cfg["delta"]
    if delta is None:  # seed 000: delta = 1 / (M R_train)
        delta = 1.0 / float(dataset.train.counts.sum())
    neighboring = "replace_one" if records.scheme == "fixed" else "add_remove"
    ledger = PrivacyLedger(OBSERVERS, delta, _budget(privacy_cfg["budget"]), privacy_cfg["conversion"],
                           privacy_cfg["analysis"], neighboring)
    return Simulation(
        dataset.train, dataset.test, CohortGradients(model), algorithm, clients, ledger, seed=run_cfg["seed"],
        boundary=privacy_cfg["boundary"], eval_every=check_range("run.eval_every", run_cfg["eval_every"], 1,
                                                                 integer=True),
        memory_budget_bytes=check_range("run.memory_mb", run_cfg["memory_mb"], 1, integer=True) * 2**20,
        checkpoint_dir=out_dir, checkpoint_every=check_range("run.checkpoint_every", run_cfg["checkpoint_every"], 1,
                                                             integer=True),
    )


def _budget(budget) -> dict | None:
    if budget is None:
        return None
    if isinstance(budget, dict):
        return budget
    return {THIRD_PARTY: budget}


def run_experiment(config: dict, out_dir: str | Path | None = None, progress: bool = False,
                   resume: bool = False) -> dict:
    """Runs ``config`` and returns its results (also written to out_dir/results.json when out_dir is given)."""
    out = Path(out_dir) if out_dir is not None else None
    sim = build_simulation(config, out)
    if resume:
        if out is None or not (out / "checkpoint.pt").exists():
            raise ConfigError("--resume", str(out), "a run directory that holds checkpoint.pt")
        sim.load_checkpoint(out)
    sim.run(config["algorithm"]["rounds"], progress=progress)
    results = results_of(sim, config)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


def results_of(sim: Simulation, config: dict) -> dict:
    final = sim.history[-1].to_dict() if sim.history else sim.evaluate().to_dict()
    final["delta"] = sim.ledger.delta
    return {
        "config": config,
        "rounds": [m.to_dict() for m in sim.history],
        "final": final,
        "privacy": {
            "analysis": sim.ledger.analysis,
            "accountant": sim.ledger.accountants(),
            "conversion": sim.ledger.conversion,
            "subsampling_bound": sim.ledger.subsampling_bound,
            "neighboring": sim.ledger.neighboring,
            "unproven": list(PAPER_UNPROVEN) if sim.ledger.analysis == "paper" else [],
            "delta": sim.ledger.delta,
            "observers": list(sim.ledger.observers),
            "unit": "one record (record-level DP)",
            "not_covered": "the reported metrics (train loss on all training records, test accuracy) are computed "
                           "without noise for research evaluation; epsilon covers the models and messages only",
            "events_per_round": {o: str(e) for o, e in sim.round_privacy().items()},
        },
        "wall_seconds": getattr(sim, "wall_seconds", math.nan),
        "stopped_reason": sim.stopped_reason,
    }
