"""dp-fedavg-joint's worst case (Heikkilä 2024's joint noise shares with S local steps): the instance's parameters,
the claim of its two analyses and its exact mu; shared by tests/privacy/test_joint_noise_worst_case.py (which runs
it through ``JointNoise.client_round`` and measures mu) and benchmarks/tightness.py.

n clients, S local steps, q = 1, gamma = eta. The owner (client 0) has linear losses, its record zeroed out on the
neighbour (each step's mean moves by Delta); every other client's quadratic losses pull its iterate back to the
round's start, so its update keeps only its last share. A sum over k clients' updates (the owner's among them) is a
Gaussian mechanism with mu = S / (z_i sqrt(S + k - 1)) (the owner's S steps shift it by S Delta; the owner's S shares
and the others' last shares add variance (S + k - 1) (z_i Delta)^2), mu-GDP exactly (Dong, Roth, Su 2022).
"""

from __future__ import annotations

import math

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import observer_events
from dpfl.algorithms.dp_fedavg_joint import JointNoiseConfig
from dpfl.algorithms.registry import Setting
from dpfl.engine.sampling import ClientSampler
from dpfl.experiments.noise_level import build_calibrated

CLIENTS, RECORDS, SIGMA, ETA, DELTA = 10, 120, 6.0, 0.01, 1e-5

#: (name, trust, colluders, min_clients, observer, clients in the observed sum)
VIEWS = [
    ("third party", "aggregator", 1, None, "third_party", CLIENTS),
    ("dropouts", "clients", 1, 7, "third_party", 7),
    ("other silo", "clients", 1, None, "other_silo", CLIENTS - 1),
    ("coalition", "coalition", 3, None, "other_silo", CLIENTS - 3),
]


def algorithm(steps, trust, colluders, min_clients, analysis="sound"):
    config = JointNoiseConfig(local_steps=steps, sample_rate=1.0, lr=ETA, clip=1.0, noise_multiplier=SIGMA,
                              trust=trust, colluders=colluders, min_clients=min_clients)
    setting = Setting(client_rate=1.0, num_clients=CLIENTS, train_counts=(RECORDS,) * CLIENTS, rounds=1, delta=DELTA,
                      analysis=analysis)
    return build_calibrated("dp-fedavg-joint", config, setting)


def claimed_epsilon(steps, trust, colluders, min_clients, observer, analysis):
    """The ledger's epsilon (the family's accountant) of one round towards ``observer``, secure aggregation."""
    alg = algorithm(steps, trust, colluders, min_clients, analysis)
    release = alg.release(0, None, torch.full((CLIENTS,), RECORDS))
    event = observer_events(release, ClientSampler(CLIENTS, 1.0).cohort(0), "secagg", analysis)[observer]
    return PrivacyLedger((observer,), DELTA, None, None, analysis, alg.neighboring, alg.accountant) \
        .epsilon_after([{observer: event}], [observer])[observer]


def exact_mu(share: float, steps: int, k: int) -> float:
    """mu of a sum over k clients' updates, shares of multiplier ``share`` (module docstring)."""
    return steps / (share * math.sqrt(steps + k - 1))


__all__ = ["CLIENTS", "RECORDS", "SIGMA", "ETA", "DELTA", "VIEWS", "algorithm", "claimed_epsilon", "exact_mu"]
