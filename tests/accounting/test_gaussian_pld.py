"""``dpfl.accounting.gaussian_pld``: dp_accounting's (subsampled) Gaussian PLD with its connect-the-dots grid computed
at once must be dp_accounting's PLD: the same PMFs to 1e-10 per probability, the same epsilon (to 1e-9) after any
number of compositions, on a grid of sampling rates, noise multipliers and every neighbouring relation dpfl uses; and
dpfl's PLDs built on it (``pld.pld_of``: a ledger's round events, participation mixtures) must equal those built by
dp_accounting's own ``PLDAccountant``."""

from collections import OrderedDict

import numpy as np
import pytest
from dp_accounting import dp_event, privacy_accountant
from dp_accounting.pld import privacy_loss_distribution

from dpfl.accounting import pld
from dpfl.accounting.events import ParticipationDpEvent
from dpfl.accounting.gaussian_pld import gaussian_pld

R = privacy_accountant.NeighboringRelation
RELATIONS = [R.ADD_OR_REMOVE_ONE, R.REPLACE_ONE, R.REPLACE_SPECIAL]  # add_remove, replace_one, zero_out
DELTA = 1e-6


def pmfs(distribution) -> list:
    """The PLD's PMFs (remove, and add unless symmetric), each as (lower loss, probabilities, infinity mass)."""
    found = [distribution._pmf_remove] + ([] if distribution._symmetric else [distribution._pmf_add])
    dense = [p if hasattr(p, "_probs") else p.to_dense_pmf() for p in found]
    return [(p._lower_loss, p._probs, p._infinity_mass) for p in dense]


def assert_same(got, expected):
    """The same grid, and every probability and the infinity mass within 1e-10 of dp_accounting's: numpy's vectorised
    log, exp, sinh and asinh may differ from the scalar calls dp_accounting makes in the last bit of a grid point's
    divergence, which the connect-the-dots step divides by e^interval - 1 = 1e-4 (numpy 2.4: up to 5.6e-12 on this
    grid; the numpy CI installed before gave dp_accounting's bits exactly)."""
    assert got._symmetric == expected._symmetric
    for (lower, probs, infinity), (lower_e, probs_e, infinity_e) in zip(pmfs(got), pmfs(expected), strict=True):
        assert lower == lower_e and probs.shape == probs_e.shape
        assert np.abs(probs - probs_e).max() <= 1e-10 and abs(infinity - infinity_e) <= 1e-10


@pytest.mark.parametrize("relation", RELATIONS, ids=lambda r: r.name)
@pytest.mark.parametrize("q", [0.02, 0.3, 1.0])
@pytest.mark.parametrize("z", [1.5, 4.0])
def test_the_gaussian_pld_is_dp_accountings_bit_for_bit(relation, q, z):
    expected = privacy_loss_distribution.from_gaussian_mechanism(z, sampling_prob=q, neighboring_relation=relation)
    got = gaussian_pld(z, q, relation, 1e-4)
    assert_same(got, expected)
    for count in (1, 20):  # the same epsilon (to 1e-9) after any number of compositions
        eps = expected.self_compose(count).get_epsilon_for_delta(DELTA)
        assert got.self_compose(count).get_epsilon_for_delta(DELTA) == pytest.approx(eps, rel=1e-9, abs=0)


@pytest.mark.slow
@pytest.mark.parametrize("relation", RELATIONS, ids=lambda r: r.name)
@pytest.mark.parametrize("q", [1e-3, 0.1, 0.5])
@pytest.mark.parametrize("z", [0.5, 1.0])
def test_the_gaussian_pld_is_dp_accountings_at_small_noise_too(relation, q, z):
    """Small noise multipliers: 10^5 grid points and more (seconds in dp_accounting's loop)."""
    expected = privacy_loss_distribution.from_gaussian_mechanism(z, sampling_prob=q, neighboring_relation=relation)
    assert_same(gaussian_pld(z, q, relation, 1e-4), expected)


def rebuilt(event, relation, monkeypatch, fast: bool) -> float:
    """epsilon(DELTA) of ``event`` by ``pld.pld_epsilon`` from an empty cache, its Gaussian leaves built by
    ``gaussian_pld`` (``fast``) or by dp_accounting's ``PLDAccountant``."""
    monkeypatch.setattr(pld, "_CACHE", OrderedDict())
    if not fast:
        monkeypatch.setattr(pld, "_gaussian_leaf", lambda *args: None)
    try:
        return pld.pld_epsilon(event, DELTA, relation)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("relation", RELATIONS, ids=lambda r: r.name)
def test_dpfls_plds_of_gaussian_leaves_are_those_dp_accounting_builds(relation, monkeypatch):
    """A ledger's round events: a Poisson-subsampled Gaussian, its participation mixture (user level), a plain
    Gaussian, self-composed as a ledger does; epsilon equal to 1e-9 (here exactly) either way."""
    sampled = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(2.0))
    events = [sampled, ParticipationDpEvent(0.1, sampled), dp_event.GaussianDpEvent(3.0),
              dp_event.SelfComposedDpEvent(ParticipationDpEvent(0.25, dp_event.SelfComposedDpEvent(sampled, 5)), 7)]
    for event in events:
        fast, slow = (rebuilt(event, relation, monkeypatch, f) for f in (True, False))
        assert 0 < fast == pytest.approx(slow, rel=1e-9, abs=0), event
