import json

import numpy as np
import torch

from dpfl.data.synthetic import NUM_CLASSES, NUM_FEATURES, generate_synthetic, synthetic_dataset


def _dominant_label_fraction(y: np.ndarray) -> float:
    """Mean over clients of the share of the client's most frequent label (1/C when balanced, 1 when pure)."""
    return float(np.mean([np.bincount(y_i, minlength=NUM_CLASSES).max() / len(y_i) for y_i in y]))


def _label_distance_to_global(y: np.ndarray) -> float:
    """Mean over clients of the total-variation distance between its label histogram and the global one."""
    client = np.stack([np.bincount(y_i, minlength=NUM_CLASSES) / len(y_i) for y_i in y])
    pooled = np.bincount(y.ravel(), minlength=NUM_CLASSES) / y.size
    return float(0.5 * np.abs(client - pooled).sum(axis=1).mean())


def test_shapes_counts_and_provenance():
    dataset = synthetic_dataset(20, 50, 1.0, 1.0, seed=0)
    assert dataset.train.x.shape == (20, 40, NUM_FEATURES) and dataset.test.x.shape == (20, 10, NUM_FEATURES)
    assert dataset.train.counts.tolist() == [40] * 20 and dataset.test.counts.tolist() == [10] * 20
    assert dataset.num_classes == 10 and dataset.num_features == 40 and dataset.num_clients == 20
    assert dataset.train.x.dtype == torch.float32 and dataset.train.y.dtype == torch.int64
    assert 0 <= int(dataset.train.y.min()) and int(dataset.train.y.max()) < 10
    info = json.loads(json.dumps(dataset.info))
    assert info["generator"]["alpha"] == 1.0 and info["partition"]["scheme"] == "natural"
    standardize_step = info["preprocessing"][0]
    assert standardize_step["scope"] == "none" and standardize_step["private"] is True
    client = synthetic_dataset(20, 50, 1.0, 1.0, seed=0, standardize_scope="client").info["preprocessing"][0]
    assert client["private"] is False and "training split" in client["statistics"]


def test_every_point_has_unit_norm():
    dataset = synthetic_dataset(10, 30, 5.0, 5.0, seed=1)
    for split in (dataset.train, dataset.test):
        x, _ = split.flat()
        assert torch.allclose(x.norm(dim=1), torch.ones(len(x)), atol=1e-5)


def test_deterministic_in_seed():
    first, again, other = (synthetic_dataset(5, 20, 1.0, 1.0, seed=s) for s in (7, 7, 8))
    assert torch.equal(first.train.x, again.train.x) and torch.equal(first.test.y, again.test.y)
    assert not torch.equal(first.train.x, other.train.x)


def test_label_noise_replaces_five_percent_by_uniform_classes():
    clean_x, clean_y = generate_synthetic(100, 1000, 1.0, 1.0, np.random.default_rng(0), label_noise=0.0)
    x, y = generate_synthetic(100, 1000, 1.0, 1.0, np.random.default_rng(0))
    assert np.array_equal(clean_x, x)
    # A replaced label keeps its class with probability 1/10: 0.05 * 0.9 = 4.5% change.
    assert abs(np.mean(y != clean_y) - 0.045) < 0.004


def test_inputs_follow_the_generator_moments():
    # x ~ N(v_i, Sigma): within a client feature j has variance j^-1.2; client means v_i ~ N(0, (1 + beta) I).
    for beta in (0.0, 5.0):
        x, _ = generate_synthetic(200, 200, 0.0, beta, np.random.default_rng(2))
        client_means = x.mean(axis=1)
        assert abs(client_means.var() / (1 + beta) - 1) < 0.06
        within = (x - client_means[:, None, :]).var(axis=(0, 1))
        assert np.allclose(within, np.arange(1, 41) ** -1.2, rtol=0.05)


def test_beta_drives_label_heterogeneity_and_alpha_does_not():
    def labels(alpha, beta):
        return generate_synthetic(400, 100, alpha, beta, np.random.default_rng(3))[1]

    at_00, at_50, at_05, at_55 = labels(0, 0), labels(5, 0), labels(0, 5), labels(5, 5)
    # Measured (seed 3): dominant-label share ~0.75 at (0,0) and (5,0), ~0.86 at (0,5) and (5,5).
    assert _dominant_label_fraction(at_55) > _dominant_label_fraction(at_00) + 0.07
    assert _label_distance_to_global(at_55) > _label_distance_to_global(at_00) + 0.04
    assert abs(_dominant_label_fraction(at_05) - _dominant_label_fraction(at_55)) < 0.03
    assert abs(_dominant_label_fraction(at_50) - _dominant_label_fraction(at_00)) < 0.03
    # Even at (0,0) users are far from iid: each has its own independent W_i, b_i.
    assert _dominant_label_fraction(at_00) > 0.5


def test_paper_size_has_the_papers_shape():
    """M = 100 users of R = 5000 records, 40 features, 80/20 split (its time: benchmarks/data_speed.py)."""
    dataset = synthetic_dataset(100, 5000, 5.0, 5.0, seed=0)
    assert dataset.train.x.shape == (100, 4000, 40) and dataset.test.x.shape == (100, 1000, 40)
