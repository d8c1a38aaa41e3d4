"""The ghost strategy on convolutional stacks (dpfl.engine.ghost): exact per-example norms and clipped sums, equal to
torch.func's per-example gradients (the vmap strategy) and to the one-example-at-a-time definition, through both of a
convolution's norm routes (its materialised layer gradient, its Gram matrices), and the models it takes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dpfl.engine import ghost
from dpfl.engine.grads import CohortGradients, default_strategy, memory_per_example
from dpfl.models import Image, build_model

from clipped_reference import hand_clipped_sum

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLIENTS, BATCH, CLASSES = 3, 5, 4


def gram_model() -> nn.Module:
    """A convolution on 2 x 2 images: T = 4 positions, 72-wide unfolded input, 16 outputs, so its Gram matrices (4 x
    4) cost less than its per-example gradient (16 x 72): the ghost identity's route."""
    return nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, CLASSES))


MODELS = {
    "femnist-cnn": (lambda: build_model("femnist-cnn", (12, 12), CLASSES), (12, 12)),
    "papernot-cnn": (lambda: build_model("papernot-cnn", (16, 16), CLASSES), (16, 16)),
    "gram": (gram_model, (8, 2, 2)),
    "no Image, valid padding, average pooling": (lambda: nn.Sequential(
        nn.Conv2d(2, 3, 3, padding="valid", bias=False), nn.AvgPool2d(2), nn.Tanh(), nn.Flatten(-3),
        nn.Linear(3 * 3 * 3, 6), nn.ReLU(), nn.Linear(6, CLASSES)), (2, 8, 8)),
}


def cohort(name: str, seed: int = 1):
    build, shape = MODELS[name]
    torch.manual_seed(0)
    model = build()
    g = torch.Generator().manual_seed(seed)
    reference = CohortGradients(model, "vmap", chunk_bytes=None)
    theta = reference.initial_params() + 0.1 * torch.randn(CLIENTS, reference.num_params, generator=g)
    x = torch.randn(CLIENTS, BATCH, *shape, generator=g)
    y = torch.randint(0, CLASSES, (CLIENTS, BATCH), generator=g)
    mask = torch.ones(CLIENTS, BATCH)
    mask[1, 3:] = 0.0
    mask[2, 1:] = 0.0
    return model, reference, theta, x, y, mask


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("clip", [None, 0.05, "per client"])
def test_ghost_is_the_per_example_gradients_of_torch_func(name, clip):
    model, reference, theta, x, y, mask = cohort(name)
    grads = CohortGradients(model, "ghost")
    clip = torch.tensor([0.05, 1.0, 0.01]) if clip == "per client" else clip
    expected = reference.clipped_sum(theta, x, y, mask, clip) if clip is not None else \
        torch.einsum("cb,cbp->cp", mask, reference._per_example_grads(theta, x, y))  # vmap's None: one per client
    assert torch.allclose(grads.clipped_sum(theta, x, y, mask, clip), expected, rtol=1e-4, atol=1e-6)
    assert torch.allclose(grads.example_norms(theta, x, y, mask), reference.example_norms(theta, x, y, mask),
                          rtol=1e-4, atol=1e-6)


def test_ghost_is_the_definition_one_example_at_a_time():
    """sum_j clip(grad l(theta_i; x_ij, y_ij)) with torch.autograd, client by client and example by example."""
    model, _, theta, x, y, mask = cohort("femnist-cnn")
    grads = CohortGradients(model, "ghost")
    expected = hand_clipped_sum(model, grads, theta, x, y, mask, 0.05)
    assert torch.allclose(grads.clipped_sum(theta, x, y, mask, 0.05), expected, rtol=1e-4, atol=1e-6)


def test_each_convolution_takes_the_cheaper_norm_route():
    for name, materialised in (("femnist-cnn", [True, True]), ("gram", [False])):
        model, _, theta, x, y, mask = cohort(name)
        grads = CohortGradients(model, "ghost")
        layers = ghost.backward(model, grads.unflatten(theta), x, y, mask)
        ghost.sq_norms(layers, CLIENTS)
        assert [layer.grads is not None for layer in layers if isinstance(layer.module, nn.Conv2d)] == materialised


def test_a_callers_loss_runs_through_the_image_layout():
    def smoothed(outputs, labels):
        return F.cross_entropy(outputs, labels, reduction="none", label_smoothing=0.2)

    model, _, theta, x, y, mask = cohort("papernot-cnn")
    got = CohortGradients(model, "ghost", loss=smoothed).clipped_sum(theta, x, y, mask, 0.05)
    want = CohortGradients(model, "vmap", loss=smoothed).clipped_sum(theta, x, y, mask, 0.05)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("model, supported", [
    (build_model("logreg", 6, 3), True), (build_model("mlp", (1, 4, 4), 3), True),
    (build_model("femnist-cnn", (8, 8), 3), True), (build_model("papernot-cnn", (16, 16), 3), True),
    (nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4, 2)), False),
    (nn.Sequential(nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect"), nn.Flatten(), nn.Linear(9, 2)), False),
    (nn.Sequential(nn.Conv2d(1, 1, 4, padding="same"), nn.Flatten(), nn.Linear(9, 2)), False),  # pads 1 then 2
    (nn.Sequential(nn.Conv2d(1, 2, 3), nn.Linear(1, 2)), False),  # a linear layer on an image
    (nn.Sequential(nn.Flatten(), nn.Linear(9, 4), nn.MaxPool2d(2)), False),  # pooling in the dense part
    (nn.Sequential(Image((9,), (1, 3, 3)), nn.Conv2d(1, 2, 3), nn.ReLU()), False),  # no dense part
    (nn.Sequential(nn.Conv2d(1, 2, 3), nn.GroupNorm(1, 2), nn.Flatten(), nn.Linear(2, 2)), False),
    (nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(0), nn.Linear(2, 2)), False),  # flattens across examples
    (nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2, return_indices=True), nn.Flatten(), nn.Linear(2, 2)), False),
])
def test_the_models_it_takes_and_the_default_strategy_on_each_device(model, supported):
    """Dense stacks take ghost everywhere; convolutional ones on a GPU only (CONV_GHOST_DEVICES); the rest vmap."""
    assert ghost.supports(model) == supported
    convolutional = any(isinstance(m, nn.Conv2d) for m in model.modules())
    assert default_strategy(model, "cuda") == ("ghost" if supported else "vmap")
    assert default_strategy(model, "cpu") == ("ghost" if supported and not convolutional else "vmap")
    assert CohortGradients(model).strategy == default_strategy(model, "cpu")


def test_memory_per_example_counts_the_layers_the_pass_holds():
    """A dense stack's estimate is unchanged (the record and 3 (in + 2 out) per linear layer); a CNN's counts its
    convolutions' activations and unfolded inputs, well below the vmap strategy's two parameter-sized vectors."""
    mlp = CohortGradients(build_model("mlp", 100, 10, hidden=(200,)))
    assert memory_per_example(mlp, (100,)) == 4 * (100 + 3 * ((100 + 400) + (200 + 20)))
    cnn = build_model("femnist-cnn", (28, 28), 62)
    ghost_bytes = memory_per_example(CohortGradients(cnn, "ghost"), (28, 28))
    vmap_bytes = memory_per_example(CohortGradients(cnn, "vmap"), (28, 28))
    unfolded = 25 * 784 + 400 * 196  # conv1 and conv2's U: C k k x T
    assert 4 * unfolded < ghost_bytes < vmap_bytes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU (CUDA) on this machine")
@pytest.mark.parametrize("name", list(MODELS))
def test_on_a_gpu_convolutional_stacks_take_ghost_and_give_the_cpus_numbers(name):
    """With TF32 off, to float tolerance (TF32 changes the gradients computed, not the clipping: the norms and the sum
    are read from the same deltas and inputs, in full float32)."""
    model, reference, theta, x, y, mask = cohort(name)
    on_gpu = CohortGradients(copy.deepcopy(model).to("cuda"))
    assert on_gpu.strategy == "ghost"
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        got = on_gpu.clipped_sum(*(t.to("cuda") for t in (theta, x, y, mask)), 0.05).cpu()
    assert torch.allclose(got, reference.clipped_sum(theta, x, y, mask, 0.05), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("conv", [nn.Conv2d(3, 2, 5, padding="same"), nn.Conv2d(3, 2, 3, padding="valid"),
                                  nn.Conv2d(3, 2, 8, stride=2, padding=2), nn.Conv2d(3, 2, 3, padding=2, dilation=2),
                                  nn.Conv2d(3, 2, (3, 5), stride=(2, 1), padding=(1, 2))])
def test_the_unfolded_input_is_im2col(conv):
    h = torch.randn(4, 2 * 3, 13, 11)  # [batch, clients * C, H, W] for 2 clients
    unfolded = ghost.Layer(conv, h).unfolded()
    assert torch.equal(unfolded, F.unfold(h.reshape(8, 3, 13, 11), conv.kernel_size, conv.dilation,
                                          ghost.symmetric_padding(conv), conv.stride))
