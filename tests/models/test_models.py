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
    with pytest.raises(ConfigError, match="square images"):
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
    with pytest.raises(ConfigError, match="28 x 28"):
        build_model("papernot-cnn", 64, 10)
