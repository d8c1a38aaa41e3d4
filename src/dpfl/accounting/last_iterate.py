"""Last-iterate (hidden iterates) accountant of Asoodeh, Chen, Calmon, Ozgur (2021).

Algorithm 1 splits the n records into disjoint batches of m, uses each record in exactly one step
W_t = proj_rho(Psi_t(W_{t-1}) - s_t Z), s_t = eta_t sigma_t / sqrt(m), and releases only the last iterate W_T.
Theorem 2 bounds the hockey-stick divergence E_eps of W_T between neighbouring datasets by

    delta(eps) = (m/n) sum_t b_t prod_{j>t} a_j,
    b_t = theta_eps(2L / (sqrt(m) sigma_t))             injection: one step's sensitivity over its noise (Lemma 1)
    a_j = theta_eps(D_j sqrt(m) / (eta_j sigma_j))      contraction of step j's projected Gaussian kernel (Lemma 2)

with the diameter D_j = 2 rho of Psi_j(ball(rho)) for convex, L-Lipschitz, beta-smooth losses and eta_j <= 2/beta,
or D_j = 2 (rho + eta_j L) without convexity or smoothness (remark after Theorem 2). Corollary 3 releases W_tau at a
uniformly random tau instead: delta = (m/n) (1/T) sum_tau S_tau, S_tau = a_tau S_{tau-1} + b_tau.

Batches are disjoint, so at most n // m steps: a schedule of T steps uses T m records and leaves n - T m out (they
never influence the output); the factor m/n (a record is in a given batch with probability m/n) stays.
Everything is in log space (deltas like 1e-141 and far below stay finite). A schedule is stored as runs of equal
(eta_t, sigma_t), so a constant schedule costs O(1) whatever T, and any schedule O(T) numpy work per eps.

**The sound analysis** (``analysis="sound"``, what a run claims) keeps Theorem 2's decomposition over the owner's
secret batch t0 but bounds each conditional E_eps by the smaller of Theorem 2's b_t0 prod_{j>t0} a_j and amplification
by iteration's (Feldman et al. 2018, Theorem 22, converted by Canonne et al. 2020, Prop. 12:
``dpfl.accounting.amplification_by_iteration``); both bound the same conditional pair, so their minimum does, and
joint convexity mixes the minima as it mixes Theorem 2's terms. Amplification by iteration needs the steps after t0
to be non-expansive: exactly Theorem 2's convex diameter condition (a step flagged ``nonconvex`` ends the window).
It is O(T) per eps (positions, not runs). With random stopping it is applied per pair (t0, tau) for one run of equal
steps; a schedule of several runs takes Corollary 3 alone. ``analysis="paper"`` is Theorem 2 / Corollary 3 alone.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy.optimize import brentq
from scipy.special import erfcx

from dpfl.accounting.amplification_by_iteration import log_delta_gaussian_rdp, shift_mu
from dpfl.errors import ConfigError, check_range

_LOG_HALF = -math.log(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_SQRT_HALF_PI = math.sqrt(math.pi / 2)
_LOG_A_FLOOR = -1e3  # random stopping: a_t < e^-1000 raised to it (conservative), prefix-sum differences stay accurate
_SERIES_BELOW = 1e-3  # c (1 - a) below which sum_{s<=c-2} (c-1-s) a^s uses its Taylor series (cancellation)
_XTOL, _RTOL = 1e-12, 1e-12


def _log1mexp(x):
    """log(1 - e^x) for x <= 0, accurate on both sides of -log 2 (Maechler 2012)."""
    x = np.minimum(np.asarray(x, dtype=float), 0.0)
    out = np.empty(x.shape)
    near_zero = x > _LOG_HALF
    with np.errstate(divide="ignore"):
        out[near_zero] = np.log(-np.expm1(x[near_zero]))
    out[~near_zero] = np.log1p(-np.exp(x[~near_zero]))
    return out


def _logsumexp(values) -> float:
    top = float(np.max(values))
    return top if top == -math.inf else top + math.log(float(np.sum(np.exp(values - top))))


def _log_theta(eps: float, r, *, complement: bool = False):
    """log theta_eps(r) of Lemma 1, eq. (6), elementwise in r; with complement also log(1 - theta_eps(r)).

    With x = eps/r - r/2, y = eps/r + r/2 and the Mills ratio M = Q/phi, e^eps phi(y) = phi(x), so
    theta = phi(x) (M(x) - M(y)) and 1 - theta = Phi(x) + e^eps Q(y) = phi(x) (M(-x) + M(y)). The first has no
    cancellation between two tails where theta is small (x >= -1); for x < -1, theta > 2/3 comes from the second,
    a sum. Where M(x) - M(y) loses more than four digits (r tiny) it is the integral of -M' over [x, y] by the
    trapezoid rule, an upper bound (-M' is convex: M(x) = int_0^inf e^{-xt - t^2/2} dt is completely monotone)
    with relative error O(r^2).
    """
    r = np.asarray(r, dtype=float)
    log_theta, log_complement = np.empty(r.shape), np.empty(r.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x, y = eps / r - r / 2, eps / r + r / 2
        log_phi_x = -x * x / 2 - _LOG_SQRT_2PI
        mills_y = _mills(y)
        near_one = x < -1
        log_complement[near_one] = log_phi_x[near_one] + np.log(_mills(-x[near_one]) + mills_y[near_one])
        log_theta[near_one] = _log1mexp(log_complement[near_one])
        small = ~near_one
        x0, my0 = x[small], mills_y[small]
        mx0 = _mills(x0)
        gap = mx0 - my0
        trapezoid = r[small] * (_mills_slope(x0, mx0) + _mills_slope(y[small], my0)) / 2
        log_theta[small] = log_phi_x[small] + np.log(np.where(gap > 1e-4 * mx0, gap, trapezoid))
    vanishing = r == 0
    log_theta[vanishing] = -np.inf
    if not complement:
        return log_theta
    log_complement[small] = _log1mexp(log_theta[small])
    log_complement[vanishing] = 0.0
    return log_theta, log_complement


def _mills(x):
    """Mills ratio M(x) = Q(x) / phi(x)."""
    return _SQRT_HALF_PI * erfcx(x / math.sqrt(2))


def _mills_slope(x, mills_x):
    """-M'(x) = 1 - x M(x); beyond x = 1e4 (cancellation) its upper bound 1 / (1 + x^2), tight to 2 / x^2."""
    return np.where(x < 1e4, 1 - x * mills_x, 1 / (1 + x * x))


def _scalar(value):
    return value.item() if isinstance(value, np.generic) else value


def _check_eps(eps) -> float:
    return float(check_range("eps", _scalar(eps), 0, math.inf, high_open=True))


def _check_r(r) -> np.ndarray:
    values = np.asarray(r, dtype=float)
    bad = np.flatnonzero(~(values >= 0))
    if bad.size:
        check_range("r" if values.ndim == 0 else f"r[{bad[0]}]", values.flat[bad[0]].item(), 0)
    return values


def _shaped(values: np.ndarray, like: np.ndarray):
    return float(values) if like.ndim == 0 else values


def log_theta(eps: float, r):
    """log theta_eps(r), the E_eps divergence between Gaussians at distance r noise units (Lemma 1, eq. (6)).

    Vectorised over r >= 0; theta_eps(0) = 0 (log = -inf) and theta_eps(inf) = 1.
    """
    r = _check_r(r)
    return _shaped(_log_theta(_check_eps(eps), r), r)


def log1m_theta(eps: float, r):
    """log(1 - theta_eps(r)), computed directly (accurate where theta_eps(r) is close to 1)."""
    r = _check_r(r)
    return _shaped(_log_theta(_check_eps(eps), r, complement=True)[1], r)


def theta(eps: float, r):
    """theta_eps(r) = Q(eps/r - r/2) - e^eps Q(eps/r + r/2) of Lemma 1, eq. (6)."""
    r = _check_r(r)
    return _shaped(np.exp(_log_theta(_check_eps(eps), r)), r)


def _log_geometric(log_a, c):
    """log g(a, c) = log sum_{s<c} a^s = log((1 - a^c) / (1 - a)); exact limits c at a = 1 and 1 at a = 0."""
    log_a, c = np.asarray(log_a, dtype=float), np.asarray(c, dtype=float)
    out = np.zeros(log_a.shape)  # g(a, 1) = 1
    longer = c != 1
    la, cl = log_a[longer], c[longer]
    with np.errstate(invalid="ignore"):
        out[longer] = np.where(la == 0, np.log(cl), _log1mexp(cl * la) - _log1mexp(la))
    return out


def _log_double_geometric(log_a, c):
    """log G(a, c) = log sum_{p<c} g(a, p) = log sum_{s<=c-2} (c-1-s) a^s, for random stopping (Corollary 3).

    G = (c (1 - a) - (1 - a^c)) / (1 - a)^2 cancels when c (1 - a) is small; there, with x = -log a,
    G = c(c-1)/2 [1 - (c-2) x / 3 + (c-1)(c-2) x^2 / 12 + O((c x)^3)].
    """
    x, c = -np.asarray(log_a, dtype=float), np.asarray(c, dtype=float)
    out = np.full(x.shape, -np.inf)  # G(a, 1) = 0
    series, direct = (c > 1) & (c * x < _SERIES_BELOW), (c > 1) & (c * x >= _SERIES_BELOW)
    xs, cs, xd, cd = x[series], c[series], x[direct], c[direct]
    out[series] = np.log(cs * (cs - 1) / 2) + np.log1p(-(cs - 2) * xs / 3 + (cs - 1) * (cs - 2) * xs**2 / 12)
    out[direct] = np.log(-cd * np.expm1(-xd) + np.expm1(-cd * xd)) - 2 * np.log(-np.expm1(-xd))
    return out


@dataclass(frozen=True)
class _Runs:
    """A schedule as runs of equal steps: run k repeats counts[k] times the injection b = theta_eps(r[b_index[k]])
    and the contraction a = theta_eps(r[a_index[k]]); r holds the distinct distances (in noise units) once.
    shift_mu: per position t0 = 1..T, the Gaussian-Renyi parameter of amplification by iteration
    (``amplification_by_iteration.shift_mu``), for the sound analysis."""

    r: np.ndarray
    b_index: np.ndarray
    a_index: np.ndarray
    counts: np.ndarray
    shift_mu: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.counts.sum())


def _runs(eta, sigma, counts, batch_size: int, lipschitz: float, radius: float, nonconvex) -> _Runs:
    """Injection 2L / (sqrt(m) sigma_t) and contraction D_t sqrt(m) / (eta_t sigma_t) arguments of Theorem 2;
    ``nonconvex`` is one flag for every run or one per run (the diameter 2(rho + eta_t L) where it is set)."""
    sqrt_m = math.sqrt(batch_size)
    diameter = np.where(nonconvex, 2 * (radius + eta * lipschitz), 2 * radius)
    r_b, r_a = 2 * lipschitz / (sqrt_m * sigma), diameter * sqrt_m / (eta * sigma)
    r, index = np.unique(np.concatenate([r_b, r_a]), return_inverse=True)
    counts = np.asarray(counts, dtype=float)
    per_step = np.repeat(np.arange(counts.size), counts.astype(int))
    contractive = ~np.broadcast_to(np.asarray(nonconvex, dtype=bool), counts.shape)
    mu = shift_mu(np.asarray(eta)[per_step], np.asarray(sigma)[per_step], contractive[per_step], batch_size,
                  lipschitz)
    return _Runs(r, index[: r_b.size], index[r_b.size :], counts, mu)


def _log_delta_runs(eps: float, runs: _Runs, n: int, batch_size: int, random_stop: bool) -> float:
    """log delta of Theorem 2 (or Corollary 3 with random_stop) for a schedule given as runs, O(#runs) numpy work."""
    if runs.steps == 0:
        return -math.inf
    log_theta_r = _log_theta(eps, runs.r)
    log_b, log_a, c = log_theta_r[runs.b_index], log_theta_r[runs.a_index], runs.counts
    log_q = math.log(batch_size / n)  # below, min(0, .) drops rounding above delta = 1
    if not random_stop:
        # S_T = sum_t b_t prod_{j>t} a_j: run k contributes b_k g(a_k, c_k) times a_l^{c_l} of every later run l.
        later = np.concatenate([np.cumsum((c * log_a)[:0:-1])[::-1], [0.0]])
        return min(0.0, log_q + _logsumexp(log_b + _log_geometric(log_a, c) + later))
    # sum_tau S_tau = sum_t b_t R_t, R_t = sum_{tau>=t} prod_{j=t+1..tau} a_j. With E_k = R at the last step of run k
    # (E_K = 1, E_{k-1} = g_k + a_k^{c_k} E_k) run k contributes b_k (G(a_k, c_k) + g(a_k, c_k) E_k). E_k is a tail
    # log-sum-exp of prefix sums Lambda of c log a, shifted by -Lambda_k.
    log_a = np.maximum(log_a, _LOG_A_FLOOR)
    log_g = _log_geometric(log_a, c)
    prefix = np.concatenate([[0.0], np.cumsum(c * log_a)])
    tail = np.logaddexp.accumulate(np.concatenate([log_g + prefix[:-1], prefix[-1:]])[::-1])[::-1]
    log_e = tail[1:] - prefix[1:]
    log_sum_s = _logsumexp(log_b + np.logaddexp(_log_double_geometric(log_a, c), log_g + log_e))
    return min(0.0, log_q - math.log(runs.steps) + log_sum_s)


def _log_delta_sound(eps: float, runs: _Runs, n: int, batch_size: int, random_stop: bool) -> float:
    """log delta of the sound analysis: per position t0 the smaller of Theorem 2's conditional bound
    b_t0 prod_{j>t0} a_j and amplification by iteration's (``amplification_by_iteration``), mixed over t0 with the
    weight m/n of each batch (joint convexity of E_eps, as in Theorem 2). With random_stop, W_tau for tau ~ U{1..T}:
    the same per pair (t0, tau) averaged over tau, for one run of equal steps (positions k = tau - t0 + 1 steps from
    entry to release, T - k + 1 pairs each); a schedule of several runs takes Corollary 3 alone (O(T^2) pairs)."""
    steps = runs.steps
    if steps == 0:
        return -math.inf
    if random_stop and runs.counts.size > 1:
        return _log_delta_runs(eps, runs, n, batch_size, True)
    log_theta_r = _log_theta(eps, runs.r)
    log_b, log_a, c = log_theta_r[runs.b_index], log_theta_r[runs.a_index], runs.counts
    later = np.concatenate([np.cumsum((c * log_a)[:0:-1])[::-1], [0.0]])
    # position i of run k (0-based from the run's end) is hidden by i steps of its own run and every later run
    within = np.concatenate([np.arange(count - 1, -1, -1, dtype=float) for count in c.astype(int)])
    run_of = np.repeat(np.arange(c.size), c.astype(int))
    contraction = log_b[run_of] + within * np.maximum(log_a[run_of], _LOG_A_FLOOR) + later[run_of]
    terms = np.minimum(contraction, log_delta_gaussian_rdp(eps, runs.shift_mu))
    log_q = math.log(batch_size / n)
    if not random_stop:
        return min(0.0, log_q + _logsumexp(terms))
    pairs = np.log(np.arange(1, steps + 1, dtype=float))  # position t0 = T - k + 1 pairs with T - k + 1 taus
    return min(0.0, log_q - math.log(steps) + _logsumexp(terms + pairs))


ANALYSES = ("sound", "paper")


def _log_delta_analysis(analysis: str, eps: float, runs: _Runs, n: int, batch_size: int, random_stop: bool) -> float:
    if analysis == "paper":
        return _log_delta_runs(eps, runs, n, batch_size, random_stop)
    return _log_delta_sound(eps, runs, n, batch_size, random_stop)


def _check_analysis(analysis: str) -> str:
    if analysis not in ANALYSES:
        raise ConfigError("analysis", analysis, f"one of {list(ANALYSES)} ('paper': Asoodeh et al.'s Theorem 2 / "
                                                "Corollary 3 alone)")
    return analysis


def _check_positive(field_name: str, value) -> float:
    return check_range(field_name, _scalar(value), 0, math.inf, low_open=True, high_open=True)


def _check_setting(n, batch_size, lipschitz, radius, smoothness) -> None:
    check_range("n", n, 1, integer=True)
    check_range("batch_size", batch_size, 1, n, integer=True)
    _check_positive("lipschitz", lipschitz)
    _check_positive("radius", radius)
    if smoothness is not None:
        _check_positive("smoothness", smoothness)


def _check_schedule(field_name: str, values, max_steps: int) -> np.ndarray:
    """A positive finite scalar (0-d result) or a non-empty 1-d sequence of at most max_steps of them."""
    if np.ndim(values) == 0:
        return np.asarray(float(_check_positive(field_name, values)))
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        array = np.empty((0, 0))
    if array.ndim != 1 or array.size == 0:
        raise ConfigError(field_name, values, "a positive number or a non-empty 1-d sequence of them")
    bad = np.flatnonzero(~((array > 0) & (array < math.inf)))
    if bad.size:
        _check_positive(f"{field_name}[{bad[0]}]", array[bad[0]].item())
    if array.size > max_steps:
        raise ConfigError(
            f"len({field_name})", array.size,
            f"at most n // batch_size = {max_steps} steps (disjoint batches: each record is used exactly once)",
        )
    return array


def _check_smooth_steps(field_name: str, eta, smoothness, nonconvex: bool) -> None:
    """Theorem 2's diameter 2 rho needs every eta_t <= 2/beta (errata: the paper writes eta <= 2/beta)."""
    if smoothness is None or nonconvex:
        return
    steps = np.atleast_1d(eta)
    bad = np.flatnonzero(steps > 2 / smoothness)
    if bad.size:
        raise ConfigError(
            field_name if np.ndim(eta) == 0 else f"{field_name}[{bad[0]}]", steps[bad[0]].item(),
            f"at most 2/smoothness = {2 / smoothness:g} (Theorem 2 needs eta_t <= 2/beta for convex smooth losses; "
            "pass nonconvex=True for the diameter 2(rho + eta_t L), which needs neither)",
        )


def _run_length(*schedules: np.ndarray):
    """Run-length encoding of aligned per-step arrays: (the values at each run's start..., run lengths)."""
    changes = np.zeros(schedules[0].size - 1, dtype=bool)
    for values in schedules:
        changes |= np.diff(values) != 0
    starts = np.flatnonzero(np.concatenate([[True], changes]))
    return (*(values[starts] for values in schedules), np.diff(np.append(starts, schedules[0].size)))


def _schedule_runs(lrs, sigmas, n, batch_size, lipschitz, radius, nonconvex, smoothness) -> _Runs:
    """Validates a schedule of T <= n // m steps (two scalars mean T = n // m) and run-length encodes it."""
    _check_setting(n, batch_size, lipschitz, radius, smoothness)
    eta = _check_schedule("lrs", lrs, n // batch_size)
    sigma = _check_schedule("sigmas", sigmas, n // batch_size)
    _check_smooth_steps("lrs", eta, smoothness, nonconvex)
    if eta.ndim == sigma.ndim == 0:
        eta = np.full(n // batch_size, eta)
    if eta.ndim == sigma.ndim == 1 and eta.size != sigma.size:
        raise ConfigError("len(sigmas)", sigma.size, f"len(lrs) = {eta.size}, or a scalar sigma")
    eta, sigma = np.broadcast_arrays(eta, sigma)
    return _runs(*_run_length(eta, sigma), batch_size, lipschitz, radius, nonconvex)


def solve_epsilon(log_delta_of_eps: Callable[[float], float], delta_target: float) -> float:
    """Smallest eps >= 0 with log_delta_of_eps(eps) <= log(delta_target); 0 when eps = 0 already meets it.

    delta(eps) is non-increasing in eps (every theta_eps(r) is), so the root is bracketed by doubling and found by
    Brent's method (bisection-safeguarded) on log delta, then rounded up by the tolerance so delta(eps) <= target.
    """
    log_target = math.log(check_range("delta", delta_target, 0, 1, low_open=True, high_open=True))

    @functools.lru_cache(maxsize=None)
    def excess(eps: float) -> float:
        return max(log_delta_of_eps(eps) - log_target, -1e300)  # finite for Brent's interpolation

    if excess(0.0) <= 0:
        return 0.0
    high = 1.0
    while excess(high) > 0:
        high *= 2
    root = brentq(excess, 0.0 if high == 1.0 else high / 2, high, xtol=_XTOL, rtol=_RTOL)
    return root + _XTOL + _RTOL * root


def log_delta(eps, lrs, sigmas, n, batch_size, lipschitz, radius, *, nonconvex=False, random_stop=False,
              smoothness=None, analysis="paper") -> float:
    """log delta(eps) of Theorem 2 (last iterate W_T) or, with random_stop, Corollary 3 (W_tau, tau ~ U{1..T}).

    lrs (eta_t) and sigmas (sigma_t) are scalars or sequences of the T <= n // batch_size steps; two scalars mean
    T = n // batch_size. Records in no batch (n - T m of them) are never used. smoothness (beta) checks
    eta_t <= 2/beta unless nonconvex, which uses the diameter 2(rho + eta_t L) instead of 2 rho. analysis =
    "sound" takes, per position, the smaller of Theorem 2's bound and amplification by iteration's (what a run
    claims: `LastIterateAccountant`); "paper" (the default here) is Theorem 2 / Corollary 3 alone.
    """
    runs = _schedule_runs(lrs, sigmas, n, batch_size, lipschitz, radius, nonconvex, smoothness)
    return _log_delta_analysis(_check_analysis(analysis), _check_eps(eps), runs, n, batch_size, random_stop)


def delta(eps, lrs, sigmas, n, batch_size, lipschitz, radius, *, nonconvex=False, random_stop=False,
          smoothness=None, analysis="paper") -> float:
    """delta(eps) of Theorem 2 / Corollary 3: exp of `log_delta` (may underflow to 0; prefer log_delta)."""
    return math.exp(log_delta(eps, lrs, sigmas, n, batch_size, lipschitz, radius, nonconvex=nonconvex,
                              random_stop=random_stop, smoothness=smoothness, analysis=analysis))


def epsilon(delta_target, lrs, sigmas, n, batch_size, lipschitz, radius, *, nonconvex=False, random_stop=False,
            smoothness=None, analysis="paper") -> float:
    """Smallest eps with delta(eps) <= delta_target for Theorem 2 / Corollary 3 (see `log_delta`)."""
    runs = _schedule_runs(lrs, sigmas, n, batch_size, lipschitz, radius, nonconvex, smoothness)
    analysis = _check_analysis(analysis)
    return solve_epsilon(lambda eps: _log_delta_analysis(analysis, eps, runs, n, batch_size, random_stop),
                         delta_target)


def log_delta_constant(eps, lr, sigma, n, batch_size, lipschitz, radius, *, nonconvex=False, smoothness=None,
                       steps=None) -> float:
    """Theorem 2's closed form for eta_t = eta, sigma_t = sigma: delta = (m/n) b (1 - a^T) / (1 - a).

    steps defaults to T = n // batch_size. It may be any real in (0, n/m]: Fig. 2 evaluates T = n/m = 10/3
    (q = 0.3), which no run of Algorithm 1 has; use it only to reproduce the paper.
    """
    _check_setting(n, batch_size, lipschitz, radius, smoothness)
    eta = np.array([_check_positive("lr", lr)], dtype=float)
    sigma_t = np.array([_check_positive("sigma", sigma)], dtype=float)
    if steps is None:
        steps = n // batch_size
    check_range("steps", steps, 0, n / batch_size, low_open=True)
    _check_smooth_steps("lr", lr, smoothness, nonconvex)
    runs = _runs(eta, sigma_t, [steps], batch_size, lipschitz, radius, nonconvex)
    log_theta_r = _log_theta(_check_eps(eps), runs.r)
    log_b, log_a = log_theta_r[runs.b_index[0]], log_theta_r[runs.a_index[0]]
    return math.log(batch_size / n) + float(log_b + _log_geometric(log_a, steps))


def composition_log_delta(eps, sigmas, n, batch_size, lipschitz) -> float:
    """Baseline without hiding: every iterate W_1..W_T released, delta = (m/n) sum_t theta_eps(2L/(sqrt(m) sigma_t)).

    A record enters one step, at a secret uniformly random batch; given the batch assignment the released
    trajectories differ in that step only (a Gaussian shift, Lemma 1; later steps are post-processing), and joint
    convexity of E_eps over the assignment gives the sum. Theorem 2 is this with the contraction factors a_j.
    A scalar sigma means T = n // batch_size steps and gives the single-step theta_eps(2L/(sqrt(m) sigma)) when m | n.
    """
    check_range("n", n, 1, integer=True)
    check_range("batch_size", batch_size, 1, n, integer=True)
    _check_positive("lipschitz", lipschitz)
    sigma = _check_schedule("sigmas", sigmas, n // batch_size)
    sigma_runs, counts = _run_length(np.broadcast_to(sigma, n // batch_size if sigma.ndim == 0 else sigma.size))
    log_b = _log_theta(_check_eps(eps), 2 * lipschitz / (math.sqrt(batch_size) * sigma_runs))
    return math.log(batch_size / n) + _logsumexp(log_b + np.log(counts))


def composition_epsilon(delta_target, sigmas, n, batch_size, lipschitz) -> float:
    """Smallest eps with `composition_log_delta` <= log(delta_target): what releasing every iterate costs."""
    return solve_epsilon(lambda eps: composition_log_delta(eps, sigmas, n, batch_size, lipschitz), delta_target)


@dataclass
class LastIterateAccountant:
    """The last iterate's privacy for a run fed one step (eta_t, sigma_t) at a time, queried at any time:
    ``analysis = "sound"`` (default), per position the smaller of Theorem 2 / Corollary 3 and amplification by
    iteration (``amplification_by_iteration``); ``"paper"``, Theorem 2 / Corollary 3 alone.

    delta depends on eps through every factor, so a running S for one eps cannot answer epsilon(delta); the
    accountant keeps the schedule as runs of equal steps instead: `step` is O(1) and a query is O(#runs) (O(1) for a
    constant schedule) for the paper analysis, O(T) for the sound one. The answer is for releasing the current
    iterate W_t; records not yet used do not count.
    With random_stop it is for W_tau, tau ~ U{1..t}, or, given the ``horizon`` T the stopping time was drawn for
    (tau ~ U{1..T}), for W_min(tau, t), what a run stopped after t < T steps releases: by joint convexity over tau,
    delta_t = (t/T) delta_stop(t) + ((T - t)/T) delta_last(t), Corollary 3 and Theorem 2 after t steps (= Corollary 3
    at t = T). A step may use the non-convex diameter on its own (``step(..., nonconvex=True)``), e.g. the early steps
    of eta_t = 1/(lambda t) where eta_t > 2/beta.
    """

    n: int
    batch_size: int
    lipschitz: float
    radius: float
    nonconvex: bool = False
    random_stop: bool = False
    smoothness: float | None = None
    horizon: int | None = None
    analysis: str = "sound"
    _lrs: list = field(default_factory=list, init=False, repr=False)
    _sigmas: list = field(default_factory=list, init=False, repr=False)
    _nonconvex: list = field(default_factory=list, init=False, repr=False)
    _counts: list = field(default_factory=list, init=False, repr=False)
    steps: int = field(default=0, init=False)

    def __post_init__(self):
        _check_setting(self.n, self.batch_size, self.lipschitz, self.radius, self.smoothness)
        _check_analysis(self.analysis)
        if self.horizon is not None:
            check_range("horizon", self.horizon, 1, self.n // self.batch_size, integer=True)

    @property
    def max_steps(self) -> int:
        return self.n // self.batch_size if self.horizon is None else self.horizon

    def step(self, lr: float, sigma: float, nonconvex: bool | None = None, count: int = 1) -> None:
        """Records ``count`` steps of Algorithm 1 with learning rate eta_t = lr and noise sigma_t = sigma (the std of
        a user's noise, in the units of L); ``nonconvex`` (default: the accountant's) picks their diameter."""
        lr, sigma = float(_check_positive("lr", lr)), float(_check_positive("sigma", sigma))
        count = check_range("count", count, 1, integer=True)
        nonconvex = self.nonconvex if nonconvex is None else bool(nonconvex)
        _check_smooth_steps("lr", lr, self.smoothness, nonconvex)
        if self.steps + count > self.max_steps:
            limit = "n // batch_size" if self.horizon is None else "the horizon"
            raise ConfigError(
                "steps", self.steps + count,
                f"at most {limit} = {self.max_steps} (disjoint batches: each record used once)",
            )
        if self._lrs and (self._lrs[-1], self._sigmas[-1], self._nonconvex[-1]) == (lr, sigma, nonconvex):
            self._counts[-1] += count
        else:
            self._lrs.append(lr)
            self._sigmas.append(sigma)
            self._nonconvex.append(nonconvex)
            self._counts.append(count)
        self.steps += count

    def _schedule(self) -> _Runs:
        return _runs(np.array(self._lrs, dtype=float), np.array(self._sigmas, dtype=float), self._counts,
                     self.batch_size, self.lipschitz, self.radius, np.array(self._nonconvex, dtype=bool))

    def _log_delta_of(self, runs: _Runs, eps: float) -> float:
        if not self.random_stop:
            return _log_delta_analysis(self.analysis, eps, runs, self.n, self.batch_size, False)
        stopped = _log_delta_analysis(self.analysis, eps, runs, self.n, self.batch_size, True)
        if self.horizon is None or self.steps in (0, self.horizon):
            return stopped
        t, horizon = self.steps, self.horizon
        last = _log_delta_analysis(self.analysis, eps, runs, self.n, self.batch_size, False)
        return float(np.logaddexp(math.log(t / horizon) + stopped, math.log((horizon - t) / horizon) + last))

    def log_delta(self, eps: float) -> float:
        return self._log_delta_of(self._schedule(), _check_eps(eps))

    def delta(self, eps: float) -> float:
        return math.exp(self.log_delta(eps))

    def epsilon(self, delta_target: float) -> float:
        runs = self._schedule()
        return solve_epsilon(lambda eps: self._log_delta_of(runs, eps), delta_target)
