"""The Dirac canary's gradient oracle (dpfl.audit.canary)."""

import pytest
import torch

from dpfl.audit import canary


def test_dirac_canary_adds_exactly_plus_minus_or_zero_c_along_an_untouched_coordinate(make_sim):
    sim = make_sim(1.0, 1e-5, 3)
    base, grads = sim.grads, canary.DiracCanaryGradients(sim.grads)
    x0 = grads.initial_params()
    assert x0.shape[0] == base.initial_params().shape[0] + 1 and grads.coordinate == x0.shape[0] - 1
    assert x0[-1] == 0
    theta = torch.randn(3, x0.shape[0])
    x, y = sim.train.x[:3], sim.train.y[:3]
    mask = torch.ones(y.shape)
    clip = torch.tensor([0.5, 1.0, 2.0])
    plain = grads.clipped_sum(theta, x, y, mask, clip)
    assert torch.equal(plain[:, -1], torch.zeros(3))  # no real record touches e
    assert torch.allclose(plain[:, :-1], base.clipped_sum(theta[:, :-1], x, y, mask, clip))
    for label, sign in canary.SIGNS.items():
        marked = canary.mark(y, 1, 0, label)
        out = grads.clipped_sum(theta, x, marked, mask, clip)
        assert out[:, -1].tolist() == pytest.approx([0.0, sign * 1.0, 0.0])
        # the marked record's own model gradient is replaced, not added to
        unmarked = mask.clone()
        unmarked[1, 0] = 0
        assert torch.allclose(out[:, :-1], base.clipped_sum(theta[:, :-1], x, y, unmarked, clip), atol=1e-6)
    loud = canary.DiracCanaryGradients(base, scale=10.0)
    assert loud.clipped_sum(theta, x, canary.mark(y, 1, 0, canary.CANARY), mask, clip)[1, -1] == pytest.approx(10.0)


def test_neighbour_follows_the_relation():
    assert canary.neighbour_mark("replace_one") == canary.OPPOSITE
    assert canary.neighbour_mark("add_remove") == canary.ABSENT
    with pytest.raises(ValueError):
        canary.neighbour_mark("replace_all")


def test_many_dirac_canaries_each_move_their_own_coordinate(make_sim):
    sim = make_sim(1.0, 1e-5, 2)
    base = sim.grads
    grads = canary.ManyDiracCanaryGradients(base, torch.tensor([1.0, -1.0, 0.0]))
    P = base.initial_params().shape[0]
    x0 = grads.initial_params()
    assert x0.shape[0] == P + 3 and torch.equal(x0[P:], torch.zeros(3))
    theta = torch.randn(2, P + 3)
    x, y = sim.train.x[:2], sim.train.y[:2].clone()
    mask = torch.ones(y.shape)
    plain = grads.clipped_sum(theta, x, y, mask, 2.0)
    assert torch.equal(plain[:, P:], torch.zeros(2, 3))
    y[0, 0], y[0, 1], y[1, 0] = canary.FIRST_OF_MANY, canary.FIRST_OF_MANY - 2, canary.FIRST_OF_MANY - 1
    out = grads.clipped_sum(theta, x, y, mask, 2.0)
    assert out[:, P:].tolist() == [[2.0, 0.0, 0.0], [0.0, -2.0, 0.0]]
    unmarked = mask.clone()
    unmarked[0, :2] = 0
    unmarked[1, 0] = 0
    assert torch.allclose(out[:, :P], base.clipped_sum(theta[:, :P], x, sim.train.y[:2], unmarked, 2.0), atol=1e-6)
