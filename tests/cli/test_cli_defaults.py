"""Minimal configs run on their defaults, through the real entry point: a one-pass family's rounds default to one
pass, a cross-silo family's client_rate to every silo, and a private config switches to its non-private twin on the
command line (--set algorithm.name=... --unset KEY)."""

from __future__ import annotations

import json
import sys

import pytest

from dpfl.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def resolved(capsys, config, *argv) -> dict:
    assert main(["config", str(config), *argv]) == 0
    return tomllib.loads(capsys.readouterr().out)


def write(tmp_path, text: str):
    path = tmp_path / "minimal.toml"
    path.write_text(text)
    return path


def test_projected_noisy_sgd_defaults_to_one_pass(tmp_path, capsys, one_torch_thread):
    """rounds = 100 (the common default) was refused as more than one pass over 20 clients."""
    config = write(tmp_path, "[data]\nname = 'breast_cancer'\nnum_clients = 20\n"
                             "[algorithm]\nname = 'projected-noisy-sgd'\n[privacy]\nepsilon = 2.0\n")
    assert resolved(capsys, config)["algorithm"]["rounds"] == 20
    assert resolved(capsys, config, "--set", "algorithm.clients_per_round=4")["algorithm"]["rounds"] == 5
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--no-progress", "--set", "data.num_clients=5"]) == 0, \
        capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["final"]["round"] == 5
    capsys.readouterr()
    assert main(["run", str(config), "--out", str(tmp_path / "more"), "--set", "algorithm.rounds=21"]) == 2
    assert "algorithm.rounds = 21" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["isrl-spider", "isrl-mb-sgd", "isrl-prox-svrg", "sdp-prox-sgd", "sdp-spider",
                                  "isrl-spider-alt"])
def test_cross_silo_families_default_to_every_silo(tmp_path, capsys, name):
    config = write(tmp_path, f"[data]\nname = 'breast_cancer'\nnum_clients = 2\n[algorithm]\nname = '{name}'\n"
                             "[privacy]\nepsilon = 2.0\n")
    assert resolved(capsys, config)["algorithm"]["client_rate"] == 1.0


def test_isrl_spider_runs_on_the_papers_two_silos_with_its_default_cohort(tmp_path, capsys, one_torch_thread):
    """client_rate = 0.2 (the common default) of 2 silos was refused: floor(0.4) = 0 silos a round."""
    config = write(tmp_path, "[data]\nname = 'breast_cancer'\nnum_clients = 2\n[algorithm]\nname = 'isrl-spider'\n"
                             "rounds = 2\n[privacy]\nepsilon = 2.0\n")
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["config"]["algorithm"]["client_rate"] == 1.0


PRIVATE = """
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
clip = 2.0
noise_multiplier = 1.0
"""


def test_a_private_config_switches_to_its_non_private_twin_with_unset(tmp_path, capsys, one_torch_thread):
    config = write(tmp_path, PRIVATE)
    twin = ["--set", "algorithm.name='fedavg'"]
    assert main(["run", str(config), "--out", str(tmp_path / "a"), *twin]) == 2
    err = capsys.readouterr().err
    assert "applies only to the private names" in err and "not 'fedavg'" in err
    assert "--unset algorithm.noise_multiplier" in err and "--unset algorithm.clip" in err  # every key, at once
    dropped = ["--unset", "algorithm.noise_multiplier", "--unset", "algorithm.clip"]
    assert resolved(capsys, config, *twin, *dropped)["algorithm"]["name"] == "fedavg"
    out = tmp_path / "b"
    assert main(["run", str(config), "--out", str(out), "--no-progress", "--json", *twin, *dropped]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["epsilon"]["third_party"] is None  # non-private: infinite
    assert main(["run", str(config), "--out", str(tmp_path / "c"), "--unset", "algorithm.lr"]) == 2
    err = capsys.readouterr().err
    assert "--unset = 'algorithm.lr' is not allowed: expected a key that" in err and "algorithm.clip" in err


def test_unset_restores_a_keys_default(tmp_path, capsys):
    config = write(tmp_path, PRIVATE)
    assert resolved(capsys, config, "--unset", "algorithm.clip")["algorithm"]["clip"] == 1.0
    for command in (["run"], ["config"], ["calibrate", "run"], ["audit"], ["flower-app"]):
        assert main([*command, "--help"]) == 0
        assert "--unset KEY" in capsys.readouterr().out
