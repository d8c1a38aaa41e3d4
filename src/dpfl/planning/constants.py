"""The problem constants of Zhou et al. (2021)'s bounds, estimated from a federated dataset and a model.

EVERY ESTIMATE HERE IS COMPUTED FROM THE TRAINING DATA WITHOUT PRIVACY: the curvature, gradient norms and optima of
the clients' data are used as they are, with no noise. A plan built on them spends privacy that no accountant
records; use them to explore, or estimate on public data of the same kind. (The paper assumes the constants known;
its Sec. V-B proposes that clients report theta_0 - theta_i* and F_i*, which is the same leak.)

The objective is the regularised empirical risk of FedSGD-DPC, F(theta) = sum_i (d_i / d) F_i(theta) with
F_i(theta) = (1 / d_i) sum_{zeta in D_i} l(theta; zeta) + (w / 2) ||theta||^2 (cross-entropy l, weight decay w).
The estimates are taken at the points of a short non-private run: theta_0 (the model's initialisation), ``steps``
full-batch gradient steps of size 1 / lambda(theta_0) on F, and the optimum theta* (L-BFGS-B):

* mu, lambda: the least and largest Hessian eigenvalue of F (Lanczos, ``scipy.sparse.linalg.eigsh``, on
  Hessian-vector products from ``torch.func``) at theta_0, the run's last step and theta*, min and max over them.
  For multinomial logistic regression the cross-entropy Hessian is singular (adding one vector to every class's
  weights leaves the softmax unchanged), so mu = w exactly, and lambda <= w + (1/2) lambda_max(E[x~ x~^T]),
  x~ = (x, 1): mu > 0 needs weight decay.
* xi_1, xi_2: the largest l1 and l2 norm of a per-sample gradient of l (the algorithm clips l's gradients, the weight
  decay is added after the noise). The run's privacy holds only for the clip the algorithm applies, so a plan uses
  the config's ``algorithm.clip`` for xi, not these (reported for comparison).
* G: max_i ||grad F_i(theta)|| over the points (Assumption 5 bounds E||grad F_i||^2 by G^2).
* Lambda_i: the largest within-client standard deviation of the per-sample gradients of l,
  Lambda_i^2 = mean_zeta ||grad l(theta; zeta)||^2 - ||grad F_i(theta) - w theta||^2 (Assumption 6).
* Gamma = F* - sum_i (d_i / d) F_i* with each client's optimum F_i* (L-BFGS-B on sum_i F_i(theta_i), all clients
  at once), by its definition (Li et al. 2020); the paper's proxy max_i F_i* - sum_i (d_i / d) F_i* needs no theta*.
* Y0 = ||theta_0 - theta*||^2 by its definition; the paper's proxy is sum_i (d_i / d) ||theta_0 - theta_i*||^2.

The work is bounded: each extreme eigenvalue takes at most ``LANCZOS_RESTARTS`` Lanczos restarts (scipy's default
is 10 P, minutes for a clustered spectrum), to a relative tolerance ``LANCZOS_TOLERANCE`` (a plan needs a few digits);
an eigenvalue that does not converge raises ``EstimationError`` naming the constant to give instead; each L-BFGS-B
minimisation stops after ``max_iterations`` (its result is then ``Estimates.unconverged``). ``progress`` is told
each stage as it starts.

Zhou et al.'s bounds need F mu-strongly convex (their Assumption 4). Without weight decay no model here is: adding
one vector to every class's weights of the last linear layer leaves the softmax unchanged, so the Hessian has a
null direction and mu = 0 (and on separable data theta* does not exist). ``estimate_mu=False`` skips mu's Lanczos
run when the caller has mu.

Other models (MLPs): the same computations run, but the loss is not convex, so mu, lambda are local curvatures along
the run (mu may be <= 0, which the bounds do not allow: the planner then asks for --mu) and theta*, theta_i* are
local optima. The numbers describe that run, not a guarantee.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy.optimize import minimize
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh
from torch.func import functional_call, vmap

from dpfl.data.federated import FederatedDataset
from dpfl.engine.grads import CohortGradients
from dpfl.errors import DpflError, check_range

#: What a caller should print beside the estimates.
NONPRIVATE_NOTE = ("estimated from the training data WITHOUT privacy (curvature, gradient norms and optima of the raw "
                   "data); this leak is not in any privacy accounting")
#: Elements of one per-example gradient block [clients, records, P] (the l1 norms need them materialised).
BLOCK_ELEMENTS = 2**24
#: Lanczos restarts (scipy's eigsh ``maxiter``) for one extreme eigenvalue, and its relative tolerance.
LANCZOS_RESTARTS = 200
LANCZOS_TOLERANCE = 1e-8
#: L-BFGS-B iterations of one minimisation (theta*, the clients' optima).
MAX_ITERATIONS = 2000


class EstimationError(DpflError):
    """A constant could not be estimated within the work allowed; the message names the constant to give instead."""


@dataclass(frozen=True)
class Estimates:
    """The constants of Zhou et al.'s Theorems 3-4 as estimated by ``estimate_constants`` (all non-private)."""

    mu: float
    lam: float
    G: float
    Gamma: float
    Y0: float
    xi1: float
    xi2: float
    Lambda: tuple[float, ...]
    p: int
    d: tuple[int, ...]
    unconverged: tuple[str, ...] = ()  #: the minimisations stopped by their iteration cap (their optima are rough)

    def to_dict(self) -> dict:
        return {**asdict(self), "Lambda": list(self.Lambda), "d": list(self.d), "unconverged": list(self.unconverged)}


class RegularisedRisk:
    """F_i and F of a model on a federated training split, as functions of flat parameter vectors (float64)."""

    def __init__(self, dataset: FederatedDataset, model: nn.Module, weight_decay: float):
        self.weight_decay = check_range("algorithm.weight_decay", weight_decay, 0)
        self.grads = CohortGradients(copy.deepcopy(model).double())
        train = dataset.train
        self.x, self.y = train.x.double(), train.y
        self.mask = train.mask.double()
        self.counts = train.counts.double()
        self.weights = self.counts / self.counts.sum()
        x_all, self.y_all = train.flat()
        self.x_all = x_all.double()

    def _client_loss(self, theta, x, y, mask, count):
        logits = functional_call(self.grads.model, self.grads.unflatten(theta), (x,))
        risk = (F.cross_entropy(logits, y, reduction="none") * mask).sum() / count
        return risk + 0.5 * self.weight_decay * theta.dot(theta)

    def client_losses(self, thetas: torch.Tensor) -> torch.Tensor:
        """[N] F_i(theta_i) for one parameter vector per client, thetas [N, P]."""
        return vmap(self._client_loss)(thetas, self.x, self.y, self.mask, self.counts)

    def loss(self, theta: torch.Tensor) -> torch.Tensor:
        """F(theta) = sum_i (d_i / d) F_i(theta) = (1 / d) sum over all records of l + (w / 2) ||theta||^2."""
        logits = functional_call(self.grads.model, self.grads.unflatten(theta), (self.x_all,))
        return F.cross_entropy(logits, self.y_all) + 0.5 * self.weight_decay * theta.dot(theta)

    def client_gradients(self, theta: torch.Tensor) -> torch.Tensor:
        """[N, P] grad F_i(theta)."""
        return gradient(lambda thetas: self.client_losses(thetas).sum(), theta.repeat(len(self.weights), 1))

    def hessian_extremes(self, theta: torch.Tensor, where: str, least: bool = True) -> tuple[float | None, float]:
        """(least, largest) eigenvalue of the Hessian of F at theta (``where`` names the point in errors): Lanczos for
        the largest, lambda_max, then (if ``least``; else None) for the largest of lambda_max I - H (both
        extreme-largest problems, which Lanczos solves fastest)."""
        theta = theta.detach().requires_grad_(True)
        (slope,) = torch.autograd.grad(self.loss(theta), theta, create_graph=True)

        def hvp(v: np.ndarray) -> np.ndarray:  # double backward through the kept graph of the gradient
            tangent = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64).reshape(-1))
            return torch.autograd.grad(slope, theta, tangent, retain_graph=True)[0].numpy()

        P = theta.numel()
        top = _largest_eigenvalue(LinearOperator((P, P), matvec=hvp, dtype=np.float64), "lambda", where)
        if not least:
            return None, top
        shifted = LinearOperator((P, P), matvec=lambda v: top * v.reshape(-1) - hvp(v), dtype=np.float64)
        return top - _largest_eigenvalue(shifted, "mu", where), top

    def example_norms(self, theta: torch.Tensor, norm: str) -> torch.Tensor:
        """[N, R] norms of the per-sample gradients of the cross-entropy (0 on padding), in blocks of records."""
        N, R = self.y.shape
        thetas = theta.expand(N, -1)
        block = max(1, BLOCK_ELEMENTS // (N * theta.numel()))
        return torch.cat([self.grads.example_norms(thetas, self.x[:, s:s + block], self.y[:, s:s + block],
                                                   self.mask[:, s:s + block], norm) for s in range(0, R, block)], 1)

    def minimise(self, start: torch.Tensor, objective, max_iterations: int = MAX_ITERATIONS
                 ) -> tuple[torch.Tensor, bool]:
        """(argmin of ``objective`` (a scalar function of a tensor shaped like ``start``) by L-BFGS-B (scipy) from
        ``start``, with gradients by torch.autograd; whether it converged within ``max_iterations``)."""

        def value_and_gradient(v: np.ndarray):
            theta = torch.from_numpy(v).reshape(start.shape).requires_grad_(True)
            value = objective(theta)
            return float(value.detach()), torch.autograd.grad(value, theta)[0].reshape(-1).numpy()

        result = minimize(value_and_gradient, start.detach().reshape(-1).numpy().copy(), jac=True, method="L-BFGS-B",
                          options={"maxiter": max_iterations, "gtol": 1e-10, "ftol": 1e-15})
        return torch.from_numpy(result.x).reshape(start.shape), bool(result.success)


def _largest_eigenvalue(operator: LinearOperator, constant: str, where: str) -> float:
    """The largest eigenvalue of a symmetric ``operator`` by Lanczos (``LANCZOS_RESTARTS``, ``LANCZOS_TOLERANCE``)."""
    try:
        return float(eigsh(operator, k=1, which="LA", v0=np.ones(operator.shape[0]), tol=LANCZOS_TOLERANCE,
                           maxiter=LANCZOS_RESTARTS, return_eigenvectors=False)[0])
    except ArpackNoConvergence:
        raise EstimationError(
            f"{constant} could not be estimated: the Lanczos iteration for the Hessian's "
            f"{'largest' if constant == 'lambda' else 'least'} eigenvalue at {where} did not converge in "
            f"{LANCZOS_RESTARTS} restarts (a spectrum clustered at its end); give {constant} instead "
            f"(dpfl plan queries-replies --{constant})") from None


def gradient(f, theta: torch.Tensor) -> torch.Tensor:
    """grad f(theta) by reverse mode (torch.autograd: torch.func's transforms of a gradient load torch's compiler)."""
    theta = theta.detach().requires_grad_(True)
    return torch.autograd.grad(f(theta), theta)[0]


def estimate_constants(dataset: FederatedDataset, model: nn.Module, weight_decay: float, steps: int = 20,
                       max_iterations: int = MAX_ITERATIONS, estimate_mu: bool = True,
                       progress: Callable[[str], None] | None = None) -> Estimates:
    """mu, lambda, G, Gamma, Y0, xi_1, xi_2 and Lambda_i of ``model`` (at its current parameters, theta_0) on the
    training split of ``dataset``, WITHOUT privacy (module docstring: what each is, how it is computed, the work
    bounds; ``estimate_mu=False``: mu is NaN, not estimated). ``progress(stage)`` is called as each stage starts."""
    steps = check_range("steps", steps, 0, integer=True)
    max_iterations = check_range("max_iterations", max_iterations, 1, integer=True)
    stages = iter(["curvature at theta_0", f"{steps} gradient steps and their curvature",
                   f"the optimum theta* (L-BFGS-B, at most {max_iterations} iterations) and its curvature",
                   "each client's optimum", "gradient norms"])
    tell = progress or (lambda stage: None)
    risk = RegularisedRisk(dataset, model, weight_decay)
    theta0 = risk.grads.initial_params()
    N, P = len(risk.weights), theta0.numel()
    tell(next(stages))
    curvature = [risk.hessian_extremes(theta0, "theta_0", estimate_mu)]
    tell(next(stages))
    points = [theta0]
    step = 1.0 / curvature[0][1]
    for _ in range(steps):
        points.append(points[-1] - step * gradient(risk.loss, points[-1]))
    if steps:
        curvature.append(risk.hessian_extremes(points[-1], f"step {steps}", estimate_mu))
    tell(next(stages))
    optimum, converged = risk.minimise(points[-1], risk.loss, max_iterations)
    unconverged = [] if converged else ["theta* (Y0, Gamma, G)"]
    curvature.append(risk.hessian_extremes(optimum, "theta*", estimate_mu))
    points.append(optimum)
    tell(next(stages))
    client_optima, converged = risk.minimise(optimum.repeat(N, 1), lambda thetas: risk.client_losses(thetas).sum(),
                                             max_iterations)
    unconverged += [] if converged else ["the clients' optima (Gamma)"]
    with torch.no_grad():
        client_optimal_losses = risk.client_losses(client_optima)
        Gamma = float(risk.loss(optimum) - risk.weights.dot(client_optimal_losses))
    tell(next(stages))
    G2, xi1, xi2, Lambda2 = 0.0, 0.0, 0.0, torch.zeros(N, dtype=torch.float64)
    for theta in points:
        client_grads = risk.client_gradients(theta)
        G2 = max(G2, float(client_grads.square().sum(1).max()))
        l2 = risk.example_norms(theta, "l2")
        xi1 = max(xi1, float(risk.example_norms(theta, "l1").max()))
        xi2 = max(xi2, float(l2.max()))
        mean_square = l2.square().sum(1) / risk.counts
        data_grads = client_grads - risk.weight_decay * theta
        Lambda2 = torch.maximum(Lambda2, (mean_square - data_grads.square().sum(1)).clamp(min=0))
    return Estimates(
        mu=min(low for low, _ in curvature) if estimate_mu else math.nan, lam=max(high for _, high in curvature),
        G=math.sqrt(G2), Gamma=max(Gamma, 0.0), Y0=float((theta0 - optimum).square().sum()), xi1=xi1, xi2=xi2,
        Lambda=tuple(math.sqrt(v) for v in Lambda2.tolist()), p=P, d=tuple(int(c) for c in dataset.train.counts),
        unconverged=tuple(unconverged))


__all__ = ["Estimates", "EstimationError", "RegularisedRisk", "estimate_constants", "NONPRIVATE_NOTE"]
