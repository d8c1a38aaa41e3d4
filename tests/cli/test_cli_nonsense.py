"""Bad input that used to end in a traceback, and nonsense that used to run silently, through the real entry point:
each is refused (exit status 2, a message naming the key) or warned about on stderr ("dpfl run: warning: KEY ..."),
or, for a loss that explodes, stopped as diverged (exit status 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpfl.cli import main

SMALL = """
[data]
name = "digits"
num_clients = 4
samples_per_client = 40
scale = 0.0625

[algorithm]
name = "dp-fedavg"
rounds = 2
client_rate = 1.0
local_steps = 1
lr = 0.5
noise_multiplier = 1.0
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def run(config, out, *overrides) -> list[str]:
    return ["run", str(config), "--out", str(out), "--no-progress", *[a for o in overrides for a in ("--set", o)]]


def refused(capsys, argv, *expected) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(e in err for e in expected), err
    return err


ACCOUNT = {
    "gaussian": (["account", "gaussian", "--steps", "10", "--sampling-rate", "0.01", "--delta", "1e-5",
                  "--noise-multiplier"], "noise_multiplier = "),
    "dp-scaffold": (["account", "dp-scaffold", "--num-clients", "10", "--records-per-client", "100", "--client-rate",
                     "0.5", "--sample-rate", "0.2", "--rounds", "5", "--local-steps", "2", "--noise-multiplier"],
                    "noise_multiplier = "),
    "last-iterate": (["account", "last-iterate", "--n", "100", "--lipschitz", "1", "--radius", "1", "--lr", "0.5",
                      "--delta", "1e-5", "--batch-size", "1", "--sigma"], "sigma = "),
    "laplace": (["account", "laplace", "--sensitivity", "1", "--steps", "10", "--delta", "1e-5", "--scale"],
                "scale "),
}


@pytest.mark.parametrize("value", ["1e300", "inf", "1e-300"])
@pytest.mark.parametrize("command", sorted(ACCOUNT))
def test_account_refuses_noise_beyond_the_accountants_range(capsys, command, value):
    """1e300 overflowed (OverflowError), inf hit a math domain error or NaN, 1e-300 divided by zero."""
    argv, flag = ACCOUNT[command]
    refused(capsys, [*argv, value], flag, "is not allowed")


@pytest.mark.parametrize("value", ["1e300", "inf", "1e-300"])
def test_run_refuses_a_noise_multiplier_beyond_the_accountants_range(small, tmp_path, capsys, value):
    refused(capsys, run(small, tmp_path / "run", f"algorithm.noise_multiplier={value}"),
            "algorithm.noise_multiplier", "a noise multiplier (noise std / l2 sensitivity) in [1e-06, 1e+06]")


@pytest.mark.parametrize("name", ["fedsgd-dpc", "isrl-mb-sgd"])
@pytest.mark.parametrize("value", ["inf", "1e300", "1e-300"])
def test_run_refuses_a_target_epsilon_beyond_the_calibrations_range(small, tmp_path, capsys, name, value):
    """fedsgd-dpc said "scale_multiplier = 0.0" for inf; isrl-mb-sgd overflowed for 1e-300."""
    overrides = [f"algorithm.name='{name}'", f"privacy.epsilon={value}"]
    if name == "fedsgd-dpc":
        overrides += ["algorithm.clip=1.0"]
    config = small.parent / "calibrated.toml"
    config.write_text(SMALL.replace("client_rate = 1.0\n", "").replace("local_steps = 1\n", "")
                      .replace("noise_multiplier = 1.0\n", ""))
    if name == "isrl-mb-sgd":
        overrides += ["algorithm.client_rate=1.0"]
    refused(capsys, run(config, tmp_path / "run", *overrides), f"privacy.epsilon = {float(value)!r}",
            "an epsilon in [1e-06, 1e+06]")


def test_calibrate_refuses_an_infinite_target(capsys):
    refused(capsys, ["calibrate", "gaussian", "--target-epsilon", "inf", "--steps", "10", "--sampling-rate", "0.01",
                     "--delta", "1e-5"], "target_epsilon = inf")


def test_a_delta_of_a_tenth_or_more_is_refused_and_one_above_1_over_n_warns(small, tmp_path, capsys):
    refused(capsys, run(small, tmp_path / "a", "privacy.delta=0.5"), "privacy.delta = 0.5", "(0, 0.1)",
            "fails outright")
    assert main(run(small, tmp_path / "b", "privacy.delta=0.05")) == 0  # 128 training records: 1 / N = 0.0078
    err = capsys.readouterr().err
    assert "dpfl run: warning: privacy.delta = 0.05 is above 1 / N = 0.00781 (N = 128 training records)" in err
    assert main(run(small, tmp_path / "c", "privacy.delta=0.001")) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_learning_rate_that_explodes_the_loss_stops_as_diverged(small, tmp_path, capsys):
    """lr = 1e6 ran to a train loss of 1e47 in 5 rounds with exit status 0."""
    out = tmp_path / "run"
    assert main(run(small, out, "algorithm.lr=1e6", "algorithm.rounds=5")) == 4
    err = capsys.readouterr().err
    assert "the run diverged and stopped after round 1 of 5" in err and "above 10000" in err and "algorithm.lr" in err
    assert json.loads((out / "results.json").read_text())["stopped_by"] == "diverged"


def test_a_cohort_that_is_mostly_empty_warns_naming_the_client_rate(small, tmp_path, capsys):
    assert main(run(small, tmp_path / "run", "algorithm.client_rate=0.1", "algorithm.client_sampling='poisson'")) == 0
    err = capsys.readouterr().err
    assert "dpfl run: warning: algorithm.client_rate = 0.1" in err and "66% of the rounds have no client" in err
    assert main(run(small, tmp_path / "fine", "algorithm.client_rate=0.5", "algorithm.client_sampling='poisson'")) == 0
    assert "warning" not in capsys.readouterr().err  # (1/2)^4: 6% of the rounds


def test_an_other_silo_epsilon_with_a_single_client_warns(small, tmp_path, capsys):
    assert main(run(small, tmp_path / "run", "data.num_clients=1", "data.samples_per_client=100")) == 0
    err = capsys.readouterr().err
    assert "dpfl run: warning: data.num_clients = 1: there is no other silo" in err


def test_a_continuous_label_column_is_refused_and_too_many_classes_warn(tmp_path, capsys):
    """A csv's fractional labels became one class each (237 classes from a measurement column)."""
    rng = np.random.default_rng(0)
    rows = ["a,b,label"] + [f"{rng.random():.4f},{rng.random():.4f},{i % 2}" for i in range(60)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    config = tmp_path / "csv.toml"
    config.write_text("[data]\nname = 'csv'\npath = 'data.csv'\nnum_clients = 2\n"
                      "[algorithm]\nname = 'dp-fedavg'\nrounds = 1\nclient_rate = 1.0\n")
    refused(capsys, run(config, tmp_path / "a", "data.label_column='a'"), "data.label_column = 'a'",
            "60 fractional numbers", "a continuous quantity")
    np.savez(tmp_path / "many.npz", x=rng.random((60, 2)), y=np.arange(60) % 12)
    assert main(run(config, tmp_path / "b", "data.name='npz'", f"data.path='{tmp_path / 'many.npz'}'")) == 0
    err = capsys.readouterr().err
    assert "dpfl run: warning: data.path" in err and "12 classes for 60 records" in err
