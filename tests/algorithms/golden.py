"""Deterministic runs of the LocalSGD names (full participation, full batches, no noise), to compare against the
golden file made from the code before the algorithm protocol (issue: one simulator for every algorithm).

    python tests/algorithms/golden.py > tests/algorithms/golden_deterministic.json
    (golden_private.json: {name: private_losses(name) for name in PRIVATE})
"""

import hashlib
import json

from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

NAMES = ("fedavg", "fedsgd", "scaffold", "scaffold-warm")
MODELS = ("logreg", "mlp")


def settings(name: str, model: str) -> list[str]:
    hidden = ["model.hidden=[8]"] if model == "mlp" else []
    return [f"algorithm.name='{name}'", f"model.name='{model}'", *hidden, "data.num_clients=6",
            "data.samples_per_client=30", "algorithm.rounds=6", "algorithm.local_steps=3",
            "algorithm.client_rate=1.0", "algorithm.sample_rate=1.0", "algorithm.lr=0.5", "run.seed=3"]


def fingerprint(name: str, model: str) -> dict:
    sim = build_simulation(load_config(None, settings(name, model)))
    history = sim.run(6)
    x = sim.model.detach().contiguous()
    return {"x_sha256": hashlib.sha256(x.numpy().tobytes()).hexdigest(), "x_head": x[:4].tolist(),
            "train_loss": [m.train_loss for m in history], "test_accuracy": [m.test_accuracy for m in history]}


if __name__ == "__main__":
    print(json.dumps({f"{n}/{m}": fingerprint(n, m) for n in NAMES for m in MODELS}, indent=1))


PRIVATE = ("dp-fedavg", "dp-fedsgd", "dp-scaffold", "dp-scaffold-warm")
SEEDS = range(10)


def private_settings(name: str, seed: int) -> list[str]:
    return [f"algorithm.name='{name}'", "data.num_clients=10", "data.samples_per_client=50", "algorithm.rounds=12",
            "algorithm.local_steps=4", "algorithm.client_rate=0.5", "algorithm.sample_rate=0.2", "algorithm.lr=0.5",
            "algorithm.noise_multiplier=2.0", f"run.seed={seed}"]


def private_losses(name: str) -> list[float]:
    """Final train loss over seeds (the noise and sampling differ with the seed; the data does not)."""
    return [build_simulation(load_config(None, private_settings(name, seed))).run(12)[-1].train_loss
            for seed in SEEDS]
