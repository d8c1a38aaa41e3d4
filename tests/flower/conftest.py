"""Helpers of the Flower tests: silo files of a config's data, and a run directory's outputs."""

import json

import numpy as np
import pytest
import torch

from dpfl.experiments.runner import build_data


def write_silos(config: dict, folder) -> list:
    """Each client's training records of the config's data, as one silo file each (client column included); their
    paths, by client id."""
    train = build_data(config).train
    paths = []
    for i in range(train.num_clients):
        n = int(train.counts[i])
        paths.append(folder / f"silo-{i}.npz")
        np.savez(paths[-1], x=train.x[i, :n].numpy(), y=train.y[i, :n].numpy(), client=np.full(n, i))
    return paths


def run_outputs(run_dir) -> tuple[dict, dict, dict]:
    """A run directory's ledger.json, results.json and checkpointed state."""
    return (json.loads((run_dir / "ledger.json").read_text()), json.loads((run_dir / "results.json").read_text()),
            torch.load(run_dir / "checkpoint.pt", weights_only=False)["state"])


@pytest.fixture(name="write_silos")
def write_silos_fixture():
    return write_silos


@pytest.fixture(name="run_outputs")
def run_outputs_fixture():
    return run_outputs
