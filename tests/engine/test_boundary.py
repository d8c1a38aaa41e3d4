"""The trust boundaries' delivery (dpfl.engine.boundary): what the server's step receives of the cohort's messages.

The simulated shuffler must hand the server the cohort's messages as an unlabelled multiset: every row delivered once,
in a uniformly random order drawn afresh each round, with nothing that names its sender. Its accounting charges the
server as plain (a record-level message is no more private for lacking its sender), so no privacy claim fails when the
permutation is missing: only these tests see it."""

import itertools
import math

import pytest
import torch
from scipy import stats

from dpfl.engine.boundary import Boundary

import survivors

SEED = 0


def delivered_senders(boundary: Boundary, cohort: torch.Tensor, round_index: int, chunks: int = 2) -> torch.Tensor:
    """The senders of the delivered rows, in delivery order: each client's message is its own id (and a second
    tensor, the id twice, so that every message name is permuted alike), sent in ``chunks`` memory chunks."""
    rows = {"dy": cohort.double().unsqueeze(1), "dc": 2.0 * cohort.double().unsqueeze(1).repeat(1, 3)}
    parts = [{name: value[part] for name, value in rows.items()} for part in torch.arange(cohort.numel()).chunk(chunks)]
    delivery = boundary.collect(parts, 100, SEED, round_index, cohort)
    dy, dc = delivery.rows("dy")[:, 0], delivery.rows("dc")
    assert torch.equal(dc, 2.0 * dy.unsqueeze(1).repeat(1, 3))  # one permutation for every message name
    torch.testing.assert_close(delivery.sum("dy"), rows["dy"].sum(0))
    assert delivery.count == cohort.numel()
    return dy.long()


def order_chi2(boundary: Boundary, rounds: int) -> float:
    """Pearson's chi-square of the delivery orders of 4 senders over ``rounds`` rounds against the uniform law on
    the 4! = 24 orders (23 degrees of freedom); asserts that the multiset is always the cohort's."""
    cohort = torch.tensor([7, 11, 23, 42])
    orders = {order: 0 for order in itertools.permutations(cohort.tolist())}
    for t in range(rounds):
        senders = delivered_senders(boundary, cohort, t)
        assert torch.equal(senders.sort().values, cohort)
        orders[tuple(senders.tolist())] += 1
    expected = rounds / len(orders)
    return sum((seen - expected) ** 2 / expected for seen in orders.values())


def test_the_simulated_shuffler_delivers_a_uniformly_random_permutation():
    """4 senders, 4,800 rounds: each of the 24 delivery orders ~200 times (chi-square at its 0.999 quantile). This
    is the whole law of the order, so sender position and cohort order are independent, and so are the positions
    of any two senders."""
    assert order_chi2(Boundary("shuffler"), 4800) < stats.chi2.ppf(0.999, 23)


def test_the_uniformity_test_catches_a_shuffler_that_does_not_permute(monkeypatch):
    survivors.unpermuted_shuffler(monkeypatch)
    assert order_chi2(Boundary("shuffler"), 240) > 100 * stats.chi2.ppf(0.999, 23)


def test_no_sender_is_identifiable_from_its_position_in_a_large_cohort():
    """50 senders, 400 rounds: a sender sits at its own cohort position in ~1/50 of the rounds (fixed points of a
    uniform permutation: Poisson(1) per round), and the Spearman correlation of cohort position and delivered
    position averages ~0 (each round's has sd 1/7)."""
    boundary = Boundary("shuffler")
    cohort = torch.randperm(100, generator=torch.Generator().manual_seed(1))[:50].sort().values
    rounds, fixed_points, correlation = 400, 0, 0.0
    for t in range(rounds):
        senders = delivered_senders(boundary, cohort, t, chunks=3)
        fixed_points += int((senders == cohort).sum())
        position = torch.argsort(torch.argsort(senders))  # the delivered position of the sender at cohort index i
        correlation += float(stats.spearmanr(torch.arange(50), position)[0]) / rounds
    assert abs(fixed_points - rounds) < 4 * math.sqrt(rounds)
    assert abs(correlation) < 4 / 7 / math.sqrt(rounds)


@pytest.mark.parametrize("name", ["shuffler", "secagg", "trusted"])
def test_nothing_that_names_a_sender_crosses_a_boundary_that_hides_it(name):
    """Behind a shuffler the server gets the rows and their sums, nothing else (a Delivery has no field for ids);
    behind secure aggregation or a trusted aggregator only the sums."""
    cohort = torch.tensor([3, 5, 8])
    delivery = Boundary(name).collect([{"dy": cohort.double().unsqueeze(1)}], 10, SEED, 0, cohort)
    assert {field for field, value in vars(delivery).items() if value is not None} == (
        {"sums", "count", "population", "messages"} if name == "shuffler" else {"sums", "count", "population"})
    assert set(delivery.sums) == {"dy"}
    if name == "shuffler":
        assert set(delivery.messages) == {"dy"}
    else:
        with pytest.raises(ValueError, match="cannot see individual messages"):
            delivery.rows("dy")


def test_the_plain_boundary_delivers_the_cohort_in_order():
    """The control: plain delivery keeps the cohort order (the server sees who sent what)."""
    cohort = torch.tensor([7, 11, 23, 42])
    assert torch.equal(delivered_senders(Boundary("plain"), cohort, 0), cohort)
