"""pld_power.self_compose is dp_accounting's self-composition bit for bit, with the moments kept per PMF."""

import gc

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_pmf
from scipy import fft, special

from dpfl.accounting import pld, pld_power
from dpfl.accounting.events import ParticipationDpEvent

NeighborRel = pld.NeighborRel
EVENTS = {
    "gaussian": dp_event.GaussianDpEvent(8.0),
    "poisson": dp_event.PoissonSampledDpEvent(0.2, dp_event.GaussianDpEvent(4.0)),  # asymmetric: two PMFs
    "participation": ParticipationDpEvent(0.3, dp_event.GaussianDpEvent(8.0)),
    "laplace": dp_event.LaplaceDpEvent(5.0),
}


def base_pld(name: str):
    if name == "randomized response":  # a sparse PMF: dp_accounting's own path
        return pld.privacy_loss_distribution.from_randomized_response(0.5, 4)
    return pld.pld_of(EVENTS[name], NeighborRel.ADD_OR_REMOVE_ONE)


def pmfs(distribution) -> list:
    return [distribution._pmf_remove] + ([] if distribution._symmetric else [distribution._pmf_add])


@pytest.mark.parametrize("name", [*EVENTS, "randomized response"])
def test_self_composition_is_dp_accountings_bit_for_bit(name):
    base = base_pld(name)
    for count in (1, 2, 3, 8, 13, 14, 40):  # the FFT length repeats between some counts: its transform is reused
        ours, theirs = pld_power.self_compose(base, count), base.self_compose(count)
        assert len(pmfs(ours)) == len(pmfs(theirs))
        for mine, reference in zip(pmfs(ours), pmfs(theirs)):
            assert type(mine) is type(reference)
            if isinstance(reference, pld_pmf.DensePLDPmf):
                assert (mine._lower_loss, mine._infinity_mass) == (reference._lower_loss, reference._infinity_mass)
                assert np.array_equal(mine._probs, reference._probs), (name, count)
        assert ours.get_epsilon_for_delta(1e-6) == theirs.get_epsilon_for_delta(1e-6)
    assert [p in pld_power._MOMENTS for p in pmfs(base)] == \
        [isinstance(p, pld_pmf.DensePLDPmf) for p in pmfs(base)]  # a dense PMF's moments are kept


def test_the_moments_live_only_as_long_as_their_pmf():
    base = pld.pld_of(EVENTS["poisson"], NeighborRel.ADD_OR_REMOVE_ONE)
    fresh = pld.privacy_loss_distribution.PrivacyLossDistribution(
        pld_pmf.DensePLDPmf(base._pmf_remove._discretization, base._pmf_remove._lower_loss,
                            base._pmf_remove._probs.copy(), base._pmf_remove._infinity_mass, True))
    pld_power.self_compose(fresh, 4)
    held = len(pld_power._MOMENTS)
    del fresh
    gc.collect()
    assert len(pld_power._MOMENTS) == held - 1


def test_the_cache_holds_a_bounded_number_of_points(monkeypatch):
    """A ledger's t-fold compositions grow with t: the cache drops the largest PLDs first (here: the compositions),
    keeping the round event every round reuses."""
    monkeypatch.setattr(pld, "_CACHE_POINTS", 600_000)
    pld._CACHE.clear()
    event = EVENTS["poisson"]
    for t in range(2, 30):
        pld.pld_of(dp_event.SelfComposedDpEvent(event, t))
    assert sum(map(pld._points, pld._CACHE.values())) <= 600_000
    assert (repr(event), NeighborRel.ADD_OR_REMOVE_ONE, pld.VALUE_DISCRETIZATION_INTERVAL) in pld._CACHE
    pld._CACHE.clear()


@pytest.mark.parametrize("length", [1, 2, 3, 15, 16, 4375, 4608, 10125])  # odd and even, 5- and 7-smooth
def test_the_transform_is_scipys_bit_for_bit(length):
    values = np.random.default_rng(length).random(min(length, 3000))
    assert np.array_equal(pld_power._transform(values, length), fft.fft(values, length))
    spectrum = fft.fft(values, length) ** 3
    assert np.array_equal(np.fft.ifft(spectrum), fft.ifft(spectrum))


def test_the_kept_transforms_hold_at_most_their_budget(monkeypatch):
    monkeypatch.setattr(pld_power, "TRANSFORM_POINTS", 300_000)
    bases = [base_pld(name) for name in ("gaussian", "poisson", "participation")]
    for count in (10, 20):
        for base in bases:
            expected = base.self_compose(count)
            assert np.array_equal(pld_power.self_compose(base, count)._pmf_remove._probs, expected._pmf_remove._probs)
            lengths = [m.fft_length for m in pld_power._MOMENTS.values() if m.transform is not None]
            assert sum(lengths) <= 300_000 or len(lengths) == 1, lengths  # beyond the budget: only the one in use
    assert max(m.fft_length for m in pld_power._MOMENTS.values()) > 100_000  # the budget held two at most


@pytest.mark.parametrize("name", EVENTS)
def test_the_fast_moments_are_within_a_hundredth_of_their_tolerance_of_scipys(name):
    for pmf in pmfs(base_pld(name)):
        probs = pmf._probs
        orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / len(probs)
        exact = [special.logsumexp(np.arange(len(probs)) * order, b=probs) for order in orders]
        assert np.max(np.abs(pld_power._fast_log_mgfs(probs) - exact)) < pld_power.MOMENT_TOLERANCE / 100


def test_a_bound_near_an_integer_takes_the_exact_moment(monkeypatch):
    """With a tolerance so wide that every bound is near an integer, every order's moment is scipy's (dp_accounting's
    own path), and the composition is still dp_accounting's bit for bit; with the default, none is needed here."""
    base = base_pld("poisson")
    pld_power.self_compose(base, 7)
    assert all(not pld_power._MOMENTS[p].exact_log_mgfs for p in pmfs(base))
    monkeypatch.setattr(pld_power, "MOMENT_TOLERANCE", 1e6)
    ours, theirs = pld_power.self_compose(base, 9), base.self_compose(9)
    assert all(len(pld_power._MOMENTS[p].exact_log_mgfs) == 40 for p in pmfs(base))
    for mine, reference in zip(pmfs(ours), pmfs(theirs)):
        assert (mine._lower_loss, mine._infinity_mass) == (reference._lower_loss, reference._infinity_mass)
        assert np.array_equal(mine._probs, reference._probs)
