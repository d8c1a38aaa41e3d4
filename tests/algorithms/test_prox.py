"""The proximal operators are exact: closed-form values, and prox optimality checked numerically (the prox point
minimises eta f1(y) + ||y - z||^2 / 2 better than every perturbation of it, and the subgradient condition holds)."""

import math

import pytest
import torch

from dpfl.algorithms.prox import REGULARIZERS, Regularizer, soft_threshold
from dpfl.errors import ConfigError

Z = torch.tensor([3.0, -0.2, 0.05, -2.5, 0.0], dtype=torch.float64)
ETA = 0.5


def objective(reg: Regularizer, y: torch.Tensor, z: torch.Tensor, eta: float) -> float:
    """eta f1(y) + ||y - z||^2 / 2, the indicators' sets tested exactly (``value`` allows float32 round-off)."""
    if reg.name == "l2_ball":
        f1 = 0.0 if float(y.norm()) <= reg.radius * (1 + 1e-12) else math.inf
    elif reg.name == "box":
        f1 = 0.0 if float(y.abs().max()) <= reg.radius else math.inf
    else:
        f1 = reg.value(y)
    return eta * f1 + 0.5 * float((y - z).square().sum())


def test_closed_forms():
    assert torch.allclose(Regularizer("none").prox(Z, ETA), Z)
    assert Regularizer("l1", 1.0).prox(Z, ETA).tolist() == pytest.approx([2.5, 0.0, 0.0, -2.0, 0.0])
    assert Regularizer("l2", 2.0).prox(Z, ETA).tolist() == pytest.approx((Z / 2.0).tolist())
    # lambda = 2, alpha = 0.25: soft(z, 0.5 * 0.5) / (1 + 0.5 * 1.5)
    assert Regularizer("elastic_net", 2.0, 0.25).prox(Z, ETA).tolist() == pytest.approx(
        [2.75 / 1.75, 0.0, 0.0, -2.25 / 1.75, 0.0])
    ball = Regularizer("l2_ball", radius=1.0).prox(Z, ETA)
    assert float(ball.norm()) == pytest.approx(1.0)
    assert torch.allclose(ball, Z / Z.norm())
    inside = torch.tensor([0.3, -0.4], dtype=torch.float64)
    assert torch.equal(Regularizer("l2_ball", radius=1.0).prox(inside, ETA), inside)
    assert Regularizer("box", radius=1.0).prox(Z, ETA).tolist() == pytest.approx([1.0, -0.2, 0.05, -1.0, 0.0])
    assert soft_threshold(torch.tensor([-1.0, 1.0]), 2.0).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("reg", [Regularizer("none"), Regularizer("l1", 0.7), Regularizer("l2", 1.3),
                                 Regularizer("elastic_net", 1.1, 0.4), Regularizer("l2_ball", radius=0.8),
                                 Regularizer("box", radius=0.6)], ids=lambda r: r.name)
def test_prox_is_the_minimiser(reg):
    """No random perturbation (projected back into the set for indicators) beats the prox point."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(200, 6, generator=gen, dtype=torch.float64) * 2
    p = reg.prox(z, ETA)
    for row in range(z.shape[0]):
        best = objective(reg, p[row], z[row], ETA)
        assert math.isfinite(best)
        for scale in (1e-1, 1e-3):
            trial = p[row] + scale * torch.randn(20, 6, generator=gen, dtype=torch.float64)
            for y in trial:
                assert objective(reg, y, z[row], ETA) >= best - 1e-12


def test_subgradient_optimality_of_elastic_net():
    """(z - p) / eta is in the subdifferential of f1 at p: lambda alpha sign(p) + lambda (1 - alpha) p where p != 0,
    and |.| <= lambda alpha where p = 0."""
    reg = Regularizer("elastic_net", 1.5, 0.3)
    z = torch.linspace(-3, 3, 61, dtype=torch.float64)
    p = reg.prox(z, ETA)
    residual = (z - p) / ETA
    nonzero = p != 0
    assert torch.allclose(residual[nonzero], reg.l1 * torch.sign(p[nonzero]) + reg.l2 * p[nonzero])
    assert bool((residual[~nonzero].abs() <= reg.l1 + 1e-12).all())
    assert int((~nonzero).sum()) > 0 and int(nonzero.sum()) > 0


def test_rows_are_independent():
    z = torch.tensor([[3.0, 4.0], [0.3, 0.4]], dtype=torch.float64)
    p = Regularizer("l2_ball", radius=1.0).prox(z, ETA)
    assert p.flatten().tolist() == pytest.approx([0.6, 0.8, 0.3, 0.4])


def test_gradient_mapping():
    w = torch.tensor([0.5, -0.1], dtype=torch.float64)
    g = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert torch.allclose(Regularizer("none").gradient_mapping(w, g, 0.1), g)
    # L1 with lambda = 1, eta = 0.1: prox(w - 0.1 g) = soft([0.4, -0.3], 0.1) = [0.3, -0.2]; G = (w - p) / 0.1
    assert Regularizer("l1", 1.0).gradient_mapping(w, g, 0.1).tolist() == pytest.approx([2.0, 1.0])
    # F0 = (w - 0.2)^2 / 2 and f1 = |w|: w* = 0 is stationary (|F0'(0)| = 0.2 <= 1), so G = 0 there and only there
    zero = torch.zeros(1, dtype=torch.float64)
    assert float(Regularizer("l1", 1.0).gradient_mapping(zero, zero - 0.2, 0.3).abs()) == 0.0
    assert float(Regularizer("l1", 1.0).gradient_mapping(zero + 0.5, zero + 0.3, 0.3).abs()) > 0


@pytest.mark.parametrize("kwargs, field", [({"name": "l3"}, "algorithm.regularizer"),
                                           ({"strength": -1.0}, "algorithm.reg_strength"),
                                           ({"l1_ratio": 1.5}, "algorithm.l1_ratio"),
                                           ({"radius": 0.0}, "algorithm.radius")])
def test_bad_parameters_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        Regularizer(**kwargs)


def test_every_regularizer_is_tested():
    assert set(REGULARIZERS) == {"none", "l1", "l2", "elastic_net", "l2_ball", "box"}
