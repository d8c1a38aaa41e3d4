"""End to end: `dpfl run` and `dpfl demo` write what the README and the issue promise."""

import json

import pytest

from dpfl.cli import main
from dpfl.results import Results
from dpfl.engine.keys import KEY_FILE, load_key
from dpfl.experiments import run_directory
from dpfl.experiments.demo import DEMO_SETTINGS, run_demo

SMALL = """
[data]
name = "synthetic"
alpha = 1
beta = 1
num_clients = 6
samples_per_client = 100

[algorithm]
name = "dp-scaffold-warm"
rounds = 8
local_steps = 3
client_rate = 1.0
sample_rate = 0.2
lr = 1.0
clip = 1.0
noise_multiplier = 2.0

[run]
checkpoint_every = 3
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def test_run_writes_results_with_the_promised_keys(config, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == list(range(1, 9))
    # run.epsilon_every = "auto": powers of two, the checkpoints (every 3rd round) and the last; null elsewhere
    assert [r["round"] for r in results["rounds"] if r["epsilon"] is not None] == [1, 2, 3, 4, 6, 8]
    reported = [r for r in results["rounds"] if r["epsilon"] is not None]
    for entry in reported + [results["final"]]:
        assert set(entry) >= {"round", "test_accuracy", "train_loss", "epsilon"}
        assert set(entry["epsilon"]) >= {"third_party", "server"}
        assert 0 < entry["epsilon"]["third_party"] <= entry["epsilon"]["server"]
    curve = Results.load(out).epsilon_curve()  # every round, from the journal: the rows' numbers exactly
    assert sorted(curve) == list(range(1, 9)) and all(curve[r["round"]] == r["epsilon"] for r in reported)
    assert results["final"]["delta"] == 1e-4  # the largest power of ten at most 1 / (10 N), N = 6 x 80
    assert results["wall_seconds"] > 0 and results["privacy"]["conversion"] == "modern"
    assert results["privacy"]["analysis"] == "sound" and results["privacy"]["unproven"] == []
    eps = [curve[r]["third_party"] for r in sorted(curve)]
    assert eps == sorted(eps)  # privacy spent only grows
    assert (out / "ledger.json").exists() and (out / "checkpoint.pt").exists()
    assert "test accuracy" in capsys.readouterr().out


def test_set_overrides_and_resume_continue_without_forgetting_privacy(config, tmp_path):
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--no-progress", "--set", "algorithm.rounds=6"]) == 0
    first = json.loads((out / "results.json").read_text())
    assert first["final"]["round"] == 6
    assert main(["run", str(config), "--out", str(out), "--no-progress", "--resume"]) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["final"]["round"] == 8
    straight = tmp_path / "straight"  # the uninterrupted run, with the resumed run's secret key
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_directory, "fresh_key", lambda: load_key(out / KEY_FILE))
        assert main(["run", str(config), "--out", str(straight), "--no-progress"]) == 0
    reference = json.loads((straight / "results.json").read_text())
    assert resumed["final"]["epsilon"] == reference["final"]["epsilon"]
    assert resumed["final"]["test_accuracy"] == reference["final"]["test_accuracy"]


@pytest.mark.parametrize("override, message", [
    ("algorithm.nam='dp-fedavg'", "algorithm.nam"),
    ("algorithm.name='dp-sgd'", "algorithm.name = 'dp-sgd' is not allowed"),
    ("algorithm.client_rate=1.5", "algorithm.client_rate = 1.5"),
    ("algorithm.lr=-1", "algorithm.lr = -1"),
    ("privacy.delta=2", "privacy.delta = 2"),
    ("data.num_clients='many'", "data.num_clients"),
    ("data.samples_per_client=2", "data.test_fraction"),
])
def test_bad_config_names_the_key_and_exits_2(config, tmp_path, capsys, override, message):
    code = main(["run", str(config), "--out", str(tmp_path / "bad"), "--no-progress", "--set", override])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_budget_stops_the_run_before_the_round_that_would_exceed_it(config, tmp_path, capsys):
    out = tmp_path / "budget"
    assert main(["run", str(config), "--out", str(out), "--no-progress", "--set", "privacy.budget=1.0"]) == 3
    results = json.loads((out / "results.json").read_text())
    assert "privacy.budget.third_party" in results["stopped_reason"]
    assert results["final"]["epsilon"]["third_party"] <= 1.0
    assert "stopped by the privacy budget" in capsys.readouterr().err


def test_demo_small_writes_a_table_and_a_plot(tmp_path, capsys):
    small = ["data.num_clients=5", "data.samples_per_client=100", "algorithm.rounds=6", "algorithm.client_rate=1.0",
             "algorithm.local_steps=2"]
    assert main(["demo", "--out", str(tmp_path), "--no-progress", *[a for s in small for a in ("--set", s)]]) == 0
    out = capsys.readouterr().out
    assert "dp-scaffold-warm" in out and "dp-fedavg" in out and "eps 3rd party" in out
    assert (tmp_path / "demo.png").stat().st_size > 10_000


@pytest.mark.slow
def test_dp_scaffold_warm_beats_dp_fedavg_on_heterogeneous_data(tmp_path):
    """Seed 000's claim at demo scale (synthetic (5,5), M=40, K=50, l=s=0.2, sigma_g=20, 100 rounds)."""
    assert "data.alpha=5" in DEMO_SETTINGS
    results = run_demo(tmp_path, progress=False)
    scaffold, fedavg = results["dp-scaffold-warm"]["final"], results["dp-fedavg"]["final"]
    # the server sees one client's messages either way (Claim 4.1); towards the aggregate only DP-FedAvg's last
    # step earns the cohort's noise
    assert scaffold["epsilon"]["server"] == fedavg["epsilon"]["server"]
    assert fedavg["epsilon"]["third_party"] <= scaffold["epsilon"]["third_party"]
    assert scaffold["test_accuracy"] > fedavg["test_accuracy"] + 0.1
    assert scaffold["train_loss"] < fedavg["train_loss"]
