"""A worst-case instance for ISRL-DP Prox-SVRG (Lowy et al. 2023, Alg. 1), run through the real ``client_round``.

One silo of n = 12 records with 1-D linear losses <theta, x_j> (gradient x_j at every theta). All records are 0 except
the owner's, +C or -C on the two replace-one neighbours. R = 4 rounds, Q = 2, inner minibatches of K = 6 (s = 0.5):

* the snapshot rounds 0 and 2 send the full mean, which moves by 2C/n between the neighbours (its sensitivity), with
  noise std z 2C/n: their sum is a 1-D Gaussian pair at mu = sqrt(2)/z, whose exact curve (Dong, Roth, Su 2022) is a
  lower bound on the true epsilon of the transcript;
* the inner rounds 1 and 3 subtract the gradient at the snapshot from the gradient at w, the same vector for a linear
  loss: no signal, but noise of std z 4C/K (two clipped terms of one record, replace-one), declared and composed.

No other silo's noise is credited (ISRL-DP): the server's and another silo's claims must be at least that exact
epsilon, and (calibrated) at most privacy.epsilon.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from scipy import stats

import exact as ex
import isrl_worst_case
from dpfl.engine.protocol import ClientContext, ClientData
from isrl_worst_case import CLIP, DELTA, EPSILON, RECORDS, ROUNDS, claimed
from worst_case import LinearQuadraticOracle

logging.getLogger("absl").setLevel(logging.ERROR)

TRIALS, ALPHA = 2000, 1e-4


def algorithm():
    return isrl_worst_case.algorithm("isrl-prox-svrg")


def transcript(alg, value: float, seed: int) -> torch.Tensor:
    """h [trials, rounds] of TRIALS independent copies of the silo, every round from theta = 0 (a linear loss's
    messages do not depend on theta); the owner's record is ``value``."""
    x = torch.zeros(TRIALS, RECORDS, 1)
    x[:, 0, 0] = value
    data = ClientData(x, torch.zeros(TRIALS, RECORDS, dtype=torch.long), torch.full((TRIALS,), RECORDS))
    server = alg.init_state(torch.zeros(1), 1).server
    rounds = [alg.client_round(r, server, {}, data, ClientContext(LinearQuadraticOracle(1, 1.0), seed, r,
                                                                  torch.arange(TRIALS))).messages["h"][:, 0]
              for r in range(ROUNDS)]
    return torch.stack(rounds, dim=1).double()


def test_the_claim_covers_the_snapshots_exact_gaussian_and_the_inner_noise_is_declared():
    alg = algorithm()
    z = alg.checkpoint.noise_multiplier
    assert [alg.is_checkpoint(r) for r in range(ROUNDS)] == [True, False, True, False]
    plus, minus = transcript(alg, CLIP, 3), transcript(alg, -CLIP, 3)
    shift = (plus - minus)[0].tolist()
    assert shift == pytest.approx([2 * CLIP / RECORDS, 0, 2 * CLIP / RECORDS, 0], abs=1e-6)
    snapshots = plus[:, 0] + plus[:, 2]
    std, n = float(snapshots.std()), snapshots.numel()
    low = 2 * 2 * CLIP / RECORDS / (std * math.sqrt((n - 1) / stats.chi2.ppf(ALPHA / 2, n - 1)))
    high = 2 * 2 * CLIP / RECORDS / (std * math.sqrt((n - 1) / stats.chi2.ppf(1 - ALPHA / 2, n - 1)))
    truth = isrl_worst_case.exact_mu("isrl-prox-svrg", alg)
    assert truth == pytest.approx(math.sqrt(2) / z)
    assert low <= truth <= high, (low, truth, high)  # the snapshot noise is z 2C/n, as declared
    for r in (1, 3):  # the inner noise: z 4C/K with K = 6
        assert float(plus[:, r].std()) == pytest.approx(z * 4 * CLIP / 6, rel=0.1)
    for observer, eps in claimed(alg).items():
        assert eps >= ex.gdp_epsilon(truth, DELTA), observer
        assert eps == pytest.approx(EPSILON, rel=1e-3)  # both streams composed to the budget
