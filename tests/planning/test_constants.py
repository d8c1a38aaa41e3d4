"""Estimating Zhou et al.'s constants from data (non-private): logistic regression with weight decay on tiny data,
where mu, lambda and the gradient bounds are known in closed form, and the optima are checked with scipy."""

import math

import numpy as np
import pytest
import scipy.optimize
import torch

from dpfl.data.federated import ClientArrays, FederatedDataset
from dpfl.models import build_model
from dpfl.planning.constants import estimate_constants

WEIGHT_DECAY = 0.1


def dataset(xs, ys) -> FederatedDataset:
    arrays = ClientArrays.from_lists(xs, ys)
    return FederatedDataset(arrays, arrays, num_classes=2, name="tiny", info={})


def binary_data(seed=0, clients=3, records=15, features=3):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(loc=i, size=(records, features)).astype(np.float32) for i in range(clients)]
    ys = [(rng.random(records) < 0.3 + 0.2 * i).astype(np.int64) for i in range(clients)]
    return xs, ys


def zero_logreg(features):
    model = build_model("logreg", features, 2)
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    return model


def numpy_risk(theta, x, y, features):
    """Regularised mean cross-entropy of 2-class logistic regression (nn.Linear order: weight [2, f], bias [2])."""
    W, b = theta[: 2 * features].reshape(2, features), theta[2 * features:]
    logits = x @ W.T + b
    logits = logits - logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    residual = np.exp(log_p)
    residual[np.arange(len(y)), y] -= 1
    gradient = np.concatenate([(residual.T @ x).ravel(), residual.sum(0)]) / len(y) + WEIGHT_DECAY * theta
    return -log_p[np.arange(len(y)), y].mean() + 0.5 * WEIGHT_DECAY * theta @ theta, gradient


def numpy_optimum(x, y, features):
    result = scipy.optimize.minimize(numpy_risk, np.zeros(2 * features + 2), args=(x, y, features), jac=True,
                                     method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10_000})
    return result.x, result.fun


def test_logistic_regression_constants_match_closed_forms_and_scipy(one_torch_thread):
    features = 3
    xs, ys = binary_data(features=features)
    est = estimate_constants(dataset(xs, ys), zero_logreg(features), WEIGHT_DECAY, steps=5)
    x_all, y_all = np.concatenate(xs).astype(np.float64), np.concatenate(ys)
    x_tilde = np.hstack([x_all, np.ones((len(x_all), 1))])
    # mu: the softmax is invariant to adding one vector to both classes' weights, so the cross-entropy Hessian is
    # singular everywhere and mu = w. lambda: for 2 classes the Hessian is (p1 p2) [[1, -1], [-1, 1]] (x) E[x~ x~^T],
    # largest at theta = 0 (p1 p2 = 1/4), the start: lambda = w + lambda_max(E[x~ x~^T]) / 2.
    assert est.mu == pytest.approx(WEIGHT_DECAY, abs=1e-8)
    second_moment = x_tilde.T @ x_tilde / len(x_tilde)
    assert est.lam == pytest.approx(WEIGHT_DECAY + np.linalg.eigvalsh(second_moment).max() / 2, rel=1e-8)
    # per-sample gradient (p - e_y) x~^T: at theta = 0 ||p - e_y||_1 = 1 and ||.||_2 = 1/sqrt 2; never above 2, sqrt 2
    l1, l2 = np.abs(x_tilde).sum(1).max(), np.linalg.norm(x_tilde, axis=1).max()
    assert l1 <= est.xi1 <= 2 * l1 and l2 / math.sqrt(2) <= est.xi2 <= math.sqrt(2) * l2
    # Y0 = ||theta_0 - theta*||^2 = ||theta*||^2, Gamma = F* - sum_i (d_i/d) F_i*, against scipy's optima
    theta_star, F_star = numpy_optimum(x_all, y_all, features)
    client_optima = [numpy_optimum(x.astype(np.float64), y, features)[1] for x, y in zip(xs, ys)]
    assert est.Y0 == pytest.approx(theta_star @ theta_star, rel=1e-6)
    assert est.Gamma == pytest.approx(F_star - np.mean(client_optima), abs=1e-9)  # equal client sizes
    assert est.Gamma > 1e-3  # the clients differ
    # G >= the largest client gradient norm at theta_0 = 0 (the run's first point)
    start = max(np.linalg.norm(numpy_risk(np.zeros(2 * features + 2), x.astype(np.float64), y, features)[1])
                for x, y in zip(xs, ys))
    assert est.G >= start * (1 - 1e-9)
    assert (est.p, est.d) == (2 * features + 2, (15, 15, 15)) and len(est.Lambda) == 3


def test_identical_clients_with_repeated_records_have_no_heterogeneity_and_no_variance(one_torch_thread):
    x = np.tile(np.array([[1.0, -2.0]], dtype=np.float32), (4, 1))
    clients = [(x, np.zeros(4, dtype=np.int64))] * 2
    data = dataset([c[0] for c in clients], [c[1] for c in clients])
    torch.manual_seed(0)
    est = estimate_constants(data, build_model("logreg", 2, 2), WEIGHT_DECAY, steps=3)
    assert est.Gamma == pytest.approx(0.0, abs=1e-10)
    assert est.Lambda == pytest.approx((0.0, 0.0), abs=1e-6)


def test_a_loss_without_weight_decay_ends_in_a_clear_error_not_minutes_of_lanczos(one_torch_thread):
    """Without weight decay the Hessian's least eigenvalue is 0 with a cluster of near-zero ones at theta*: Lanczos
    stops at its restart cap and the error names the constant to give (scipy's default cap ran for minutes and
    raised ArpackNoConvergence)."""
    from dpfl.data import build_dataset
    from dpfl.planning.constants import LANCZOS_RESTARTS, EstimationError

    data = build_dataset("digits", num_clients=10, samples_per_client=30, test_fraction=0.2)
    torch.manual_seed(0)
    model = build_model("logreg", data.train.feature_shape, data.num_classes)
    with pytest.raises(EstimationError, match=f"mu could not be estimated: .* in {LANCZOS_RESTARTS} restarts.*--mu"):
        estimate_constants(data, model, 0.0, steps=2)
    stages = []
    estimates = estimate_constants(data, model, 0.0, steps=2, estimate_mu=False, progress=stages.append)
    assert math.isnan(estimates.mu) and estimates.lam > 0 and len(stages) == 5
