"""Shuffle-model accounting: amplification by shuffling and the binomial vector-summation protocol.

Amplification by shuffling (Feldman, McMillan, Talwar, "Hiding among the clones", FOCS 2021, arXiv 2012.12803;
FMT21 below). Each of n users applies an eps0-DP local randomizer (adaptively chosen is fine) and a trusted shuffler
permutes the n reports. FMT21 show that for neighbouring datasets the shuffled output is a post-processing of

    P = (A + Delta, C),    Q = (A + 1 - Delta, C),
    C ~ Bin(n - 1, e^{-eps0}),  A ~ Bin(C, 1/2),  Delta ~ Bern(e^{eps0} / (e^{eps0} + 1)),

("C clones of the changed user's two possible reports, each landing on either side with probability 1/2"), so the
shuffled output is (eps, D_{e^eps}(P || Q))-DP. This module evaluates that hockey-stick divergence exactly (closed
form per clone count c, see ``_divergence_given_clones``), which is the quantity the authors' public numerical
procedure (github.com/apple/ml-shuffling-amplification, ``computeamplification.py``, FMT21 App. E) bounds by
bucketing c; ``shuffle_epsilon`` then solves delta(eps) = delta for eps. The closed-form bound is FMT21's main
theorem (numbered Thm 3.1 in the arXiv version OpenDP's smartnoise-core cites; other versions may differ):

    eps = log(1 + (e^{eps0} - 1)/(e^{eps0} + 1) * (8 sqrt(e^{eps0} log(4/delta)) / sqrt(n) + 8 e^{eps0} / n)),
    valid for eps0 <= log(n / (16 log(2/delta))).

(eps0, delta0)-DP randomizers (FMT21 Thm 3.8): the shuffled output is (eps, delta + (e^eps + 1)(1 + e^{-eps0}/2) n
delta0)-DP whenever the eps0-DP analysis gives (eps, delta). Statement as transcribed by OpenDP's smartnoise-core
(``utilities/shuffling.rs``, "theorem 3.8"); the paper text itself was not readable from this workplace.

Binomial vector summation (Cheu, Joseph, Mao, Peng, "Shuffle private stochastic convex optimization", ICLR 2022,
arXiv 2106.09805): the protocol P_vec that Lowy et al. (Thm D.2) uses for its SDP algorithms
(``dpfl.protocols.shuffler``), its parameters calibrated by dpfl's own proof (``dpfl.accounting.binomial``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from dpfl.errors import ConfigError, check_range

METHODS = ("numerical", "closed_form")
_CLONE_WINDOW = 12.0  # clone counts kept: mean +- (12 sd + 40); the exact mass cut off is added to delta
_GRID_POINTS = 24  # grid of the non-monotone search (delta0 > 0)


# ---------------------------------------------------------------- amplification by shuffling (FMT21)


def closed_form_validity_bound(n: int, delta: float) -> float:
    """Largest eps0 for which FMT21's closed form holds: log(n / (16 log(2/delta))) (-inf when n is too small)."""
    ratio = n / (16.0 * math.log(2.0 / delta))
    return math.log(ratio) if ratio > 0 else -math.inf


def _closed_form_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """FMT21 Thm 3.1 (closed form), capped at eps0 (the shuffled reports are trivially eps0-DP)."""
    shrink = math.tanh(epsilon0 / 2.0)  # (e^{eps0} - 1) / (e^{eps0} + 1)
    spread = 8.0 * math.sqrt(math.exp(epsilon0) * math.log(4.0 / delta) / n) + 8.0 * math.exp(epsilon0) / n
    return min(math.log1p(shrink * spread), epsilon0)


def _closed_form_delta(epsilon: float, epsilon0: float, n: int) -> float:
    """Smallest delta for which the closed form (inverted in delta) gives at most ``epsilon``; 1 if none."""
    if epsilon >= epsilon0:
        return 0.0
    excess = math.expm1(epsilon) / math.tanh(epsilon0 / 2.0) - 8.0 * math.exp(epsilon0) / n
    if excess <= 0:
        return 1.0
    delta = 4.0 * math.exp(-n * excess**2 / (64.0 * math.exp(epsilon0)))
    smallest_valid = 2.0 * math.exp(-n / (16.0 * math.exp(epsilon0)))  # eps0 <= log(n / (16 log(2/delta)))
    return min(1.0, max(delta, smallest_valid))


def _clone_counts(epsilon0: float, n: int):
    """Clone counts c around the mean of C ~ Bin(n - 1, e^{-eps0}), their probabilities, and the mass left out."""
    clone = stats.binom(n - 1, math.exp(-epsilon0))
    half_width = _CLONE_WINDOW * clone.std() + 40.0
    low, high = max(0, math.floor(clone.mean() - half_width)), min(n - 1, math.ceil(clone.mean() + half_width))
    counts = np.arange(low, high + 1)
    cut_mass = float(clone.cdf(low - 1) + clone.sf(high))
    return counts, clone.pmf(counts), cut_mass


def _divergence_given_clones(epsilon: float, epsilon0: float, counts: np.ndarray) -> np.ndarray:
    """D_{e^eps}(P_c || Q_c) for P_c = A + Delta, Q_c = A + 1 - Delta, A ~ Bin(c, 1/2), one value per c.

    The likelihood ratio P_c(a)/Q_c(a) increases in a and exceeds e^eps exactly for a > beta (c + 1) with
    beta = (e^{eps + eps0} - 1) / ((e^{eps0} - 1)(e^eps + 1)); summing P_c - e^eps Q_c over
    a >= a0 = floor(beta (c + 1)) + 1 gives (e^{eps0} - e^eps)/(e^{eps0} + 1) Pr[A = a0 - 1] - (e^eps - 1) Pr[A >= a0].
    The map a -> c + 1 - a swaps P_c and Q_c, so D(Q_c || P_c) is the same number (the public code evaluates both).
    """
    beta = math.expm1(epsilon + epsilon0) / (math.expm1(epsilon0) * (math.exp(epsilon) + 1.0))
    top = np.floor(beta * (counts + 1)).astype(np.int64)  # a0 - 1
    halves = stats.binom(counts, 0.5)
    weight = (math.exp(epsilon0) - math.exp(epsilon)) / (math.exp(epsilon0) + 1.0)
    divergence = weight * halves.pmf(top) - math.expm1(epsilon) * halves.sf(top)
    return np.clip(divergence, 0.0, None)


def _numerical_delta(epsilon: float, epsilon0: float, n: int) -> float:
    """delta(eps) = E_C[D_{e^eps}(P_C || Q_C)] (FMT21's reduction), over-estimated by the clone mass cut off."""
    if epsilon >= epsilon0:
        return 0.0
    counts, probabilities, cut_mass = _clone_counts(epsilon0, n)
    return min(1.0, float(probabilities @ _divergence_given_clones(epsilon, epsilon0, counts)) + cut_mass)


def _approximate_ldp_term(epsilon: float, epsilon0: float, n: int, delta0: float) -> float:
    """FMT21 Thm 3.8: extra delta (e^eps + 1)(1 + e^{-eps0}/2) n delta0 for (eps0, delta0)-DP randomizers."""
    return (math.exp(epsilon) + 1.0) * (1.0 + math.exp(-epsilon0) / 2.0) * n * delta0


def _check(epsilon0, n, delta0, method):
    check_range("epsilon0", epsilon0, 0.0, 100.0, low_open=True)
    check_range("n", n, 1, integer=True)
    check_range("delta0", delta0, 0.0, 1.0, high_open=True)
    if method not in METHODS:
        raise ConfigError("method", method, f"one of {', '.join(METHODS)}")
    return int(n)


def shuffle_delta(epsilon: float, epsilon0: float, n: int, delta0: float = 0.0, method: str = "numerical") -> float:
    """delta such that shuffling n (eps0, delta0)-DP local reports is (epsilon, delta)-DP (FMT21).

    ``method="numerical"``: the exact divergence of FMT21's reduction (valid for every eps0);
    ``"closed_form"``: the main theorem inverted in delta (1.0 where it gives nothing). delta0 > 0 adds Thm 3.8's
    (e^eps + 1)(1 + e^{-eps0}/2) n delta0. Result capped at 1.
    """
    n = _check(epsilon0, n, delta0, method)
    check_range("epsilon", epsilon, 0.0)
    pure = _numerical_delta if method == "numerical" else _closed_form_delta
    return min(1.0, pure(epsilon, epsilon0, n) + _approximate_ldp_term(epsilon, epsilon0, n, delta0))


def _smallest_feasible_epsilon(total_delta, delta: float, epsilon_max: float, monotone: bool) -> float | None:
    """Smallest eps in [0, eps_max] with total_delta(eps) <= delta, or None if there is none.

    With delta0 = 0 total_delta decreases in eps (``monotone``): one root search on [0, eps_max]. Otherwise (Thm 3.8's
    term grows with eps) the first feasible point of a geometric grid is refined. The returned eps is always checked
    to satisfy total_delta(eps) <= delta, so it is a valid guarantee even where it is not the smallest.
    """
    excess = lambda eps: total_delta(eps) - delta  # noqa: E731
    grid = [0.0, epsilon_max] if monotone else [0.0, *(epsilon_max * np.geomspace(1e-6, 1.0, _GRID_POINTS))]
    feasible = next((i for i, eps in enumerate(grid) if excess(eps) <= 0), None)
    if feasible is None:
        return None
    if feasible == 0:
        return 0.0
    low, high = float(grid[feasible - 1]), float(grid[feasible])
    root = optimize.brentq(excess, low, high, xtol=1e-12, rtol=1e-10)
    for candidate in (root, root * (1 + 1e-9) + 1e-12, root * (1 + 1e-6) + 1e-9):
        if candidate <= high and excess(candidate) <= 0:
            return candidate
    return high


def shuffle_epsilon(
    epsilon0: float, n: int, delta: float, delta0: float = 0.0, method: str = "numerical"
) -> float:
    """epsilon such that shuffling n (eps0, delta0)-DP local reports is (epsilon, delta)-DP (FMT21).

    ``delta`` is the total delta (Thm 3.8's n delta0 term included). ``method="numerical"`` solves for eps on the exact
    divergence of FMT21's reduction and never exceeds eps0 (falling back to the trivial (eps0, delta0) guarantee);
    ``"closed_form"`` is the main theorem, valid for eps0 <= log(n / (16 log(2/delta))) (ConfigError otherwise).
    The numerical value is at most the closed form wherever the latter is valid.
    """
    n = _check(epsilon0, n, delta0, method)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    if method == "closed_form":
        validity = closed_form_validity_bound(n, delta)
        if epsilon0 > validity:
            raise ConfigError("epsilon0", epsilon0, f"a number <= log(n/(16 log(2/delta))) = {validity:.6g} "
                              "(validity range of the FMT21 closed form; use method='numerical')")
        if delta0 == 0.0:
            return _closed_form_epsilon(epsilon0, n, delta)
    epsilon = _smallest_feasible_epsilon(
        lambda eps: shuffle_delta(eps, epsilon0, n, delta0, method), delta, epsilon0, monotone=delta0 == 0.0
    )
    if epsilon is not None:
        return epsilon
    if method == "numerical" and delta0 <= delta:
        return epsilon0
    raise ConfigError("delta0", delta0, f"a number for which (e^eps + 1)(1 + e^-eps0/2) n delta0 < delta = {delta}")


# ---------------------------------------------------------------- binomial vector summation (Cheu et al. 2021)


def shuffle_local_epsilon(target_epsilon: float, n: int, delta: float, delta0: float = 0.0, *,
                          rtol: float = 1e-4) -> float:
    """The largest local epsilon0 whose n shuffled reports are (target_epsilon, delta)-DP (FMT21, numerical bound).

    The shuffled epsilon grows with epsilon0, so 1 / epsilon0 plays the role of the noise in ``solve_noise``.
    """
    from dpfl.accounting.calibrate import solve_noise

    return 1.0 / solve_noise(lambda u: shuffle_epsilon(1.0 / u, n, delta, delta0), target_epsilon, rtol=rtol)


@dataclass(frozen=True)
class BinomialSummationParameters:
    """Parameters of P_vec for n users and the exact error they give (see ``binomial_summation_parameters``)."""

    epsilon: float
    delta: float
    n: int
    dim: int
    bound: float
    grid: int  # g: each coordinate of x in [-L, L] is mapped to [0, 1], scaled by g and randomly rounded
    trials: int  # b: Bernoulli(p) noise bits (binomial trials) each user adds per coordinate
    probability: float  # p
    messages_per_user: int  # d (g + b): one-bit messages labelled by coordinate
    noise_variance_per_coordinate: float  # Var of the binomial noise in the estimate of one coordinate of the sum
    mean_squared_error: float  # upper bound on E||P_vec(X) - sum_i x_i||^2 (rounding + binomial noise)


def default_grid(dim: int) -> int:
    """g = ceil(sqrt(d)): the rounding's extra shift (up to 1 in every coordinate, sqrt(d) in l2) costs at most a
    factor (1 + sqrt(d)/g)^2 = 4 in noise variance over the grid's own shift g, with few trials to account."""
    return max(1, math.ceil(math.sqrt(check_range("dim", dim, 1, integer=True))))


def binomial_event(users: int, trials: int, probability: float, dim: int, grid: int):
    """The event of one P_vec run seen by an observer who does not know ``users`` users' bits, under replacing one
    user's vector by another of the same l2 bound L (distance 2L, so l2_shift = g)."""
    from dpfl.accounting.events import BinomialSumDpEvent

    return BinomialSumDpEvent(int(users) * int(trials), float(probability), int(dim), int(grid), float(grid))


def smallest_trials(epsilon_of_trials, target_epsilon: float, initial_trials: float) -> int:
    """The smallest b (within 5%) with ``epsilon_of_trials(b) <= target_epsilon`` (epsilon decreases in b: adding
    independent bits is post-processing); the returned b is checked to meet the target."""
    from dpfl.accounting.calibrate import solve_noise

    found = solve_noise(lambda b: epsilon_of_trials(max(1, math.ceil(b))), target_epsilon,
                        initial_noise=max(1.0, initial_trials), rtol=0.05)
    trials = max(1, math.ceil(found))
    while epsilon_of_trials(trials) > target_epsilon:  # never entered unless bisection stopped just short
        trials = math.ceil(trials * 1.05) + 1
    return trials


def gaussian_trials_guess(epsilon: float, delta: float, users: int, dim: int, grid: int, probability: float) -> float:
    """b for which Bin(U b, p) has the variance of a Gaussian of l2 sensitivity g + sqrt(d) at (eps, delta)
    (Dwork & Roth 2014, Thm A.1): only the calibration's starting point."""
    sigma = (grid + math.sqrt(dim)) * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    return sigma**2 / (users * probability * (1.0 - probability))


def binomial_summation_parameters(epsilon: float, delta: float, n: int, dim: int, bound: float, *,
                                  grid: int | None = None, probability: float = 0.5) -> BinomialSummationParameters:
    """Parameters of Cheu et al.'s (2021) shuffle vector-summation protocol P_vec for n vectors of l2 norm <= L, with
    the noise bits b calibrated so that the shuffled messages are (epsilon, delta)-DP under replacing one vector.

    Protocol: ``dpfl.protocols.shuffler``. Privacy: the RDP accountant on ``BinomialSumDpEvent`` (its proof is
    ``dpfl.accounting.binomial``: the shuffled view is the per-coordinate counts; approximate RDP of the worst
    allocation of the rounded shifts). g defaults to ``default_grid``. The estimate is unbiased with

        E||P_vec - sum_i x_i||^2 <= d (2L/g)^2 (n/4 + n b p (1 - p)).
    """
    from dpfl.accounting import accountants
    from dpfl.accounting.accountant import NEIGHBORING

    check_range("epsilon", epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    n = check_range("n", n, 1, integer=True)
    dim = check_range("dim", dim, 1, integer=True)
    check_range("bound", bound, 0.0, low_open=True)
    check_range("probability", probability, 0.0, 1.0, low_open=True, high_open=True)
    grid = default_grid(dim) if grid is None else check_range("grid", grid, 1, integer=True)

    def epsilon_of(trials: int) -> float:
        accountant = accountants.make("tightest", NEIGHBORING["replace_one"])
        accountant.compose(binomial_event(n, trials, probability, dim, grid))
        return accountant.get_epsilon(delta)

    trials = smallest_trials(epsilon_of, epsilon, gaussian_trials_guess(epsilon, delta, n, dim, grid, probability))
    scale = 2.0 * bound / grid
    noise_variance = scale**2 * n * trials * probability * (1.0 - probability)
    return BinomialSummationParameters(
        epsilon=epsilon, delta=delta, n=n, dim=dim, bound=bound, grid=grid, trials=trials, probability=probability,
        messages_per_user=dim * (grid + trials), noise_variance_per_coordinate=noise_variance,
        mean_squared_error=dim * (scale**2 * n / 4.0 + noise_variance),
    )
