"""The models' shapes: the papers' parameter counts, and clear refusals."""

import pytest
import torch

from dpfl.engine.grads import CohortGradients
from dpfl.errors import ConfigError
from dpfl.models import build_model


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_zhou_et_al_models_have_the_papers_parameter_counts():
    """Zhou et al. 2021, Sec. VI: logistic regression without bias on MNIST (784 x 10) and the FEMNIST CNN."""
    assert count(build_model("logreg", 784, 10, bias=False)) == 7_840
    assert count(build_model("logreg", 784, 10)) == 7_850
    cnn = build_model("femnist-cnn", 784, 62)
    assert [count(m) for m in cnn if count(m)] == [416, 12_832, 97_278] and count(cnn) == 110_526


def test_the_cnn_runs_on_digits_and_its_per_example_gradients_are_clipped():
    grads = CohortGradients(build_model("femnist-cnn", 64, 10))
    theta = grads.initial_params().unsqueeze(0).expand(2, -1)
    x, y = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(0)), torch.tensor([[0, 1, 2], [3, 4, 5]])
    total = grads.clipped_sum(theta, x, y, torch.ones(2, 3), 0.5)
    assert total.shape == (2, 32 * 2 * 2 * 10 + 10 + 416 + 12_832) and float(total.norm(dim=1).max()) <= 1.5 + 1e-5


def test_the_cnn_refuses_features_that_are_not_a_square_image():
    with pytest.raises(ConfigError, match="shape \\[30\\]: femnist-cnn takes images"):
        build_model("femnist-cnn", 30, 2)


def test_papernots_cnn_has_the_papers_parameter_count_and_clipped_per_example_gradients():
    """Papernot et al. 2021's Fashion-MNIST CNN, as Heikkilä et al. use it: 26,010 parameters for 28 x 28 x 10."""
    cnn = build_model("papernot-cnn", 784, 10)
    assert [count(m) for m in cnn if count(m)] == [1_040, 8_224, 16_416, 330] and count(cnn) == 26_010
    grads = CohortGradients(cnn)
    theta = grads.initial_params().unsqueeze(0).expand(2, -1)
    x, y = torch.randn(2, 3, 784, generator=torch.Generator().manual_seed(0)), torch.tensor([[0, 1, 2], [3, 4, 5]])
    total = grads.clipped_sum(theta, x, y, torch.ones(2, 3), 0.5)
    assert total.shape == (2, 26_010) and float(total.norm(dim=1).max()) <= 1.5 + 1e-5
    with pytest.raises(ConfigError, match="8 x 8 images: papernot-cnn needs images of at least 16 x 16"):
        build_model("papernot-cnn", 64, 10)
    assert count(build_model("papernot-cnn", (1, 16, 16), 10)) == 1_040 + 8_224 + 32 * 32 + 32 + 330


def test_the_cnns_read_image_shaped_records_as_they_are_and_flat_ones_as_square_images():
    """[C, H, W] records keep their channels; [H, W] and F = s^2 flat features are one-channel s x s images; the
    same pixels give the same logits whichever way they come."""
    for name in ("femnist-cnn", "papernot-cnn"):
        torch.manual_seed(0)
        flat = build_model(name, 784, 10)
        torch.manual_seed(0)
        square = build_model(name, (28, 28), 10)
        pixels = torch.randn(5, 784, generator=torch.Generator().manual_seed(1))
        assert torch.equal(flat(pixels), square(pixels.reshape(5, 28, 28)))
        colour = build_model(name, (3, 32, 32), 10)
        assert colour[1].in_channels == 3 and colour(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert count(build_model("femnist-cnn", (3, 32, 32), 10)) == 3 * 25 * 16 + 16 + 12_832 + 32 * 64 * 10 + 10


@pytest.mark.parametrize("name", ["logreg", "mlp"])
def test_dense_models_flatten_image_records_and_keep_ghost_clipping_exact(name):
    """A dense model on [C, H, W] records is the same model as on their flat pixels: same parameters, same logits,
    and the ghost clipped sum equals the per-example (vmap) one."""
    torch.manual_seed(0)
    on_images = build_model(name, (2, 3, 3), 4, hidden=(5,)) if name == "mlp" else build_model(name, (2, 3, 3), 4)
    torch.manual_seed(0)
    on_flat = build_model(name, 18, 4, hidden=(5,)) if name == "mlp" else build_model(name, 18, 4)
    x = torch.randn(2, 3, 2, 3, 3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(on_images(x[0]), on_flat(x[0].reshape(3, 18)))
    ghost, vmap = CohortGradients(on_images), CohortGradients(on_images, strategy="vmap")
    assert ghost.strategy == "ghost"
    theta = ghost.initial_params().unsqueeze(0).expand(2, -1)
    y, mask = torch.tensor([[0, 1, 2], [3, 0, 1]]), torch.ones(2, 3)
    torch.testing.assert_close(ghost.clipped_sum(theta, x, y, mask, 0.3), vmap.clipped_sum(theta, x, y, mask, 0.3))
    loss, accuracy = ghost.loss_and_accuracy(theta[0], x[0], y[0])
    assert loss > 0 and 0 <= accuracy <= 1
