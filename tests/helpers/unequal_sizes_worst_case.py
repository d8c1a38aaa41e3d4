"""Worst-case instances with unequal client sizes and record sampling (q < 1), for every family that credits other
clients' noise: the instances, their claims and their exact epsilons; shared by
tests/privacy/test_unequal_sizes_worst_case.py (which runs each through the real ``client_round``, the real boundary
and the real ``server_update`` and measures the derived pair) and benchmarks/tightness.py.

In the units of the released sum each client i's message has a sensitivity w_i and a noise std s_i:

* fedsgd-dpc (Zhou et al. 2021) weights each reply by its record count d_i: w_i = d_i Delta_i, s_i = z_i w_i, with
  Delta_i = 2 xi / b_i over a batch of b_i = floor(q d_i) records without replacement; the server divides by
  sum_i d_i ("normalized") or d b / N ("paper");
* dp-fedsgd (one step; Noble et al. 2022's FedSGD) averages unweighted steps: w_i = eta Delta_i, s_i = z w_i, with
  Delta_i = 2C / floor(s n_i) (fixed batches) or C / (q n_i) (Poisson, zero-out);
* dp-fedavg-joint (one step; Heikkilä et al.) averages unweighted steps gamma g_i (mean + share): w_i = gamma g_i C /
  (q n_i), s_i = sigma_i w_i, with g_i = 1 or g_i = n_i / max n (``client_lr = "proportional_to_size"``: steps
  weighted by record count).

The owner o's records all have clipped gradient -C except one, +C on one dataset and -C on the other (fixed batches,
replace-one), or all 0 except one, C against 0 (Poisson, zero-out): the dominating pairs of the record sampling
(``exact.without_replacement_pair``, ``exact.poisson_pair``). An observer of the sum over the clients S sees that
pair at rate r_o (b_o / n_o, or q) with noise multiplier z_S = sqrt(sum_{i in S} s_i^2) / w_o: S = every client for a
third party and a server behind secure aggregation, every client but one silo j for that silo (it subtracts its own
message; the worst j has the largest s_j), the owner alone for a server that sees messages. The exact epsilon is the
largest over the owners; the claim must never be below it.

The issue's instances (fedsgd-dpc, 10 clients, the owner with 7 records and nine with 4, q = 0.26, eps_i = 16;
30 clients, 5 and 29 x 1, q = 0.3, eps_i = 8): exact 5.099 (third party), 5.484 (other silo), 3.050 at the noise
the PLD of sampling without replacement calibrates (``pld.without_replacement_as_poisson``); at RDP's calibration
they were 4.303, 4.638, 3.051, where crediting the others' noise per unweighted message claimed 2.903, 3.157, 1.149.
fedsgd-dpc's and dp-fedsgd's claims are each owner's own (``Release.owners``): exact to the grid for every view
(before it, the worst owner's noise at another owner's ratio: fedsgd-dpc 1.15x-1.66x, dp-fedsgd with batches of 1
and 3 1.44x).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Callable

import torch

import exact as ex
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.algorithms.dp_fedavg_joint import JointNoiseConfig
from dpfl.algorithms.fedsgd_dpc import FedSGDDPCConfig
from dpfl.algorithms.local_sgd import LocalSGDConfig, build_local_sgd
from dpfl.algorithms.registry import Setting
from dpfl.engine.boundary import Boundary
from dpfl.engine.sampling import ClientSampler
from dpfl.experiments.noise_level import build_calibrated

logging.getLogger("absl").setLevel(logging.ERROR)

DELTA, CLIP, LR = 1e-5, 1.0, 0.1
#: the exact PLDs' loss grid: coarser than the default for speed; the truth stays a certified lower bound (one round)
INTERVAL = 5e-4
#: (observer, boundary): the statistic each one sees
VIEWS = [("third_party", "plain"), ("server", "secagg"), ("other_silo", "plain"), ("server", "plain")]


def fedsgd_dpc(counts, q, epsilon, aggregation):
    return dataclasses.replace(calibrated_fedsgd_dpc(counts, q, epsilon), aggregation=aggregation)


@functools.lru_cache(maxsize=8)
def calibrated_fedsgd_dpc(counts, q, epsilon):
    """The replies of both aggregations (only the server's step differs), calibrated once."""
    setting = Setting(client_rate=1.0, num_clients=len(counts), train_counts=counts, rounds=1, delta=DELTA,
                      epsilon=epsilon)
    return build_calibrated("fedsgd-dpc", FedSGDDPCConfig(mechanism="gaussian", sample_rate=q, clip=CLIP), setting)


def dp_fedsgd(counts, q, z, record_sampling):
    return build_local_sgd("dp-fedsgd", LocalSGDConfig(local_steps=1, sample_rate=q, record_sampling=record_sampling,
                                                       lr=LR * q, weight_decay=0.0, clip=CLIP, noise_multiplier=z),
                           client_rate=1.0)


def joint(counts, q, sigma, client_lr):
    setting = Setting(client_rate=1.0, num_clients=len(counts), train_counts=counts, rounds=1, delta=DELTA)
    return build_calibrated("dp-fedavg-joint", JointNoiseConfig(local_steps=1, sample_rate=q, lr=LR, clip=CLIP,
                                                                 noise_multiplier=sigma, client_lr=client_lr), setting)


@dataclasses.dataclass(frozen=True)
class Case:
    """One family's instance: how to build it, and each client's (w_i, s_i, r_i) in the units of its message."""

    family: str
    counts: tuple[int, ...]
    build: Callable
    args: tuple
    key: str  # the message the server sums into the update

    @property
    def name(self) -> str:
        counts = ",".join(f"{d}x{self.counts.count(d)}" for d in dict.fromkeys(self.counts))
        return f"{self.family}-{counts}-{'-'.join(str(a) for a in self.args)}"

    @property
    def poisson(self) -> bool:
        return self.algorithm().neighboring == "zero_out"

    @functools.cache
    def algorithm(self):
        return self.build(self.counts, *self.args)

    def replies(self) -> "Case":
        """The case whose client round this one's is (fedsgd-dpc's aggregation is the server's alone)."""
        return dataclasses.replace(self, args=self.args[:2] + ("normalized",)) if self.family == "fedsgd-dpc" else self

    def units(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(w_i, s_i, r_i) of every client (module docstring)."""
        alg, counts = self.algorithm(), torch.tensor(self.counts)
        if self.family == "fedsgd-dpc":
            w = counts.double() * alg.sensitivity(counts).double()
            return w, alg.noise * w, alg.sampler.batch_sizes(counts).double() / counts
        sampler = alg.sampler
        ratio = sampler.batch_sizes(counts).double() / counts if sampler.scheme == "fixed" else \
            torch.full((len(counts),), sampler.rate, dtype=torch.float64)
        if self.family == "dp-fedsgd":
            w = alg.local_lr * sampler.mean_sensitivity(CLIP, counts)
            return w, alg.mechanism.noise_multiplier * w, ratio
        lr, _, noise, _ = alg.relaxations.rows(torch.arange(len(counts)))
        w = alg.lr * lr * sampler.mean_sensitivity(CLIP, counts)
        return w, alg.shares.share * noise * w, ratio


CASES = [
    *(Case("fedsgd-dpc", counts, fedsgd_dpc, (q, eps, aggregation), "dx")
      for counts, q, eps in [((7,) + (4,) * 9, 0.26, 16.0), ((5,) + (1,) * 29, 0.3, 8.0),
                             ((7, 6) + (4,) * 8, 0.26, 16.0)]  # a silo of 6 records subtracts the largest share
      for aggregation in ("normalized", "paper")),
    Case("dp-fedsgd", (5,) + (10,) * 9, dp_fedsgd, (0.3, 2.0, "fixed"), "dy"),  # batches of 1 and 3
    Case("dp-fedsgd", (5,) + (20,) * 9, dp_fedsgd, (0.3, 2.0, "poisson"), "dy"),
    Case("dp-fedavg-joint", (5,) + (20,) * 9, joint, (0.3, 1.5, None), "dy"),
    Case("dp-fedavg-joint", (5,) + (20,) * 9, joint, (0.3, 1.5, "proportional_to_size"), "dy"),
]
#: the exact epsilons of the issue's instances (either aggregation: keyed by the normalized one's name)
EXACT = {("fedsgd-dpc-7x1,4x9-0.26-16.0-normalized", "third_party", "plain"): 5.099,
         ("fedsgd-dpc-7x1,4x9-0.26-16.0-normalized", "server", "secagg"): 5.099,
         ("fedsgd-dpc-7x1,4x9-0.26-16.0-normalized", "other_silo", "plain"): 5.484,
         ("fedsgd-dpc-5x1,1x29-0.3-8.0-normalized", "third_party", "plain"): 3.050}


def observed(view: tuple[str, str], owner: int, noise: torch.Tensor) -> list[int]:
    """The clients whose noise is in the statistic the observer sees (module docstring)."""
    if view == ("server", "plain"):
        return [owner]
    everyone = list(range(len(noise)))
    if view[0] != "other_silo":
        return everyone
    silo = max((j for j in everyone if j != owner), key=lambda j: float(noise[j]))
    return [j for j in everyone if j != silo]


def multiplier(case: Case, view, owner: int) -> float:
    """z_S of the owner's pair (module docstring)."""
    w, s, _ = case.units()
    return float(s[observed(view, owner, s)].square().sum().sqrt() / w[owner])


def exact_epsilon(case: Case, view, owner: int) -> float:
    rate = float(case.units()[2][owner])
    pair = (ex.poisson_pair if case.poisson else ex.without_replacement_pair)(rate, multiplier(case, view, owner))
    return ex.Instance(((1.0, 1.0, pair),)).epsilon(DELTA, interval=INTERVAL)


def worst_owner(case: Case, view) -> tuple[int, float]:
    """(owner, exact epsilon) of the owner with the largest exact epsilon (one per distinct record count)."""
    firsts = [case.counts.index(d) for d in sorted(set(case.counts))]
    return max(((o, exact_epsilon(case, view, o)) for o in firsts), key=lambda pair: pair[1])


@functools.lru_cache(maxsize=64)
def claimed_epsilon(case: Case, view: tuple[str, str]) -> float:
    """The ledger's epsilon after the round, as the run would charge it."""
    alg, (observer, boundary) = case.algorithm(), view
    release = alg.release(0, None, torch.tensor(case.counts))
    cohort = release.cohort or ClientSampler(len(case.counts), 1.0).cohort(0)
    ledger = PrivacyLedger((observer,), DELTA, neighboring=alg.neighboring,
                           accountant=getattr(alg, "accountant", None))
    ledger.record(0, {observer: Boundary(boundary).views(release, cohort, "sound")[observer]})
    return ledger.epsilon()[observer]


__all__ = ["DELTA", "CLIP", "LR", "INTERVAL", "VIEWS", "Case", "CASES", "EXACT", "fedsgd_dpc", "dp_fedsgd", "joint",
           "observed", "multiplier", "exact_epsilon", "worst_owner", "claimed_epsilon"]
