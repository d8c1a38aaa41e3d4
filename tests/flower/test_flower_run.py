"""dpfl on Flower's simulation runtime: the ServerApp and ClientApps reproduce `dpfl run` (model and ledger)."""

import json

import numpy as np
import pytest
import torch

from dpfl.cli import main
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_data

flwr = pytest.importorskip("flwr")
pytest.importorskip("ray")  # Flower's simulation runtime runs ClientApps on Ray

TINY = """
[data]
name = "synthetic"
num_clients = 3
samples_per_client = 40

[algorithm]
name = "dp-scaffold"
rounds = 2
local_steps = 2
client_rate = 0.67
client_sampling = "fixed"
sample_rate = 0.25
lr = 0.5
clip = 1.0
noise_multiplier = 1.5

[run]
threads = 1
"""


def write_silos(config: dict, folder) -> None:
    """Each client's training records of the config's data, as one silo file each (client column included)."""
    train = build_data(config).train
    for i in range(train.num_clients):
        n = int(train.counts[i])
        np.savez(folder / f"silo-{i}.npz", x=train.x[i, :n].numpy(), y=train.y[i, :n].numpy(), client=np.full(n, i))


@pytest.mark.slow
def test_flower_simulation_matches_dpfl_run(tmp_path):
    from flwr.simulation import run_simulation

    from dpfl.flower.client_app import client_app
    from dpfl.flower.server_app import server_app

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    assert main(["run", str(path), "--out", str(tmp_path / "sim"), "--no-progress"]) == 0
    config = load_config(path)
    write_silos(config, tmp_path)
    assert main(["flower-app", str(path), "--out", str(tmp_path / "app")]) == 0
    run_config = {"dpfl-config": json.dumps(config), "out": str(tmp_path / "flower"), "round-timeout": 120.0}
    run_simulation(server_app(run_config), client_app({"silo-path": str(tmp_path / "silo-{partition-id}.npz")}),
                   num_supernodes=3, backend_config={"client_resources": {"num_cpus": 1}})

    sim, fl = tmp_path / "sim", tmp_path / "flower"
    ledger_sim, ledger_fl = (json.loads((d / "ledger.json").read_text()) for d in (sim, fl))
    assert ledger_fl == ledger_sim  # the same events, round by round, with the same fingerprints
    model_sim, model_fl = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (sim, fl))
    results_sim, results_fl = (json.loads((d / "results.json").read_text()) for d in (sim, fl))
    assert results_fl["status"] == "finished"
    assert [r["epsilon"] for r in results_fl["rounds"]] == [r["epsilon"] for r in results_sim["rounds"]]
    x_sim, x_fl = (m["state"]["server"]["x"] for m in (model_sim, model_fl))
    assert torch.equal(x_fl, x_sim)
