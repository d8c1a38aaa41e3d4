"""Worst-case instances for dp-fedavg-joint's two analyses, run through the real ``JointNoise.client_round``.

The review's instance (``tests/helpers/worst_case.py``) with noise shares: n clients, S local steps, q = 1 (every record
in every step's Poisson batch, so no record sampling), gamma = eta. The record owner (client 0) has linear losses
<theta, v_j>; its record v = C is zeroed out on the neighbouring dataset, so each step's mean moves by C / b = Delta.
Every other client has quadratic losses ||theta - x||^2 / (2 eta) that pull its iterate back to the round's start, so
its update keeps only its LAST noise share. With shares of std z_i Delta, the observers see Gaussians with

    a sum over k clients' updates (the owner's among them):   mu = S / (z_i sqrt(S + k - 1))

k = n for a third party, t when only t clients reach the sum (dropouts), n - m for a coalition of m clients that
subtracts its own updates. The sound analysis claims sqrt(S - 1 + 1/k) / z_i (the last step at the k shares' noise,
the others at the owner's share): never below. The paper's analysis (every step at the k shares) claims
sqrt(S / k) / z_i: below the truth for S > 1. For S = 1 both are exact. The instance's parameters, its claim and mu are
``tests/helpers/joint_worst_case.py`` (shared with benchmarks/tightness.py).
"""

from __future__ import annotations

import functools
import logging
import math

import pytest
import torch
from scipy import stats

import exact as ex
from dpfl.engine.protocol import ClientContext, ClientData
from joint_worst_case import CLIENTS, DELTA, ETA, RECORDS, VIEWS, algorithm, claimed_epsilon, exact_mu
from worst_case import LinearQuadraticOracle

logging.getLogger("absl").setLevel(logging.ERROR)

TRIALS, COUPLED = 500, 4


def round_updates(alg, trials: int, value: float, seed: int):
    """dy [trials, n] of ``trials`` copies of the instance on the client axis; the owner's record is ``value``."""
    n = CLIENTS * trials
    x = torch.zeros(n, RECORDS, 1)
    y = torch.ones(n, RECORDS, dtype=torch.long)
    y[::CLIENTS] = 0  # client 0 of every trial: linear losses, its record 0 is the one that differs
    x[::CLIENTS, 0, 0] = value
    oracle = LinearQuadraticOracle(1, ETA)
    ids = torch.arange(n)
    out = alg.client_round(0, {"x": torch.zeros(1)}, {}, ClientData(x, y, torch.full((n,), RECORDS)),
                           ClientContext(oracle, seed, 0, ids))
    assert oracle.clipped == 0  # the quadratic clients' pull-back is exact
    return out.messages["dy"].reshape(trials, CLIENTS).double()


@functools.lru_cache(maxsize=16)
def measured_mu(steps, trust, colluders, min_clients, k, alpha=1e-4):
    """(low, high) of mu = shift / std of the sum of the owner's and k - 1 others' updates."""
    alg = algorithm(steps, trust, colluders, min_clients)
    statistic = lambda dy: dy[:, :k].sum(1)  # noqa: E731 (the owner and k - 1 others)
    big = statistic(round_updates(alg, TRIALS, 1.0, 1))
    shift = float((statistic(round_updates(alg, COUPLED, 1.0, 2)) - statistic(round_updates(alg, COUPLED, 0.0, 2)))
                  .abs().mean())
    std = float(big.std())
    upper, lower = stats.chi2.ppf(1 - alpha / 2, TRIALS - 1), stats.chi2.ppf(alpha / 2, TRIALS - 1)
    return shift / (std * math.sqrt((TRIALS - 1) / lower)), shift / (std * math.sqrt((TRIALS - 1) / upper))


@pytest.mark.parametrize("steps", [1, 8])
@pytest.mark.parametrize("name, trust, colluders, min_clients, observer, k", VIEWS, ids=[v[0] for v in VIEWS])
def test_the_sound_claim_covers_the_instance_and_the_papers_does_not_for_several_steps(
        name, trust, colluders, min_clients, observer, k, steps):
    share = algorithm(steps, trust, colluders, min_clients).mechanism.noise_multiplier
    truth = exact_mu(share, steps, k)
    low, high = measured_mu(steps, trust, colluders, min_clients, k)
    assert low <= truth <= high, (low, truth, high)
    sound = claimed_epsilon(steps, trust, colluders, min_clients, observer, "sound")
    # S > 1: the claim leaves a margin, so it must cover the measurement's upper end; S = 1: it is exact (the truth)
    assert sound >= ex.gdp_epsilon(max(truth, high) if steps > 1 else truth, DELTA) * (1 - 1e-9)
    paper = claimed_epsilon(steps, trust, colluders, min_clients, observer, "paper")
    if steps == 1:
        assert paper >= ex.gdp_epsilon(truth, DELTA) * (1 - 1e-9)  # one step: the paper's claim is sound
    else:
        assert paper < ex.gdp_epsilon(low, DELTA)  # several steps: it claims less than the code releases
