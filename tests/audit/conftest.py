"""Small audited configurations: FedSGD, one local step, full batches (s = 1), every client every round."""

import pytest
from scipy import optimize

from dpfl.accounting.theory import gdp_epsilon


def noise_for(epsilon: float, delta: float) -> float:
    """The noise multiplier z of a single Gaussian release (mu = 1/z) with PLD epsilon ``epsilon`` at ``delta``."""
    return 1 / optimize.brentq(lambda mu: gdp_epsilon(mu, delta) - epsilon, 1e-3, 10)


def overrides(noise: float, delta: float, clients: int = 1, *extra) -> list[str]:
    return [f"data.num_clients={clients}", "data.samples_per_client=20", "algorithm.name='dp-fedsgd'",
            "algorithm.local_steps=1", "algorithm.sample_rate=1.0", "algorithm.client_rate=1.0",
            f"algorithm.noise_multiplier={noise!r}", f"privacy.delta={delta!r}", "algorithm.rounds=1",
            "algorithm.lr=1.0", "algorithm.weight_decay=0.0",  # eta0 as before issue 35's default (0.1)
            "run.noise_seed=0", *extra]  # reproducible trials, as `dpfl audit`


@pytest.fixture
def make_sim():
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import build_simulation

    def make(noise: float, delta: float, clients: int = 1, *extra):
        return build_simulation(load_config(None, overrides(noise, delta, clients, *extra)))

    return make
