"""DP-FTRL's linear worst case (Kairouz et al. 2021's tree aggregation, restarted every epoch), and BandMF's
(Choquette-Choo et al. 2023, the banded square root of Kalinin and Lampert 2024), run through the real engine, and
their exact privacy: shared by tests/algorithms/test_dp_ftrl.py, tests/algorithms/test_bandmf.py and
benchmarks/tightness.py.

Every record is x = 1 labelled 1 under the loss -<w_0, x> y, so every client's update is the constant -2 clipped to
-C e_0 whatever the model (one step of lr 2, C = 1); the owner's (client 0) is 0 on its zero-out neighbour (labels 0:
the null client). The released models are then a linear Gaussian mechanism x = x_0 - (eta/n)(A s + G nu),
nu ~ N(0, (z C)^2 I) the T nodes the server draws, G the oracle's own reading of the tree (``release_noise_matrix``);
for BandMF G = A C^{-1} of the strategy C (``band_noise_matrix``), nu ~ N(0, (z ||c|| C)^2 I).
The shift between the neighbours is measured through the engine with common random numbers (the same noise key), so
the exact privacy of all T models is mu-GDP (Dong, Roth, Su 2022, Cor. 2.13) with mu = ||Sigma^{-1/2} shift||,
Sigma = (eta z C / n)^2 G G^T: the Mahalanobis length of the shift (a Gaussian pair with a common covariance is, after
whitening, N(0, I) against N(d, I), whose loss depends on x only through its projection on d).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

import dpfl
from dpfl.data.federated import ClientArrays, FederatedDataset


def decomposition(position: int) -> list[int]:
    """The ends of the dyadic nodes whose sum is the prefix [1, position] (one per set bit, highest first): the
    oracle's own reading of the tree, independent of the implementation's incremental update."""
    ends, start = [], 0
    for level in reversed(range(position.bit_length())):
        if position >> level & 1:
            start += 2**level
            ends.append(start)
    return ends


def linear_loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-<w_0, x> y: its gradient in w_0 is -x y whatever w (the client's update does not depend on the model)."""
    return -outputs[:, 0] * labels.to(outputs.dtype)


def worst_case_data(clients: int, owner_label: int, others_label: int = 1) -> FederatedDataset:
    """Every record x = 1 labelled ``others_label``, except the owner's (client 0), labelled ``owner_label``: 0 is the
    null client (zero gradient, update 0: the zero-out neighbour)."""
    y = torch.full((clients, 4), others_label, dtype=torch.int64)
    y[0] = owner_label
    arrays = ClientArrays(torch.ones(clients, 4, 1), y, torch.full((clients,), 4, dtype=torch.int64))
    return FederatedDataset(arrays, arrays, 2, "worst-case", {})


def worst_case_run(boundary: str, sampling: str, owner_label: int, rounds: int, name: str = "dp-ftrl",
                   others_label: int = 1, noise_seed: int = 5, privacy: dict | None = None, **algorithm):
    """x_1..x_T of a run of K = 1 step of lr 2 (every update -2 clipped to C = 1, the owner's 0 on the neighbour; the
    other clients' 0 too with ``others_label`` 0); ``algorithm``: further [algorithm] keys of ``name``, ``privacy``
    further [privacy] keys."""
    model = nn.Linear(1, 2, bias=False)
    nn.init.zeros_(model.weight)
    config = {"algorithm": {"name": name, "rounds": rounds, "client_rate": 0.25, "client_sampling": sampling,
                            "noise_multiplier": 0.8, "lr": 2.0, "sample_rate": 1.0, "global_lr": 0.5, **algorithm},
              "privacy": {"boundary": boundary, **(privacy or {})}, "run": {"noise_seed": noise_seed, "seed": 3}}
    sim = dpfl.build(config, model=model, loss=linear_loss, data=worst_case_data(8, owner_label, others_label))
    trajectory = []
    for _ in range(rounds):
        sim.step()
        trajectory.append(sim.model[0].item())
    return sim, np.array(trajectory, dtype=np.float64)


def release_noise_matrix(epoch: int, rounds: int) -> np.ndarray:
    """G [T, T]: x_t's noise is -(eta / n) (G nu)_t, nu the T drawn nodes (node t ends at round t of its epoch), a
    restarted tree per epoch whose anchor carries the previous epochs' full prefix noise."""
    G = np.zeros((rounds, rounds))
    for t in range(rounds):
        start, position = t - t % epoch, t % epoch + 1
        for earlier in range(0, start, epoch):  # every earlier epoch's last prefix sum
            for end in decomposition(min(epoch, rounds - earlier)):
                G[t, earlier + end - 1] += 1
        for end in decomposition(position):
            G[t, start + end - 1] += 1
    return G


def worst_case_mu(boundary: str, sampling: str, rounds: int):
    """(the run with the owner, mu of its T released models, the owner's contribution to each drawn node in units
    of C) of the instance of the module docstring."""
    sim, with_owner = worst_case_run(boundary, sampling, 1, rounds)
    _, null_owner = worst_case_run(boundary, sampling, 0, rounds)
    alg = sim.algorithm
    shift = with_owner - null_owner
    scale = alg.global_lr / alg.cohort_size
    G = release_noise_matrix(alg.epoch, rounds)
    mu = linear_mu(shift, scale * alg.noise_multiplier * alg.clip, G)
    return sim, mu, np.linalg.solve(G, shift / (scale * alg.clip))


def linear_mu(shift: np.ndarray, std: float, G: np.ndarray) -> float:
    """mu = ||Sigma^{-1/2} shift||, Sigma = std^2 G G^T: the exact GDP of a release whose noise is std G nu,
    nu ~ N(0, I), and whose mean moves by ``shift`` between the neighbours (module docstring)."""
    return math.sqrt(shift @ np.linalg.solve(std**2 * G @ G.T, shift))


def band_noise_matrix(coefficients: tuple[float, ...], rounds: int) -> np.ndarray:
    """G = A C^{-1} [T, T]: BandMF's x_t noise is -(eta / n) (G nu)_t, C the lower-triangular banded Toeplitz matrix
    with c_k on its k-th subdiagonal, A the prefix sums: the oracle's dense inverse, not the engine's recurrence."""
    C = sum(c * np.eye(rounds, k=-k) for k, c in enumerate(coefficients))
    return np.tril(np.ones((rounds, rounds))) @ np.linalg.inv(C)


def bandmf_worst_case_mu(boundary: str, rounds: int, **algorithm):
    """(the run with the owner, mu of its T released models, the owner's move of C g in units of C: its columns) of
    BandMF under round robin (the owner, client 0, in rounds 1, 1 + M / n, ...)."""
    sim, with_owner = worst_case_run(boundary, "round_robin", 1, rounds, "bandmf", **algorithm)
    _, null_owner = worst_case_run(boundary, "round_robin", 0, rounds, "bandmf", **algorithm)
    alg = sim.algorithm
    shift, scale = with_owner - null_owner, alg.global_lr / alg.cohort_size
    G = band_noise_matrix(alg.coefficients, rounds)
    mu = linear_mu(shift, scale * alg.noise_multiplier * alg.draw_sensitivity, G)
    return sim, mu, np.linalg.solve(G, shift / (scale * alg.clip))


def amplified_bandmf_worst_case(rounds: int, privacy: dict | None = None, **algorithm):
    """(the run with the owner, the owner's move of C g in units of C, its eligible rounds) of amplified BandMF
    (``partitioned_poisson``) on the instance of the module docstring with every other client null: the released
    models are x = x_0 - (eta / n) A (C^{-1} nu + sum_{j sampled} e_j d_j) exactly, nothing else moving them. The
    noise key is the first (from 0) whose cohorts hold the owner in every round of its partition, so the measured
    move is every column."""
    for noise_seed in range(200):
        sim, with_owner = worst_case_run("trusted", "partitioned_poisson", 1, rounds, "bandmf", others_label=0,
                                         noise_seed=noise_seed, privacy=privacy, **algorithm)
        eligible = [t for t in range(rounds) if t % sim.algorithm.bands == 0]
        if all(0 in sim.clients.sample(t, sim.seed).tolist() for t in eligible):
            break
    _, null_owner = worst_case_run("trusted", "partitioned_poisson", 0, rounds, "bandmf", others_label=0,
                                   noise_seed=noise_seed, privacy=privacy, **algorithm)
    alg = sim.algorithm
    G = band_noise_matrix(alg.coefficients, rounds)
    moved = np.linalg.solve(G, (with_owner - null_owner) / (alg.global_lr / alg.cohort_size * alg.clip))
    return sim, moved, eligible


def subsampled_gaussian_epsilon(rate: float, shifts: list[float], delta: float, knows_cohort: bool = False,
                                step: float = 2e-4) -> float:
    """The exact epsilon at ``delta`` of the composition of the pairs (1 - q) N(0, 1) + q N(m_k, 1) against N(0, 1),
    m_k = ``shifts`` (in units of the noise std), in both directions (zero-out: the owner's data or the null client's);
    ``knows_cohort``: an observer who sees the owner's coin, for whom the pair is N(m_k, 1) against N(0, 1) with
    probability q and identical otherwise. The privacy loss of each pair on a grid of x (spacing 1e-3, +-14 std), its
    distribution binned to ``step`` (rounded down: at most len(shifts) x ``step`` below the truth), convolved over the
    pairs, then delta(eps) = E[(1 - e^(eps - L))_+] solved for
    eps. Computed here from the densities, not by dp_accounting, which the ledger uses."""
    from scipy import signal, stats

    def loss_distribution(m: float, remove: bool) -> tuple[int, np.ndarray]:
        x = np.arange(-14.0, 14.0 + m, 1e-3)
        log_q = stats.norm.logpdf(x)
        mixed = 1.0 if knows_cohort else rate  # the observer who sees the coin meets the Gaussian itself
        log_p = np.logaddexp(np.log1p(-mixed) + log_q, np.log(mixed) + stats.norm.logpdf(x, m)) if mixed < 1 else \
            stats.norm.logpdf(x, m)
        loss, weight = (log_p - log_q, np.exp(log_p)) if remove else (log_q - log_p, np.exp(log_q))
        bins = np.floor(loss / step).astype(np.int64)  # rounded down: a lower bound on delta(eps), so on eps
        if knows_cohort:  # the coin: no loss with probability 1 - q
            bins, weight = np.append(bins, 0), np.append(weight / weight.sum() * rate, 1 - rate)
        low = int(bins.min())
        pmf = np.bincount(bins - low, weights=weight / weight.sum())
        return low, pmf

    def epsilon(remove: bool) -> float:
        low, pmf = 0, np.ones(1)
        for m in shifts:
            offset, part = loss_distribution(m, remove)
            low, pmf = low + offset, np.clip(signal.fftconvolve(pmf, part), 0.0, None)
        losses = (low + np.arange(pmf.size)) * step

        def delta_of(eps: float) -> float:
            above = losses > eps
            return float(np.sum(pmf[above] * -np.expm1(eps - losses[above])))

        lo, hi = 0.0, float(losses.max())
        if delta_of(0.0) <= delta:
            return 0.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
        return hi

    return max(epsilon(True), epsilon(False))


__all__ = ["decomposition", "linear_loss", "worst_case_data", "worst_case_run", "release_noise_matrix",
           "worst_case_mu", "linear_mu", "band_noise_matrix", "bandmf_worst_case_mu", "amplified_bandmf_worst_case",
           "subsampled_gaussian_epsilon"]
