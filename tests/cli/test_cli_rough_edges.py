"""A new user's rough edges, through the real entry points (`dpfl.cli.main`, `import dpfl`): files without records,
features or proper labels, a run directory that is no path, a delta a run would refuse, a negative number of rounds,
the plain Gaussian mechanism without --sampling, and a planner that blames a missing flag before it estimates."""

import json

import numpy as np
import pytest

import dpfl
from dpfl.cli import main

ALGORITHM = "[algorithm]\nname = 'dp-fedavg'\nrounds = 1\nnoise_multiplier = 1.0\nclient_rate = 1.0\n"


def refused(capsys, argv, *expected) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(e in err for e in expected), err
    return err


def run_npz(tmp_path, **arrays) -> list[str]:
    np.savez(tmp_path / "own.npz", **arrays)
    (tmp_path / "own.toml").write_text(f"[data]\nname = 'npz'\npath = 'own.npz'\nnum_clients = 3\n{ALGORITHM}")
    return ["run", str(tmp_path / "own.toml"), "--out", str(tmp_path / "run"), "--no-progress"]


@pytest.mark.parametrize("x, y, shape", [
    (np.zeros((0, 3)), np.zeros(0, dtype=int), "[0, 3]"),
    (np.zeros((60, 0)), np.arange(60) % 2, "[60, 0]"),
])
def test_an_npz_without_records_or_features_is_refused_naming_its_shape(tmp_path, capsys, x, y, shape):
    refused(capsys, run_npz(tmp_path, x=x, y=y), f"data.path = '{tmp_path / 'own.npz'}' is not allowed",
            f"at least one record and one feature in 'x' (found x of shape {shape})")
    assert not (tmp_path / "run").exists()


def test_a_negative_label_is_refused_naming_the_file_and_the_value(tmp_path, capsys):
    x = np.random.default_rng(0).normal(size=(60, 3))
    refused(capsys, run_npz(tmp_path, x=x, y=np.array([0, 1, -1] * 20)),
            f"data.path = '{tmp_path / 'own.npz'}' is not allowed: expected class labels: names, or integers 0..C-1",
            "20 records labelled -1, the first y[2], among 3 distinct labels")


def test_a_negative_label_in_a_csv_names_the_column_and_the_line(tmp_path, capsys):
    (tmp_path / "own.csv").write_text("a,b,outcome\n" + "1,2,0\n2,3,1\n" * 10 + "3,4,-1\n")
    (tmp_path / "own.toml").write_text("[data]\nname = 'csv'\npath = 'own.csv'\nlabel_column = 'outcome'\n"
                                       f"num_clients = 3\n{ALGORITHM}")
    refused(capsys, ["run", str(tmp_path / "own.toml"), "--out", str(tmp_path / "run")],
            "data.label_column = 'outcome' is not allowed", f"found in {tmp_path / 'own.csv'} 1 records labelled -1, "
            "the first line 22")


def test_arrays_with_a_negative_label_are_refused_naming_data():
    x = np.random.default_rng(0).normal(size=(60, 3))
    with pytest.raises(dpfl.ConfigError, match=r"data = 'arrays' .*labelled -1"):
        dpfl.build({"data": {"num_clients": 3}, "algorithm": {"name": "fedavg", "client_rate": 1.0}},
                   data=(x, np.array([0, 1, -1] * 20)))


TINY = {"data": {"num_clients": 4, "samples_per_client": 20}, "algorithm": {"name": "fedavg", "rounds": 1,
                                                                          "client_rate": 1.0}}


def test_a_run_directory_that_is_no_path_is_refused(tmp_path):
    with pytest.raises(dpfl.ConfigError, match=r"^out = 123 is not allowed: expected the run directory as a str or "
                                               r"pathlib.Path, or None"):
        dpfl.run(TINY, out=123)


def test_a_negative_number_of_rounds_is_refused_and_zero_runs_none():
    simulation = dpfl.build(TINY)
    for rounds in (-1, 2.5):
        with pytest.raises(dpfl.ConfigError, match=rf"^rounds = {rounds} is not allowed: expected an integer in "
                                                   r"\[0, inf\)"):
            simulation.run(rounds)
    assert simulation.run(0) == [] and simulation.next_round == 0
    assert len(simulation.run(np.int64(1))) == 1 and simulation.next_round == 1


DELTA = ("delta = 0.5 is not allowed: expected a number in (0, 0.1): delta is the probability that the epsilon "
         "guarantee fails outright")


@pytest.mark.parametrize("argv", [
    ["account", "gaussian", "--noise-multiplier", "1", "--steps", "10", "--sampling-rate", "0.01"],
    ["account", "laplace", "--scale", "1", "--sensitivity", "1", "--steps", "10"],
    ["account", "dp-fedavg-user", "--num-clients", "100", "--client-rate", "0.1", "--rounds", "10",
     "--noise-multiplier", "1"],
    ["calibrate", "gaussian", "--target-epsilon", "1", "--steps", "10", "--sampling-rate", "0.01"],
])
def test_the_commands_refuse_a_delta_a_run_refuses(capsys, argv):
    refused(capsys, [*argv, "--delta", "0.5"], f"dpfl {argv[0]}: error: {DELTA}")


def test_a_delta_below_a_tenth_is_answered(capsys):
    assert main(["account", "gaussian", "--noise-multiplier", "1", "--steps", "10", "--delta", "0.05", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["delta"] == 0.05


def test_without_a_sampling_rate_account_gaussian_is_the_plain_gaussian_mechanism(capsys):
    argv = ["account", "gaussian", "--noise-multiplier", "2", "--steps", "10", "--delta", "1e-5", "--json"]
    answers = []
    for extra in ([], ["--sampling", "none"], ["--sampling-rate", "0.01"], ["--sampling", "poisson",
                                                                             "--sampling-rate", "0.01"]):
        assert main([*argv, *extra]) == 0
        answers.append(json.loads(capsys.readouterr().out)["epsilon"])
    plain, none, rate, poisson = answers
    assert plain == none and rate == poisson and poisson < plain
    assert plain == pytest.approx(dpfl.account(noise_multiplier=2.0, steps=10, sampling="none", delta=1e-5).epsilon)
    refused(capsys, [*argv, "--sampling", "poisson"], "sampling_rate = None")  # poisson named: it needs its rate


def test_plan_queries_replies_blames_a_missing_epsilon_before_estimating(tmp_path, capsys, monkeypatch):
    from dpfl.cli import plan_queries_replies

    monkeypatch.setattr(plan_queries_replies, "_estimate", lambda *a, **k: pytest.fail("estimated first"))
    (tmp_path / "fedavg.toml").write_text("[data]\nname = 'digits'\nnum_clients = 10\n" + ALGORITHM)
    refused(capsys, ["plan", "queries-replies", str(tmp_path / "fedavg.toml")],
            "--epsilon = None is not allowed: expected each client's budget eps_i (or privacy.epsilon in CONFIG)")
