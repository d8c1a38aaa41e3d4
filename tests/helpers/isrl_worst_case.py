"""The ISRL-DP algorithms' worst-case instances (Lowy et al. 2023): the algorithms, the ledger's claim and the exact mu
of each instance; shared by tests/privacy/test_isrl_worst_case.py and tests/privacy/test_isrl_svrg_worst_case.py
(which run every instance through the real ``client_round`` and measure its shift and noise) and
benchmarks/tightness.py.

One silo of n = 12 records with 1-D linear losses <theta, x_j> (gradient x_j at every theta); all records are 0 except
the owner's, +C or -C on the two replace-one neighbours (a batch mean of K records moves by 2C/K, its sensitivity).
R = 4 rounds, each calibrated to epsilon = 1 at delta = 1e-5 by the family's own ledger. The transcript's privacy
is that of a 1-D Gaussian pair, mu-GDP (Dong, Roth, Su 2022, Cor. 2.13), with (``exact_mu``):

* isrl-prox-sgd, K = floor(12 / 4) = 3 disjoint records per round: the record moves one round by eta 2C/K at noise
  std z eta 2C/K, mu = 1/z (an observer that knows the permutation);
* isrl-mb-sgd (s = 1) and isrl-local-sgd (s = 1, 2 local steps): every draw moves by its sensitivity, mu = sqrt(R K)/z;
* isrl-spider (q = 2) and isrl-prox-svrg (Q = 2, s = 0.5): the checkpoint rounds 0 and 2 move by their sensitivity,
  mu = sqrt(2)/z; the difference (inner) rounds carry no signal for a linear loss, but their noise is composed;
* isrl-spider-alt, and isrl-spider beside its linear instance: a record whose clipped gradient flips sign with the
  model moves every round, difference rounds included, by its full sensitivity: mu = sqrt(2/z1^2 + 2/z2^2), 2/z at
  z1 = z2 (``FlippingOracle`` of the test). isrl-spider's claim is that composition, so the linear instance's 1.46x
  is the instance's weakness, not the claim's: no bound below it holds for every loss.

With one silo there is no other silo's noise to credit, so the server's and another silo's claims are the same.
With M silos of that size (``silos``), all records 0 but the owner's, an observer of the round's sum (the third party;
another silo, which knows its own message) sees the owner's shift under the M (or M - 1) silos' independent draws
where they are additive (``sum_mu``).
"""

from __future__ import annotations

import logging
import math

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY, observer_events
from dpfl.algorithms.isrl import ISRLConfig, ISRLKeys
from dpfl.algorithms.isrl_spider import SpiderConfig
from dpfl.algorithms.isrl_svrg import SVRGConfig
from dpfl.algorithms.registry import Setting
from dpfl.engine.sampling import ClientSampler
from dpfl.experiments.noise_level import build_calibrated

logging.getLogger("absl").setLevel(logging.ERROR)

RECORDS, ROUNDS, CLIP, ETA, DELTA, EPSILON = 12, 4, 1.0, 0.1, 1e-5, 1.0
#: every family of the module docstring, in its order
NAMES = ("isrl-prox-sgd", "isrl-mb-sgd", "isrl-local-sgd", "isrl-spider", "isrl-spider-alt", "isrl-prox-svrg")


def algorithm(name: str, silos: int = 1):
    """The instance's algorithm ``name`` (one of ``NAMES``) over ``silos`` silos of RECORDS records, calibrated to
    EPSILON over ROUNDS rounds."""
    setting = Setting(client_rate=1.0, num_clients=silos, train_counts=(RECORDS,) * silos, rounds=ROUNDS, delta=DELTA,
                      epsilon=EPSILON)
    if name == "isrl-spider":
        return build_calibrated(name, SpiderConfig(lr=ETA, clip=CLIP, sample_rate=1.0, period=2), setting)
    if name == "isrl-spider-alt":
        return build_calibrated(name, ISRLKeys(lr=ETA, clip=CLIP, sample_rate=1.0), setting)
    if name == "isrl-prox-svrg":
        return build_calibrated(name, SVRGConfig(clip=CLIP, sample_rate=0.5, period=2), setting)
    return build_calibrated(name, ISRLConfig(lr=ETA, clip=CLIP, sample_rate=1.0, local_steps=2), setting)


def claimed(alg, silos: int = 1) -> dict[str, float]:
    """The ledger's epsilon towards the server and another silo (plain boundary) after ROUNDS rounds, and towards the
    third party where there are ``silos`` > 1 silos of RECORDS records."""
    counts = torch.tensor([RECORDS] * silos)
    cohort = ClientSampler(silos, 1.0).cohort
    observers = (SERVER, OTHER_SILO) + ((THIRD_PARTY,) if silos > 1 else ())
    rounds = []
    for r in range(ROUNDS):
        release = alg.release(r, None, counts)
        rounds.append(observer_events(release, release.cohort or cohort(r), "plain"))
    ledger = PrivacyLedger(observers, DELTA, None, None, "sound", alg.neighboring, alg.accountant)
    return ledger.epsilon_after(rounds, list(observers))


def sum_mu(name: str, alg, shares: int) -> float:
    """mu of the rounds' sums of ``shares`` silos' messages, the owner's among them (linear losses, equal sizes):
    Prox-SGD's one round, 1 / (z sqrt(shares)); minibatch SGD's R rounds, sqrt(R / shares) / z; Local SGD's R rounds
    of K steps, each message the sum of its K draws and K times the shift, sqrt(R K / shares) / z."""
    z = alg.steps.mechanism.noise_multiplier
    draws = {"isrl-prox-sgd": 1, "isrl-mb-sgd": ROUNDS, "isrl-local-sgd": ROUNDS * alg.steps.local_steps}[name]
    return math.sqrt(draws / shares) / z


def exact_mu(name: str, alg, flipping: bool | None = None) -> float:
    """mu of the transcript of ``name``'s instance (module docstring): linear losses, or (``flipping``, the default
    for isrl-spider-alt) a record whose gradient flips with the model, which moves every round of the SPIDER
    recursion by its sensitivity: mu = sqrt(Q / z1^2 + D / z2^2) over Q = 2 checkpoint and D = 2 difference rounds."""
    flipping = name == "isrl-spider-alt" if flipping is None else flipping
    if flipping:
        if name not in ("isrl-spider", "isrl-spider-alt"):
            raise ValueError(f"name = {name!r}: the flipping record's instance is the SPIDER recursion's")
        z1, z2 = alg.checkpoint.noise_multiplier, alg.difference.noise_multiplier
        return math.hypot(math.sqrt(2) / z1, math.sqrt(2) / z2)
    if name in ("isrl-spider", "isrl-spider-alt", "isrl-prox-svrg"):
        return math.sqrt(2) / alg.checkpoint.noise_multiplier
    z = alg.steps.mechanism.noise_multiplier
    draws = {"isrl-prox-sgd": 1, "isrl-mb-sgd": ROUNDS, "isrl-local-sgd": 2 * ROUNDS}[name]
    return math.sqrt(draws) / z


__all__ = ["RECORDS", "ROUNDS", "CLIP", "ETA", "DELTA", "EPSILON", "NAMES", "algorithm", "claimed", "exact_mu"]
