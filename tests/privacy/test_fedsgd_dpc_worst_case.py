"""Worst-case instances for fedsgd-dpc (Gaussian) with unequal client sizes, run through the real ``client_round``,
the real boundary and the real ``server_update`` of both aggregations.

Client i has d_i records and replies with d_i (g_i + w_i), g_i the mean clipped gradient over a batch of
b_i = floor(q d_i) records without replacement (replace-one sensitivity Delta_i = 2 xi / b_i), w_i ~ N(0, (z_i
Delta_i)^2); the server divides the sum by sum_i d_i ("normalized") or by d b / N ("paper"). In the units of the
sum, client i's sensitivity is d_i Delta_i and its noise std s_i = z_i d_i Delta_i. The owner o's records all have
clipped gradient -xi except one, +xi on one dataset and -xi on the other (the dominating pair of sampling without
replacement, ``exact.without_replacement_pair``): an observer of a sum over the clients S (the owner among them) sees

    (1 - r_o) N(0, z_S^2) + r_o N(1, z_S^2)  against  N(0, z_S^2),   r_o = b_o / d_o,
    z_S = sqrt(sum_{i in S} s_i^2) / (d_o Delta_o)                          (in units of the owner's sensitivity)

S = every client for a third party and a server behind secure aggregation, every client but one silo j for that silo
(which subtracts its own message; the worst j has the largest s_j), the owner alone for a server that sees messages.
The exact epsilon is the largest over the owners. The issue's instances: 10 clients, the owner with 7 records and
nine with 4, q = 0.26, eps_i = 16 (every b_i = 1, so the owner's sensitivity in the sum is 7/4 of the others'):
third party 4.303, other silo 4.638; crediting the others' noise per unweighted message claimed 2.903 and 3.157.
30 clients, the owner with 5 records and 29 with 1, q = 0.3, eps_i = 8: third party 3.051 (claimed 1.149).
"""

from __future__ import annotations

import functools
import logging
import math

import pytest
import torch
from scipy import stats

from dpfl.accounting import exact as ex
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.algorithms.fedsgd_dpc import FedSGDDPCConfig, build_fedsgd_dpc
from dpfl.algorithms.registry import Setting
from dpfl.engine.boundary import Boundary, Delivery
from dpfl.engine.protocol import ClientContext, ClientData

logging.getLogger("absl").setLevel(logging.ERROR)
pytestmark = pytest.mark.usefixtures("one_torch_thread")

DELTA, CLIP, TRIALS, ALPHA = 1e-5, 1.0, 500, 1e-4
#: the exact PLDs' loss grid: coarser than the default for speed; the truth stays a certified lower bound (one round)
INTERVAL = 5e-4

#: name: (records per client, the owner first; q; eps_i)
INSTANCES = {
    "7-and-nine-4": ((7,) + (4,) * 9, 0.26, 16.0),
    "5-and-29-1": ((5,) + (1,) * 29, 0.3, 8.0),
    "7-6-and-eight-4": ((7, 6) + (4,) * 8, 0.26, 16.0),  # another silo of 6 records subtracts the largest share
}
#: (observer, boundary): the statistic each one sees
VIEWS = [("third_party", "plain"), ("server", "secagg"), ("other_silo", "plain"), ("server", "plain")]
#: the exact epsilons of the issue's instances
EXACT = {("7-and-nine-4", "third_party", "plain"): 4.303, ("7-and-nine-4", "server", "secagg"): 4.303,
         ("7-and-nine-4", "other_silo", "plain"): 4.638, ("5-and-29-1", "third_party", "plain"): 3.051}


class LinearOracle:
    """Duck-typed ``CohortGradients``: record j's loss is <theta, x_j>, its gradient x_j (one parameter)."""

    def clipped_sum(self, theta, x, y, mask, clip, norm="l2"):
        g = x.to(theta.dtype)
        g = g * torch.clamp(clip / (g.abs().sum(-1, keepdim=True) + 1e-12), max=1.0)
        return (g * mask.unsqueeze(-1).to(g.dtype)).sum(1)


@functools.lru_cache(maxsize=8)
def algorithm(name: str, aggregation: str):
    counts, q, eps = INSTANCES[name]
    setting = Setting(client_rate=1.0, num_clients=len(counts), train_counts=counts, rounds=1, delta=DELTA,
                      epsilon=eps)
    return build_fedsgd_dpc("fedsgd-dpc", FedSGDDPCConfig(mechanism="gaussian", sample_rate=q, clip=CLIP,
                                                          aggregation=aggregation), setting)


def shares(name: str, alg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d_i Delta_i, s_i = z_i d_i Delta_i, r_i = b_i / d_i): each client's sensitivity and noise std in the units
    of the sum, and its sampling ratio."""
    counts = torch.tensor(INSTANCES[name][0], dtype=torch.float64)
    batch = alg.sampler.batch_sizes(counts.long()).double()
    weighted = counts * 2 * CLIP / batch
    return weighted, alg.noise * weighted, batch / counts


def observed(view: tuple[str, str], owner: int, noise: torch.Tensor) -> list[int]:
    """The clients whose noise is in the statistic the observer sees (module docstring)."""
    if view == ("server", "plain"):
        return [owner]
    everyone = list(range(len(noise)))
    if view[0] != "other_silo":
        return everyone
    silo = max((j for j in everyone if j != owner), key=lambda j: float(noise[j]))
    return [j for j in everyone if j != silo]


def exact_epsilon(name: str, alg, view: tuple[str, str], owner: int) -> float:
    weighted, noise, ratio = shares(name, alg)
    z = float(noise[observed(view, owner, noise)].square().sum().sqrt() / weighted[owner])
    pair = ex.without_replacement_pair(float(ratio[owner]), z)
    return ex.Instance(((1.0, 1.0, pair),)).epsilon(DELTA, interval=INTERVAL)


def worst_owner(name: str, alg, view) -> tuple[int, float]:
    """(owner, exact epsilon) of the owner with the largest exact epsilon (one per distinct record count)."""
    counts = INSTANCES[name][0]
    firsts = [counts.index(d) for d in sorted(set(counts))]
    return max(((o, exact_epsilon(name, alg, view, o)) for o in firsts), key=lambda pair: pair[1])


@functools.lru_cache(maxsize=32)
def claimed_epsilon(name: str, view: tuple[str, str]) -> float:
    """The ledger's claim after the round (the aggregation does not change the release)."""
    alg = algorithm(name, "normalized")
    observer, boundary = view
    counts = torch.tensor(INSTANCES[name][0])
    release = alg.release(0, None, type("Train", (), {"counts": counts})())
    ledger = PrivacyLedger((observer,), DELTA, accountant=alg.accountant)
    ledger.record(0, {observer: Boundary(boundary).views(release, release.cohort, "sound")[observer]})
    return ledger.epsilon()[observer]


@functools.lru_cache(maxsize=8)
def replies(name: str, owner: int, sign: float) -> dict[str, torch.Tensor]:
    """The messages [clients, TRIALS, 1] of one round of TRIALS copies of the clients on the client axis (each row
    with its own streams, the same for both signs): the owner's differing record ``sign`` xi and its others -xi, every
    other client's records 0. The aggregation does not touch the replies: one run serves both."""
    counts = torch.tensor(INSTANCES[name][0])
    n = len(counts)
    x = torch.zeros(n * TRIALS, int(counts.max()), 1)
    x[owner::n, : int(counts[owner]), 0] = -CLIP
    x[owner::n, 0, 0] = sign * CLIP
    data = ClientData(x, torch.zeros(x.shape[:2], dtype=torch.long), counts.repeat(TRIALS))
    ctx = ClientContext(LinearOracle(), 11, 0, torch.arange(n).repeat(TRIALS), torch.arange(n * TRIALS))
    out = algorithm(name, "normalized").client_round(0, {"x": torch.zeros(1)}, {}, data, ctx)
    return {k: v.double().reshape(TRIALS, n, -1).transpose(0, 1) for k, v in out.messages.items()}


def statistics(alg, name: str, owner: int, sign: float) -> dict[tuple[str, str], torch.Tensor]:
    """Every view's statistic [TRIALS]: the replies through the real boundary and ``server_update``."""
    by_client = replies(name, owner, sign)
    n = len(INSTANCES[name][0])
    start = {"x": torch.zeros(1, dtype=torch.float64)}
    delivery = Boundary("secagg").collect([by_client], n, 11, 0)  # the cohort's sums, one per trial
    silo = next(j for j in range(n) if j not in observed(("other_silo", "plain"), owner, shares(name, alg)[1]))
    without = Delivery({"dx": delivery.sum("dx") - by_client["dx"][silo], "weight": delivery.sum("weight")}, n, n)
    released = alg.server_update(0, start, delivery)["x"][:, 0]
    return {("third_party", "plain"): released, ("server", "secagg"): released,
            ("other_silo", "plain"): alg.server_update(0, start, without)["x"][:, 0],
            ("server", "plain"): by_client["dx"][owner, :, 0]}


@functools.lru_cache(maxsize=8)
def measured(name: str, aggregation: str):
    """Per view: (how often the record moved the statistic, the move over the statistic's std, with its (1 - ALPHA)
    interval) for the worst owner of the third party's sum."""
    alg = algorithm(name, aggregation)
    owner, _ = worst_owner(name, alg, ("third_party", "plain"))
    plus, minus = statistics(alg, name, owner, 1.0), statistics(alg, name, owner, -1.0)
    upper, lower = stats.chi2.ppf(1 - ALPHA / 2, TRIALS - 1), stats.chi2.ppf(ALPHA / 2, TRIALS - 1)
    out = {}
    for view in VIEWS:
        moved = (plus[view] - minus[view]).abs()
        hit = moved > 1e-9 * float(moved.max())
        shift = float(moved[hit].mean())
        assert float(moved[hit].std()) <= 1e-6 * shift  # the record moves the statistic by one constant, or not at all
        std = float(minus[view].std())  # on the second dataset the owner's mean is the constant -xi
        out[view] = (owner, float(hit.double().mean()), std / shift,
                     std * math.sqrt((TRIALS - 1) / upper) / shift, std * math.sqrt((TRIALS - 1) / lower) / shift)
    return out


@pytest.mark.parametrize("aggregation", ["normalized", "paper"])
@pytest.mark.parametrize("name", list(INSTANCES))
def test_the_released_aggregate_is_the_derived_mechanism_and_the_claim_covers_it(name, aggregation):
    alg = algorithm(name, aggregation)
    weighted, noise, ratio = shares(name, alg)
    for view in VIEWS:
        owner, hits, z, z_low, z_high = measured(name, aggregation)[view]
        derived = float(noise[observed(view, owner, noise)].square().sum().sqrt() / weighted[owner])
        assert z_low <= derived <= z_high, (view, z_low, derived, z_high)
        rate = float(ratio[owner])  # the record is in the batch b_o / d_o of the time
        assert stats.binomtest(round(hits * TRIALS), TRIALS, rate).pvalue > ALPHA, (view, hits, rate)
        _, truth = worst_owner(name, alg, view)
        claim = claimed_epsilon(name, view)
        assert claim >= truth, (view, claim, truth)
        if (name, *view) in EXACT:
            assert truth == pytest.approx(EXACT[name, *view], abs=2e-3)
