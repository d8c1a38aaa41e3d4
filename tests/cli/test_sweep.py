"""`dpfl sweep`: a grid of runs of one config, each its own `dpfl run` process, gathered in one table with the epsilon
of releasing all of them together (``dpfl.experiments.sweep``)."""

from __future__ import annotations

import json
import math

import pytest

import dpfl
from dpfl.cli import main
from dpfl.errors import ConfigError
from dpfl.experiments import sweep

TINY = """[data]
name = "synthetic"
num_clients = 4
samples_per_client = 20
[model]
name = "logreg"
[algorithm]
name = "dp-fedavg"
rounds = 2
client_rate = 0.5
"""


@pytest.mark.parametrize("entries, problem", [
    (["algorithm.lr"], "KEY=V1,V2"), (["algorithm.lr="], "KEY=V1,V2"), (["algorithm.lr=0.1,"], "KEY=V1,V2"),
    (["=0.1"], "KEY=V1,V2"), (["algorithm.lr=0.1", "algorithm.lr=0.2"], "given twice"), ([], "at least one")])
def test_a_malformed_grid_is_refused_naming_the_entry(entries, problem):
    with pytest.raises(ConfigError, match=problem) as err:
        sweep.parse_grid(entries)
    assert "--grid" in str(err.value)


def test_the_points_are_every_combination_in_the_order_given_with_unique_sortable_names():
    grid = sweep.parse_grid(["algorithm.lr=0.05,0.1", "algorithm.client_sampling='fixed','poisson'"])
    assert [p.overrides for p in sweep.points(grid)] == [
        ["algorithm.lr=0.05", "algorithm.client_sampling='fixed'"],
        ["algorithm.lr=0.05", "algorithm.client_sampling='poisson'"],
        ["algorithm.lr=0.1", "algorithm.client_sampling='fixed'"],
        ["algorithm.lr=0.1", "algorithm.client_sampling='poisson'"]]
    assert [p.name for p in sweep.points(grid)] == [
        "0-lr=0.05-client_sampling=fixed", "1-lr=0.05-client_sampling=poisson", "2-lr=0.1-client_sampling=fixed",
        "3-lr=0.1-client_sampling=poisson"]


def test_a_malformed_point_is_refused_before_any_run_starts(tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    code = main(["sweep", str(config), "--grid", "algorithm.rounds=2,'many'", "--out", str(tmp_path / "sweep")])
    assert code == 2
    err = capsys.readouterr().err
    assert "point 1-rounds=many" in err and "algorithm.rounds" in err
    assert not (tmp_path / "sweep").exists()


def test_a_sweep_runs_every_point_and_states_what_choosing_among_them_costs(tmp_path, capsys):
    """Two points of 2 rounds each, 2 jobs: both finish, the table holds their final metrics, and the composed epsilon
    equals a single 4-round run's (its rounds are the same events: releasing both runs is 4 such rounds); the same
    command again starts no run."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    out = tmp_path / "sweep"
    argv = ["sweep", str(config), "--grid", "algorithm.lr=0.05,0.1", "--out", str(out), "--jobs", "2",
            "--select", "test_accuracy", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [(r["point"], r["status"], r["rounds"]) for r in summary["points"]] == \
        [("0-lr=0.05", "finished", 2), ("1-lr=0.1", "finished", 2)]
    assert summary == json.loads((out / "sweep.json").read_text())
    assert (out / "sweep.csv").read_text().splitlines()[0].startswith("point,algorithm.lr,status,rounds")
    best = max(summary["points"], key=lambda r: r["test_accuracy"])
    assert summary["selected"] == best["point"] and "composed epsilon" in summary["selected_note"]
    single = dpfl.run(dpfl.load_config(str(config), ["algorithm.rounds=4"]))
    for observer, epsilon in single.epsilon.items():
        assert summary["composed_epsilon"][observer] == pytest.approx(epsilon, rel=1e-9)
        assert summary["composed_epsilon"][observer] > summary["points"][0][f"epsilon.{observer}"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "started" not in captured.err and captured.err.count("already done") == 2
    # a point its run refuses (an algorithm's own range) is reported with the run's error, not dropped
    assert main([*argv[:3], "algorithm.lr=0.05,-1", *argv[4:]]) == 2
    captured = capsys.readouterr()
    refused = json.loads(captured.out)["points"][1]
    assert refused["point"] == "1-lr=-1" and refused["status"].startswith("error: ") and "algorithm.lr" in \
        refused["status"]
    assert "1-lr=-1: exit status 2: " in captured.err


def test_runs_that_share_a_fixed_noise_key_get_no_composed_epsilon(tmp_path):
    """Two runs drawn from the same run.noise_seed (the research mode) add the same noise: their ledgers' composition
    is not their privacy, so none is stated; with secret keys it is (each run's epsilon below it)."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.replace("rounds = 2", "rounds = 1"))
    runs = {}
    for name, extra in (("a", ["run.noise_seed=3"]), ("b", ["run.noise_seed=3", "algorithm.lr=0.05"]), ("c", []),
                        ("d", ["algorithm.lr=0.05"])):
        dpfl.run(dpfl.load_config(str(config), extra), out=tmp_path / name)
        runs[name] = tmp_path / name
    composed, note = sweep.composed_epsilon([runs["a"], runs["b"]])
    assert composed is None and "run.noise_seed" in note
    composed, note = sweep.composed_epsilon([runs["c"], runs["d"]])
    single = json.loads((runs["c"] / "results.json").read_text())["final"]["epsilon"]
    assert note == "2 runs' ledgers composed (2 rounds)"
    assert all(math.isfinite(composed[o]) and composed[o] > single[o] for o in single)
