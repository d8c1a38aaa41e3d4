"""A target epsilon for the Noble et al. families (dp-fedavg, dp-fedsgd, dp-scaffold, dp-scaffold-warm), from Python
(``dpfl.calibrate(config, target_epsilon=...)``, then ``dpfl.run``) and from `dpfl run` with privacy.epsilon: the
solved noise meets the target towards every observer of the boundary (the worst of them, which results.json names)
and not measurably less, the run spends exactly what the calibration says, and the mixes that cannot hold are refused
naming the key."""

import json

import pytest

import dpfl
from dpfl.cli import main

TARGET = 2.0
OBSERVERS = ("third_party", "server", "other_silo")
#: a tiny run; dp-scaffold-warm's round(4 / l) warm-start rounds need l = 1 to leave rounds to train
SMALL = {"data": {"num_clients": 6, "samples_per_client": 30}, "run": {"noise_seed": 1}}
ALGORITHMS = {"dp-fedavg": {"rounds": 3, "local_steps": 2}, "dp-fedsgd": {"rounds": 3, "local_steps": 2},
              "dp-scaffold": {"rounds": 3, "local_steps": 2},
              "dp-scaffold-warm": {"rounds": 5, "local_steps": 2, "client_rate": 1.0}}


def config_of(name: str, **privacy) -> dict:
    return {**SMALL, "algorithm": {"name": name, **ALGORITHMS[name]}, "privacy": privacy}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_calibrate_pins_the_noise_that_meets_the_target_and_the_run_spends_it(name):
    calibrated = dpfl.calibrate(config_of(name), target_epsilon=TARGET)
    assert calibrated.observers == OBSERVERS and calibrated.boundary == "plain"
    assert calibrated.noise_key == "noise_multiplier"
    assert calibrated.config["algorithm"]["noise_multiplier"] == calibrated.noise
    assert calibrated.config["privacy"]["epsilon"] is None
    worst = max(calibrated.epsilon.values())
    assert worst <= TARGET and worst >= TARGET * (1 - 1e-3), calibrated.epsilon
    results = dpfl.run(calibrated)
    assert results.status == "finished"
    assert results.epsilon == pytest.approx(calibrated.epsilon, rel=1e-12)
    assert name in str(calibrated) and f"{calibrated.noise:.6g}" in str(calibrated)


def test_dpfl_run_with_privacy_epsilon_names_the_observers_it_bounds_in_results_json(tmp_path, capsys):
    path = tmp_path / "fedavg.toml"
    path.write_text('[data]\nnum_clients = 6\nsamples_per_client = 30\n[algorithm]\nname = "dp-fedavg"\nrounds = 3\n'
                    f'local_steps = 2\n[privacy]\nepsilon = {TARGET}\n[run]\nnoise_seed = 1\n')
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress", "--json"]) == 0, \
        capsys.readouterr().err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    calibration = results["privacy"]["calibration"]
    assert calibration["target_epsilon"] == TARGET and calibration["observers"] == list(OBSERVERS)
    assert calibration["boundary"] == "plain"
    spent = results["final"]["epsilon"]
    assert max(spent.values()) <= TARGET and max(spent.values()) >= TARGET * (1 - 1e-3), spent
    # the Python route solves the same level, and pins it
    assert dpfl.calibrate(str(path), target_epsilon=TARGET).noise == calibration["noise_level"]


def test_a_run_without_a_target_reports_no_calibration():
    results = dpfl.run({**SMALL, "algorithm": {"name": "dp-fedavg", "rounds": 1, "local_steps": 2,
                                               "noise_multiplier": 5.0}})
    assert results.privacy["calibration"] is None


def test_user_level_keeps_its_own_observer():
    """dp-fedavg-user with server noise protects another silo (its Calibration): the one the target bounds."""
    calibrated = dpfl.calibrate({**SMALL, "algorithm": {"name": "dp-fedavg-user", "rounds": 3, "local_steps": 2}},
                                target_epsilon=TARGET)
    assert calibrated.observers == ("other_silo",) and calibrated.noise_key == "noise_multiplier"
    assert TARGET * (1 - 1e-3) <= calibrated.epsilon["other_silo"] <= TARGET


@pytest.mark.parametrize("name, privacy, algorithm, key", [
    ("dp-fedavg", {"epsilon": 0.0}, {}, "privacy.epsilon"),
    ("dp-fedavg", {"epsilon": TARGET}, {"noise_multiplier": 3.0}, "algorithm.noise_multiplier"),
    ("dp-fedavg", {"epsilon": TARGET}, {"clip_heuristic": "median-nonprivate"}, "privacy.epsilon"),
    ("dp-fedavg", {"epsilon": TARGET}, {"noise_sharing": "cohort-nonprivate"}, "privacy.epsilon"),
    ("fedavg", {"epsilon": TARGET}, {}, "privacy.epsilon"),
])
def test_a_target_no_noise_meets_is_refused_naming_the_key(name, privacy, algorithm, key):
    config = {**SMALL, "algorithm": {"name": name, "rounds": 2, "local_steps": 2, **algorithm}, "privacy": privacy}
    with pytest.raises(dpfl.ConfigError) as refused:
        dpfl.run(config)
    assert refused.value.field == key


def test_calibrate_refuses_a_wrong_mix_naming_the_argument():
    config = config_of("dp-fedavg")
    cases = [(lambda: dpfl.calibrate(config, target_epsilon=1.0, delta=1e-5), "delta"),
             (lambda: dpfl.calibrate(config, target_epsilon=1.0, accountant="rdp"), "accountant"),
             (lambda: dpfl.calibrate(config), "target_epsilon"),
             (lambda: dpfl.calibrate(config, target_epsilon=-1.0), "target_epsilon"),
             (lambda: dpfl.calibrate(1.0, delta=1e-5, steps=10, sampling_rate=0.01, data=([0.0], [0])), "data"),
             (lambda: dpfl.calibrate(1.0, target_epsilon=2.0, delta=1e-5, steps=10, sampling_rate=0.01),
              "target_epsilon"),
             (lambda: dpfl.calibrate([1.0], target_epsilon=1.0), "config"),
             (lambda: dpfl.calibrate(config_of("dp-fedavg", epsilon=3.0), target_epsilon=1.0), "privacy.epsilon"),
             (lambda: dpfl.calibrate({**SMALL, "algorithm": {"name": "fedavg"}}, target_epsilon=1.0), "algorithm.name")]
    for call, key in cases:
        with pytest.raises(dpfl.ConfigError) as refused:
            call()
        assert refused.value.field == key


def test_the_gaussian_form_is_unchanged_and_takes_the_target_by_keyword():
    gaussian = dict(delta=1e-5, steps=100, sampling_rate=0.01, accountant="rdp")
    z = dpfl.calibrate(1.0, **gaussian)
    assert dpfl.calibrate(target_epsilon=1.0, **gaussian) == z
    assert dpfl.account(noise_multiplier=z, **gaussian).epsilon <= 1.0 < \
        dpfl.account(noise_multiplier=z / (1 + 1e-4), **gaussian).epsilon
