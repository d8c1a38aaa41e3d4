"""The PLD of the (Poisson-subsampled) Gaussian mechanism, dp_accounting's connect-the-dots construction vectorised.

dp_accounting (0.6.0) builds ``PrivacyLossDistribution.from_gaussian_mechanism`` by the connect-the-dots algorithm
(Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022, Alg. 1): for every grid loss eps_k = k * interval between the
losses at the noise's truncation points (``connect_dots_bounds``) it computes the hockey-stick divergence
delta(eps_k) = mu_upper_cdf(x_k) - e^{eps_k} mu_lower_cdf(x_k) at x_k = L^{-1}(eps_k), the largest output whose
privacy loss is at least eps_k (the loss is non-increasing in x), and hands the deltas to
``pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap``. It finds the x_k one at a time, a Python call per grid
point (``inverse_privacy_loss``): about 80,000 points per direction at z = 1, q = 0.1 and the 1e-4 grid, 1-4 s, most of
a run's first round. Here the x_k are computed for the whole grid at once in numpy, by the same closed forms
(sensitivity s = 1, standard deviation sigma, subsampling q, the Gaussian's unsubsampled inverse loss
I(l) = -s / 2 - l sigma^2 / s):

* REMOVE (mu_upper = (1 - q) mu + q mu(. + s), mu_lower = mu): x = I(log(1 + (e^eps - 1) / q)) for
  eps > log(1 - q), computed as dp_accounting does (log(e^{eps + log(1/q)} - (1/q - 1)) by ``_log_sub``), +inf
  where eps is within 1e-9 relative of log(1 - q) (``math.isclose``); delta = 1 - e^eps below it;
* ADD (mu_upper = mu, mu_lower = (1 - q) mu + q mu(. - s)): x = s + I(-log(1 + (e^{-eps} - 1) / q)) for
  eps < -log(1 - q), -inf where eps is within 1e-9 relative of -log(1 - q); delta = 0 above it;
* REPLACE (dp_accounting's replace-one reading: mu_upper = (1 - q) mu + q mu(. + s), mu_lower = (1 - q) mu +
  q mu(. - s)): x = sigma^2 / s (asinh(-sinh(eps / 2) alpha) - eps / 2), alpha = e^{s^2 / (2 sigma^2)} (1 - q) / q,
  through log-space sinh and asinh as dp_accounting's ``common.log_sinh`` and ``asinh_exp``; x = 0 at eps = 0;
* q = 1: x = I(eps) (REMOVE, and REPLACE with twice the sensitivity: -eps sigma^2 / (2 s)) or s + I(eps) (ADD).

The divergences then come from the mechanism's own (vectorised) cdfs, and the PMF from dp_accounting's own construction,
so the PLD is dp_accounting's up to the last bits of numpy's vectorised log and exp against its scalar calls: epsilon
agrees to 1e-9 relative (tests/accounting/test_gaussian_pld.py, on a grid of q, z, compositions and every neighbouring
relation dpfl uses), each grid probability to 1e-10 (numpy 2.4: up to 5.6e-12 for replace-one, whose sinh and asinh
round a grid point's divergence an ulp apart; the numpy CI installed before gave the same bits). Any other dp_accounting
layout (its private ``_create_pmf`` steps renamed) is left to dp_accounting's own construction.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import privacy_accountant
from dp_accounting.pld import pld_pmf, privacy_loss_distribution, privacy_loss_mechanism

NeighborRel = privacy_accountant.NeighboringRelation
Adjacency = privacy_loss_mechanism.AdjacencyType
Pld = privacy_loss_distribution.PrivacyLossDistribution
#: ``math.isclose``'s default relative tolerance, which dp_accounting's inverse losses compare with
_ISCLOSE = 1e-9
#: dp_accounting's defaults for ``from_gaussian_mechanism``
LOG_MASS_TRUNCATION_BOUND = -50.0


def gaussian_pld(noise_multiplier: float, sampling_prob: float, relation: NeighborRel, interval: float) -> Pld:
    """``PrivacyLossDistribution.from_gaussian_mechanism(noise_multiplier, sampling_prob=sampling_prob,
    value_discretization_interval=interval, neighboring_relation=relation)`` (sensitivity 1, pessimistic,
    connect-the-dots), with its grid's inverse losses computed at once (module docstring). ``noise_multiplier`` > 0,
    ``sampling_prob`` in (0, 1]."""

    def pmf(adjacency: Adjacency) -> pld_pmf.PLDPmf:
        loss = privacy_loss_mechanism.GaussianPrivacyLoss(
            noise_multiplier, sensitivity=1, pessimistic_estimate=True,
            log_mass_truncation_bound=LOG_MASS_TRUNCATION_BOUND, sampling_prob=sampling_prob,
            adjacency_type=adjacency)
        bounds = loss.connect_dots_bounds()
        lower = math.floor(bounds.epsilon_lower / interval)
        upper = math.ceil(bounds.epsilon_upper / interval)
        deltas = hockey_stick(loss, np.arange(lower, upper + 1) * interval)
        return connect_the_dots(interval, lower, upper, deltas)

    if relation == NeighborRel.REPLACE_ONE:
        return Pld(pmf(Adjacency.REPLACE))
    if relation not in (NeighborRel.ADD_OR_REMOVE_ONE, NeighborRel.REPLACE_SPECIAL):
        raise ValueError(f"unsupported neighboring relation {relation}")
    remove = pmf(Adjacency.REMOVE)
    return Pld(remove) if sampling_prob == 1.0 else Pld(remove, pmf(Adjacency.ADD))


def hockey_stick(loss: privacy_loss_mechanism.GaussianPrivacyLoss, epsilons: np.ndarray) -> np.ndarray:
    """``loss.get_delta_for_epsilon(epsilons)`` with the inverse losses of ``inverse_losses``."""
    q = loss.sampling_prob
    deltas = np.zeros_like(epsilons, dtype=float)
    if q == 1.0 or loss.adjacency_type == Adjacency.REPLACE:
        inverse = np.full(len(epsilons), True)
    elif loss.adjacency_type == Adjacency.ADD:
        inverse = epsilons < -math.log1p(-q)
    else:
        inverse = epsilons > math.log1p(-q)
        deltas[~inverse] = -np.expm1(epsilons[~inverse])
    x = inverse_losses(loss, epsilons[inverse])
    deltas[inverse] = loss.mu_upper_cdf(x) - np.exp(epsilons[inverse] + loss.mu_lower_log_cdf(x))
    return np.clip(deltas, 0, 1)


def inverse_losses(loss: privacy_loss_mechanism.GaussianPrivacyLoss, epsilons: np.ndarray) -> np.ndarray:
    """``[loss.inverse_privacy_loss(e) for e in epsilons]`` in numpy (module docstring's closed forms), for epsilons
    where dp_accounting computes it (``hockey_stick``: its ``inverse_indices``)."""
    s, sigma, q = loss.sensitivity, loss.standard_deviation, loss.sampling_prob
    variance = sigma**2

    def unsampled_remove(losses):  # GaussianPrivacyLoss._inverse_privacy_loss_without_subsampling_remove
        return -0.5 * s - losses * variance / s

    if loss.adjacency_type == Adjacency.REPLACE:
        return _inverse_replace(epsilons, s, sigma, q)
    if q == 1.0:
        return unsampled_remove(epsilons) + (s if loss.adjacency_type == Adjacency.ADD else 0.0)
    sign = 1.0 if loss.adjacency_type == Adjacency.REMOVE else -1.0  # ADD: the REMOVE form at -eps, negated
    edge = sign * math.log(1 - q)
    at_edge = np.abs(epsilons - edge) <= _ISCLOSE * np.maximum(np.abs(epsilons), abs(edge))
    unsampled = sign * _log_a_exp_b_plus_c(1 / q, sign * epsilons, 1 - 1 / q)
    x = unsampled_remove(np.where(at_edge, -sign * math.inf, unsampled))
    return x + (s if loss.adjacency_type == Adjacency.ADD else 0.0)


def connect_the_dots(interval: float, lower: int, upper: int, deltas: np.ndarray) -> pld_pmf.PLDPmf:
    """``pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(interval, lower, upper, deltas)``: a dense PMF built
    from its probabilities at once, where dp_accounting passes them through a dict of one entry per point and back
    (``create_pmf``, ``common.dictionary_to_list``: 0.1 s per 80,000 points); the same arithmetic, the same numbers.
    A PMF small enough to be sparse (or a layout without ``_MAX_PMF_SPARSE_SIZE``) is dp_accounting's own."""
    deltas = np.asarray(deltas, dtype=np.float64)
    if upper - lower + 1 <= getattr(pld_pmf, "_MAX_PMF_SPARSE_SIZE", math.inf) or len(deltas) != upper - lower + 1 \
            or np.any(np.diff(deltas) > pld_pmf._DELTA_DIFF_TOLERANCE) or np.any((deltas < 0) | (deltas > 1)):
        return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(interval, lower, upper, deltas)  # or its error
    deltas = np.minimum.accumulate(deltas)
    diffs = np.diff(deltas)
    probs = np.zeros_like(deltas)
    probs[0] = 1 - deltas[0] + diffs[0] / math.expm1(interval)
    probs[1:-1] = (diffs[1:] - diffs[:-1] * math.exp(interval)) / math.expm1(interval)
    probs[-1] = diffs[-1] / math.expm1(-interval)
    return pld_pmf.DensePLDPmf(interval, lower, np.maximum(0.0, probs), deltas[-1], True)


def _log_a_exp_b_plus_c(a: float, b: np.ndarray, c: float) -> np.ndarray:
    """``common.log_a_times_exp_b_plus_c(a, b, c)`` elementwise for a > 1, c = 1 - a < 0 (the inverse losses'
    case): log(a + c) = 0 at b = 0, else d + log1p(-exp(log(-c) - d)), d = b + log(a) (``_log_sub``; NaN where
    it would raise, b <= log(1 - 1/a)... never asked: ``hockey_stick`` asks above it)."""
    d = b + np.log(a)
    with np.errstate(invalid="ignore", divide="ignore"):
        result = d + np.log1p(-np.exp(np.log(-c) - d))
    return np.where(b == 0, np.log(a + c), result)


def _inverse_replace(epsilons: np.ndarray, s: float, sigma: float, q: float) -> np.ndarray:
    """``GaussianPrivacyLoss._inverse_privacy_loss_replace`` elementwise."""
    variance = sigma**2
    if q == 1.0:
        return np.where(epsilons == 0, 0.0, -epsilons * variance / s / 2)
    magnitude = np.abs(epsilons)
    sign = np.where(epsilons >= 0, 1.0, -1.0)
    log_alpha = 0.5 * (s / sigma) ** 2 + math.log1p(-q) - math.log(q)
    half = magnitude / 2
    with np.errstate(divide="ignore"):  # common.log_sinh: a + log1p(-exp(-2a)) - log 2 (0 at a = 0: masked below)
        log_sinh = half + np.log1p(-np.exp(-2 * half)) - math.log(2)
    log_term = log_alpha + log_sinh  # common.asinh_exp(log_term, -sign): |b| = 1
    asinh = -sign * np.logaddexp(0.5 * np.logaddexp(0, 2 * log_term), log_term)
    return np.where(epsilons == 0, 0.0, variance / s * (asinh - epsilons / 2))


__all__ = ["LOG_MASS_TRUNCATION_BOUND", "gaussian_pld", "hockey_stick", "inverse_losses", "connect_the_dots"]
