"""run.epsilon_every: which evaluations report epsilon, and what results.json says between them."""

import math

import pytest

from dpfl.engine.epsilon_schedule import check_epsilon_every, epsilon_due
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.resolved import resolve
from dpfl.experiments.results_file import results_of
from dpfl.experiments.runner import build_simulation


def due(rounds: int, every, checkpoint_every: int = 10) -> list[int]:
    return [r for r in range(1, rounds + 1) if epsilon_due(r, rounds, every, checkpoint_every)]


def test_auto_is_the_powers_of_two_the_checkpoints_and_the_last_round():
    assert due(40, "auto") == [1, 2, 4, 8, 10, 16, 20, 30, 32, 40]
    assert due(7, "auto", checkpoint_every=3) == [1, 2, 3, 4, 6, 7]
    assert due(3, 2) == [2, 3] and due(10, 3) == [3, 6, 9, 10] and due(5, 1) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("value", [0, -1, 2.0, "every", True, None])
def test_anything_else_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="run.epsilon_every"):
        check_epsilon_every(value)


def test_results_between_scheduled_rounds_carry_null_until_the_run_ends():
    """Written after round 3 of 5 at run.epsilon_every = 2: the row and, mid-run, final's epsilon are null (nothing
    accounted); the results written at the end (``exact``) carry the ledger's epsilon, a fresh ledger's number."""
    config = load_config(None, ["algorithm.name='dp-fedavg'", "data.num_clients=8", "data.samples_per_client=20",
                                "algorithm.rounds=5", "run.epsilon_every=2", "run.noise_seed=0"])
    sim = build_simulation(config)
    history = sim.run(3)  # a run of 3 rounds: its last round reports epsilon
    assert [m.epsilon is None for m in history] == [True, False, False]
    reported = history[-1].epsilon
    sim.history[-1] = sim.evaluate(epsilon=False)  # as round 3 of the 5-round run reports it
    mid = results_of(sim, resolve(config), exact=False)
    assert mid["rounds"][-1]["epsilon"] is None and mid["final"]["epsilon"] is None
    end = results_of(sim, resolve(config))
    expected = sim.ledger.epsilon_curve([3])[3]
    assert end["final"]["epsilon"] == {o: None if math.isinf(e) else e for o, e in expected.items()}
    assert 0 < end["final"]["epsilon"]["third_party"] == reported["third_party"]
