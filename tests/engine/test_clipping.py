"""The clip holds for every input (dpfl.engine.clipping): records of huge finite features (1e20 ... 3e38, which the
data checks accept) among normal ones give a finite clipped sum on both strategies and every model kind (dense ghost,
convolutional ghost on both norm routes, vmap); every example's clipped vector, recomputed in float64 from its float32
entries, has norm <= C; an example whose norm is not finite adds exactly 0 and is counted; normal inputs give what
they gave before (bit for bit where the clip does not bite, the former factor times 1 - 2^-20 where it does); a run
with one such record releases a finite model and reports the count in results.json."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dpfl
from dpfl.engine import ghost
from dpfl.engine.device import full_float32_matmuls
from dpfl.engine.grads import CohortGradients
from dpfl.models import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLIENTS, BATCH, CLASSES, CLIP = 3, 6, 3, 0.5
HUGE = (1e20, -1e30, 1e38, 3e38)
MODELS = {
    "logreg": (lambda: build_model("logreg", 5, CLASSES), (5,)),
    "mlp": (lambda: build_model("mlp", 5, CLASSES, hidden=(6, 4), activation="relu"), (5,)),
    "femnist-cnn": (lambda: build_model("femnist-cnn", (12, 12), CLASSES), (12, 12)),
    "gram": (lambda: nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, CLASSES)),
             (8, 2, 2)),  # a convolution whose Gram matrices are the cheaper norm route (tests/engine/test_ghost.py)
}
PATHS = [(name, strategy) for name in MODELS for strategy in ("ghost", "vmap")]


def cohort(name: str, strategy: str, huge: bool = True):
    """A model, its CohortGradients and a cohort of 3 clients x 6 records; with ``huge``, client 0's records 1..4
    have every feature equal to one of ``HUGE`` and client 2's record 0 is 3e38 (the rest are normal)."""
    build, shape = MODELS[name]
    torch.manual_seed(0)
    grads = CohortGradients(build(), strategy, chunk_bytes=None)
    g = torch.Generator().manual_seed(1)
    theta = grads.initial_params() + 0.1 * torch.randn(CLIENTS, grads.num_params, generator=g)
    x = torch.randn(CLIENTS, BATCH, *shape, generator=g)
    if huge:
        for j, value in enumerate(HUGE):
            x[0, 1 + j] = value
        x[2, 0] = 3e38
    y = torch.randint(0, CLASSES, (CLIENTS, BATCH), generator=g)
    mask = torch.ones(CLIENTS, BATCH)
    mask[1, 4:] = 0.0
    return grads, theta, x, y, mask


def one_by_one(grads, theta, x, y, clip):
    """[clients, batch, P]: each example's clipped vector (a batch of one: the clipped sum is that vector)."""
    return torch.stack([grads.clipped_sum(theta, x[:, j : j + 1], y[:, j : j + 1], torch.ones(CLIENTS, 1), clip)
                        for j in range(x.shape[1])], dim=1)


@pytest.mark.parametrize("name, strategy", PATHS)
def test_huge_records_add_at_most_c_each_and_non_finite_ones_add_zero(name, strategy):
    grads, theta, x, y, mask = cohort(name, strategy)
    total = grads.clipped_sum(theta, x, y, mask, CLIP)
    assert torch.isfinite(total).all()
    zeroed = grads.take_nonfinite_examples()
    vectors = one_by_one(grads, theta, x, y, CLIP)
    assert torch.isfinite(vectors).all()
    assert (vectors.double().norm(dim=-1) <= CLIP).all()  # the float32 vector's norm, recomputed in float64
    norms = grads.example_norms(theta, x, y, torch.ones(CLIENTS, BATCH))
    non_finite = ~torch.isfinite(norms)
    huge = torch.zeros(CLIENTS, BATCH, dtype=torch.bool)
    huge[0, 1:5] = huge[2, 0] = True
    assert non_finite.any() and not (non_finite & ~huge).any()  # some huge records; never a normal one
    assert zeroed == int((non_finite & (mask > 0)).sum())  # counted among the real examples only
    assert grads.take_nonfinite_examples() == int(non_finite.sum())  # the one-by-one calls: every example is real
    assert grads.take_nonfinite_examples() == 0  # taking resets
    assert (vectors[non_finite] == 0).all()
    finite = ~non_finite
    assert (vectors[finite & (norms > CLIP)].double().norm(dim=-1) > CLIP * (1 - 1e-5)).all()  # clipped, not zeroed
    # the sum is that of the other examples: a zeroed example adds exactly 0
    assert torch.equal(total, grads.clipped_sum(theta, x, y, mask * finite, CLIP))


@pytest.mark.parametrize("name, strategy", PATHS)
def test_a_huge_record_changes_only_its_own_clients_row(name, strategy):
    """Client 0 holds the records of HUGE; clients 1 and 2 get the sums they get without them."""
    grads, theta, x, y, mask = cohort(name, strategy)
    _, _, normal, _, _ = cohort(name, strategy, huge=False)
    normal[2, 0] = x[2, 0]
    assert torch.equal(grads.clipped_sum(theta, x, y, mask, CLIP)[1:],
                       grads.clipped_sum(theta, normal, y, mask, CLIP)[1:])


@pytest.mark.parametrize("name, strategy", PATHS)
def test_normal_records_give_what_they_gave_before(name, strategy):
    """Where the clip does not bite (C above every norm) the weights are exactly the mask, as before: the sum is the
    unclipped one bit for bit; where it bites, each vector is the former min(1, C / ||g||) g times 1 - 2^-20."""
    grads, theta, x, y, mask = cohort(name, strategy, huge=False)
    norms = grads.example_norms(theta, x, y, mask)
    not_biting = float(norms.max()) * 2
    assert torch.equal(grads.clipped_sum(theta, x, y, mask, not_biting), unclipped(grads, theta, x, y, mask))
    clip = float(norms[mask > 0].median())
    raw = one_by_one(grads, theta, x, y, None)
    former = raw * torch.clamp(clip / (raw.norm(dim=-1, keepdim=True) + 1e-12), max=1.0)
    factor = torch.where(raw.norm(dim=-1, keepdim=True) > clip, 1 - 2**-20, 1.0)
    assert (factor < 1).any() and (factor == 1).any()
    error = (one_by_one(grads, theta, x, y, clip) - former * factor).double().norm(dim=-1)
    assert (error <= 1e-6 * clip).all()  # float32 rounding of the vector (the margin itself is 5e-7 C)
    assert grads.take_nonfinite_examples() == 0


def unclipped(grads, theta, x, y, mask):
    """The former clipped sum where every factor min(1, C / ||g||) is 1: each strategy's sum with weights = mask, the
    vmap strategy's over its per-example gradients (its clip None takes one gradient per client instead), the ghost
    strategy's after its norms (which materialise a convolution's per-example gradient for the sum to read)."""
    if grads.strategy == "vmap":
        return torch.einsum("cb,cbp->cp", mask, grads._per_example_grads(theta, x, y))
    with full_float32_matmuls():
        layers = ghost.backward(grads.model, grads.unflatten(theta), x, y, mask)
        ghost.sq_norms(layers, CLIENTS)
        return ghost.weighted_sum(layers, mask)


def test_clipped_examples_zero_and_count_the_non_finite_ones():
    """The shuffle-DP families' per-example vectors (vmap): norm <= C each, 0 where the norm is not finite."""
    grads, theta, x, y, mask = cohort("mlp", "vmap")
    vectors = grads.clipped_examples(theta, x, y, mask, CLIP)
    assert torch.isfinite(vectors).all() and (vectors.double().norm(dim=-1) <= CLIP).all()
    non_finite = ~torch.isfinite(grads.example_norms(theta, x, y, torch.ones(CLIENTS, BATCH))) & (mask > 0)
    assert non_finite.any() and (vectors[non_finite] == 0).all()
    assert grads.take_nonfinite_examples() == int(non_finite.sum())


def test_a_run_with_one_huge_record_releases_a_finite_model_and_reports_the_count(tmp_path):
    """Every client's every record in every step (client_rate = sample_rate = 1): the record of features 1e20 is in
    each of the 2 rounds' 3 local steps, and its squared norm overflows float32, so 3 examples a round are zeroed."""
    rng = torch.Generator().manual_seed(0)
    x = torch.randn(80, 4, generator=rng)
    y = (x[:, 0] > 0).long()
    x[7] = 1e20
    config = {"algorithm": {"name": "dp-fedavg", "rounds": 2, "client_rate": 1.0, "local_steps": 3,
                            "sample_rate": 1.0, "noise_multiplier": 1.0, "clip": 1.0, "lr": 1.0},
              "data": {"num_clients": 4}, "run": {"noise_seed": 0}}
    results = dpfl.run(config, data=(x.numpy(), y.numpy()), out=tmp_path / "run")
    assert results.status == "finished"
    assert [r["nonfinite_examples"] for r in results.rounds] == [3, 3]
    assert results.final["nonfinite_examples"] == 3
    released = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["state"]["server"]["x"]
    assert released.shape == (4 * 2 + 2,) and torch.isfinite(released).all()
    assert results.final["train_loss"] < 0.7  # it learned from the other 79 records
