"""The options behind the Noble, Bellet, Dieuleveut (2022) cause experiment (``dpfl.papers.noble2022.causes``), on tiny
data: the authors' min-max preprocessing, cohort-shared noise, and the per-tensor clip's whole-model equivalent."""

import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event

from dpfl.algorithms.local_sgd import LocalSGD
from dpfl.data.preprocess import noble2022_minmax, standardize
from dpfl.data.synthetic import synthetic_dataset
from dpfl.engine.grads import CohortGradients
from dpfl.engine.protocol import ClientContext
from dpfl.engine.randomness import ClientStreams
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.papers.noble2022.causes import SWITCHES, authors_lr, overrides, per_tensor_equivalent, report
from dpfl.models import build_model
from dpfl.noise import GaussianMechanism

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def authors_loop(train: list[list[float]], test: list[list[float]]) -> None:
    """The authors' rescaling as their generator runs it, in place on lists: for each feature, the bounds of the
    training record of that index (already rescaled in its earlier features)."""
    for dim in range(len(train[0])):
        low, high = min(train[dim]), max(train[dim])
        for record in train + test:
            record[dim] = (record[dim] - low) / (high - low)


def test_noble2022_minmax_is_the_authors_in_place_loop():
    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(12, 5)) * 3 + 1, rng.normal(size=(4, 5))
    ours_train, ours_test = noble2022_minmax(train, test)
    theirs_train, theirs_test = train.tolist(), test.tolist()
    authors_loop(theirs_train, theirs_test)
    np.testing.assert_allclose(ours_train, theirs_train, rtol=1e-12)
    np.testing.assert_allclose(ours_test, theirs_test, rtol=1e-12)


def test_the_authors_preprocessing_gives_unit_norm_rows_unlike_raw_features():
    data = synthetic_dataset(4, 60, 5.0, 5.0, standardize_scope="noble2022-minmax")
    raw = synthetic_dataset(4, 60, 5.0, 5.0)
    for split in (data.train, data.test):
        np.testing.assert_allclose(split.x.norm(dim=-1).numpy(), 1.0, atol=1e-5)
    assert not torch.allclose(data.train.x, raw.train.x)
    assert data.info["preprocessing"][0]["scope"] == "noble2022-minmax"


def test_the_authors_preprocessing_needs_as_many_records_as_features():
    x = np.ones((3, 5))
    with pytest.raises(ConfigError) as refused:
        standardize([x], [x], "noble2022-minmax")
    assert refused.value.field == "data.standardize"


def local_sgd(sharing: str) -> LocalSGD:
    return LocalSGD(local_steps=2, lr=0.1, sampler=RecordSampler(0.5), mechanism=GaussianMechanism(1.0), clip=1.0,
                    noise_sharing=sharing)


def test_a_bad_noise_sharing_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as refused:
        local_sgd("per-round")
    assert refused.value.field == "algorithm.noise_sharing"


def test_cohort_shared_noise_is_the_same_for_every_client_and_not_private():
    with pytest.warns(UserWarning, match="NOT differentially private"):
        shared = local_sgd("cohort-nonprivate")
    grads = CohortGradients(build_model("logreg", 3, 2))
    draws = shared.standard_normal(ClientContext(grads, 7, 3, torch.tensor([0, 4, 9])), 3, (2, 5))
    alone = shared.standard_normal(ClientContext(grads, 7, 3, torch.tensor([9])), 1, (2, 5))  # another chunking
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2]) and torch.equal(alone[0], draws[0])
    assert shared.step_noise_event == dp_event.NonPrivateDpEvent()


def test_independent_noise_is_each_clients_own_stream():
    independent = local_sgd("independent")
    grads = CohortGradients(build_model("logreg", 3, 2))
    draws = independent.standard_normal(ClientContext(grads, 7, 3, torch.tensor([0, 4])), 2, (2, 5))
    assert torch.equal(draws[1], ClientStreams(7, 3, [4], "noise").normal((2, 5))[0])
    assert not torch.equal(draws[0], draws[1])
    assert independent.step_noise_event == dp_event.GaussianDpEvent(1.0)


def per_example_gradients(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example gradients of softmax regression with bias at a random point: weight [N, C, d], bias [N, C]."""
    torch.manual_seed(1)
    weight, bias = torch.randn(3, x.shape[1]), torch.randn(3)
    residual = torch.softmax(x @ weight.T + bias, dim=1) - torch.nn.functional.one_hot(y, 3)
    return residual[:, :, None] * x[:, None, :], residual


def clip(g: torch.Tensor, bound: float) -> torch.Tensor:
    norms = g.flatten(1).norm(dim=1).reshape(-1, *[1] * (g.dim() - 1))
    return g * torch.clamp(bound / norms, max=1.0)


def test_per_tensor_clip_on_unit_norm_records_is_the_whole_model_clip_at_c_sqrt_p():
    x = torch.nn.functional.normalize(torch.randn(20, 4), dim=1)
    weight, bias = per_example_gradients(x, torch.randint(0, 3, (20,)))
    c = 0.3
    whole_clip, multiplier = per_tensor_equivalent(10.0, c)
    assert (whole_clip, multiplier) == pytest.approx((c * math.sqrt(2), 10.0 / math.sqrt(2)))
    per_tensor = [clip(weight, c), clip(bias, c)]
    assert max(float(g.flatten(1).norm(dim=1).max()) for g in per_tensor) <= c * (1 + 1e-6)  # each tensor bounded
    whole = clip(torch.cat([weight.flatten(1), bias], dim=1), whole_clip)
    torch.testing.assert_close(whole, torch.cat([per_tensor[0].flatten(1), per_tensor[1]], dim=1))
    # noise multiplier * 2C per tensor is multiplier / sqrt(P) times the whole clip's sensitivity 2 C sqrt(P)
    assert multiplier * 2 * whole_clip == pytest.approx(10.0 * 2 * c)


def test_all_switches_reach_the_config():
    chosen = overrides(SWITCHES["all"], 10.0, 5, 1.0)
    config = load_config(None, chosen)
    assert config["data"]["standardize"] == "noble2022-minmax"
    assert config["algorithm"]["clip_heuristic"] == "median-nonprivate"
    assert config["algorithm"]["noise_sharing"] == "cohort-nonprivate"
    assert config["algorithm"]["noise_multiplier"] == pytest.approx(10.0 / math.sqrt(2))
    assert load_config(None, overrides(SWITCHES["baseline"], 10.0, 5, 1.0))["algorithm"]["clip"] == 1.0


def test_report_sets_each_cell_beside_the_paper():
    cell = {"last10": 50.0, "lr": 1.0, "rounds": 488}
    table = report({"baseline": {key: cell for key in ("10,1", "10,5", "10,20", "10,40", "40,10")}})
    assert "| 10, 5 (488) | 45.53 | 50.0 (eta0 1) |" in table


@pytest.mark.parametrize("k, factor", [(1, 0.2), (5, 1.0), (10, 1.0), (40, 1.0)])
def test_authors_lr_gives_their_local_step(k, factor):
    """Their local step is eta0 / max(round(s K), 1): dpfl's eta0' / (s K) equals it; only K = 1 differs (s K = 0.2
    rounds to 0)."""
    assert authors_lr(0.5, k) == pytest.approx(0.5 * factor)
    assert authors_lr(0.5, k) / (0.2 * k) == pytest.approx(0.5 / max(round(0.2 * k), 1))
