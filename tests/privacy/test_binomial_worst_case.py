"""Worst-case instances for the binomial vector summation's accounting (dpfl.accounting.binomial): the accountant's
epsilon is never below the exact privacy curve of the shuffled view (the per-coordinate counts)."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpfl.accounting import accountants
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.accounting.binomial import (capacity, exact_worst_allocation, largest_shift, shift_divergence,
                                      worst_allocation_rdp)
from dpfl.accounting.events import BinomialSumDpEvent
from dpfl.accounting.rdp import tail_delta


def accountant_epsilon(event, delta, name="tightest"):
    accountant = accountants.make(name, NEIGHBORING["replace_one"])
    accountant.compose(event)
    return accountant.get_epsilon(delta)


def view(x: float, grid: int, trials: int, p: float) -> np.ndarray:
    """Exact pmf of the count r(x) + Bin(m, p) on 0..m + g, r(x) the randomised rounding of g (x + 1)/2 (L = 1)."""
    scaled = (x + 1.0) / 2.0 * grid
    low = math.floor(scaled)
    noise = stats.binom.pmf(np.arange(trials + 1), trials, p)
    pmf = np.zeros(trials + grid + 2)
    for r, weight in ((low, 1.0 - (scaled - low)), (low + 1, scaled - low)):
        if weight > 0:
            pmf[r: r + trials + 1] += weight * noise
    return pmf


def exact_delta(epsilon: float, grid: int, trials: int, p: float) -> float:
    """max over x, x' in [-1, 1] (steps of 1/8) and both directions of sum_y (P_x(y) - e^eps P_x'(y))_+."""
    views = [view(x, grid, trials, p) for x in np.linspace(-1, 1, 17)]
    return max(float(np.maximum(a - math.exp(epsilon) * b, 0).sum()) for a in views for b in views)


@pytest.mark.parametrize("trials, p, delta", [(60, 0.5, 1e-3), (60, 0.3, 1e-3), (6, 0.5, 0.2)])
def test_one_dimension_accountant_never_below_the_exact_curve(trials, p, delta):
    """d = 1, g = 2, L = C = 1 (l2 shift S = g): the exact hockey-stick divergence of the two counts' distributions
    (infinite-loss mass included) at the accountant's epsilon is at most delta. With m = 6 the tail delta0 matters
    (Pr[Bin(6, 1/2) >= 5] = 7/64) and is subtracted before the RDP conversion; for p = 1/2 the default accountant
    is the exact PLD (``dpfl.accounting.discrete_pld``, ``tests/privacy/test_discrete_pld_worst_case.py``), which
    carries that mass as an infinite loss."""
    event = BinomialSumDpEvent(trials, p, 1, 2, 2.0)
    epsilon = accountant_epsilon(event, delta)
    assert math.isfinite(epsilon)
    assert exact_delta(epsilon, 2, trials, p) <= delta
    # not vacuous: the exact curve needs a positive epsilon, within a factor of the claim
    exact = next(e for e in np.arange(0.0, 20.0, 0.01) if exact_delta(e, 2, trials, p) <= delta)  # 0.01 above
    assert 0.3 < exact - 0.01 <= epsilon < 3 * exact + 0.5
    if trials == 6:
        assert tail_delta(event) == pytest.approx(7 / 64)


def test_tail_larger_than_delta_gives_no_guarantee():
    event = BinomialSumDpEvent(6, 0.5, 1, 2, 2.0)
    assert accountant_epsilon(event, 0.1) == math.inf  # delta0 = 7/64 > 0.1


def test_good_part_divergence_is_the_finite_sum():
    """f_a(k) for p = 1/2: (1/(a-1)) [log sum_{x=k..m} q(x-k)^a q(x)^(1-a) - a log(1 - Pr[Bin > m - k])]."""
    m, k, a = 30, 2, 5
    q = stats.binom.pmf(np.arange(m + 1), m, 0.5)
    tail = q[m - k + 1:].sum()
    reference = (math.log(sum(q[x - k] ** a * q[x] ** (1 - a) for x in range(k, m + 1))) - a * math.log(1 - tail))
    curve, pi = shift_divergence(m, 0.5, k, [a])
    assert curve[0] == pytest.approx(reference / (a - 1), rel=1e-10)
    assert pi == pytest.approx(tail)


def test_rounded_shifts_satisfy_the_knapsack_constraint_and_its_bound_covers_them():
    """d = 2, g = 3, L = 1, ||x - x'|| <= 2: every coupled rounding (common coins u) of every pair on a grid gives
    shifts k with sum (k_j - 1)_+^2 <= W = ceil(S^2) - 1 and k_j <= g; the brute-force maximum of sum f_a(k_j) over
    all integer allocations obeying that constraint equals ``exact_worst_allocation`` and is at most the bound."""
    grid, shift = 3, 3.0
    points = np.array(list(itertools.product(np.linspace(-1, 1, 9), repeat=2)))  # [81, 2]
    coins = np.array(list(itertools.product(np.linspace(0, 0.999, 12), repeat=2)))  # [144, 2]
    x, y = points[:, None, :], points[None, :, :]
    near = np.linalg.norm(x - y, axis=-1) <= 2.0 + 1e-12  # [81, 81]
    rounded = np.floor(grid * (points[:, None, :] + 1) / 2 + coins[None, :, :])  # [81, 144, 2]
    k = np.abs(rounded[:, None] - rounded[None, :]).astype(int)[near]  # [pairs, 144, 2]
    assert k.max() <= largest_shift(grid, shift)
    assert (np.maximum(k - 1, 0) ** 2).sum(-1).max() <= capacity(shift)
    realised = {tuple(sorted(row)) for row in k.reshape(-1, 2).tolist()}
    assert (1, 3) in realised and (2, 2) in realised  # the constraint is met with equality
    orders = np.arange(2, 9)
    values = np.stack([shift_divergence(40, 0.4, k, orders)[0] for k in range(4)], axis=1)
    feasible = [k for k in itertools.product(range(4), repeat=2)
                if sum(max(kj - 1, 0) ** 2 for kj in k) <= capacity(shift)]
    brute = np.max([values[:, list(k)].sum(axis=1) for k in feasible], axis=0)
    assert np.allclose(exact_worst_allocation(values, 2, capacity(shift)), brute)
    assert np.all(worst_allocation_rdp(values, 2, capacity(shift)) >= brute - 1e-12)
    assert np.all(brute >= np.max([values[:, list(k)].sum(axis=1) for k in realised], axis=0) - 1e-12)


@pytest.mark.parametrize("dimension, grid", [(3, 4), (5, 3), (2, 5), (12, 2)])
def test_knapsack_bound_is_never_below_the_brute_force(dimension, grid):
    values = np.stack([shift_divergence(50, 0.5, k, np.arange(2, 7))[0] for k in range(grid + 1)], axis=1)
    exact = exact_worst_allocation(values, dimension, capacity(float(grid)))
    bound = worst_allocation_rdp(values, dimension, capacity(float(grid)))
    assert np.all(bound >= exact - 1e-12)
    if capacity(float(grid)) <= dimension:  # the heavy-item knapsack is exact then
        assert np.allclose(bound, exact)


def test_every_rdp_entry_point_charges_the_tail():
    """account() and delta_for_epsilon() convert the same curve as the ledger's accountant: at delta minus the tail
    delta0, and delta0 added back."""
    from dpfl.accounting.accountant import account, delta_for_epsilon

    event = BinomialSumDpEvent(6, 0.5, 1, 2, 2.0)  # delta0 = 7/64
    epsilon = account(event, 0.2, "rdp", "modern", "replace_one").epsilon
    assert epsilon == pytest.approx(accountant_epsilon(event, 0.2, "rdp"))
    assert account(event, 0.1, "rdp", neighboring="replace_one").epsilon == math.inf
    assert delta_for_epsilon(event, epsilon, "rdp", "modern", "replace_one").delta == pytest.approx(0.2, rel=1e-2)


def test_silo_participation_never_below_the_exact_mixture():
    """The owner's silo takes part with probability p = 0.3; when it does not, the counts come from a common
    distribution R (here: any other user's view). For every pair x, x' and every R on the grid, the exact hockey-stick
    divergence of (1 - p) R + p P_x vs (1 - p) R + p P_x' at the accountant's epsilon is at most delta."""
    from dpfl.accounting.events import ParticipationDpEvent

    trials, p, delta, q = 60, 0.5, 1e-3, 0.3
    epsilon = accountant_epsilon(ParticipationDpEvent(q, BinomialSumDpEvent(trials, p, 1, 2, 2.0)), delta)
    assert epsilon < accountant_epsilon(BinomialSumDpEvent(trials, p, 1, 2, 2.0), delta)  # amplified
    views = np.array([view(x, 2, trials, p) for x in np.linspace(-1, 1, 17)])  # [17, support]
    mixtures = (1 - q) * views[:, None, :] + q * views[None, :, :]  # [R, x, support]
    worst = max(float(np.maximum(mixtures[r, i] - math.exp(epsilon) * mixtures[r, j], 0).sum())
                for r in range(17) for i in range(17) for j in range(17))
    assert 0 < worst <= delta
