"""Do the defaults train? Every algorithm name given on its own (a minimal config: data.name, model.name and
algorithm.name, plus data.path for a file format), on every built-in data set and format, with every model the
records' shape allows, for a few rounds: the train loss after each round against the untrained model's (issue 35).

A cell *diverges* when the run stops as diverged (``Simulation.stopped_by``: a non-finite model or train loss) or a
round's train loss exceeds the untrained loss by more than ``MARGIN``; it *trains* when the last round's loss is below
the untrained loss. A name whose defaults cannot run without more keys (a family calibrated only to privacy.epsilon)
is refused with a ConfigError, listed as such.

The file formats are written small by the tests' own writers (``tests/data/conftest.py``: MNIST's IDX files,
CIFAR-10's python pickles, LEAF's FEMNIST JSON), so the records are random pixels with a readable label pixel.

    PYTHONPATH=src python benchmarks/default_sweep.py [--rounds 5] [--names dp-fedavg,dp-scaffold] [--data digits]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from dpfl.algorithms import registry
from dpfl.api import build
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config

ROOT = Path(__file__).resolve().parents[1]
#: How far above the untrained loss a round's train loss may go before the cell counts as diverged (nats).
MARGIN = 0.1
MODELS = ("logreg", "mlp", "femnist-cnn", "papernot-cnn")
#: The models each data set's records fit (the CNNs need square images; papernot-cnn at least 16 x 16).
FITTING = {"synthetic": ("logreg", "mlp"), "breast_cancer": ("logreg", "mlp"),
           "digits": ("logreg", "mlp", "femnist-cnn"), "mnist": MODELS, "femnist": MODELS, "cifar10": MODELS}


def _writers():
    spec = importlib.util.spec_from_file_location("format_writers", ROOT / "tests" / "data" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_formats(folder: Path) -> dict[str, Path]:
    """Small files of each public format: MNIST (IDX, 1000 + 200 records of 28 x 28), CIFAR-10 (python pickles, 5 x 200
    + 200 records), FEMNIST (LEAF JSON, 20 writers of 30 records, the last 6 of each in test/)."""
    writers = _writers()
    writers.write_mnist(folder / "mnist", writers.mnist_records(1000, 200))
    writers.write_cifar(folder / "cifar10", per_batch=200, test=200)
    users = {f"f{i:04d}_{i:02d}": writers.femnist_writer(i, 30) for i in range(20)}
    writers.write_leaf(folder / "femnist" / "train", "all_data_0_train_9.json",
                       {u: (x[:-6], y[:-6]) for u, (x, y) in users.items()})
    writers.write_leaf(folder / "femnist" / "test", "all_data_0_test_9.json",
                       {u: (x[-6:], y[-6:]) for u, (x, y) in users.items()})
    return {"mnist": folder / "mnist", "cifar10": folder / "cifar10", "femnist": folder / "femnist"}


def minimal_config(name: str, data: str, model: str, paths: dict[str, Path], rounds: int,
                   settings: tuple[str, ...] = ()) -> dict:
    """The minimal config of a cell: its three names (and data.path), algorithm.rounds to stop early (after SCAFFOLD-
    warm's round(4 / l) warm-start rounds, which leave the model as it is), and ``settings`` ("section.key=value", the
    value as TOML: to try another default)."""
    config = {"data": {"name": data}, "model": {"name": model}, "algorithm": {"name": name}}
    if data in paths:
        config["data"]["path"] = str(paths[data])
    config = load_config(config, list(settings))
    warm = round(4 / config["algorithm"]["client_rate"]) if name.endswith("scaffold-warm") else 0
    config["algorithm"]["rounds"] = warm + rounds
    return config


def run_cell(name: str, data: str, model: str, paths: dict[str, Path], rounds: int,
             settings: tuple[str, ...] = ()) -> dict:
    """The untrained train loss, the train loss and test accuracy after each round, and how the run stopped."""
    try:
        config = minimal_config(name, data, model, paths, rounds, settings)
        sim = build(config)
    except ConfigError as err:
        return {"refused": str(err)}
    untrained = sim.evaluate(epsilon=False).train_loss
    sim.eval_every = 1
    started = time.perf_counter()
    history = sim.run(config["algorithm"]["rounds"])
    return {"untrained": untrained, "losses": [m.train_loss for m in history],
            "accuracies": [m.test_accuracy for m in history], "stopped_by": sim.stopped_by,
            "reason": sim.stopped_reason, "seconds": time.perf_counter() - started}


def verdict(cell: dict) -> str:
    """'trains', 'diverges', 'stalls' (finite, not above the margin, not below the untrained loss) or 'refused'."""
    if "refused" in cell:
        return "refused"
    losses = cell["losses"]
    if cell["stopped_by"] == "diverged" or any(not math.isfinite(v) or v > cell["untrained"] + MARGIN
                                               for v in losses):
        return "diverges"
    return "trains" if losses and losses[-1] < cell["untrained"] else "stalls"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--names", default=",".join(registry.names()))
    parser.add_argument("--data", default=",".join(FITTING))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--set", action="append", default=[], help="section.key=value, e.g. algorithm.lr=0.1")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bad = 0
    with tempfile.TemporaryDirectory() as folder:
        paths = write_formats(Path(folder))
        print(f"{'algorithm':<32} {'data':<14} {'model':<13} {'verdict':<9} {'untrained':>9}  train loss per round "
              "(test accuracy last)", flush=True)
        for name in args.names.split(","):
            for data in args.data.split(","):
                for model in (m for m in args.models.split(",") if m in FITTING[data]):
                    cell = run_cell(name, data, model, paths, args.rounds, tuple(args.set))
                    outcome = verdict(cell)
                    bad += outcome == "diverges"
                    if outcome == "refused":
                        detail = cell["refused"][:90]
                        print(f"{name:<32} {data:<14} {model:<13} {outcome:<9} {'':>9}  {detail}", flush=True)
                        continue
                    losses = " ".join(f"{v:.3g}" for v in cell["losses"])
                    accuracy = cell["accuracies"][-1] if cell["accuracies"] else float("nan")
                    print(f"{name:<32} {data:<14} {model:<13} {outcome:<9} {cell['untrained']:>9.3g}  {losses}"
                          f"  (acc {accuracy:.3f}, {cell['seconds']:.1f} s)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
