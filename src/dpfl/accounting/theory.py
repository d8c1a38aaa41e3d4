"""Closed-form privacy formulas the papers state, for display beside the numerical accountants.

These are the papers' own calibrations: mostly looser than dpfl's RDP/PLD accountants, sometimes asymptotic (said so
where it is). Experiments calibrate with the numerical accountants; these functions exist so a user can compare.
Sources: Dwork & Roth 2014 (DR14), Dwork, Rothblum, Vadhan 2010 (DRV10), Kairouz, Oh, Viswanath 2015 (KOV15),
Bun & Steinke 2016 (BS16), Wang, Balle, Kasiviswanathan 2019 (WBK19), and the federated papers' own closed forms:
Noble, Bellet, Dieuleveut 2022 (DP-SCAFFOLD), Zhou et al. 2021 (the numbers of queries and replies, FedSGD-DPC) and
Lowy, Ghafelebashi, Razaviyayn 2023 (ISRL-DP).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import optimize, special

from dpfl.errors import check_range


class ValidityWarning(UserWarning):
    """A closed form was evaluated outside the range its theorem covers."""


def _check_epsilon_delta(epsilon, delta):
    check_range("epsilon", epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)


# ---------------------------------------------------------------- composition


def basic_composition(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """k-fold adaptive composition of (eps, delta)-DP mechanisms is (k eps, k delta)-DP (DR14 Thm 3.16)."""
    check_range("epsilon", epsilon, 0.0)
    check_range("delta", delta, 0.0, 1.0)
    k = check_range("k", k, 1, integer=True)
    return k * epsilon, min(1.0, k * delta)


def advanced_composition(epsilon: float, delta: float, k: int, delta_prime: float) -> tuple[float, float]:
    """Strong composition (DRV10 Thm III.3; DR14 Thm 3.20), for any eps >= 0 and delta' in (0, 1):

    k-fold adaptive composition of (eps, delta)-DP mechanisms is
    (sqrt(2k ln(1/delta')) eps + k eps (e^eps - 1), k delta + delta')-DP.
    """
    check_range("epsilon", epsilon, 0.0)
    check_range("delta", delta, 0.0, 1.0)
    k = check_range("k", k, 1, integer=True)
    check_range("delta_prime", delta_prime, 0.0, 1.0, low_open=True, high_open=True)
    total = math.sqrt(2.0 * k * math.log(1.0 / delta_prime)) * epsilon + k * epsilon * math.expm1(epsilon)
    return total, min(1.0, k * delta + delta_prime)


def kairouz_composition_delta(epsilon: float, delta: float, k: int, i: int) -> float:
    """KOV15 Thm 3.3 (optimal homogeneous composition): k-fold composition of (eps, delta)-DP mechanisms is
    ((k - 2i) eps, 1 - (1 - delta)^k (1 - delta_i))-DP for every i in {0, ..., floor(k/2)}, where

        delta_i = sum_{l=0}^{i-1} C(k, l) (e^{(k-l) eps} - e^{(k-2i+l) eps}) / (1 + e^eps)^k.

    Tight: k-fold randomized response attains it. Returns the total delta for the given i.
    """
    check_range("epsilon", epsilon, 0.0)
    check_range("delta", delta, 0.0, 1.0)
    k = check_range("k", k, 1, integer=True)
    i = check_range("i", i, 0, k // 2, integer=True)
    ell = np.arange(i)
    log_terms = (
        special.gammaln(k + 1) - special.gammaln(ell + 1) - special.gammaln(k - ell + 1)
        + (k - ell) * epsilon - k * np.logaddexp(0.0, epsilon)
    )
    delta_i = float(np.sum(np.exp(log_terms) * -np.expm1(2.0 * (ell - i) * epsilon)))
    return min(1.0, 1.0 - (1.0 - delta) ** k * (1.0 - delta_i))


def kairouz_composition_epsilon(epsilon: float, delta: float, k: int, target_delta: float) -> float:
    """Smallest (k - 2i) eps of KOV15 Thm 3.3 whose delta is <= target_delta (math.inf if none).

    delta_i grows with i, so the largest admissible i is found by bisection.
    """
    check_range("target_delta", target_delta, 0.0, 1.0, high_open=True)
    if kairouz_composition_delta(epsilon, delta, k, 0) > target_delta:
        return math.inf
    low, high = 0, k // 2  # admissible i: low is, and the answer lies in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if kairouz_composition_delta(epsilon, delta, k, middle) <= target_delta:
            low = middle
        else:
            high = middle - 1
    return (k - 2 * low) * epsilon


# ---------------------------------------------------------------- zCDP and the Gaussian mechanism


def zcdp_to_dp_epsilon(rho: float, delta: float) -> float:
    """rho-zCDP implies (rho + 2 sqrt(rho ln(1/delta)), delta)-DP for every delta in (0, 1) (BS16 Prop. 1.3)."""
    check_range("rho", rho, 0.0)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def dp_to_zcdp_rho(epsilon: float, delta: float) -> float:
    """Largest rho with zcdp_to_dp_epsilon(rho, delta) <= eps: (sqrt(ln(1/delta) + eps) - sqrt(ln(1/delta)))^2."""
    _check_epsilon_delta(epsilon, delta)
    log_inv = math.log(1.0 / delta)
    return (math.sqrt(log_inv + epsilon) - math.sqrt(log_inv)) ** 2


def gaussian_sigma_for_zcdp(sensitivity: float, rho: float) -> float:
    """Gaussian noise N(0, sigma^2) on an l2-sensitivity-Delta query is Delta^2/(2 sigma^2)-zCDP (BS16 Prop. 1.6),
    so rho-zCDP needs sigma = Delta / sqrt(2 rho)."""
    check_range("sensitivity", sensitivity, 0.0, low_open=True)
    check_range("rho", rho, 0.0, low_open=True)
    return sensitivity / math.sqrt(2.0 * rho)


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """sigma = Delta sqrt(2 ln(1.25/delta)) / eps (DR14 Thm A.1), proven only for eps in (0, 1).

    Evaluated for eps >= 1 too (peer systems do, e.g. Flower's LocalDpMod) but with a ValidityWarning: there it is
    not a proven guarantee. The analytic Gaussian mechanism (Balle & Wang 2018) is exact for every eps.
    """
    _check_epsilon_delta(epsilon, delta)
    check_range("sensitivity", sensitivity, 0.0, low_open=True)
    if epsilon >= 1.0:
        warnings.warn(
            f"classical Gaussian sigma with epsilon = {epsilon} >= 1: DR14 Thm A.1 covers only epsilon < 1",
            ValidityWarning,
            stacklevel=2,
        )
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


# ---------------------------------------------------------------- DP-SCAFFOLD (Noble, Bellet, Dieuleveut 2022)


def dp_scaffold_sigma_order(
    epsilon: float, delta: float, rounds: int, local_steps: int, user_rate: float, data_rate: float, users: int
) -> float:
    """Noble et al. 2022 Thm 4.1: sigma_g = Omega(s sqrt(l T K log(2Tl/delta) log(2/delta)) / (eps sqrt(M))).

    ASYMPTOTIC: the theorem hides an unspecified constant and guarantees (O(eps), delta)-DP; this returns the
    expression with constant 1. Do not calibrate with it (it gives ~1.52 where the experiments need 60).
    """
    _check_epsilon_delta(epsilon, delta)
    rounds = check_range("rounds", rounds, 1, integer=True)
    local_steps = check_range("local_steps", local_steps, 1, integer=True)
    check_range("user_rate", user_rate, 0.0, 1.0, low_open=True)
    check_range("data_rate", data_rate, 0.0, 1.0, low_open=True)
    users = check_range("users", users, 1, integer=True)
    product = user_rate * rounds * local_steps * math.log(2 * rounds * user_rate / delta) * math.log(2.0 / delta)
    return data_rate * math.sqrt(product) / (epsilon * math.sqrt(users))


def dp_scaffold_server_guarantee(epsilon: float, delta: float, user_rate: float, users: int) -> tuple[float, float]:
    """Noble et al. 2022 Thm 4.1 (2): towards the server (O(eps_s), delta_s) with eps_s = eps sqrt(M/l),
    delta_s = (delta/2)(1/l + 1). ASYMPTOTIC like the third-party statement (same hidden constant)."""
    _check_epsilon_delta(epsilon, delta)
    check_range("user_rate", user_rate, 0.0, 1.0, low_open=True)
    users = check_range("users", users, 1, integer=True)
    return epsilon * math.sqrt(users / user_rate), 0.5 * delta * (1.0 / user_rate + 1.0)


def wang_subsampled_gaussian_rdp(order: int, sampling_rate: float, noise_multiplier: float) -> float:
    """Noble et al. 2022 Lemma B.7 (WBK19): RDP at integer order a >= 2 of the Gaussian mechanism (noise multiplier sigma)
    on a q-subsample drawn without replacement:

        1/(a-1) log(1 + 2 q^2 C(a,2) min{2(e^{1/sigma^2} - 1), e^{1/sigma^2}}
                    + sum_{j=3}^{a} 2 q^j C(a,j) e^{j(j-1)/(2 sigma^2)})   (evaluated in log space).
    """
    order = check_range("order", order, 2, integer=True)
    check_range("sampling_rate", sampling_rate, 0.0, 1.0, low_open=True)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    inv_var = 1.0 / noise_multiplier**2
    log_min_second = min(math.log(2.0) + inv_var + math.log(-math.expm1(-inv_var)), inv_var)
    j = np.arange(3, order + 1)
    log_binom = special.gammaln(order + 1) - special.gammaln(j + 1) - special.gammaln(order - j + 1)
    log_terms = np.concatenate((
        [0.0, math.log(2.0 * order * (order - 1) / 2.0) + 2.0 * math.log(sampling_rate) + log_min_second],
        math.log(2.0) + j * math.log(sampling_rate) + log_binom + j * (j - 1) * inv_var / 2.0,
    ))
    return float(special.logsumexp(log_terms)) / (order - 1)


def dp_scaffold_strong_composition_epsilon(
    noise_multiplier: float, rounds: int, local_steps: int, user_rate: float, data_rate: float, users: int,
    delta: float, max_order: int = 256,
) -> float:
    """Noble et al. 2022 App. B.4, non-asymptotic route ("without approximation") towards a third party:

        eps_a(a, d') = K eps'(a; q = s, sigma = sigma_g sqrt(lM)) + log(1/d')/(a - 1)     (RDP over K steps -> DP)
        eps*        = log(1 + l (e^{eps_a} - 1))                                         (user sampling, delta l d')
        eps_T       = eps* sqrt(2T log(1/delta'')) + T eps* (e^{eps*} - 1)                  (DRV10 over T rounds)

    with d' = x delta/(T l), delta'' = (1 - x) delta so the total is delta; minimised over integer orders
    a in [2, max_order] (eps' from Lemma B.7; the paper's real-order interpolation (8) is omitted) and x on a grid
    of (0, 1). The paper itself fixes x = 1/2.
    """
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    rounds = check_range("rounds", rounds, 1, integer=True)
    local_steps = check_range("local_steps", local_steps, 1, integer=True)
    check_range("user_rate", user_rate, 0.0, 1.0, low_open=True)
    check_range("data_rate", data_rate, 0.0, 1.0, low_open=True)
    users = check_range("users", users, 1, integer=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    max_order = check_range("max_order", max_order, 2, integer=True)
    aggregated_sigma = noise_multiplier * math.sqrt(user_rate * users)
    orders = np.arange(2, max_order + 1)
    rdp = np.array([local_steps * wang_subsampled_gaussian_rdp(int(a), data_rate, aggregated_sigma) for a in orders])
    split = np.linspace(0.01, 0.99, 99)[:, None]  # x
    eps_a = rdp[None, :] + np.log(rounds * user_rate / (split * delta)) / (orders[None, :] - 1)
    eps_star = np.log1p(user_rate * np.expm1(np.minimum(eps_a, 700.0)))
    eps_total = eps_star * np.sqrt(2.0 * rounds * np.log(1.0 / ((1.0 - split) * delta))) \
        + rounds * eps_star * np.expm1(np.minimum(eps_star, 700.0))
    return float(np.min(eps_total))


# ---------------------------------------------------------------- queries and replies (Zhou et al.)


def zhou_replies_per_client(clients_per_round: int, rounds: int, clients: int) -> int:
    """Zhou et al.: each client answers bT/N queries; ceil(bT/N) is the guaranteed count under round robin/uniform."""
    clients_per_round = check_range("clients_per_round", clients_per_round, 1, integer=True)
    rounds = check_range("rounds", rounds, 1, integer=True)
    clients = check_range("clients", clients, clients_per_round, integer=True)
    return -(-clients_per_round * rounds // clients)


def zhou_laplace_scale(
    epsilon: float, clients_per_round: int, rounds: int, clients: int, l1_clip: float, client_samples: int
) -> float:
    """Zhou et al., Laplace mechanism: s_i = 2 b T xi_1 / (N d_i eps_i) per coordinate.

    Pure eps_i-DP for client i by basic composition over its bT/N replies, each a full-batch mean gradient of
    l1 sensitivity 2 xi_1 / d_i (per-sample gradients clipped to l1 norm xi_1; q = 1).
    """
    check_range("epsilon", epsilon, 0.0, low_open=True)
    clients_per_round = check_range("clients_per_round", clients_per_round, 1, integer=True)
    rounds = check_range("rounds", rounds, 1, integer=True)
    clients = check_range("clients", clients, clients_per_round, integer=True)
    check_range("l1_clip", l1_clip, 0.0, low_open=True)
    client_samples = check_range("client_samples", client_samples, 1, integer=True)
    return 2.0 * clients_per_round * rounds * l1_clip / (clients * client_samples * epsilon)


def zhou_gaussian_sigma(noise_multiplier: float, l2_clip: float, sampling_rate: float, client_samples: int) -> float:
    """Zhou et al. Gaussian rule: std of the noise on client i's batch-mean gradient, sigma_i = z xi_2 / (q d_i).

    The paper states sigma_i^2 >= c2^2 xi_2^2 (bT/N) log(1/delta_i)/(d_i^2 eps_i^2) with the moments accountant's
    unspecified constant c2; dpfl replaces it by a numerical accountant: z is the noise multiplier that gives
    (eps_i, delta_i) for ceil(bT/N) steps of q-subsampled Gaussian (dpfl's calibration), converted here to a std.
    """
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_range("l2_clip", l2_clip, 0.0, low_open=True)
    check_range("sampling_rate", sampling_rate, 0.0, 1.0, low_open=True)
    client_samples = check_range("client_samples", client_samples, 1, integer=True)
    return noise_multiplier * l2_clip / (sampling_rate * client_samples)


# ---------------------------------------------------------------- ISRL-DP (Lowy, Ghafelebashi, Razaviyayn)


def isrl_zcdp_budget(epsilon: float, delta: float) -> float:
    """Lowy et al.: the transcript is made eps^2/(8 ln(1/delta))-zCDP, which implies (eps, delta)-DP (BS16 Prop. 1.3)
    when eps <= 2 ln(1/delta) (then eps^2/(8 ln(1/delta)) + eps/sqrt(2) <= eps)."""
    _check_epsilon_delta(epsilon, delta)
    check_range("epsilon", epsilon, 0.0, 2.0 * math.log(1.0 / delta), low_open=True)
    return epsilon**2 / (8.0 * math.log(1.0 / delta))


def isrl_prox_sgd_sigma(epsilon: float, delta: float, lipschitz: float, batch: int) -> float:
    """Lowy et al. Noisy ISRL-DP Prox-SGD (derived): sigma^2 = 16 L^2 ln(1/delta)/(eps^2 K^2).

    Disjoint batches give parallel composition, so each round alone must be (eps, delta)-DP: Gaussian noise on a
    mean of K L-Lipschitz gradients (sensitivity 2L/K) made eps^2/(8 ln(1/delta))-zCDP. Valid for
    eps <= 2 ln(1/delta).
    """
    rho = isrl_zcdp_budget(epsilon, delta)
    check_range("lipschitz", lipschitz, 0.0, low_open=True)
    batch = check_range("batch", batch, 1, integer=True)
    return gaussian_sigma_for_zcdp(2.0 * lipschitz / batch, rho)


def isrl_spider_sigmas(
    epsilon: float, delta: float, lipschitz: float, smoothness: float, rounds: int, period: int,
    checkpoint_batch: int, difference_batch: int,
) -> tuple[float, float]:
    """Lowy et al. ISRL-DP FedProx-SPIDER (Alg. 3, derived): (sigma_1, sigma_2hat) with

        sigma_1^2    = 32 L^2 ceil(R/q) ln(1/delta) / (eps^2 K1^2)    (checkpoint gradients, sensitivity 2L/K1)
        sigma_2hat^2 = 32 beta^2 R ln(1/delta) / (eps^2 K2^2)         (sigma_2 = sigma_2hat ||w_r - w_{r-1}||,
                                                                        sensitivity 2 beta ||w_r - w_{r-1}|| / K2)

    i.e. the eps^2/(8 ln(1/delta))-zCDP budget split equally between ceil(R/q) checkpoints and at most R
    difference rounds. The paper's theory takes K1 = K2 = n. Valid for eps <= 2 ln(1/delta).
    """
    rho = isrl_zcdp_budget(epsilon, delta)
    check_range("lipschitz", lipschitz, 0.0, low_open=True)
    check_range("smoothness", smoothness, 0.0, low_open=True)
    rounds = check_range("rounds", rounds, 1, integer=True)
    period = check_range("period", period, 1, integer=True)
    checkpoint_batch = check_range("checkpoint_batch", checkpoint_batch, 1, integer=True)
    difference_batch = check_range("difference_batch", difference_batch, 1, integer=True)
    checkpoints = -(-rounds // period)
    sigma_1 = gaussian_sigma_for_zcdp(2.0 * lipschitz / checkpoint_batch, rho / (2.0 * checkpoints))
    sigma_2hat = gaussian_sigma_for_zcdp(2.0 * smoothness / difference_batch, rho / (2.0 * rounds))
    return sigma_1, sigma_2hat


def isrl_svrg_sigmas(
    epsilon: float, delta: float, lipschitz: float, n: int, batch: int, snapshots: int, inner_steps: int,
) -> tuple[float, float]:
    """Lowy et al. ISRL-DP Prox-SVRG / Prox-PL-SVRG (Alg. 1, 2; Thm E.2, derived): (sigma_1, sigma_2) with

        sigma_1^2 = 4096 L^2 k1 ln(4/delta) ln(5 K k1 / (n delta)) / (eps^2 n^2)   (k1 inner steps, sensitivity 4L/K)
        sigma_2^2 =  256 L^2 k2 ln(4/delta) ln(5 k2 / delta) / (eps^2 n^2)       (k2 snapshots, sensitivity 2L/n)

    Each stream spends (eps/2, delta/2) by advanced composition (DR14 Thm 3.20 in the paper's form: k steps of
    (eps0, delta0), eps0 = (eps/2) / (2 sqrt(2 k ln(4/delta))), delta0 = delta/(4k), compose to (eps/2, delta/2) when
    eps <= 4 ln(4/delta)); each snapshot is a classical Gaussian (DR14 Thm A.1) at (eps0, delta0). Each inner step is
    a classical Gaussian at (eps', delta') = (eps0 n/(2K), delta0 n/K), amplified by sampling K of n records to
    (2 (K/n) eps', (K/n) delta') (Ullman 2017; e^x - 1 <= 2x for x <= 1), i.e. (eps0, delta0); K = n: no sampling,
    (eps', delta') = (eps0, delta0). A ValidityWarning when eps' >= 1: the paper's condition on K (K > eps0 n / 2)
    fails. The paper's counts are k1 = S E Q and k2 = S E; dpfl omits the E S draws at w = w~ (``isrl_svrg``)."""
    _check_epsilon_delta(epsilon, delta)
    check_range("lipschitz", lipschitz, 0.0, low_open=True)
    n = check_range("n", n, 1, integer=True)
    batch = check_range("batch", batch, 1, n, integer=True)
    snapshots = check_range("snapshots", snapshots, 1, integer=True)
    inner_steps = check_range("inner_steps", inner_steps, 1, integer=True)

    def per_step(k: int) -> tuple[float, float]:
        return epsilon / (4.0 * math.sqrt(2.0 * k * math.log(4.0 / delta))), delta / (4.0 * k)

    eps0, delta0 = per_step(snapshots)
    sigma_2 = classical_gaussian_sigma(eps0, delta0, 2.0 * lipschitz / n)
    eps1, delta1 = per_step(inner_steps)
    rate = batch / n
    base = (eps1, delta1) if batch == n else (eps1 / (2.0 * rate), delta1 / rate)
    sigma_1 = classical_gaussian_sigma(*base, 4.0 * lipschitz / batch)
    return sigma_1, sigma_2


def _isrl_code_sigma(factor: float, epsilon: float, delta: float, clip: float, rounds: int, n: int) -> float:
    _check_epsilon_delta(epsilon, delta)
    check_range("clip", clip, 0.0, low_open=True)
    rounds = check_range("rounds", rounds, 1, integer=True)
    n = check_range("n", n, 1, integer=True)
    return math.sqrt(factor * clip**2 * rounds * math.log(2.0 / delta) / (n**2 * epsilon**2))


def isrl_mbsgd_code_sigma(epsilon: float, delta: float, clip: float, rounds: int, n: int) -> float:
    """Lowy et al.'s public code, ISRL-DP MB-SGD baseline: per-silo noise variance 8 C^2 R ln(2/delta)/(n^2 eps^2).

    The code's moments-accountant-style constant, smaller than the theory's; not a proven guarantee by itself.
    """
    return _isrl_code_sigma(8.0, epsilon, delta, clip, rounds, n)


def isrl_local_sgd_code_sigma(
    epsilon: float, delta: float, clip: float, rounds: int, n: int, local_steps: int
) -> float:
    """Lowy et al.'s public code, ISRL-DP Local SGD baseline: each of the K local steps noised with variance
    8 C^2 K R ln(2/delta)/(n^2 eps^2). Same caveat as ``isrl_mbsgd_code_sigma``."""
    local_steps = check_range("local_steps", local_steps, 1, integer=True)
    return _isrl_code_sigma(8.0 * local_steps, epsilon, delta, clip, rounds, n)


def isrl_alternate_spider_code_sigmas(
    epsilon: float, delta: float, clip: float, rounds: int, n: int
) -> tuple[float, float]:
    """Lowy et al.'s public code, Alternate SPIDER (Alg. 11): (sigma_u1, sigma_u2) with variances 32 C^2 R ln(2/delta)/(n^2 eps^2)
    (difference stream) and 8 C^2 R ln(2/delta)/(n^2 eps^2) (gradient stream). The code calibrates EACH stream as if
    it alone spent (eps, delta); the two streams still have to be composed. ``isrl-spider-alt`` composes them, one
    noise multiplier z over all T = 2R - 1 communication rounds: sigma_u1 = z 4C/K, sigma_u2 = z 2C/K
    (``ISRLSpider.noise_std``), the same 2:1 ratio, and larger than these (1.3% at n = 20, R = 5, K = n; 2.35x at
    n = 400, R = 25 with the code's batch K = 195; eps = 1, delta = 1e-5: tests/algorithms/test_isrl_spider_alt.py)."""
    return (_isrl_code_sigma(32.0, epsilon, delta, clip, rounds, n),
            _isrl_code_sigma(8.0, epsilon, delta, clip, rounds, n))


# -- Gaussian differential privacy (Dong, Roth, Su 2019/2022): N(0, 1) against N(mu, 1) is mu-GDP, and K mu_k-GDP
# mechanisms compose to sqrt(sum mu_k^2)-GDP (Cor. 3.3) ----------------------------------------------------------------
def gdp_delta(mu: float, epsilon):
    """delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) of mu-GDP (Dong, Roth, Su 2019, Cor. 2.13)."""
    mu = check_range("mu", mu, 0)
    eps = np.asarray(epsilon, dtype=float)
    if mu == 0:
        out = np.zeros_like(eps)
    else:
        # e^eps Phi(b) computed as exp(eps + log Phi(b)) to survive large eps
        out = special.ndtr(-eps / mu + mu / 2) - np.exp(eps + special.log_ndtr(-eps / mu - mu / 2))
        out = np.maximum(out, 0.0)
    return float(out) if out.ndim == 0 else out


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon >= 0 with mu-GDP (epsilon, delta)-DP: the inverse of ``gdp_delta`` in epsilon."""
    mu = check_range("mu", mu, 0)
    delta = check_range("delta", delta, 0, 1, low_open=True, high_open=True)
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    high = max(1.0, mu * mu / 2 + mu * 10)
    while gdp_delta(mu, high) > delta:
        high *= 2
    return float(optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, high, xtol=1e-14, rtol=1e-14))


def gdp_rdp(mu: float, orders) -> np.ndarray:
    """RDP of mu-GDP: a mu^2 / 2 (Mironov 2017, Prop. 7)."""
    mu = check_range("mu", mu, 0)
    return np.asarray(orders, dtype=float) * mu * mu / 2


