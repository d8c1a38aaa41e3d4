"""Calibration for the accountants that are not DpEvents: last iterate (seed 003) and shuffling (FMT21)."""

import json

import pytest

from dpfl.accounting import last_iterate
from dpfl.accounting.calibrate import last_iterate_sigma, solve_noise
from dpfl.accounting.shuffle import shuffle_local_epsilon
from dpfl.accounting.shuffle import shuffle_epsilon
from dpfl.cli import main
from dpfl.errors import ConfigError


def test_solve_noise_inverts_a_known_decreasing_function():
    assert solve_noise(lambda z: 3.0 / z, 0.5, rtol=1e-6) == pytest.approx(6.0, rel=1e-5)
    with pytest.raises(ConfigError, match="target_epsilon"):
        solve_noise(lambda z: 1.0 + 1.0 / z, 0.5)  # epsilon never drops below 1


def test_last_iterate_sigma_recovers_the_notes_regime():
    """notes 003: n=100, m=1, L=rho=1, eta=0.5, sigma=4 gives epsilon 1.365 at delta 1e-5."""
    sigma = last_iterate_sigma(1.364548, 1e-5, 100, 1, 1.0, 1.0, 0.5)
    assert sigma == pytest.approx(4.0, rel=1e-3)
    assert last_iterate.epsilon(1e-5, 0.5, sigma, 100, 1, 1.0, 1.0) <= 1.364548 + 1e-9


def test_shuffle_local_epsilon_recovers_epsilon0_and_meets_the_target():
    target = shuffle_epsilon(4.0, 100_000, 1e-6)
    epsilon0 = shuffle_local_epsilon(target, 100_000, 1e-6)
    assert epsilon0 == pytest.approx(4.0, rel=1e-3)
    assert shuffle_epsilon(epsilon0, 100_000, 1e-6) <= target * (1 + 1e-9)


def test_calibrate_cli_for_last_iterate_and_shuffle(capsys):
    assert main(["calibrate", "last-iterate", "--target-epsilon", "1.364548", "--delta", "1e-5", "--n", "100",
                 "--batch-size", "1", "--lipschitz", "1", "--radius", "1", "--lr", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sigma"] == pytest.approx(4.0, rel=1e-3)
    assert main(["calibrate", "shuffle", "--target-epsilon", "0.5", "--n", "10000", "--delta", "1e-6", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert shuffle_epsilon(result["epsilon0"], 10_000, 1e-6) <= 0.5 + 1e-9
