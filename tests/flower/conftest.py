"""Helpers of the Flower tests: silo files of a config's data, and a run directory's outputs."""

import json

import pytest
import torch

from dpfl.experiments.assembly import build_data
from dpfl.flower.silo import write_silos


def run_outputs(run_dir) -> tuple[dict, dict, dict]:
    """A run directory's ledger.json, results.json and checkpointed state."""
    return (json.loads((run_dir / "ledger.json").read_text()), json.loads((run_dir / "results.json").read_text()),
            torch.load(run_dir / "checkpoint.pt", weights_only=False)["state"])


@pytest.fixture(name="write_silos")
def write_silos_fixture():
    """The silo files of a config's training data, one per client (``dpfl.flower.silo.write_silos``)."""
    return lambda config, folder: write_silos(build_data(config["data"]), folder)


@pytest.fixture(name="run_outputs")
def run_outputs_fixture():
    return run_outputs


@pytest.fixture
def flower_task():
    """What Flower's runtime sets in the ServerApp's process before messages are created."""
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    saved = TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
