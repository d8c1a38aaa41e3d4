"""The accounting of run.secure_noise against the exact divergences of the mechanism it charges.

``DiscreteGaussianDpEvent(z, k, d)`` claims eps(a) = a / (2 z_eff^2), z_eff = z 2^k / (2^k + sqrt(d)), for the
value rounded to a grid of step gamma <= Delta 2^-k plus N_Z(0, s) noise in grid units, s = ceil(z^2 4^k). Here:

* the grid map moves two values at l2 distance Delta by at most 2^k + sqrt(d) grid units (worst-case roundings);
* in one dimension the rounded values differ by an integer shift m <= 2^k + 1 (the charged bound; rounding attains
  2^k), and the exact Renyi divergence
  D_a(N_Z(m, s) || N_Z(0, s)), summed from the pmfs in 60-digit arithmetic, is never above the claim (m = 1,
  2^k and 2^k + 1);
* one Poisson-sampled round (zero-out: the record's data present with probability q, absent otherwise, the
  mechanism's input then moving by the full sensitivity) has the exact mixture divergences D_a(P || Q) and
  D_a(Q || P), P = (1 - q) N_Z(0, s) + q N_Z(m, s), Q = N_Z(0, s), never above what dpfl's RDP accountant claims
  for that round.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from dp_accounting import dp_event, privacy_accountant

from dpfl.accounting.events import DiscreteGaussianDpEvent
from dpfl.accounting.rdp import rdp_curve
from dpfl.noise import DiscreteGaussianMechanism, grid_steps, grid_variance

mpmath.mp.dps = 60
ZERO_OUT = privacy_accountant.NeighboringRelation.REPLACE_SPECIAL
#: (z, k): noise multipliers and grid exponents small enough that the pmfs can be summed term by term
SETTINGS = [(0.6, 1), (1.0, 2), (1.5, 2), (2.0, 3), (0.8, 4)]
ORDERS = [2, 3, 5, 8, 16, 32]


def pmf_terms(s: int, shift: int, width: int) -> dict[int, mpmath.mpf]:
    """exp(-(y - shift)^2 / (2 s)) for y in [-width, width + shift] (unnormalised)."""
    return {y: mpmath.exp(-mpmath.mpf((y - shift) ** 2) / (2 * s)) for y in range(-width, width + shift + 1)}


def renyi(p: dict, q: dict, order: int) -> float:
    """D_a(P || Q) of two pmfs on the same support, each given unnormalised."""
    zp, zq = mpmath.fsum(p.values()), mpmath.fsum(q.values())
    moment = mpmath.fsum((p[y] / zp) ** order * (q[y] / zq) ** (1 - order) for y in p)
    return float(mpmath.log(moment) / (order - 1))


def width_of(s: int, shift: int) -> int:
    """A support wide enough that the mass left out is below exp(-40^2 / 2) of either pmf."""
    return shift + 40 * (math.isqrt(s) + 1)


def test_the_grid_moves_neighbours_by_at_most_two_to_the_k_plus_root_d():
    """Worst-case roundings (no noise: zero draws), Delta a power of two (gamma = Delta 2^-k): every coordinate of x
    just below half a grid step, x' the same just above it on coordinates 2..d (each rounds one step apart) and nearly
    Delta further on coordinate 1 (2^k steps apart), ||x - x'|| <= Delta. The rounded vectors are sqrt(4^k + d - 1)
    apart, within the 2^k + sqrt(d) charged, and random pairs at distance Delta never exceed it."""
    k, d, delta = 3, 16, 0.25
    mechanism = DiscreteGaussianMechanism(1.0, k, d)
    gamma = float(grid_steps(torch.tensor([delta]), k))
    assert gamma == delta / 2**k
    zeros = torch.zeros(2, d, dtype=torch.int64)
    eta = 2.0**-20
    x = torch.full((d,), (0.5 - eta) * gamma, dtype=torch.float64)
    x_prime = torch.full((d,), (0.5 + eta) * gamma, dtype=torch.float64)
    x_prime[0] = x[0] + math.sqrt(delta**2 - (d - 1) * (2 * eta * gamma) ** 2)
    assert float((x_prime - x).norm()) <= delta
    released, _ = mechanism(torch.stack([x, x_prime]), torch.tensor([delta, delta]), zeros)
    grid = released / gamma
    assert torch.equal(grid, grid.round())
    distance = float((grid[1] - grid[0]).norm())
    assert distance == pytest.approx(math.sqrt(4**k + d - 1))
    assert distance <= 2**k + math.sqrt(d)
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = torch.tensor(rng.normal(size=d) * gamma * 5)
        step = torch.tensor(rng.normal(size=d))
        x_prime = x + delta * step / step.norm()
        released, _ = mechanism(torch.stack([x, x_prime]), torch.tensor([delta, delta]), zeros)
        assert float(((released[1] - released[0]) / gamma).norm()) <= 2**k + math.sqrt(d) + 1e-9


@pytest.mark.parametrize("z, k", SETTINGS)
def test_the_exact_renyi_divergence_is_never_above_the_claim(z, k):
    s = grid_variance(z, k)
    assert s >= (z * 2**k) ** 2
    claim = rdp_curve(DiscreteGaussianDpEvent(z, k, 1), ORDERS)
    largest = 2**k + 1  # 1-D: |x - x'| / gamma <= 2^k, plus 1 from the two roundings
    width = width_of(s, largest)
    q = pmf_terms(s, 0, width)
    for shift in (1, 2**k, largest):
        p = pmf_terms(s, shift, width - shift)
        p = {y: p.get(y, mpmath.mpf(0)) for y in q}
        exact = [renyi(p, q, a) for a in ORDERS]
        assert all(e <= c * (1 + 1e-12) for e, c in zip(exact, claim)), (shift, exact, claim)
    # the claim is the zCDP bound a m^2 / (2 s) at the largest shift, up to s >= (z 2^k)^2: it is not slack elsewhere
    assert exact[0] == pytest.approx(ORDERS[0] * largest**2 / (2 * s), rel=0.05)


@pytest.mark.parametrize("z, k", SETTINGS)
@pytest.mark.parametrize("q_rate", [0.05, 0.3])
def test_one_poisson_sampled_round_is_never_above_what_the_accountant_claims(z, k, q_rate):
    s = grid_variance(z, k)
    event = DiscreteGaussianDpEvent(z, k, 1)
    claim = rdp_curve(dp_event.PoissonSampledDpEvent(q_rate, event), ORDERS, ZERO_OUT)
    shift = 2**k + 1
    width = width_of(s, shift)
    absent = pmf_terms(s, 0, width)
    present = pmf_terms(s, shift, width - shift)
    z_absent, z_present = mpmath.fsum(absent.values()), mpmath.fsum(present.values())
    mixture = {y: (1 - q_rate) * absent[y] / z_absent + q_rate * present.get(y, 0) / z_present for y in absent}
    normalised = {y: absent[y] / z_absent for y in absent}
    for a, c in zip(ORDERS, claim):
        assert renyi(mixture, normalised, a) <= c * (1 + 1e-12)
        assert renyi(normalised, mixture, a) <= c * (1 + 1e-12)


def test_the_accountant_never_uses_the_gaussians_sampled_curves_for_the_discrete_event():
    """Sampled, the discrete event goes through the general bounds only: at a small rate and a high order they are
    above the continuous Gaussian's exact sampled curve at the same z_eff (which would not be valid here)."""
    event = DiscreteGaussianDpEvent(1.0, 10, 100)
    gaussian = dp_event.GaussianDpEvent(event.effective_multiplier)
    orders = np.array([2.0, 8.0, 32.0])
    discrete = rdp_curve(dp_event.PoissonSampledDpEvent(0.01, event), orders, ZERO_OUT)
    continuous = rdp_curve(dp_event.PoissonSampledDpEvent(0.01, gaussian), orders, ZERO_OUT)
    assert discrete[0] == pytest.approx(continuous[0], rel=1e-9)  # order 2: Zhu and Wang's bound is exact
    assert all(discrete[1:] > continuous[1:])
    # without replacement (replace-one), at z = 5: Wang et al.'s Gaussian-specific Thm 27 is not used for it
    event = DiscreteGaussianDpEvent(5.0, 10, 100)
    gaussian = dp_event.GaussianDpEvent(event.effective_multiplier)
    replace = privacy_accountant.NeighboringRelation.REPLACE_ONE
    sampled = rdp_curve(dp_event.SampledWithoutReplacementDpEvent(10, 1, event), orders, replace)
    thm27 = rdp_curve(dp_event.SampledWithoutReplacementDpEvent(10, 1, gaussian), orders, replace)
    assert sampled[0] == pytest.approx(thm27[0], rel=1e-9) and all(sampled[1:] > 3 * thm27[1:])
