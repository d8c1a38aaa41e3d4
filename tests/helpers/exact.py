"""Exact privacy of small instances: the ground truth that worst-case tests hold accountants to (a test oracle: it
lives with the tests, not in the installed package; the Gaussian DP closed forms it uses are ``dpfl.accounting.theory``).

An accountant's claim (an RDP curve, or epsilon at a delta) is sound only if it is never below the privacy of any
instance the algorithm can meet. This module computes that privacy *exactly* for instances whose view reduces to a
pair of one-dimensional Gaussian mixtures with a common standard deviation sigma,

    P = sum_i w_i N(m_i, sigma^2)        (the observer's view on one dataset)
    Q = sum_j v_j N(n_j, sigma^2)        (on its neighbour),

composed over independent rounds. Everything is computed from the two mixtures; nothing is taken from an accountant.
Torch-free. All means are divided by sigma first, so internally sigma = 1.

Renyi divergence (``gaussian_mixture_rdp``)
--------------------------------------------
D_a(P || Q) = 1/(a-1) log int p^a q^(1-a) dx (Renyi 1961; RDP: Mironov 2017, Def. 3), evaluated by quadrature in log
space. Writing each log density as -x^2/2 + lse_i(log w_i + x m_i - m_i^2/2) (lse = log-sum-exp) the quadratic
terms of a log p and (1-a) log q cancel exactly, so the log integrand f(x) = a log p(x) + (1-a) log q(x) is computed
without the catastrophic cancellation of the naive form (a x^2/2 against (a-1) x^2/2). f is, up to O(a log K),
piecewise quadratic with curvature -1, so its mass lies near (i) the points a m_i - (a-1) n_j (the peak of a
component pair; every stationary point of f lies in their convex hull, since f'(x) = -x + a E_p[m|x] - (a-1) E_q[m|x]),
(ii) the points where two components of q (or of p) are equally likely, where f can have a kink, and (iii) the means.
Windows of +-40 sigma around all of them (f drops by >= 800 beyond, a factor e^-800) are cut into 1-sigma panels and
integrated by adaptive Gauss-Legendre quadrature: each panel with 16 and 32 nodes, bisected until the two agree to
1e-13 of the running total. Accuracy, checked by tests/privacy/test_exact.py: a single Gaussian pair gives
a mu^2/2 to ~1e-12 relative at every order up to 1024; the Poisson-subsampled Gaussian pair agrees with the exact
binomial expansion (Mironov, Talwar, Zhang 2019, Sec. 3.3, as dp_accounting computes it) to ~1e-10 relative at integer
orders 2..256; participation pairs with a far component agree with the closed form below to ~1e-9 relative up to
order 256. A pair of single Gaussians skips the quadrature (closed form a (m - n)^2 / (2 sigma^2)).

delta(epsilon) of a composition (``gaussian_mixture_delta``, ``LossPmf``)
------------------------------------------------------------------------
The hockey-stick divergence delta(eps) = sup_S P(S) - e^eps Q(S) = E_P[(1 - e^(eps - L))_+], L = log p/q the privacy
loss (Balle et al. 2018; Sommer, Meiser, Mohammadi 2019), and the privacy loss of a product of independent pairs is
the sum of the losses, so composition is convolution of privacy loss distributions (PLDs; Koskela et al. 2020).
``LossPmf`` holds a PLD discretised to multiples of ``interval`` as a CERTIFIED LOWER BOUND: every mass is put at a
loss at or below every loss it stands for. As (1 - e^(eps - L))_+ increases with L, and as sums of rounded-down
losses are below the sums of the true ones, every delta computed from it, after any number of compositions, is <= the
true delta (up to floating-point round-off, < 1e-10 absolute). This is dp_accounting's optimistic PLD
(``pessimistic_estimate=False``), built here on a grid in x because L need not be monotone in x for mixtures
(dp_accounting's mixture PLD inverts a monotone loss):

* [min mean - 40 sigma, max mean + 40 sigma] is cut into cells of 0.01 sigma; cells of P- and Q-mass < 1e-25 are
  dropped (lost mass only lowers delta). Each remaining cell is cut into sub-cells so that L varies by about
  interval/2 across one; a sub-cell [x0, x1] of width h gets its exact P-mass (normal CDF differences) at the loss
      min(L(x0), L(x1)) - M2 h^2 / 8,   rounded down to the grid,
  where M2 bounds |L''| on the cell: L'' = Var_p(m|x) - Var_q(m|x) (d^2/dx^2 log p = -1 + Var_p(m|x) for sigma = 1),
  and Var(m|x) <= sum_{i != r} pi_i(x) (m_i - m_r)^2 with each posterior pi_i bounded over the cell by interval
  arithmetic (its log is linear in x). The linear interpolation error of a C^2 function is at most M2 h^2 / 8, so the
  loss of the sub-cell is a true lower bound. The same cells give the Q-direction (loss -L under Q).
* Composition: FFT convolution by repeated squaring. After each product, entries below 1e-15 of the largest (FFT
  round-off is ~1e-17 of it) are set to 0, and tails of total mass <= 1e-18 are cut: the left one dropped, the right
  one moved down to the last kept loss. Both only lower delta.
* delta(eps) = sum_{L > eps} p_L (1 - e^(eps - L)); delta is reported as the maximum over the two directions (P, Q)
  and (Q, P): a neighbouring relation contains both orders of every pair.
Rounding down costs at most ``interval`` of loss per composition (T interval in all), which is how far the lower bound
may sit below the truth in epsilon; the default 1e-4 keeps that below 0.01 for T <= 100.

Gaussian differential privacy (``gdp_delta``, ``gdp_epsilon``, ``gdp_rdp``)
---------------------------------------------------------------------------
N(0, 1) against N(mu, 1) is mu-GDP (Dong, Roth, Su 2019/2022, Def. 2.6); its exact privacy profile is
delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (ibid., Cor. 2.13; Balle & Wang 2018, Thm 8), and its
RDP a mu^2 / 2 (Mironov 2017, Prop. 7). K mu_k-GDP mechanisms compose to sqrt(sum mu_k^2)-GDP (Dong et al., Cor. 3.3).

Participation (``participation_pair``, ``participation_rdp``)
-------------------------------------------------------------
If the record's owner takes part with probability l, the observer sees P = (1-l) R + l P_in against
Q = (1-l) R + l Q_in, where R, its view when the owner is absent, is the same on both datasets. For any event S,
P(S) - e^eps Q(S) = (1-l)(1 - e^eps) R(S) + l (P_in(S) - e^eps Q_in(S)) <= l H_eps(P_in || Q_in), with equality
when R is disjoint from the optimal S: an observer that can tell participation (R far away) is the worst case,
delta = l delta_in(eps) with NO amplification of epsilon. For RDP, int p^a q^(1-a) splits over the disjoint supports:
    D_a = log(1 - l + l exp((a-1) D_a(P_in || Q_in))) / (a - 1).
``participation_pair`` builds the pair with R = N(far, sigma^2) at a finite ``far``; the identity is its far -> inf
limit. Realisability: far is the distance, in noise units, between the owner's update and the other clients'; with
b records per client it can reach ~b/z (2C/(b) sensitivity, z 2C/b noise, updates up to 2C apart per coordinate),
so far -> inf is approached by instances with large batches. At order a the inner pair's mass sits near a d/sigma
(d = the inner mean difference) and the far component cuts it off near far/2, so finite-far RDP matches the
identity only for far >~ 2 (a d/sigma + 10) sigma; the default far (600 sigma past the inner means) covers orders up
to 256 for d <= sigma. ``Instance`` uses the identity (far = inf) directly, for RDP and for PLDs: under P the loss is
exactly 0 with probability 1 - l and the inner loss otherwise.

Instances (``Instance``, ``observer_instance``)
-----------------------------------------------
An ``Instance`` is a union of branches (label probability, participation probability, inner pair) in which the
observer sees the branch label (e.g. how many other clients took part): int p^a q^(1-a) and PLDs are the label-weighted
mixtures of the branches'. ``observer_instance`` builds, for one round of one noisy step per client, the instance of
each observer of the federated setting of Noble et al. 2022 and Heikkilä 2024, in sensitivity units (see its
docstring for each observer).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from scipy import signal, special, stats

from dpfl.accounting.theory import gdp_delta, gdp_epsilon, gdp_rdp
from dpfl.errors import ConfigError, check_range

#: Default grid step of discretised privacy losses (see the module docstring).
DEFAULT_INTERVAL = 1e-4

#: Default distance (in sigma) between the inner means and the "owner absent" component of ``participation_pair``.
FAR_GAP = 600.0

_WINDOW = 40.0  # half-width (in sigma) of the quadrature windows and of the PLD's x range
_PANEL = 1.0  # initial quadrature panel width (in sigma)
_QUAD_RTOL = 1e-13  # per-panel agreement of the 16- and 32-node rules, relative to the running total
_MAX_BISECTIONS = 60
_CELL = 0.01  # coarse PLD cell width (in sigma)
_MIN_CELL_MASS = 1e-25  # coarse PLD cells lighter than this under both P and Q are dropped
_MAX_SUBCELLS = 20000  # per coarse cell
_FFT_FLOOR = 1e-15  # entries below this fraction of the largest are zeroed after each convolution
_TAIL_MASS = 1e-18  # mass cut from each tail after each convolution

_GL16 = np.polynomial.legendre.leggauss(16)
_GL32 = np.polynomial.legendre.leggauss(32)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


# ---------------------------------------------------------------------------------------------------------------------
# Mixtures


def _mixture(weights, means, sigma, name: str):
    """Validated (log weights, means / sigma) of a mixture, zero-weight components dropped."""
    w = np.atleast_1d(np.asarray(weights, dtype=float))
    m = np.atleast_1d(np.asarray(means, dtype=float))
    if w.ndim != 1 or w.shape != m.shape or w.size == 0:
        raise ConfigError(f"{name} weights / means", (w.tolist(), m.tolist()), "two 1-D arrays of the same length")
    if not (np.all(np.isfinite(w)) and np.all(w >= 0) and np.all(np.isfinite(m))):
        raise ConfigError(f"{name} weights / means", (w.tolist(), m.tolist()), "finite means and weights >= 0")
    if abs(w.sum() - 1) > 1e-9:
        raise ConfigError(f"{name} weights", w.tolist(), "weights summing to 1")
    keep = w > 0
    return np.log(w[keep] / w.sum()), m[keep] / sigma


def _check_sigma(sigma) -> float:
    return check_range("sigma", sigma, 0, low_open=True)


def _lse_terms(x, log_w, means):
    """log sum_i w_i exp(x m_i - m_i^2/2) at each x: log density + x^2/2 + log sqrt(2 pi)."""
    return special.logsumexp(log_w + np.multiply.outer(x, means) - 0.5 * means**2, axis=-1)


# ---------------------------------------------------------------------------------------------------------------------
# Renyi divergence


def _log_integrand(x, a, lw_p, m_p, lw_q, m_q):
    """f(x) = a log p(x) + (1 - a) log q(x), with the x^2 terms cancelled analytically."""
    return -0.5 * x**2 - _HALF_LOG_2PI + a * _lse_terms(x, lw_p, m_p) + (1 - a) * _lse_terms(x, lw_q, m_q)


def _kinks(log_w, means):
    """Points where two components of a mixture have equal weighted densities."""
    points = []
    for j in range(means.size):
        for k in range(j + 1, means.size):
            if means[j] != means[k]:
                points.append(0.5 * (means[j] + means[k]) + (log_w[k] - log_w[j]) / (means[j] - means[k]))
    return points


def _log_renyi_integral(a: float, lw_p, m_p, lw_q, m_q) -> float:
    """log int p^a q^(1-a) dx by windowed adaptive Gauss-Legendre quadrature (see the module docstring)."""
    centres = np.concatenate([
        (a * m_p[:, None] - (a - 1) * m_q[None, :]).ravel(),
        _kinks(lw_q, m_q), _kinks(lw_p, m_p), m_p, m_q,
    ])
    centres = np.sort(centres[np.isfinite(centres)])
    # union of [c - W, c + W], cut into panels of width <= _PANEL
    starts, ends = [centres[0] - _WINDOW], [centres[0] + _WINDOW]
    for c in centres[1:]:
        if c - _WINDOW <= ends[-1]:
            ends[-1] = c + _WINDOW
        else:
            starts.append(c - _WINDOW)
            ends.append(c + _WINDOW)
    lo, hi = [], []
    for s, e in zip(starts, ends):
        n = max(1, math.ceil((e - s) / _PANEL))
        edges = np.linspace(s, e, n + 1)
        lo.append(edges[:-1])
        hi.append(edges[1:])
    lo, hi = np.concatenate(lo), np.concatenate(hi)

    def rule(lo, hi, nodes_weights):
        nodes, weights = nodes_weights
        mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
        x = mid[:, None] + half[:, None] * nodes[None, :]
        f = _log_integrand(x, a, lw_p, m_p, lw_q, m_q)
        return special.logsumexp(f + np.log(weights)[None, :], axis=1) + np.log(half)

    done = []
    for _ in range(_MAX_BISECTIONS):
        coarse, fine = rule(lo, hi, _GL16), rule(lo, hi, _GL32)
        total = special.logsumexp(np.concatenate(done + [fine]))
        with np.errstate(invalid="ignore"):
            error = np.abs(np.exp(fine - total) - np.exp(coarse - total))
        ok = ~(error > _QUAD_RTOL)  # NaN (both -inf: no mass) counts as converged
        done.append(fine[ok])
        if ok.all():
            break
        mid = 0.5 * (lo[~ok] + hi[~ok])
        lo, hi = np.concatenate([lo[~ok], mid]), np.concatenate([mid, hi[~ok]])
    else:  # pragma: no cover - never reached for the mixtures tested; kept so that failure is loud
        raise ArithmeticError(f"Renyi quadrature did not converge at order {a}")
    return float(special.logsumexp(np.concatenate(done)))


def gaussian_mixture_rdp(weights_p, means_p, weights_q, means_q, sigma, orders) -> np.ndarray:
    """Exact Renyi divergence D_a(P || Q) of two 1-D Gaussian mixtures with common standard deviation ``sigma``.

    Args:
      weights_p, means_p: P = sum_i weights_p[i] N(means_p[i], sigma^2) (weights summing to 1).
      weights_q, means_q: Q likewise.
      sigma: > 0.
      orders: Renyi orders a > 1 (tested up to 1024; see the module docstring for the accuracy).

    Returns D_a(P || Q) at each order (>= 0; +inf never occurs for Gaussian mixtures with a common sigma).
    """
    sigma = _check_sigma(sigma)
    return _rdp(_mixture(weights_p, means_p, sigma, "P"), _mixture(weights_q, means_q, sigma, "Q"), _orders(orders))


def gaussian_mixture_rdp_symmetric(weights_p, means_p, weights_q, means_q, sigma, orders) -> np.ndarray:
    """max(D_a(P || Q), D_a(Q || P)) at each order: the RDP of the pair under a symmetric neighbouring relation."""
    forward = gaussian_mixture_rdp(weights_p, means_p, weights_q, means_q, sigma, orders)
    return np.maximum(forward, gaussian_mixture_rdp(weights_q, means_q, weights_p, means_p, sigma, orders))


def _orders(orders) -> np.ndarray:
    orders = np.atleast_1d(np.asarray(orders, dtype=float))
    if orders.ndim != 1 or not np.all(np.isfinite(orders)) or not np.all(orders > 1):
        raise ConfigError("orders", orders.tolist(), "finite Renyi orders > 1")
    return orders


def _rdp(p, q, orders: np.ndarray) -> np.ndarray:
    (lw_p, m_p), (lw_q, m_q) = p, q
    if m_p.size == 1 and m_q.size == 1:  # N(m, 1) against N(n, 1): closed form (Mironov 2017, Prop. 7)
        return orders * (m_p[0] - m_q[0]) ** 2 / 2
    values = np.array([_log_renyi_integral(a, lw_p, m_p, lw_q, m_q) / (a - 1) for a in orders])
    return np.maximum(values, 0.0)


# ---------------------------------------------------------------------------------------------------------------------
# Privacy loss distributions (lower bounds)


@dataclasses.dataclass(frozen=True, eq=False)
class LossPmf:
    """Lower-bound privacy loss distributions of a pair in both directions, on the grid ``interval`` Z.

    ``forward`` = (offset, probs): under P, the loss log p/q lies at or above (offset + k) interval with probability
    >= probs[k] (the bound of the module docstring); ``backward`` likewise for log q/p under Q. Missing mass is mass
    dropped (lowering delta).
    """

    interval: float
    forward: tuple
    backward: tuple

    def compose(self, times: int) -> "LossPmf":
        """The ``times``-fold composition (product of independent copies)."""
        times = check_range("compositions", times, 1, integer=True)
        return LossPmf(self.interval, _power(self.forward, times), _power(self.backward, times))

    def delta(self, epsilon):
        """Lower bound on delta(epsilon), max over both directions; an array if ``epsilon`` is one."""
        eps = np.asarray(epsilon, dtype=float)
        out = np.maximum(_delta(self.forward, self.interval, eps), _delta(self.backward, self.interval, eps))
        return float(out) if out.ndim == 0 else out

    def epsilon(self, delta: float) -> float:
        """Lower bound on epsilon(delta): the smallest epsilon >= 0 at which this lower bound on delta is <= delta."""
        delta = check_range("delta", delta, 0, 1, low_open=True, high_open=True)
        return max(_epsilon(self.forward, self.interval, delta), _epsilon(self.backward, self.interval, delta))

    @staticmethod
    def mixture(parts) -> "LossPmf":
        """sum_k w_k PLD_k for (w_k, LossPmf_k) pairs: a union of branches whose label the observer sees."""
        parts = [(float(w), pmf) for w, pmf in parts if w > 0]
        interval = parts[0][1].interval
        if any(pmf.interval != interval for _, pmf in parts):
            raise ConfigError("interval", [pmf.interval for _, pmf in parts], "the same grid for every part")
        return LossPmf(interval, _add([(w, p.forward) for w, p in parts]), _add([(w, p.backward) for w, p in parts]))

    def participation(self, probability: float) -> "LossPmf":
        """The pair (1-l) R + l P, (1-l) R + l Q with R disjoint from both: loss 0 with probability 1 - l."""
        probability = check_range("probability", probability, 0, 1)
        return LossPmf.mixture([(1 - probability, _ZERO_LOSS(self.interval)), (probability, self)])


def _ZERO_LOSS(interval: float) -> LossPmf:
    return LossPmf(interval, (0, np.ones(1)), (0, np.ones(1)))


def _add(parts):
    offset = min(o for _, (o, _) in parts)
    size = max(o + p.size for _, (o, p) in parts) - offset
    out = np.zeros(size)
    for w, (o, p) in parts:
        out[o - offset: o - offset + p.size] += w * p
    return offset, out


def _clean(offset: int, probs: np.ndarray):
    """Zero FFT round-off and cut light tails, keeping a lower bound (see the module docstring)."""
    probs = np.where(probs > _FFT_FLOOR * probs.max(), probs, 0.0)
    left = int(np.searchsorted(np.cumsum(probs), _TAIL_MASS, side="right"))
    right_tail = np.cumsum(probs[::-1])
    cut = int(np.searchsorted(right_tail, _TAIL_MASS, side="right"))  # the cut right tail has mass <= _TAIL_MASS
    end = probs.size - cut
    if end <= left:  # nothing substantial left: keep the heaviest entry
        k = int(np.argmax(probs))
        return offset + k, probs[k:k + 1].copy()
    kept = probs[left:end].copy()
    kept[-1] += probs[end:].sum()  # right tail moved down to the last kept loss
    return offset + left, kept


def _convolve(a, b):
    probs = signal.fftconvolve(a[1], b[1]) if min(a[1].size, b[1].size) > 64 else np.convolve(a[1], b[1])
    return _clean(a[0] + b[0], np.clip(probs, 0.0, None))


def _power(pmf, times: int):
    result, base = None, _clean(*pmf)
    while True:
        if times & 1:
            result = base if result is None else _convolve(result, base)
        times >>= 1
        if not times:
            return result
        base = _convolve(base, base)


def _delta(pmf, interval: float, eps: np.ndarray) -> np.ndarray:
    offset, probs = pmf
    losses = (offset + np.arange(probs.size)) * interval
    eps_flat = np.atleast_1d(eps).ravel()
    out = np.empty_like(eps_flat)
    for i, e in enumerate(eps_flat):
        above = losses > e
        out[i] = np.dot(probs[above], -np.expm1(e - losses[above]))
    return np.maximum(out, 0.0).reshape(eps.shape)


def _epsilon(pmf, interval: float, delta: float) -> float:
    offset, probs = pmf
    losses = (offset + np.arange(probs.size)) * interval
    if probs.size == 0 or losses[-1] <= 0 or _delta(pmf, interval, np.array(0.0)) <= delta:
        return 0.0
    start = int(np.searchsorted(losses, 0.0))  # only losses >= 0 matter for epsilon >= 0
    losses, probs = losses[start:], probs[start:]
    # For eps in [L_{k-1}, L_k): delta(eps) = S1_k - e^eps S2_k, S1_k = sum_{j >= k} p_j, S2_k = sum_{j >= k} p_j e^-L_j
    s1 = np.cumsum(probs[::-1])[::-1]
    s2 = np.cumsum((probs * np.exp(-losses))[::-1])[::-1]
    with np.errstate(divide="ignore"):
        log_s2 = np.log(s2)
    at_losses = s1 - np.exp(losses + log_s2)  # delta(L_k); L_k + log S2_k <= log S1_k, so no overflow
    k = int(np.flatnonzero(at_losses <= delta)[0])  # exists: delta(L_last) = 0
    lower = max(losses[k - 1], 0.0) if k > 0 else 0.0
    if s1[k] <= delta or not np.isfinite(log_s2[k]):
        return float(lower)
    eps = math.log(s1[k] - delta) - log_s2[k]
    return float(min(max(eps, lower), losses[k]))


@functools.lru_cache(maxsize=256)
def _pair_pmf(p_key, q_key, interval: float) -> LossPmf:
    p = (np.array(p_key[0]), np.array(p_key[1]))
    q = (np.array(q_key[0]), np.array(q_key[1]))
    (lw_p, m_p), (lw_q, m_q) = p, q
    means = np.concatenate([m_p, m_q])
    lo, hi = means.min() - _WINDOW, means.max() + _WINDOW
    n = math.ceil((hi - lo) / _CELL)
    edges = lo + _CELL * np.arange(n + 1)
    mass_p, mass_q = _cell_masses(edges, lw_p, m_p), _cell_masses(edges, lw_q, m_q)
    keep = (mass_p > _MIN_CELL_MASS) | (mass_q > _MIN_CELL_MASS)
    a, b = edges[:-1][keep], edges[1:][keep]
    loss_a = _lse_terms(a, lw_p, m_p) - _lse_terms(a, lw_q, m_q)
    loss_b = _lse_terms(b, lw_p, m_p) - _lse_terms(b, lw_q, m_q)
    curvature = np.maximum(_variance_bound(a, b, lw_p, m_p), _variance_bound(a, b, lw_q, m_q))
    width = b - a
    pieces = np.maximum(np.abs(loss_b - loss_a) / (interval / 2), width * np.sqrt(curvature / interval))
    pieces = np.clip(np.ceil(pieces), 1, _MAX_SUBCELLS).astype(np.int64)
    # sub-cells
    cell = np.repeat(np.arange(a.size), pieces)
    first = np.cumsum(pieces) - pieces
    k = np.arange(cell.size) - first[cell]
    h = width[cell] / pieces[cell]
    x0 = a[cell] + k * h
    x1 = np.where(k + 1 == pieces[cell], b[cell], x0 + h)
    sub_edges_loss0 = _lse_terms(x0, lw_p, m_p) - _lse_terms(x0, lw_q, m_q)
    sub_edges_loss1 = _lse_terms(x1, lw_p, m_p) - _lse_terms(x1, lw_q, m_q)
    margin = curvature[cell] * (x1 - x0) ** 2 / 8
    low = np.minimum(sub_edges_loss0, sub_edges_loss1) - margin
    high = np.maximum(sub_edges_loss0, sub_edges_loss1) + margin
    sub_p, sub_q = _interval_masses(x0, x1, lw_p, m_p), _interval_masses(x0, x1, lw_q, m_q)
    return LossPmf(interval, _bin(low, sub_p, interval), _bin(-high, sub_q, interval))


def _bin(losses, masses, interval):
    keep = masses > 0
    index = np.floor(losses[keep] / interval).astype(np.int64)
    if index.size == 0:
        return 0, np.zeros(1)
    offset = int(index.min())
    return offset, np.bincount(index - offset, weights=masses[keep])


def _interval_masses(x0, x1, log_w, means):
    """P([x0, x1]) of the mixture (sigma = 1), from normal CDF differences taken on the side of each tail."""
    z0, z1 = x0[:, None] - means[None, :], x1[:, None] - means[None, :]
    right = z0 > 0
    diff = np.where(right, special.ndtr(-z0) - special.ndtr(-z1), special.ndtr(z1) - special.ndtr(z0))
    return np.maximum(diff, 0.0) @ np.exp(log_w)


def _cell_masses(edges, log_w, means):
    return _interval_masses(edges[:-1], edges[1:], log_w, means)


def _variance_bound(a, b, log_w, means):
    """Upper bound on Var(m | x) over each cell [a, b] (sigma = 1), by interval arithmetic on the posteriors."""
    if means.size == 1:
        return np.zeros_like(a)
    # log posterior weights are s_i(x) - lse(s(x)) with s_i(x) = log w_i + x m_i - m_i^2/2, linear in x
    s_a = log_w + np.multiply.outer(a, means) - 0.5 * means**2
    s_b = log_w + np.multiply.outer(b, means) - 0.5 * means**2
    s_min, s_max = np.minimum(s_a, s_b), np.maximum(s_a, s_b)
    floor = special.logsumexp(s_min, axis=1, keepdims=True)  # lse(s(x)) >= lse(min s) on the cell
    ref = np.argmax(s_min, axis=1)
    post = np.minimum(1.0, np.exp(s_max - floor))
    spread = (means[None, :] - means[ref][:, None]) ** 2
    return (post * spread).sum(axis=1)


def _key(mix):
    return tuple(mix[0].tolist()), tuple(mix[1].tolist())


def gaussian_mixture_loss_pmf(weights_p, means_p, weights_q, means_q, sigma,
                              interval: float = DEFAULT_INTERVAL) -> LossPmf:
    """Lower-bound PLDs (both directions) of the pair (P, Q); see ``LossPmf``."""
    sigma = _check_sigma(sigma)
    interval = check_range("interval", interval, 0, low_open=True)
    p, q = _mixture(weights_p, means_p, sigma, "P"), _mixture(weights_q, means_q, sigma, "Q")
    return _pair_pmf(_key(p), _key(q), interval)


def gaussian_mixture_delta(weights_p, means_p, weights_q, means_q, sigma, epsilon, compositions: int = 1,
                           interval: float = DEFAULT_INTERVAL):
    """Certified lower bound on delta(epsilon) of the ``compositions``-fold product of (P, Q), max of both directions.

    See the module docstring: losses are rounded down (optimistic discretisation with step ``interval``), so the
    result is <= the true delta; it may be below it by the effect of shifting every loss by up to ``interval`` per
    composition. ``epsilon`` may be an array.
    """
    pmf = gaussian_mixture_loss_pmf(weights_p, means_p, weights_q, means_q, sigma, interval)
    return pmf.compose(compositions).delta(epsilon)


# ---------------------------------------------------------------------------------------------------------------------
# Gaussian differential privacy


# ---------------------------------------------------------------------------------------------------------------------
# Participation


def participation_pair(probability: float, inner_weights_p, inner_means_p, inner_weights_q, inner_means_q,
                       far: float | None = None, sigma: float = 1.0):
    """The 1-D worst case of "the record's owner takes part with probability l" (see the module docstring).

    P = (1-l) N(far, sigma^2) + l P_in, Q = (1-l) N(far, sigma^2) + l Q_in, with P_in, Q_in the inner mixtures
    (std ``sigma``). ``far`` defaults to FAR_GAP sigma beyond the largest inner mean, which makes the pair's RDP match
    the far -> inf identity (``participation_rdp``) to ~1e-9 up to order 256 when the inner means span <= sigma.

    Returns (weights_p, means_p, weights_q, means_q) as arrays, for ``gaussian_mixture_rdp`` / ``_delta``.
    """
    l = check_range("probability", probability, 0, 1)
    sigma = _check_sigma(sigma)
    wp, mp = np.atleast_1d(np.asarray(inner_weights_p, float)), np.atleast_1d(np.asarray(inner_means_p, float))
    wq, mq = np.atleast_1d(np.asarray(inner_weights_q, float)), np.atleast_1d(np.asarray(inner_means_q, float))
    if far is None:
        far = max(np.abs(mp).max(), np.abs(mq).max()) + FAR_GAP * sigma
    return (np.concatenate([[1 - l], l * wp]), np.concatenate([[far], mp]),
            np.concatenate([[1 - l], l * wq]), np.concatenate([[far], mq]))


def participation_rdp(probability: float, inner_rdp, orders) -> np.ndarray:
    """D_a of the participation pair with R disjoint (far -> inf): log(1 - l + l e^((a-1) D_in(a))) / (a - 1)."""
    l = check_range("probability", probability, 0, 1)
    orders = _orders(orders)
    inner = np.asarray(inner_rdp, dtype=float)
    if l == 0:
        return np.zeros_like(orders)
    log_terms = np.logaddexp(math.log1p(-l) if l < 1 else -np.inf, math.log(l) + (orders - 1) * inner)
    return np.maximum(log_terms / (orders - 1), 0.0)


# ---------------------------------------------------------------------------------------------------------------------
# Instances


@dataclasses.dataclass(frozen=True)
class MixturePair:
    """A pair of 1-D Gaussian mixtures with common std ``sigma`` (tuples, so the pair is hashable and cacheable)."""

    weights_p: tuple
    means_p: tuple
    weights_q: tuple
    means_q: tuple
    sigma: float = 1.0

    def __post_init__(self):
        for name in ("weights_p", "means_p", "weights_q", "means_q"):
            object.__setattr__(self, name, tuple(float(v) for v in np.atleast_1d(getattr(self, name))))
        _mixture(self.weights_p, self.means_p, self.sigma, "P")
        _mixture(self.weights_q, self.means_q, self.sigma, "Q")

    def scaled(self, factor: float) -> "MixturePair":
        """The same means with std sigma * factor (e.g. the noise of ``factor**2`` clients' shares)."""
        return dataclasses.replace(self, sigma=self.sigma * factor)

    def swapped(self) -> "MixturePair":
        return MixturePair(self.weights_q, self.means_q, self.weights_p, self.means_p, self.sigma)

    def rdp(self, orders) -> np.ndarray:
        """D_a(P || Q)."""
        return _cached_rdp(self, tuple(_orders(orders).tolist())).copy()

    def rdp_symmetric(self, orders) -> np.ndarray:
        return np.maximum(self.rdp(orders), self.swapped().rdp(orders))

    def loss_pmf(self, interval: float = DEFAULT_INTERVAL) -> LossPmf:
        return gaussian_mixture_loss_pmf(self.weights_p, self.means_p, self.weights_q, self.means_q, self.sigma,
                                         interval)

    def delta(self, epsilon, compositions: int = 1, interval: float = DEFAULT_INTERVAL):
        return self.loss_pmf(interval).compose(compositions).delta(epsilon)


@functools.lru_cache(maxsize=4096)
def _cached_rdp(pair: MixturePair, orders: tuple) -> np.ndarray:
    return gaussian_mixture_rdp(pair.weights_p, pair.means_p, pair.weights_q, pair.means_q, pair.sigma, orders)


def gaussian_pair(noise_multiplier: float) -> MixturePair:
    """N(1, z^2) against N(0, z^2): the Gaussian mechanism in sensitivity units (replace-one, s = 1)."""
    return MixturePair((1.0,), (1.0,), (1.0,), (0.0,), check_range("noise_multiplier", noise_multiplier, 0,
                                                                  low_open=True))


def poisson_pair(rate: float, noise_multiplier: float) -> MixturePair:
    """(1-q) N(0, z^2) + q N(1, z^2) against N(0, z^2): Poisson sampling at rate q around the Gaussian mechanism, one
    record added (add/remove; the record's gradient C, the others' 0, the sum divided by the expected batch size).
    The swapped pair (removal) is the other direction; ``Instance`` takes both."""
    q = check_range("rate", rate, 0, 1)
    return MixturePair((1 - q, q), (0.0, 1.0), (1.0,), (0.0,), check_range("noise_multiplier", noise_multiplier, 0,
                                                                            low_open=True))


def without_replacement_pair(rate: float, noise_multiplier: float) -> MixturePair:
    """The worst case of a fixed-size batch b out of n (q = b/n) without replacement, replace-one neighbours.

    All of the client's records have clipped gradient -C except the differing one, +C on one dataset and -C on the
    other. The batch mean is -C on the second dataset always; on the first it is -C + 2C/b = -C + Delta when the
    record is drawn (probability q). In sensitivity units, shifted by C: (1-q) N(0) + q N(1) against N(0), the same
    pair as Poisson sampling. It dominates the antipodal instance (others' gradients 0, the record +C against -C:
    ``without_replacement_antipodal_pair``), and it is tight: (q P + (1-q) Q, Q) with (P, Q) = (N(1), N(0)) is a
    dominating pair of sampling without replacement under replace-one (Balle, Barthe, Gaboardi 2018, Thm 10; Zhu,
    Dong, Wang 2022, Prop. 30).
    """
    return poisson_pair(rate, noise_multiplier)


def without_replacement_antipodal_pair(rate: float, noise_multiplier: float) -> MixturePair:
    """(1-q) N(0) + q N(1/2) against (1-q) N(0) + q N(-1/2): the differing record +C against -C, the others 0.

    A valid instance of sampling without replacement (replace-one), but NOT the worst one: see
    ``without_replacement_pair``."""
    q = check_range("rate", rate, 0, 1)
    z = check_range("noise_multiplier", noise_multiplier, 0, low_open=True)
    return MixturePair((1 - q, q), (0.0, 0.5), (1 - q, q), (0.0, -0.5), z)


@dataclasses.dataclass(frozen=True)
class Instance:
    """A union of observed branches: with probability ``label`` the observer sees the branch's label, then the owner
    takes part with probability ``participation`` and the observer sees ``pair`` (else a view disjoint from it).

    ``branches`` is a tuple of (label, participation, MixturePair). The probabilities of the labels sum to <= 1; a
    deficit is mass left out (the branches dropped by ``observer_instance``), which only lowers RDP and delta.
    """

    branches: tuple

    def __post_init__(self):
        object.__setattr__(self, "branches", tuple((float(w), float(l), pair) for w, l, pair in self.branches))
        total = sum(w for w, _, _ in self.branches)
        if not self.branches or total > 1 + 1e-9 or any(w < 0 for w, _, _ in self.branches):
            raise ConfigError("branches", [w for w, _, _ in self.branches], "label probabilities >= 0 summing to <= 1")

    def rdp(self, orders) -> np.ndarray:
        """Exact RDP (max over both directions) of one round: log sum_c w_c (1 - l_c + l_c e^((a-1) D_c)) / (a-1)."""
        orders = _orders(orders)
        directions = []
        for forward in (True, False):
            log_terms = []
            for w, l, pair in self.branches:
                if w == 0:
                    continue
                inner = pair.rdp(orders) if forward else pair.swapped().rdp(orders)
                log_terms.append(math.log(w) + (orders - 1) * participation_rdp(l, inner, orders))
            directions.append(special.logsumexp(np.array(log_terms), axis=0) / (orders - 1))
        return np.maximum(np.maximum(*directions), 0.0)

    def loss_pmf(self, interval: float = DEFAULT_INTERVAL) -> LossPmf:
        return _cached_instance_pmf(self, interval)

    def delta(self, epsilon, compositions: int = 1, interval: float = DEFAULT_INTERVAL):
        """Certified lower bound on delta(epsilon) of ``compositions`` independent rounds."""
        return _cached_composed(self, compositions, interval).delta(epsilon)

    def epsilon(self, delta: float, compositions: int = 1, interval: float = DEFAULT_INTERVAL) -> float:
        """Certified lower bound on epsilon(delta) of ``compositions`` independent rounds."""
        return _cached_composed(self, compositions, interval).epsilon(delta)


@functools.lru_cache(maxsize=256)
def _cached_instance_pmf(instance: Instance, interval: float) -> LossPmf:
    parts = [(w, pair.loss_pmf(interval).participation(l)) for w, l, pair in instance.branches if w > 0]
    return LossPmf.mixture(parts)


@functools.lru_cache(maxsize=64)
def _cached_composed(instance: Instance, compositions: int, interval: float) -> LossPmf:
    return _cached_instance_pmf(instance, interval).compose(compositions)


OBSERVER_VIEWS = ("third_party", "server", "other_silo")


def observer_instance(observer: str, step: MixturePair, num_clients: int, cohort_size: int, boundary: str = "plain",
                      client_sampling: str = "fixed", label_mass: float = 1e-16) -> Instance:
    """The instance one observer meets in one round in which every client of the cohort releases one noisy step.

    ``step`` is one client's release in sensitivity units with that client's noise (e.g. ``gaussian_pair(z)``).
    The cohort is ``cohort_size`` of ``num_clients`` clients (fixed size, without replacement), or each client
    independently with probability l = cohort_size / num_clients (Poisson). Noise shares add: the sum of k clients'
    releases carries std z sqrt(k) (``MixturePair.scaled``). The instance gives every other client its own
    coordinate and a large offset there, so that the observer learns exactly who took part (the branch label) and
    the owner's presence (the far component); the owner's coordinate carries the owner's statistic plus the noise of
    every share in the observed sum. That is a realisable configuration, so its privacy bounds any sound claim from
    below (the claim must also hold for it).

    * ``server``, ``plain``: the owner's own message, sent with probability l (n/M for fixed size).
    * ``server``, ``secagg`` and ``third_party``: the cohort's sum. Fixed size: the owner takes part with probability
      n/M and the sum has n shares. Poisson: c ~ Binomial(M-1, l) other clients take part (observed), the owner with
      probability l, and the sum has c + 1 shares.
    * ``other_silo``: the sum minus its own share. Fixed size: it is in the cohort with probability n/M (then the
      owner is with probability (n-1)/(M-1) and the sum keeps n-1 shares) or not (owner with probability n/(M-1), n
      shares). Poisson: c ~ Binomial(M-2, l) others, the owner with probability l, c + 1 shares.

    Branches of probability < ``label_mass`` are left out (lowering the instance's RDP and delta).
    """
    if observer not in OBSERVER_VIEWS:
        raise ConfigError("observer", observer, f"one of {OBSERVER_VIEWS}")
    if boundary not in ("plain", "secagg"):
        raise ConfigError("boundary", boundary, "'plain' or 'secagg'")
    if client_sampling not in ("fixed", "poisson"):
        raise ConfigError("client_sampling", client_sampling, "'fixed' or 'poisson'")
    m = check_range("num_clients", num_clients, 1, integer=True)
    n = check_range("cohort_size", cohort_size, 1, m, integer=True)
    rate = n / m
    if observer == "server" and boundary == "plain":
        return Instance(((1.0, rate, step),))
    if observer in ("server", "third_party"):
        if client_sampling == "fixed":
            return Instance(((1.0, rate, step.scaled(math.sqrt(n))),))
        return Instance(_binomial_branches(m - 1, rate, step, label_mass))
    if client_sampling == "poisson":
        return Instance(_binomial_branches(max(m - 2, 0), rate, step, label_mass))
    if m == 1:
        return Instance(((1.0, 0.0, step),))
    inside, outside = rate, 1 - rate  # the silo itself is in the cohort, or not
    branches = [(outside, n / (m - 1), step.scaled(math.sqrt(n))),
                (inside, (n - 1) / (m - 1), step.scaled(math.sqrt(max(n - 1, 1))))]  # n = 1: the owner is out
    return Instance(tuple((w, l, pair) for w, l, pair in branches if w > 0))


def _binomial_branches(others: int, rate: float, step: MixturePair, label_mass: float):
    counts = np.arange(others + 1)
    weights = stats.binom.pmf(counts, others, rate)
    return tuple((float(w), rate, step.scaled(math.sqrt(c + 1))) for c, w in zip(counts, weights) if w >= label_mass)


__all__ = [
    "DEFAULT_INTERVAL", "FAR_GAP", "LossPmf", "MixturePair", "Instance", "OBSERVER_VIEWS",
    "gaussian_mixture_rdp", "gaussian_mixture_rdp_symmetric", "gaussian_mixture_loss_pmf", "gaussian_mixture_delta",
    "gdp_delta", "gdp_epsilon", "gdp_rdp", "participation_pair", "participation_rdp", "gaussian_pair",
    "poisson_pair", "without_replacement_pair", "without_replacement_antipodal_pair", "observer_instance",
]
