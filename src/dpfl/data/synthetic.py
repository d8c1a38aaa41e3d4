"""The synthetic (alpha, beta) federated classification data of Li et al. 2020 (FedProx, Sec. 5.1), in the variant
used by DP-SCAFFOLD (Noble, Bellet, Dieuleveut 2022, Sec. 5 and its public code).

For each user i (10 classes, d' = 40 features):
  u_i ~ N(0, alpha I) (40 x 10),  W_i ~ N(u_i, I);   u'_i ~ N(0, alpha I_10),  b_i ~ N(u'_i, I)
  B_i ~ N(0, beta I_40),          v_i ~ N(B_i, I)
  x ~ N(v_i, Sigma), Sigma diagonal with Sigma_jj = j^-1.2;  y = argmax softmax(x W_i + b_i)
  each label is then replaced, with probability 0.05, by a class drawn uniformly (so ~4.5% of labels change).
alpha and beta are variances: alpha controls how much users' models differ, beta how much their inputs differ.
(Li et al. draw scalar u_i and B_i; DP-SCAFFOLD's code draws the matrix / vector forms above, which we follow.)
Note that alpha does not change the distribution of the data in either form: each user's u_i is independent of the
others', so W_i ~ N(0, (1 + alpha) I) and b_i ~ N(0, (1 + alpha) I) are only rescaled together, and the argmax is
scale invariant (in Li et al.'s scalar form u_i shifts every logit equally). Heterogeneity between users comes from
beta (inputs v_i ~ N(0, (1 + beta) I) dominate the class-independent covariance, concentrating each user's labels)
and from the independent W_i, b_i of every user, already at alpha = beta = 0 (tests measure both).

Each user's R records are split 80/20 into train and test; then features are standardised and every point is
scaled to unit L2 norm. By default each client standardises with the statistics of its OWN training split: a
non-private preprocessing of the client's own data that releases nothing to the server or the other silos (see
``dpfl.data.preprocess``; the choice is recorded in ``info``).
"""

from __future__ import annotations

import numpy as np
import torch

from dpfl.data.federated import ClientArrays, FederatedDataset, num_test_records
from dpfl.data.preprocess import describe_standardize, standardize, unit_norm

NUM_FEATURES = 40
NUM_CLASSES = 10
LABEL_NOISE = 0.05
FEATURE_VARIANCES = np.arange(1, NUM_FEATURES + 1, dtype=np.float64) ** -1.2


def generate_synthetic(
    num_clients: int,
    samples_per_client: int,
    alpha: float,
    beta: float,
    rng: np.random.Generator,
    label_noise: float = LABEL_NOISE,
) -> tuple[np.ndarray, np.ndarray]:
    """Raw records of every user: x [M, R, 40] float32 and y [M, R] int64, before split and preprocessing.

    The random draws happen in the same order whatever ``label_noise`` is, so the same generator state with
    ``label_noise=0`` yields the clean labels of the same data.
    """
    m, r, d, c = num_clients, samples_per_client, NUM_FEATURES, NUM_CLASSES
    weights = np.sqrt(alpha) * rng.standard_normal((m, d, c)) + rng.standard_normal((m, d, c))
    biases = np.sqrt(alpha) * rng.standard_normal((m, c)) + rng.standard_normal((m, c))
    input_means = np.sqrt(beta) * rng.standard_normal((m, d)) + rng.standard_normal((m, d))
    x = rng.standard_normal((m, r, d), dtype=np.float32)
    x *= np.sqrt(FEATURE_VARIANCES).astype(np.float32)
    x += input_means[:, None, :].astype(np.float32)
    logits = torch.bmm(torch.from_numpy(x), torch.from_numpy(weights.astype(np.float32)))
    y = (logits + torch.from_numpy(biases.astype(np.float32))[:, None, :]).argmax(dim=-1).numpy()  # softmax is monotone
    replaced = rng.random((m, r)) < label_noise
    uniform_labels = rng.integers(0, c, size=(m, r))
    return x, np.where(replaced, uniform_labels, y).astype(np.int64)


def _stacked(x: np.ndarray, y: np.ndarray) -> ClientArrays:
    """ClientArrays of clients that all hold the same number of records (no padding)."""
    counts = torch.full((x.shape[0],), x.shape[1], dtype=torch.int64)
    return ClientArrays(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(y.copy()), counts)


def synthetic_dataset(
    num_clients: int,
    samples_per_client: int,
    alpha: float,
    beta: float,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    standardize_scope: str = "none",
) -> FederatedDataset:
    """The FedProx synthetic (alpha, beta) data of ``num_clients`` users with ``samples_per_client`` records each.

    Deterministic in ``seed`` (a numpy Generator). Parameters are assumed valid (``build_dataset`` checks them).
    """
    rng = np.random.default_rng(seed)
    x, y = generate_synthetic(num_clients, samples_per_client, alpha, beta, rng)
    # A user's records are iid given its parameters, so its first records already form a uniformly random split.
    num_train = samples_per_client - num_test_records(samples_per_client, test_fraction)
    train_xs, test_xs = standardize(x[:, :num_train], x[:, num_train:], standardize_scope)
    train = _stacked(np.stack([unit_norm(x_i) for x_i in train_xs]), y[:, :num_train])
    test = _stacked(np.stack([unit_norm(x_i) for x_i in test_xs]), y[:, num_train:])
    info = {
        "source": "Li et al. 2020 (FedProx) synthetic, DP-SCAFFOLD variant (Noble et al. 2022)",
        "generator": {
            "alpha": alpha,
            "beta": beta,
            "num_features": NUM_FEATURES,
            "num_classes": NUM_CLASSES,
            "label_noise": LABEL_NOISE,
            "feature_variances": "j^-1.2, j = 1..40",
        },
        "num_clients": num_clients,
        "samples_per_client": samples_per_client,
        "partition": {"scheme": "natural", "param": None, "note": "each generated user is one client"},
        "split": {"test_fraction": test_fraction, "per_client": True},
        "preprocessing": [describe_standardize(standardize_scope), {"step": "unit_l2_norm", "private": True}],
        "seed": seed,
    }
    return FederatedDataset(
        train=train,
        test=test,
        num_classes=NUM_CLASSES,
        name="synthetic",
        info=info,
    )


__all__ = ["NUM_FEATURES", "NUM_CLASSES", "LABEL_NOISE", "generate_synthetic", "synthetic_dataset"]
