"""Worst-case instances with unequal client sizes and record sampling (q < 1), for every family that credits other
clients' noise, run through the real ``client_round``, the real boundary and the real ``server_update``.

The instances (fedsgd-dpc, dp-fedsgd, dp-fedavg-joint), each client's sensitivity w_i and noise std s_i in the units
of the released sum, the observers' pairs, their exact epsilons and the ledger's claims are
``tests/helpers/unequal_sizes_worst_case.py`` (its docstring derives them; shared with benchmarks/tightness.py). Here
the messages of TRIALS coupled copies go through the engine, and each view's measured shift, hit rate and noise must
be the derived pair, and the claim at least its exact epsilon.
"""

from __future__ import annotations

import functools
import logging
import math

import pytest
import torch
from scipy import stats

from dpfl.engine.boundary import Boundary, Delivery
from dpfl.engine.protocol import ClientContext, ClientData, ServerContext
from unequal_sizes_worst_case import CASES, CLIP, EXACT, VIEWS, Case, claimed_epsilon, multiplier, observed, worst_owner

logging.getLogger("absl").setLevel(logging.ERROR)
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRIALS, ALPHA, SEED = 500, 1e-4, 11


@functools.lru_cache(maxsize=16)
def messages(case: Case, owner: int, differs: bool) -> dict[str, torch.Tensor]:
    """The messages [clients, TRIALS, .] of one round of TRIALS copies of the clients on the client axis (each row
    with its own streams, the same for both datasets): the owner's differing record (+C or -C among -C records;
    Poisson: C or 0 among 0 records) on the first dataset if ``differs``, every other record 0."""
    counts = torch.tensor(case.counts)
    n = len(counts)
    x = torch.zeros(n * TRIALS, int(counts.max()), 1)
    base, other = (0.0, 0.0) if case.poisson else (-CLIP, -CLIP)
    x[owner::n, : int(counts[owner]), 0] = base
    x[owner::n, 0, 0] = CLIP if differs else other
    data = ClientData(x, torch.zeros(x.shape[:2], dtype=torch.long), counts.repeat(TRIALS))
    ctx = ClientContext(LinearOracle(), SEED, 0, torch.arange(n).repeat(TRIALS), torch.arange(n * TRIALS))
    out = case.algorithm().client_round(0, case.algorithm().init_state(torch.zeros(1), n).server, {}, data, ctx)
    return {k: v.double().reshape(TRIALS, n, -1).transpose(0, 1) for k, v in out.messages.items()}


class LinearOracle:
    """Duck-typed ``CohortGradients``: record j's loss is <theta, x_j>, its gradient x_j (one parameter)."""

    def clipped_sum(self, theta, x, y, mask, clip, norm="l2"):
        g = x.to(theta.dtype)
        clip = torch.as_tensor(clip, dtype=g.dtype).reshape(-1, 1, 1)
        g = g * torch.clamp(clip / (g.abs().sum(-1, keepdim=True) + 1e-12), max=1.0)
        return (g * mask.unsqueeze(-1).to(g.dtype)).sum(1)


def statistics(case: Case, owner: int, differs: bool) -> dict[tuple[str, str], torch.Tensor]:
    """Every view's statistic [TRIALS]: the messages through the real boundary and ``server_update``."""
    by_client, n, alg = messages(case.replies(), owner, differs), len(case.counts), case.algorithm()
    start = {k: v.double() for k, v in alg.init_state(torch.zeros(1), n).server.items()}
    delivery = Boundary("secagg").collect([by_client], n, SEED, 0)  # the cohort's sums, one per trial
    silo = next(j for j in range(n) if j not in observed(("other_silo", "plain"), owner, case.units()[1]))
    sums = dict(delivery.sums, **{case.key: delivery.sum(case.key) - by_client[case.key][silo]})
    released = alg.server_update(0, start, delivery, ServerContext(0, 0))["x"][:, 0]
    return {("third_party", "plain"): released, ("server", "secagg"): released,
            ("other_silo", "plain"): alg.server_update(0, start, Delivery(sums, n, n), ServerContext(0, 0))["x"][:, 0],
            ("server", "plain"): by_client[case.key][owner, :, 0]}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_released_aggregate_is_the_derived_mechanism_and_the_claim_covers_it(case):
    """The measured statistic is the derived pair (the record moves it by one constant at rate r_o; its std over that
    move is z_S, within a (1 - ALPHA) chi-square interval), and the claim is never below the exact epsilon."""
    owner, _ = worst_owner(case, ("third_party", "plain"))
    first, second = statistics(case, owner, True), statistics(case, owner, False)
    upper, lower = stats.chi2.ppf(1 - ALPHA / 2, TRIALS - 1), stats.chi2.ppf(ALPHA / 2, TRIALS - 1)
    for view in VIEWS:
        moved = (first[view] - second[view]).abs()
        hit = moved > 1e-9 * float(moved.max())
        shift = float(moved[hit].mean())
        assert float(moved[hit].std()) <= 1e-6 * shift  # the record moves the statistic by one constant, or not at all
        rate = float(case.units()[2][owner])
        assert stats.binomtest(int(hit.sum()), TRIALS, rate).pvalue > ALPHA, (view, float(hit.double().mean()), rate)
        std = float(second[view].std())  # on the second dataset the owner's mean is a constant
        low, high = std * math.sqrt((TRIALS - 1) / upper) / shift, std * math.sqrt((TRIALS - 1) / lower) / shift
        assert low <= multiplier(case, view, owner) <= high, (view, low, multiplier(case, view, owner), high)
        _, truth = worst_owner(case, view)
        assert claimed_epsilon(case, view) >= truth, (view, claimed_epsilon(case, view), truth)
        if case.family in ("fedsgd-dpc", "dp-fedsgd"):  # per owner, each its own PLD: the truth up to the grids
            assert claimed_epsilon(case, view) <= truth + 1e-3, (view, claimed_epsilon(case, view), truth)
        if (case.replies().name, *view) in EXACT:  # both aggregations release the same (the normalized's name)
            assert truth == pytest.approx(EXACT[case.replies().name, *view], abs=2e-3)
