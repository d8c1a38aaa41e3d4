"""CohortGradients: clipped per-example gradient sums (ghost and vmap), evaluation, parameter flattening."""

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dpfl.engine import ghost
from dpfl.engine.device import full_float32_matmuls
from dpfl.engine.grads import CohortGradients, memory_per_example
from dpfl.errors import ConfigError
from dpfl.models import build_model

from clipped_reference import hand_clipped_sum
import survivors

CLIENTS, BATCH, FEATURES, CLASSES = 3, 5, 4, 3


def make_model(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "logreg":
        return build_model("logreg", FEATURES, CLASSES)
    return build_model("mlp", FEATURES, CLASSES, hidden=(6, 5), activation="tanh")


def cohort(seed: int = 1, num_params: int = 0, scale: float = 1.0):
    """Per-client parameters (perturbed copies), inputs, labels and a mask with some padding."""
    g = torch.Generator().manual_seed(seed)
    theta = scale * torch.randn(CLIENTS, num_params, generator=g)
    x = 2.0 * torch.randn(CLIENTS, BATCH, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (CLIENTS, BATCH), generator=g)
    mask = torch.ones(CLIENTS, BATCH)
    mask[1, 3:] = 0.0  # client 1 has 3 real examples
    mask[2, 1:] = 0.0  # client 2 has 1
    return theta, x, y, mask


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("clip", [None, 0.3, 100.0])
def test_ghost_and_vmap_agree(kind, clip):
    model = make_model(kind)
    ghost, vm = CohortGradients(model, "ghost"), CohortGradients(model, "vmap")
    theta, x, y, mask = cohort(num_params=ghost.num_params)
    a = ghost.clipped_sum(theta, x, y, mask, clip)
    b = vm.clipped_sum(theta, x, y, mask, clip)
    assert a.shape == (CLIENTS, ghost.num_params)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
@pytest.mark.parametrize("clip", [None, 0.3])
def test_clipped_sum_equals_hand_loop(kind, strategy, clip):
    model = make_model(kind)
    grads = CohortGradients(model, strategy)
    theta, x, y, mask = cohort(num_params=grads.num_params)
    expected = hand_clipped_sum(make_model(kind), grads, theta, x, y, mask, clip)
    got = grads.clipped_sum(theta, x, y, mask, clip)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # the clip really bites in this case: the clipped sum differs from the plain one
    if clip is not None:
        plain = grads.clipped_sum(theta, x, y, mask, None)
        assert (got - plain).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
def test_each_clipped_example_has_norm_at_most_clip(kind, strategy):
    model = make_model(kind)
    grads = CohortGradients(model, strategy)
    theta, x, y, _ = cohort(num_params=grads.num_params, scale=2.0)
    clip = 0.25
    raw_norms, clipped_norms = [], []
    for j in range(BATCH):  # a batch of one example: the sum is that example's clipped gradient
        xb, yb, mb = x[:, j : j + 1], y[:, j : j + 1], torch.ones(CLIENTS, 1)
        raw_norms.append(grads.clipped_sum(theta, xb, yb, mb, None).norm(dim=1))
        clipped_norms.append(grads.clipped_sum(theta, xb, yb, mb, clip).norm(dim=1))
    raw, clipped = torch.stack(raw_norms), torch.stack(clipped_norms)
    assert (clipped <= clip * (1 + 1e-5)).all()
    big = raw > clip
    assert big.any() and (~big).any()  # both cases occur
    torch.testing.assert_close(clipped[big], torch.full_like(clipped[big], clip), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(clipped[~big], raw[~big], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_clipped_examples_are_each_within_the_clip_even_for_huge_gradients(kind, strategy, scale):
    assert_each_example_within_the_clip(kind, strategy, scale)


def assert_each_example_within_the_clip(kind: str, strategy: str, scale: float) -> None:
    """``clipped_examples`` (the shuffle-DP families' local randomiser input, one vector per example): every
    example's vector has l2 norm <= C, also when the raw gradients are 10^4 times larger (inputs scaled up); the ones
    the clip bites are scaled to exactly C along their own direction, the others pass unchanged; a masked example is
    0; and the vectors add up to ``clipped_sum``. (A ``clipped_examples`` that skips the clip passes every other test
    of the shuffle-DP path: the randomiser's l-inf clamp hides it while the accounting assumes the l2 ball.)"""
    model = make_model(kind)
    grads = CohortGradients(model, strategy)
    theta, x, y, mask = cohort(num_params=grads.num_params, scale=2.0)
    x = scale * x
    clip = 0.25
    vectors = grads.clipped_examples(theta, x, y, mask, clip)
    raw = grads.clipped_examples(theta, x, y, mask, float("inf"))  # min(1, C / ||g||) = 1: the raw gradients
    assert vectors.shape == (CLIENTS, BATCH, grads.num_params)
    norms, raw_norms = vectors.norm(dim=-1), raw.norm(dim=-1)
    real = mask > 0
    assert (norms <= clip * (1 + 1e-5)).all()
    assert (vectors[~real] == 0).all()
    big = real & (raw_norms > clip)
    assert big.any() and (real & ~big).any()  # both cases occur (saturated softmaxes give exact zeros)
    assert raw_norms.max() > (20 if scale > 1 else 2) * clip  # the clip bites hard
    torch.testing.assert_close(norms[big], torch.full_like(norms[big], clip), rtol=1e-5, atol=1e-7)
    direction = (vectors[big] * raw[big]).sum(-1) / (norms[big] * raw_norms[big])
    torch.testing.assert_close(direction, torch.ones_like(direction), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vectors[real & ~big], raw[real & ~big])
    torch.testing.assert_close(vectors.sum(1), grads.clipped_sum(theta, x, y, mask, clip), rtol=1e-4,
                               atol=1e-5 * clip)


def test_the_per_example_clip_test_catches_examples_left_unclipped(monkeypatch):
    survivors.unclipped_examples(monkeypatch)
    with pytest.raises(AssertionError):
        assert_each_example_within_the_clip("logreg", "vmap", 1e4)


@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
def test_masked_examples_contribute_nothing(strategy):
    model = make_model("mlp")
    grads = CohortGradients(model, strategy)
    theta, x, y, mask = cohort(num_params=grads.num_params)
    before = grads.clipped_sum(theta, x, y, mask, 0.5)
    x2, y2 = x.clone(), y.clone()
    x2[mask == 0] = 100.0
    y2[mask == 0] = (y2[mask == 0] + 1) % CLASSES
    after = grads.clipped_sum(theta, x2, y2, mask, 0.5)
    torch.testing.assert_close(after, before, atol=1e-6, rtol=1e-6)
    # a client whose mask is all zero gets a zero sum
    mask0 = mask.clone()
    mask0[0] = 0.0
    assert grads.clipped_sum(theta, x, y, mask0, 0.5)[0].abs().max() == 0


@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
def test_example_norms(strategy):
    model = make_model("mlp")
    grads = CohortGradients(model, strategy)
    theta, x, y, mask = cohort(num_params=grads.num_params)
    norms = grads.example_norms(theta, x, y, mask)
    assert norms.shape == (CLIENTS, BATCH)
    expected = torch.zeros(CLIENTS, BATCH)
    for j in range(BATCH):
        one = grads.clipped_sum(theta, x[:, j : j + 1], y[:, j : j + 1], torch.ones(CLIENTS, 1), None)
        expected[:, j] = one.norm(dim=1)
    torch.testing.assert_close(norms, expected * mask, atol=1e-5, rtol=1e-5)
    assert (norms[mask == 0] == 0).all()
    l1 = grads.example_norms(theta, x, y, mask, norm="l1")
    assert ((l1 >= norms - 1e-6) & (l1 <= norms * grads.num_params**0.5 + 1e-6)).all()


@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
def test_per_client_clip_tensor(strategy):
    model = make_model("mlp")
    grads = CohortGradients(model, strategy)
    theta, x, y, mask = cohort(num_params=grads.num_params)
    bounds = torch.tensor([0.05, 0.3, 2.0])
    got = grads.clipped_sum(theta, x, y, mask, bounds)
    for c in range(CLIENTS):
        alone = grads.clipped_sum(theta[c : c + 1], x[c : c + 1], y[c : c + 1], mask[c : c + 1], float(bounds[c]))
        torch.testing.assert_close(got[c], alone[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
def test_l1_clipping(strategy):
    model = make_model("mlp")
    grads = CohortGradients(model, strategy)
    theta, x, y, mask = cohort(num_params=grads.num_params, scale=2.0)
    clip = 0.2
    for j in range(BATCH):
        xb, yb, mb = x[:, j : j + 1], y[:, j : j + 1], torch.ones(CLIENTS, 1)
        g = grads.clipped_sum(theta, xb, yb, mb, clip, norm="l1")
        assert (g.abs().sum(dim=1) <= clip * (1 + 1e-5)).all()
    expected = hand_clipped_sum(make_model("mlp"), grads, theta, x, y, mask, clip, norm="l1")
    torch.testing.assert_close(grads.clipped_sum(theta, x, y, mask, clip, norm="l1"), expected, atol=1e-5, rtol=1e-5)
    # l1 clipping is stricter than l2 clipping at the same C (||g||_1 >= ||g||_2)
    l2 = grads.clipped_sum(theta, x, y, mask, clip, norm="l2")
    assert not torch.allclose(l2, expected, atol=1e-4)


def test_bad_arguments():
    model = make_model("logreg")
    with pytest.raises(ValueError, match="strategy"):
        CohortGradients(model, "fast")
    grads = CohortGradients(model)
    theta, x, y, mask = cohort(num_params=grads.num_params)
    with pytest.raises(ValueError, match="norm"):
        grads.clipped_sum(theta, x, y, mask, 1.0, norm="linf")


def test_strategy_defaults():
    assert CohortGradients(make_model("logreg")).strategy == "ghost"
    assert CohortGradients(make_model("mlp")).strategy == "ghost"

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(FEATURES, CLASSES)
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x):
            return self.scale * self.lin(x)

    custom = Custom()
    assert CohortGradients(custom).strategy == "vmap"
    with pytest.raises(ValueError, match="ghost"):
        CohortGradients(custom, "ghost")
    # a Sequential with a parametrised non-linear module is not a linear stack either
    with pytest.raises(ValueError, match="ghost"):
        CohortGradients(nn.Sequential(nn.Linear(FEATURES, 4), nn.LayerNorm(4), nn.Linear(4, CLASSES)), "ghost")


def test_vmap_on_custom_model_matches_hand_loop():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(FEATURES, CLASSES)
            self.scale = nn.Parameter(torch.tensor([1.5]))

        def forward(self, x):
            return self.scale * torch.tanh(self.lin(x))

    torch.manual_seed(0)
    model = Custom()
    grads = CohortGradients(model)
    theta, x, y, mask = cohort(num_params=grads.num_params)
    expected = hand_clipped_sum(Custom(), grads, theta, x, y, mask, 0.3)
    torch.testing.assert_close(grads.clipped_sum(theta, x, y, mask, 0.3), expected, atol=1e-5, rtol=1e-5)


def test_loss_and_accuracy_hand_made():
    model = build_model("logreg", 2, 3)
    grads = CohortGradients(model)
    # W = [[1, 0], [0, 1], [-1, -1]], b = [0, 0.5, 0]
    theta = torch.tensor([1.0, 0.0, 0.0, 1.0, -1.0, -1.0, 0.0, 0.5, 0.0])
    x = torch.tensor([[2.0, 0.0], [0.0, 2.0], [-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]])
    y = torch.tensor([0, 1, 2, 0, 1])
    logits = x @ theta[:6].reshape(3, 2).T + theta[6:]
    expected_loss = float(F.cross_entropy(logits, y))
    predictions = logits.argmax(-1)
    assert predictions.tolist() == [0, 1, 2, 1, 1]  # the hand-made case: 4 of 5 right
    for chunk in (65536, 2, 1):
        loss, accuracy = grads.loss_and_accuracy(theta, x, y, chunk=chunk)
        assert loss == pytest.approx(expected_loss, rel=1e-6)
        assert accuracy == pytest.approx(0.8)
    # an explicit value: logits of the last example are [0, 0.5, 0] -> loss log(2 + e^0.5) - 0.5
    loss, accuracy = grads.loss_and_accuracy(theta, x[4:], y[4:])
    assert loss == pytest.approx(torch.log(torch.tensor(2.0) + torch.exp(torch.tensor(0.5))).item() - 0.5, rel=1e-6)
    assert accuracy == 1.0


def test_initial_params_and_unflatten_round_trip():
    model = make_model("mlp")
    grads = CohortGradients(model)
    flat = grads.initial_params()
    named = dict(model.named_parameters())
    assert flat.shape == (grads.num_params,) == (sum(p.numel() for p in model.parameters()),)
    assert list(grads.unflatten(flat)) == list(named)
    for name, tensor in grads.unflatten(flat).items():
        assert torch.equal(tensor, named[name].detach())
    # a copy, not a view of the model's parameters
    flat[0] += 1.0
    assert not torch.equal(grads.unflatten(flat)[grads.names[0]], named[grads.names[0]].detach())
    # leading dimensions are kept and the round trip is exact
    stacked = torch.randn(2, 3, grads.num_params)
    parts = grads.unflatten(stacked)
    for name, shape in zip(grads.names, grads.shapes):
        assert parts[name].shape == (2, 3, *shape)
    assert torch.equal(torch.cat([p.reshape(2, 3, -1) for p in parts.values()], dim=-1), stacked)


def test_memory_per_example_positive_and_ghost_smaller():
    model = build_model("mlp", 100, 10, hidden=(200,))
    ghost, vm = CohortGradients(model, "ghost"), CohortGradients(model, "vmap")
    assert 0 < memory_per_example(ghost, (100,)) < memory_per_example(vm, (100,))
    assert memory_per_example(vm, (100,)) == 4 * (100 + 2 * vm.num_params)


def smoothed(outputs, labels):
    """A caller's per-example loss: cross-entropy with label smoothing 0.2."""
    return F.cross_entropy(outputs, labels, reduction="none", label_smoothing=0.2)


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
def test_a_callers_loss_is_the_one_differentiated(kind, strategy):
    """A caller's per-example loss goes through both strategies: its clipped sums are those of the definition (one
    example at a time, autograd), and cross-entropy given as a loss gives the default's sums."""
    model = make_model(kind)
    default, given = CohortGradients(model, strategy), CohortGradients(model, strategy, loss=smoothed)
    theta, x, y, mask = cohort(num_params=given.num_params)
    expected = torch.zeros_like(theta)
    for c in range(CLIENTS):
        for j in range(BATCH):
            if mask[c, j]:
                g = torch.func.grad(lambda t: smoothed(torch.func.functional_call(
                    model, given.unflatten(t), (x[c, j : j + 1],)), y[c, j : j + 1]).sum())(theta[c])
                expected[c] += g / max(1.0, float(g.norm()) / 0.3)
    torch.testing.assert_close(given.clipped_sum(theta, x, y, mask, 0.3), expected, atol=1e-5, rtol=1e-5)
    plain = CohortGradients(model, strategy, loss=lambda o, t: F.cross_entropy(o, t, reduction="none"))
    torch.testing.assert_close(plain.clipped_sum(theta, x, y, mask, 0.3), default.clipped_sum(theta, x, y, mask, 0.3))
    loss, _ = given.loss_and_accuracy(theta[0], x[0], y[0])
    assert loss == pytest.approx(float(smoothed(torch.func.functional_call(model, given.unflatten(theta[0]), (x[0],)),
                                                y[0]).mean()), rel=1e-6)


@pytest.mark.parametrize("layer, named", [(nn.BatchNorm1d(6), "1 (BatchNorm1d)"), (nn.Dropout(0.1), "1 (Dropout)")])
def test_layers_without_per_example_gradients_are_refused_by_name(layer, named):
    with pytest.raises(ConfigError, match=rf"model = '{re.escape(named)}' is not allowed") as refused:
        CohortGradients(nn.Sequential(nn.Linear(FEATURES, 6), layer, nn.Linear(6, CLASSES)))
    assert refused.value.field == "model"
    CohortGradients(nn.Sequential(nn.Linear(FEATURES, 6), nn.Dropout(0.1).eval(), nn.Linear(6, CLASSES)))  # no draws


# -- the vmap strategy's chunks of clients ---------------------------------------------------------------------------
def conv_cohort(clients: int = 4, batch: int = 6):
    """femnist-cnn on 12 x 12 one-channel images of 5 classes (4,385 parameters): per-client perturbed parameters."""
    torch.manual_seed(0)
    model = build_model("femnist-cnn", (12, 12), 5)
    grads = CohortGradients(model, "vmap", chunk_bytes=None)
    g = torch.Generator().manual_seed(3)
    theta = grads.initial_params() + 0.05 * torch.randn(clients, grads.num_params, generator=g)
    x = torch.randn(clients, batch, 12, 12, generator=g)
    y = torch.randint(0, 5, (clients, batch), generator=g)
    mask = torch.ones(clients, batch)
    mask[1, 4:] = 0.0
    return model, grads, theta, x, y, mask


@pytest.mark.parametrize("per_call", [1, 3])
def test_a_chunked_cohort_of_a_conv_model_agrees_with_the_unchunked_one(per_call):
    """Chunks of 1 and 3 of 4 clients (the last chunk shorter): the same clipped sums, clipped examples and norms to
    float tolerance, with a per-client clip split along with its clients; and the unchunked call is the hand loop."""
    model, whole, theta, x, y, mask = conv_cohort()
    chunked = CohortGradients(model, "vmap", chunk_bytes=per_call * 4 * x.shape[1] * whole.num_params)
    assert whole.strategy == chunked.strategy == "vmap"
    assert chunked.clients_per_call(theta, x) == per_call and whole.clients_per_call(theta, x) == 4
    clip = torch.tensor([0.05, 1.0, 0.2, 5.0])
    expected = hand_clipped_sum(model, whole, theta, x, y, mask, 0.3)
    assert torch.allclose(whole.clipped_sum(theta, x, y, mask, 0.3), expected, rtol=1e-4, atol=1e-6)
    for call in (lambda g: g.clipped_sum(theta, x, y, mask, clip), lambda g: g.clipped_sum(theta, x, y, mask, 0.3),
                 lambda g: g.clipped_sum(theta, x, y, mask, None, norm="l1"),
                 lambda g: g.clipped_examples(theta, x, y, mask, 0.3), lambda g: g.example_norms(theta, x, y, mask)):
        got, want = call(chunked), call(whole)
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-7)


def test_on_the_cpu_chunks_are_sized_to_chunk_bytes_and_elsewhere_the_cohort_is_one_call():
    _, grads, theta, x, _, _ = conv_cohort(clients=8, batch=10)
    per_client = 4 * 10 * grads.num_params
    sized = CohortGradients(grads.model, "vmap", chunk_bytes=3 * per_client + 7)
    assert sized.clients_per_call(theta, x) == 3
    assert CohortGradients(grads.model, "vmap", chunk_bytes=1).clients_per_call(theta, x) == 1  # at least one client
    assert sized.clients_per_call(theta.to("meta"), x.to("meta")) == 8  # not the CPU (a GPU): the whole cohort


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU (CUDA) on this machine")
def test_the_vmap_strategy_on_a_gpu_is_the_cpus():
    """femnist-cnn's clipped sums, clipped examples and norms computed on a GPU (the whole cohort in one call) are
    the CPU's (in chunks) to float tolerance, with TF32 off (its 2^-11 rounding is the
    only difference torch's default CUDA settings would add: clipping acts on the gradients computed, so TF32 changes
    the gradient, not the sensitivity)."""
    model, grads, theta, x, y, mask = conv_cohort()
    on_gpu = CohortGradients(build_model("femnist-cnn", (12, 12), 5).to("cuda"), "vmap")
    on_gpu.model.load_state_dict(model.state_dict())
    gpu = [t.to("cuda") for t in (theta, x, y, mask)]
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False), full_float32_matmuls():
        for name, args in (("clipped_sum", (0.3,)), ("clipped_examples", (0.3,)), ("example_norms", ())):
            got, want = getattr(on_gpu, name)(*gpu, *args).cpu(), getattr(grads, name)(theta, x, y, mask, *args)
            assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_the_ghost_sum_and_norms_are_full_float32_products_whatever_the_users_setting(precision, monkeypatch):
    """Under a user's TF32 / bfloat16 matmul setting the ghost strategy's norms and sum still run at "highest" (its
    sensitivity holds to float32 rounding: ``dpfl.engine.device.full_float32_matmuls``), and the setting is restored."""
    grads = CohortGradients(make_model("mlp"), "ghost")
    theta, x, y, mask = cohort(num_params=grads.num_params)
    expected = grads.clipped_sum(theta, x, y, mask, 0.5)
    seen = []
    inner = ghost.weighted_sum
    monkeypatch.setattr(ghost, "weighted_sum",
                        lambda *args, **kwargs: seen.append(torch.get_float32_matmul_precision())
                        or inner(*args, **kwargs))
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        got = grads.clipped_sum(theta, x, y, mask, 0.5)
        assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen == ["highest"] and torch.equal(got, expected)
