"""The gradient mapping metric: ||G_eta(w)||^2, G_eta(w) = (w - prox_{eta f1}(w - eta grad F0(w))) / eta (Lowy et
al. 2023, Sec. 1), on the pooled train data at every evaluation, for the algorithms with a prox step."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

SMALL = ("data.num_clients=3", "data.samples_per_client=30", "algorithm.rounds=2", "algorithm.client_rate=1.0")


def simulation(*overrides):
    return build_simulation(load_config(None, [*SMALL, *overrides]))


def pooled_gradient(sim, x: torch.Tensor) -> torch.Tensor:
    """grad F0(x), the mean cross-entropy over every train record, by autograd on the model."""
    features, labels = sim.train.flat()
    theta = x.detach().clone().requires_grad_()
    F.cross_entropy(functional_call(sim.grads.model, sim.grads.unflatten(theta), (features,)), labels).backward()
    return theta.grad


@pytest.mark.parametrize("name", ["isrl-mb-sgd", "isrl-spider-alt", "isrl-prox-svrg"])
def test_without_f1_it_is_the_squared_norm_of_the_train_gradient(name):
    sim = simulation(f"algorithm.name='{name}'", "privacy.epsilon=2.0")
    history = sim.run(2)
    assert [m.gradient_mapping is not None for m in history] == [True, True]
    expected = float(pooled_gradient(sim, sim.model).double().square().sum())
    assert expected > 0
    assert history[-1].gradient_mapping == pytest.approx(expected, rel=1e-5)
    assert history[-1].to_dict()["gradient_mapping"] == history[-1].gradient_mapping


class FixedGradient:
    """A gradient oracle whose train gradient is ``g`` at every point."""

    def __init__(self, g):
        self.g = torch.tensor(g, dtype=torch.float64)

    def mean_loss_gradient(self, x, pieces):
        return self.g


@pytest.mark.parametrize("w, g, expected", [
    ((0.0, 0.0), (3.0, 4.0), 25.0),  # interior: w - eta g = (-0.3, -0.4) stays in the ball, G = g
    ((1.0, 0.0), (3.0, 4.0), 25.0),  # boundary, stepping inwards: (0.7, -0.4) in the ball, G = g
    ((1.0, 0.0), (-3.0, 0.0), 0.0),  # boundary, -grad the outward normal: stationary, prox(1.3, 0) = (1, 0)
    # boundary, oblique: z = (1.3, -0.4), prox = z / ||z||, ||G||^2 = (1 - 2 <w, z>/||z|| + 1) / eta^2
    ((1.0, 0.0), (-3.0, 4.0), (2.0 - 2.6 / math.sqrt(1.85)) / 0.01),
])
def test_an_l2_ball_at_interior_and_boundary_points(w, g, expected):
    sim = simulation("algorithm.name='isrl-spider-alt'", "privacy.epsilon=2.0", "algorithm.lr=0.1",
                     "algorithm.regularizer='l2_ball'", "algorithm.radius=1.0")
    sim.grads = FixedGradient(g)
    assert sim.gradient_mapping(torch.tensor(w, dtype=torch.float64)) == pytest.approx(expected, abs=1e-12)


def test_the_isrl_step_is_the_server_prox_step():
    """isrl-local-sgd's prox after K local steps of size eta is prox_{K eta f1}: its G uses K eta."""
    sim = simulation("algorithm.name='isrl-local-sgd'", "privacy.epsilon=2.0", "algorithm.lr=0.1",
                     "algorithm.local_steps=3", "algorithm.regularizer='l1'", "algorithm.reg_strength=1.0")
    f1, eta = sim.algorithm.composite
    assert f1.name == "l1" and eta == pytest.approx(3 * 0.1)


def test_an_algorithm_without_a_prox_step_reports_none():
    sim = simulation("algorithm.name='dp-fedavg'", "algorithm.noise_multiplier=1.0")
    (metrics,) = sim.run(1)
    assert metrics.gradient_mapping is None and "gradient_mapping" not in metrics.to_dict()
