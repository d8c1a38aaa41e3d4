"""dp-fedavg-joint's appendix relaxations (Heikkilä et al. 2024, "Loosening assumptions"): Eq. 25's worst case, its
claim and its exact mu; shared by tests/algorithms/test_joint_relaxations.py (which runs it through the real
``client_round`` and measures each owner's shift and the sum's noise) and benchmarks/tightness.py.

4 clients, q = 1 (every record in the step's batch), one local step, client-specific learning rates g_i, clips C_i and
noise factors f_i, records n_i all unequal (``COUNTS``, ``LR``, ``CLIP``, ``NOISE``). Client i's step has the
sensitivity Delta_i = gamma g_i C_i / (q n_i) and the noise std s_i = f_i sigma' Delta_i (sigma' the share of
``NoiseShares``). The sum of the clients' updates is a 1-D Gaussian: a record of client o shifts it by Delta_o, its
noise std is sqrt(sum_j s_j^2) (another silo subtracts its own share), so its exact privacy is mu-GDP (Dong, Roth,
Su 2022) with mu the largest Delta_o / std over the owners o (and, for another silo, over the silos).

With S > 1 steps (``algorithm(steps=S)``) the sound analysis charges owner o its first S - 1 draws at its own
multiplier f_o sigma' and the last credited, mu_o^2 = (S - 1) / (f_o sigma')^2 + Delta_o^2 / std^2 (``owner_mu``;
the single bound before each owner's release was declared combined the least f_i with the worst owner's credit,
``bound_mu``). A linear loss (every record's clipped gradient the same at every iterate) attains sqrt(S) Delta_o /
std towards the third party (``linear_mu``: the sum of S steps moves by S Delta_o, its noise is S times the step's),
a lower bound of the exact epsilon.
"""

from __future__ import annotations

import logging
import math

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import observer_events
from dpfl.algorithms.dp_fedavg_joint import JointNoiseConfig
from dpfl.algorithms.registry import Setting
from dpfl.engine.sampling import ClientSampler
from dpfl.experiments.noise_level import build_calibrated

logging.getLogger("absl").setLevel(logging.ERROR)

DELTA, SIGMA = 1e-5, 3.0
#: (n_i, g_i, C_i, f_i), unequal
COUNTS, LR, CLIP, NOISE = (40, 80, 40, 20), [1.0, 0.5, 2.0, 1.0], [1.0, 2.0, 0.5, 1.0], [1.0, 1.5, 0.8, 2.0]
#: (trust, observer): the aggregate's observers (another silo subtracts its own share)
VIEWS = (("aggregator", "third_party"), ("clients", "other_silo"))


def algorithm(analysis: str = "sound", trust: str = "aggregator", steps: int = 1):
    """The instance's dp-fedavg-joint (S = ``steps`` local steps, q = 1, sigma = SIGMA)."""
    setting = Setting(client_rate=1.0, num_clients=len(COUNTS), train_counts=COUNTS, rounds=1, delta=DELTA,
                      analysis=analysis)
    return build_calibrated("dp-fedavg-joint", JointNoiseConfig(
        local_steps=steps, sample_rate=1.0, noise_multiplier=SIGMA, trust=trust, client_lr=LR, client_clip=CLIP,
        client_noise=NOISE), setting)


def sensitivities(alg) -> list[float]:
    """Delta_i = gamma g_i C_i / (q n_i) (q = 1)."""
    return [alg.lr * g * c / n for g, c, n in zip(LR, CLIP, COUNTS)]


def exact_mu(alg, observer: str) -> float:
    """The largest mu = Delta_o / std of what ``observer`` sees (module docstring)."""
    delta = sensitivities(alg)
    std = [f * alg.shares.share * d for f, d in zip(NOISE, delta)]
    total = sum(s * s for s in std)
    if observer == "third_party":
        return max(d / math.sqrt(total) for d in delta)
    return max(delta[o] / math.sqrt(total - std[s] ** 2) for o in range(len(COUNTS)) for s in range(len(COUNTS))
               if s != o)


def owner_mu(alg) -> float:
    """The third party's largest mu over the owners of each owner's own S draws, its last credited (docstring)."""
    delta, total = sensitivities(alg), _summed_variance(alg)
    return max(math.sqrt((alg.local_steps - 1) / (f * alg.shares.share) ** 2 + d * d / total)
               for f, d in zip(NOISE, delta))


def bound_mu(alg) -> float:
    """The single bound's mu towards the third party: S - 1 draws at the least f_i sigma', the worst credit."""
    return math.sqrt((alg.local_steps - 1) / (min(NOISE) * alg.shares.share) ** 2
                     + max(sensitivities(alg)) ** 2 / _summed_variance(alg))


def linear_mu(alg) -> float:
    """sqrt(S) max_o Delta_o / std: a linear loss's third-party view (docstring), attained."""
    return math.sqrt(alg.local_steps) * exact_mu(alg, "third_party")


def _summed_variance(alg) -> float:
    return sum((f * alg.shares.share * d) ** 2 for f, d in zip(NOISE, sensitivities(alg)))


def claimed_epsilon(alg, observer: str, analysis: str = "sound") -> float:
    """The ledger's epsilon (PLD accountant) of the round towards ``observer``, secure aggregation."""
    release = alg.release(0, None, torch.tensor(COUNTS))
    event = observer_events(release, ClientSampler(len(COUNTS), 1.0).cohort(0), "secagg", analysis)[observer]
    ledger = PrivacyLedger((observer,), DELTA, None, None, analysis, alg.neighboring, "pld")
    return ledger.epsilon_after([{observer: event}], [observer])[observer]


__all__ = ["DELTA", "SIGMA", "COUNTS", "LR", "CLIP", "NOISE", "VIEWS", "algorithm", "sensitivities", "exact_mu",
           "owner_mu", "bound_mu", "linear_mu", "claimed_epsilon"]
