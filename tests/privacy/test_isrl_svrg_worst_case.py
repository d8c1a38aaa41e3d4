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
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import OTHER_SILO, SERVER, observer_events
from dpfl.algorithms.isrl_svrg import SVRGConfig
from dpfl.experiments.noise_level import build_calibrated
from dpfl.algorithms.registry import Setting
from worst_case import LinearQuadraticOracle
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.engine.sampling import ClientSampler

logging.getLogger("absl").setLevel(logging.ERROR)

RECORDS, ROUNDS, CLIP, DELTA, EPSILON, TRIALS, ALPHA = 12, 4, 1.0, 1e-5, 1.0, 2000, 1e-4


def algorithm():
    setting = Setting(client_rate=1.0, num_clients=1, train_counts=(RECORDS,), rounds=ROUNDS, delta=DELTA,
                      epsilon=EPSILON)
    return build_calibrated("isrl-prox-svrg", SVRGConfig(clip=CLIP, sample_rate=0.5, period=2), setting)


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


def claimed(alg) -> dict[str, float]:
    counts = torch.tensor([RECORDS])
    cohort = ClientSampler(1, 1.0).cohort
    rounds = [observer_events(alg.release(r, None, counts), cohort(r), "plain") for r in range(ROUNDS)]
    ledger = PrivacyLedger((SERVER, OTHER_SILO), DELTA, None, None, "sound", alg.neighboring, alg.accountant)
    return ledger.epsilon_after(rounds, [SERVER, OTHER_SILO])


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
    truth = math.sqrt(2) / z
    assert low <= truth <= high, (low, truth, high)  # the snapshot noise is z 2C/n, as declared
    for r in (1, 3):  # the inner noise: z 4C/K with K = 6
        assert float(plus[:, r].std()) == pytest.approx(z * 4 * CLIP / 6, rel=0.1)
    for observer, eps in claimed(alg).items():
        assert eps >= ex.gdp_epsilon(truth, DELTA), observer
        assert eps == pytest.approx(EPSILON, rel=1e-3)  # both streams composed to the budget
