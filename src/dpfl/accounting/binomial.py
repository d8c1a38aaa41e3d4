"""Privacy of Cheu et al.'s binomial vector summation (``BinomialSumDpEvent``): approximate RDP, proved here.

**The view.** Cheu, Joseph, Mao, Peng (2021, "Shuffle private stochastic convex optimization", ICLR 2022) P_vec: each
user maps coordinate j of x in [-L, L]^d to w_j = (x_j + L)/(2L), randomly rounds g w_j to an integer r_j and adds
Bin(b, p) noise bits (``dpfl.protocols.shuffler``). A shuffled multiset of coordinate-labelled bits is equivalent to
the per-coordinate counts, so an observer sees exactly

    V_j = sum_users r_j + N_j,   N_j ~ Bin(m, p) independent over j,

with m = U b, U the users whose bits the observer does not know (an other-silo observer subtracts its own users').

**A record change.** Replacing one user's x by x' (l2 distance <= D, e.g. D = 2C for C-clipped vectors) changes the
integer sum by Delta_j = r_j(x) - r_j(x'). Couple the rounding coins: r_j = floor(g w_j + u_j) with the same
u_j ~ U[0, 1) under both datasets; then |Delta_j| <= ceil(t_j), t_j = g |x_j - x'_j| / (2L) <= g, and
sum_j t_j^2 <= S^2 with S = g D / (2L) (``l2_shift``). So every coordinate with |Delta_j| = k >= 1 has t_j > k - 1:

    sum_{j: k_j >= 1} (k_j - 1)^2 < S^2,   k_j = |Delta_j| <= g,   at most d coordinates.       (A)

**Why approximate RDP.** Bin(m, p) + k and Bin(m, p) have different supports, so their Renyi divergence is infinite
at every order: the mechanism is not RDP. It is delta-approximately RDP in the following sense, which composes
(adaptively, the deltas add) and survives mixtures: P(S) <= G(S) + delta0 for every event S, with G a distribution
and D_a(G || Q) <= eps(a) (Bun, Steinke 2016, Def. 8.1 and Lemma 8.3, there for zCDP; the proof is per order).

*One coordinate.* For P_k = Bin(m, p) + k vs Q = Bin(m, p), let pi = P_k(outside supp Q) = Pr[Bin(m,p) > m - k] and G
the normalised restriction of P_k to supp Q: P_k(S) <= G(S) + pi and

    D_a(G || Q) = 1/(a-1) [ log sum_{x=k..m} q(x - k)^a q(x)^(1-a) - a log(1 - pi) ]      (finite sum, exact),

and the same for the other direction (Q vs P_k, tail Pr[Bin(m,p) < k]) and for -k (the reflection x -> m - x turns
Bin(m, p) - k vs Bin(m, p) into Bin(m, 1-p) + k vs Bin(m, 1-p)). ``shift_divergence`` f_a(k) is the largest of these.

*d coordinates.* The coordinates are independent given the coins, so the product of the G's has RDP sum_j f_a(k_j)
(Mironov 2017, Prop. 1) and, by a hybrid argument, P(S) <= G(S) + sum_j pi_j <= G(S) + d pi(g) = G(S) + delta0.

*The coins.* The coins u (the owner's and every other user's) have the same law under both datasets, P = E_u P_u,
Q = E_u Q_u, so P(S) <= E_u G_u(S) + delta0 and, by the joint convexity of exp((a-1) D_a), D_a(E_u G_u || Q) <= sup_u
sum_j f_a(k_j(u)): the worst allocation of the shifts under (A).

*The worst allocation* is a knapsack: d items, item j takes k_j in {0..K}, K = min(g, ceil(S)), weight
(k_j - 1)_+^2, value f_a(k_j), capacity W = ceil(S^2) - 1 (the largest integer < S^2). ``worst_allocation_rdp``
takes the smaller of an unbounded knapsack over the items with k >= 2 (exact when W <= d) and Lagrangian weak
duality (for every lambda >= 0, max sum_j f_a(k_j) <= lambda W + d max_k (f_a(k) - lambda (k - 1)_+^2)); both are
valid upper bounds; the test suite checks them against the brute-force maximum on small instances. ``exact_worst_allocation`` is
that brute force.

The RDP accountant (``dpfl.accounting.rdp``) charges the curve and adds delta0 (``tail_delta``) to the delta it
converts at: a run is (eps, delta)-DP with eps the conversion of the composed curve at delta - sum of the tails.
Orders are the integers 2..``MAX_ORDER`` (the curve grows fast with a: q(m)^(1-a)-type terms), +inf above.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

from dpfl.errors import check_range

#: Highest integer order evaluated; higher orders are +inf (a valid bound; the conversion never needs them here).
MAX_ORDER = 64
#: Orders evaluated exactly; in between, the cumulant (a - 1) eps(a) is interpolated linearly, a valid upper bound
#: because it is convex in a for every allocation (van Erven, Harremoes 2014), hence below the chord of the bounds.
ANCHOR_ORDERS = (*range(2, 11), 12, 14, 16, 20, 24, 28, 32, 40, 48, MAX_ORDER)


def check_parameters(trials: int, probability: float, dimension: int, grid: int, l2_shift: float) -> None:
    check_range("trials", trials, 1, integer=True)
    check_range("probability", probability, 0.0, 1.0, low_open=True, high_open=True)
    check_range("dimension", dimension, 1, integer=True)
    check_range("grid", grid, 1, integer=True)
    check_range("l2_shift", l2_shift, 0.0)


def largest_shift(grid: int, l2_shift: float) -> int:
    """K: the largest |Delta_j| allowed by (A): k - 1 < S and k <= g (0 when S = 0)."""
    if l2_shift == 0:
        return 0
    return min(grid, math.ceil(l2_shift))


def capacity(l2_shift: float) -> int:
    """W = ceil(S^2) - 1, the largest integer strictly below S^2 (the knapsack's capacity in (A)); -1 when S = 0."""
    return math.ceil(l2_shift**2) - 1


#: exp(x) is exactly 0.0 in float64 for every x below this (the smallest subnormal is exp(-744.44))
UNDERFLOW = -746.0
_BLOCK = 4096  # x's per block of terms in ``_log_moments``


@functools.lru_cache(maxsize=4)
def _log_pmf(trials: int, probability: float) -> np.ndarray:
    """log q(x), x = 0..m, q = Bin(m, p)'s pmf: one array shared by every shift and direction (read-only)."""
    logq = stats.binom(trials, probability).logpmf(np.arange(trials + 1))
    logq.setflags(write=False)
    return logq


@functools.lru_cache(maxsize=256)
def _tail(trials: int, probability: float, shift: int, reverse: bool) -> float:
    """The mass of one direction's P outside the support of its Q' (see ``_one_direction``): Pr[Bin > m - k]
    forward, Pr[Bin < k] reverse; 1 when k > m."""
    if shift > trials:
        return 1.0
    binomial = stats.binom(trials, probability)
    return min(1.0, float(binomial.cdf(shift - 1) if reverse else binomial.sf(trials - shift)))


def _log_sum_exp(terms: np.ndarray) -> np.ndarray:
    """log sum_x exp(terms[:, x]) for each row, as top + log sum_x exp(terms - top), over the whole row."""
    top = terms.max(axis=1)
    return top + np.log(np.exp(terms - top[:, None]).sum(axis=1))


def _log_moments(numerator: np.ndarray, denominator: np.ndarray, orders: tuple) -> np.ndarray:
    """log sum_x exp(a numerator(x) + (1 - a) denominator(x)) at each order a, as top + log sum_x exp(term - top).

    The terms are built in blocks of ``_BLOCK`` x's (in one buffer that stays in the CPU's cache): a first pass finds
    each order's top, the second sums exp(term - top) over the blocks holding a term >= top + UNDERFLOW. Every term of
    the other blocks has exp(term - top) exactly 0.0, so the sum is the one over all x up to the order of its
    additions (the blocks kept are ~5% of a large m's). Orders with a NaN or infinite top are summed whole, as NaN
    and inf propagate there."""
    a = np.asarray(orders, dtype=float)[:, None]
    with np.errstate(invalid="ignore"):
        slope = numerator - denominator
        if len(slope) <= _BLOCK:
            return _log_sum_exp(a * slope + denominator)
        buffer = np.empty((len(a), _BLOCK))

        def terms_of(start: int) -> np.ndarray:  # a log q_num + (1 - a) log q_den, x in the block at ``start``
            den = denominator[start: start + _BLOCK]
            out = buffer[:, : len(den)]
            np.multiply(a, slope[start: start + _BLOCK], out=out)
            return np.add(out, den, out=out)

        starts = range(0, len(slope), _BLOCK)
        block_tops = np.stack([terms_of(start).max(axis=1) for start in starts], axis=1)  # [orders, blocks]
        top = block_tops.max(axis=1)
        if not np.isfinite(top).all():
            return _log_sum_exp(a * slope + denominator)
        needed = (block_tops >= (top + UNDERFLOW)[:, None]).any(axis=0)
        sums = np.zeros(len(top))
        for start in (start for start, kept in zip(starts, needed) if kept):
            out = terms_of(start)
            np.subtract(out, top[:, None], out=out)
            sums += np.exp(out, out=out).sum(axis=1)
    return top + np.log(sums)


@functools.lru_cache(maxsize=256)
def _one_direction(trials: int, probability: float, shift: int, reverse: bool, orders: tuple):
    """(D_a(G || Q'), tail) at ``orders``, q = Bin(m, p)'s pmf. Forward: P = Bin + k vs Q' = Bin, G the normalised
    restriction of P to [0, m], tail Pr[Bin > m - k]: terms q(x - k)^a q(x)^(1-a), x = k..m. Reverse: P = Bin vs
    Q' = Bin + k, G the restriction of P to [k, m], tail Pr[Bin < k]: terms q(x)^a q(x - k)^(1-a)."""
    tail = _tail(trials, probability, shift, reverse)
    if tail >= 1:
        return np.full(len(orders), np.inf), 1.0
    logq = _log_pmf(trials, probability)
    shifted, unshifted = logq[: trials + 1 - shift], logq[shift:]
    numerator, denominator = (unshifted, shifted) if reverse else (shifted, unshifted)
    a = np.asarray(orders, dtype=float)
    return (_log_moments(numerator, denominator, orders) - a * math.log1p(-tail)) / (a - 1), tail


def _directions(probability: float) -> list[tuple[float, bool]]:
    """(p, reverse) of the one-direction comparisons whose worst is f_a(k): both signs of the shift (the reflection
    x -> m - x turns -k into +k with p -> 1 - p) and both directions; for p = 1/2 the same reflection maps the
    reverse direction onto the forward one, so one direction suffices."""
    directions = (False,) if probability == 0.5 else (False, True)
    return [(p, reverse) for p in sorted({probability, 1.0 - probability}) for reverse in directions]


def shift_divergence(trials: int, probability: float, shift: int, orders) -> tuple[np.ndarray, float]:
    """(f_a(k) at integer ``orders``, pi(k)): the largest D_a of the good parts over both directions and both signs
    of the shift k, and the largest mass outside the other's support (module docstring)."""
    orders = tuple(int(a) for a in orders)
    if shift == 0:
        return np.zeros(len(orders)), 0.0
    parts = [_one_direction(trials, p, shift, reverse, orders) for p, reverse in _directions(probability)]
    return np.max([curve for curve, _ in parts], axis=0), max(tail for _, tail in parts)


def shift_tail(trials: int, probability: float, shift: int) -> float:
    """pi(k) of ``shift_divergence`` alone (no divergence evaluated)."""
    if shift == 0:
        return 0.0
    return max(_tail(trials, p, shift, reverse) for p, reverse in _directions(probability))


def shift_table(trials: int, probability: float, largest: int, orders) -> tuple[np.ndarray, np.ndarray]:
    """f[order, k] for k = 0..K and pi[k]."""
    rows = [shift_divergence(trials, probability, k, orders) for k in range(largest + 1)]
    return np.stack([r for r, _ in rows], axis=1), np.array([t for _, t in rows])


def worst_allocation_rdp(values: np.ndarray, dimension: int, capacity_: int) -> np.ndarray:
    """An upper bound on max sum_j values[:, k_j] over d items with sum_j (k_j - 1)_+^2 <= W (module docstring),
    ``values`` [orders, K + 1] with values[:, 0] = 0: the smaller of two valid bounds at every order,

    * the unbounded knapsack of the "heavy" items (k >= 2, weight (k - 1)^2 >= 1, value f(k) - f(1)) on top of
      d f(1), dropping the limit of d items: exact when W <= d (then at most W <= d items are heavy);
    * Lagrangian weak duality, lambda W + d max_k (f(k) - lambda (k - 1)_+^2) at its breakpoints lambda (and 0).
    """
    largest = values.shape[1] - 1
    if largest == 0 or capacity_ < 0:
        return np.zeros(values.shape[0])
    if np.isinf(values).any():
        return np.where(np.isinf(values).any(axis=1), np.inf, worst_allocation_rdp(
            np.where(np.isinf(values), 0.0, values), dimension, capacity_))
    weights = np.maximum(np.arange(largest + 1) - 1, 0) ** 2
    return np.minimum(_heavy_knapsack(values, dimension, capacity_, weights), _dual(values, dimension, capacity_,
                                                                                     weights.astype(float)))


def _heavy_knapsack(values, dimension, capacity_, weights):
    base = dimension * np.maximum(values[:, 1], 0.0)
    gains = values[:, 2:] - np.maximum(values[:, 1:2], 0.0)  # [orders, K - 1]
    best = np.zeros((values.shape[0], capacity_ + 1))
    for room in range(1, capacity_ + 1):
        fits = weights[2:] <= room
        if fits.any():
            before = best[:, room - weights[2:][fits]]
            best[:, room] = np.maximum(best[:, room - 1], (before + gains[:, fits]).max(axis=1))
        else:
            best[:, room] = best[:, room - 1]
    return base + np.maximum(best[:, capacity_], 0.0)


def _dual(values, dimension, capacity_, weights):
    dv = values[:, :, None] - values[:, None, :]
    dw = weights[:, None] - weights[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = np.where(dw[None] > 0, dv / np.where(dw > 0, dw, 1.0)[None], 0.0)
    lambdas = np.concatenate([np.zeros((values.shape[0], 1)), np.maximum(slopes, 0.0).reshape(values.shape[0], -1)],
                             axis=1)  # [orders, candidates]
    inner = values[:, None, :] - lambdas[:, :, None] * weights[None, None, :]
    return (lambdas * capacity_ + dimension * inner.max(axis=2)).min(axis=1)


def exact_worst_allocation(values: np.ndarray, dimension: int, capacity_: int) -> np.ndarray:
    """The exact maximum of the knapsack (brute force over multisets of shifts; small instances, tests)."""
    largest = values.shape[1] - 1
    weights = [max(k - 1, 0) ** 2 for k in range(largest + 1)]
    best = np.full(values.shape[0], -np.inf)

    def walk(start: int, left: int, room: int, total: np.ndarray):
        nonlocal best
        if left == 0 or start > largest:
            best = np.maximum(best, total)
            return
        for k in range(start, largest + 1):
            if weights[k] <= room:
                walk(k, left - 1, room - weights[k], total + values[:, k])
        best = np.maximum(best, total)

    walk(0, dimension, capacity_, np.zeros(values.shape[0]))
    return best


def binomial_sum_rdp(trials: int, probability: float, dimension: int, grid: int, l2_shift: float,
                     orders) -> np.ndarray:
    """The approximate-RDP curve eps(a) of ``BinomialSumDpEvent`` at integer ``orders`` (+inf above MAX_ORDER)."""
    check_parameters(trials, probability, dimension, grid, l2_shift)
    orders = np.asarray(orders, dtype=float)
    anchors = np.array(ANCHOR_ORDERS, dtype=float)
    values, _ = shift_table(trials, probability, largest_shift(grid, l2_shift), anchors)
    cumulant = (anchors - 1) * worst_allocation_rdp(values, dimension, capacity(l2_shift))
    curve = np.full(orders.shape, np.inf)
    inside = orders <= MAX_ORDER
    curve[inside] = np.interp(orders[inside], anchors, cumulant) / (orders[inside] - 1)
    return curve


def binomial_sum_tail(trials: int, probability: float, dimension: int, grid: int, l2_shift: float) -> float:
    """delta0 = d pi(K): the mass the good part leaves out (module docstring); pi increases with the shift."""
    check_parameters(trials, probability, dimension, grid, l2_shift)
    largest = largest_shift(grid, l2_shift)
    return min(1.0, dimension * shift_tail(trials, probability, largest))


__all__ = ["MAX_ORDER", "binomial_sum_rdp", "binomial_sum_tail", "shift_divergence", "worst_allocation_rdp",
           "exact_worst_allocation", "largest_shift", "capacity"]
