"""`dpfl calibrate run CONFIG`: the answer is checked against real runs of the config through `dpfl run`, and its
refusals (non-private algorithms, self-calibrating configs, unknown observers, unreachable targets) name what to do."""

import dataclasses
import functools
import json

import pytest

from dpfl.algorithms import registry
from dpfl.cli import main
from dpfl.engine import progress

TINY = """
[data]
name = "synthetic"
alpha = 1
beta = 1
num_clients = 10
samples_per_client = 100

[algorithm]
name = "dp-fedavg"
rounds = 4
local_steps = 2
client_rate = 0.5
sample_rate = 0.2
noise_multiplier = 1.0
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return str(path)


def calibrate(capsys, *argv):
    capsys.readouterr()
    assert main(["calibrate", "run", *argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def run_epsilon(capsys, config, tmp_path, name, *overrides, status=0):
    """final.epsilon of a real `dpfl run` of ``config`` with ``overrides``."""
    sets = [a for o in overrides for a in ("--set", o)]
    capsys.readouterr()
    assert main(["run", config, "--out", str(tmp_path / name), "--no-progress", "--json", *sets]) == status
    return json.loads(capsys.readouterr().out)["epsilon"]


def test_noise_meets_the_target_in_a_real_run_and_less_noise_does_not(config, tmp_path, capsys):
    out = calibrate(capsys, config, "--target-epsilon", "2")
    assert out["observer"] == "third_party" and out["rounds"] == 4 and out["noise_key"] == "algorithm.noise_multiplier"
    assert (out["analysis"], out["conversion"], out["neighboring"], out["accountant"]) == (
        "sound", "modern", "replace_one", "pld")  # fixed-size batches: the Gaussian's dominating Poisson pair
    assert out["delta"] == 1e-4  # the largest power of ten at most 1 / (10 N), N = 10 x 80
    noise = out["noise_multiplier"]
    real = run_epsilon(capsys, config, tmp_path, "at", f"algorithm.noise_multiplier={noise!r}")
    assert real["third_party"] == pytest.approx(out["epsilon"], rel=1e-12) and real["third_party"] <= 2
    less = noise / (1 + out["noise_rtol"])
    below = run_epsilon(capsys, config, tmp_path, "less", f"algorithm.noise_multiplier={less!r}")
    assert below["third_party"] == pytest.approx(out["epsilon_with_less_noise"], rel=1e-12) and below["third_party"] > 2
    # printed values err on the safe side: noise and epsilon rounded up
    assert main(["calibrate", "run", config, "--target-epsilon", "2"]) == 0
    printed = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert noise <= float(printed["noise_multiplier"]) <= noise * (1 + 1e-5)
    assert float(printed["epsilon"]) >= out["epsilon"] and printed["rounds"] == "4"


def test_observer_and_poisson_records_use_the_runs_accountant(config, tmp_path, capsys):
    """Poisson record sampling: the run's ledger answers with PLD (zero-out), and so does the calibration, here for
    the server."""
    poisson = ["algorithm.record_sampling='poisson'", "algorithm.rounds=2", "algorithm.noise_multiplier=2.5"]
    sets = [a for o in poisson for a in ("--set", o)]
    server = calibrate(capsys, config, "--target-epsilon", "1", "--observer", "server", *sets)
    assert (server["observer"], server["accountant"], server["neighboring"]) == ("server", "pld", "zero_out")
    real = run_epsilon(capsys, config, tmp_path, "server", *poisson,
                       f"algorithm.noise_multiplier={server['noise_multiplier']!r}")
    assert real["server"] == pytest.approx(server["epsilon"], rel=1e-12) and real["server"] <= 1
    assert real["third_party"] < real["server"]  # the third party's last step is credited the cohort's noise


def test_solve_rounds_is_the_last_round_within_the_target(config, tmp_path, capsys, monkeypatch):
    """DP-SCAFFOLD-warm at client rate 0.5 spends round(4 / 0.5) = 8 warm-start rounds first; the answer R is the
    last round of a real run whose ledger stays within the target. The search's trials go to stderr (here at once)."""
    monkeypatch.setattr(progress, "Heartbeat", functools.partial(progress.Heartbeat, after_s=0.0, every_s=0.0))
    warm = ("--set", "algorithm.name='dp-scaffold-warm'", "--set", "algorithm.noise_multiplier=4.0")
    capsys.readouterr()
    assert main(["calibrate", "run", config, "--target-epsilon", "1.5", "--solve", "rounds", *warm, "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert f"dpfl calibrate run: rounds {out['rounds']} -> epsilon " in captured.err
    rounds = out["rounds"]
    assert rounds > 8 and out["noise_multiplier"] == 4.0
    assert out["epsilon"] <= 1.5 < out["epsilon_with_one_more_round"]
    real = run_epsilon(capsys, config, tmp_path, "r", "algorithm.name='dp-scaffold-warm'",
                       "algorithm.noise_multiplier=4.0", f"algorithm.rounds={rounds + 1}", "privacy.budget=1.5",
                       status=3)
    # the budget stops the real run before round R + 1: it spent exactly the calibration's epsilon
    assert real["third_party"] == pytest.approx(out["epsilon"], rel=1e-12)


def refused(capsys, argv):
    capsys.readouterr()
    assert main(["calibrate", "run", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_refusals_name_the_field_and_what_to_do(config, tmp_path, capsys, monkeypatch):
    public = tmp_path / "fedavg.toml"
    public.write_text(TINY.replace("noise_multiplier = 1.0", "").replace('"dp-fedavg"', '"fedavg"'))
    err = refused(capsys, [str(public), "--target-epsilon", "1"])
    assert "algorithm.name = 'fedavg'" in err and "'dp-fedavg'" in err
    err = refused(capsys, [config, "--target-epsilon", "1", "--observer", "auditor"])
    assert "--observer = 'auditor'" in err and "['third_party', 'server', 'other_silo']" in err
    err = refused(capsys, [config, "--target-epsilon", "1", "--observer", "server", "--set",
                           "privacy.boundary='trusted'"])
    assert "--observer = 'server'" in err and "'trusted'" in err
    err = refused(capsys, [config, "--target-epsilon", "1", "--set", "privacy.epsilon=1.0"])
    assert "privacy.epsilon = 1.0" in err and "algorithm.noise_multiplier" in err
    err = refused(capsys, [config, "--target-epsilon", "0.5", "--solve", "rounds"])
    assert "--target-epsilon = 0.5" in err and "1 round(s)" in err and "towards third_party" in err
    err = refused(capsys, [config, "--target-epsilon", "1", "--set", "algorithm.clip_heuristic='median-nonprivate'"])
    assert "infinite whatever the noise" in err
    spec = registry.spec_of("dp-fedavg")
    fixed = dataclasses.replace(spec, noise_key=None)
    monkeypatch.setitem(registry._REGISTRY, "dp-fedavg", fixed)
    err = refused(capsys, [config, "--target-epsilon", "1"])
    assert "algorithm.name = 'dp-fedavg'" in err and "noise_key is None" in err


def test_help_lists_the_command_and_its_options(capsys):
    assert main(["calibrate", "--help"]) == 0
    assert "run --solve rounds" in capsys.readouterr().out
    assert main(["calibrate", "run", "--help"]) == 0
    text = capsys.readouterr().out
    assert all(option in text for option in ("CONFIG", "--target-epsilon", "--observer", "--solve", "--set", "--json"))
