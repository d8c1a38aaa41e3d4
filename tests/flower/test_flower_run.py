"""dpfl on Flower's simulation runtime: the ServerApp and ClientApps reproduce `dpfl run` (model and ledger)."""

import pytest
import torch

from dpfl.cli import main
from dpfl.experiments.config import load_config
from dpfl.engine.client_table import ClientTable
from flower_config import app_run_config, silo_pin, spent

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
noise_seed = 0  # research mode: every party draws from this seed, so Flower's model equals dpfl run's
"""


@pytest.mark.slow
def test_flower_simulation_matches_dpfl_run(tmp_path, monkeypatch, write_silos, run_outputs):
    """3 silos, 2 rounds of DP-SCAFFOLD (client state, noise, a sampled cohort) on Flower's simulation runtime: the
    same ledger and the same model as `dpfl run`, bit for bit against a run that works one client at a time (a
    Flower client works alone; batching clients in one tensor changes float rounding, ~1e-7 here), and within
    rounding of the default run."""
    from flwr.simulation import run_simulation

    from dpfl.engine.simulator import Simulation
    from dpfl.flower.client_app import client_app
    from dpfl.flower.server_app import server_app

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    assert main(["run", str(path), "--out", str(tmp_path / "batched"), "--no-progress"]) == 0
    with monkeypatch.context() as patch:
        patch.setattr(Simulation, "chunk_size", lambda self, cohort_size: 1)
        assert main(["run", str(path), "--out", str(tmp_path / "one-by-one"), "--no-progress"]) == 0
    config = load_config(path)
    write_silos(config, tmp_path)
    run_config = app_run_config(config, tmp_path / "flower", **{"round-timeout": 120.0})
    silos = client_app({"silo-path": str(tmp_path / "silo-{partition-id}.npz")}, silo_pin(config))
    run_simulation(server_app(run_config), silos, num_supernodes=3, backend_config={"client_resources": {"num_cpus": 1}})

    ledger, results, state = run_outputs(tmp_path / "flower")
    ledger_1, results_1, state_1 = run_outputs(tmp_path / "one-by-one")
    ledger_b, results_b, state_b = run_outputs(tmp_path / "batched")
    assert results["status"] == "finished" and [r["round"] for r in results["rounds"]] == [1, 2]
    assert spent(ledger) == spent(ledger_1)  # the same events round by round
    assert torch.equal(state["server"]["x"], state_1["server"]["x"])
    assert torch.equal(ClientTable.from_state_dict(state["clients"]["c"]).dense(),
                       ClientTable.from_state_dict(state_1["clients"]["c"]).dense())
    assert [r["epsilon"] for r in results["rounds"]] == [r["epsilon"] for r in results_b["rounds"]]
    assert [e["events"] for e in ledger["journal"]] == [e["events"] for e in ledger_b["journal"]]
    assert torch.allclose(state["server"]["x"], state_b["server"]["x"], atol=1e-6)
