"""Worst-case instances for the exact lattice PLDs of ``dpfl.accounting.discrete_pld``: the claim through the real
accountants against the exact epsilon, computed independently by ``tests/helpers/lattice_exact.py`` (Skellam pmfs
summed from Poisson pmfs in mpmath at 40 digits, binomial pmfs from scipy, compositions as product distributions, the
hockey-stick divergence summed over every outcome), and against the RDP bounds they replace."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from scipy import stats

from dpfl.accounting import accountants, pld
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.accounting.discrete_pld import skellam_log_pmf, skellam_shift
from dpfl.accounting.events import BinomialSumDpEvent, ParticipationDpEvent, SkellamDpEvent
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import observer_events
from dpfl.algorithms.dp_fedavg_joint import JointNoiseConfig
from dpfl.algorithms.registry import Setting
from dpfl.engine.sampling import ClientSampler
from dpfl.experiments.noise_level import build_calibrated
from lattice_exact import binomial_pairs, exact_epsilon, skellam_pairs, skellam_pmf

logging.getLogger("absl").setLevel(logging.ERROR)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def claim(event, delta: float, name: str = "tightest", neighboring: str = "add_remove") -> float:
    accountant = accountants.make(name, NEIGHBORING[neighboring])
    accountant.compose(event)
    return accountant.get_epsilon(delta)


# -- Skellam ---------------------------------------------------------------------------------------------------------
def test_the_lattice_pmf_is_the_skellam_pmf():
    support = np.arange(-25, 26)
    for variance in (0.05, 4.0, 30.0):
        np.testing.assert_allclose(np.exp(skellam_log_pmf(support, variance)), skellam_pmf(support, variance),
                                   rtol=1e-10, atol=0)


@pytest.mark.parametrize("q, times, delta", [(1.0, 1, 1e-3), (1.0, 2, 1e-4), (0.2, 2, 1e-4), (0.2, 3, 1e-5)])
def test_skellam_claim_covers_the_exact_epsilon_and_is_within_a_tenth(q, times, delta):
    """One coordinate, s D = 2.5 integer units, so D2' = s D + 1 = 3.5 and K = 3; integer variance s^2 mu = 4. The
    exact instance at the worst shift (input 0 vs 3): the claim is at least its epsilon and within 1.1 of it (the
    1e-4 grid and the truncated tails only); the RDP bound it replaces is far above."""
    event = SkellamDpEvent(l2_sensitivity=1.75, l1_sensitivity=1.75, variance=1.0, scale=2.0, dimension=1)
    assert skellam_shift(event) == 3
    composed = dp_event.SelfComposedDpEvent(event if q == 1 else dp_event.PoissonSampledDpEvent(q, event), times)
    exact = exact_epsilon(skellam_pairs(4.0, ([(1.0, 3)], [(1.0, 0)]), q, times), delta)
    ours = claim(composed, delta)
    assert exact <= ours <= 1.1 * exact, (exact, ours)
    assert claim(composed, delta, "rdp") > 1.3 * ours


def test_the_rounding_mixtures_are_below_the_worst_shift():
    """The charged rounding: real inputs 0.3 and 2.8 (distance s D = 2.5) rounded with common coins give the integer
    laws 0.7 [0] + 0.3 [1] and 0.2 [2] + 0.8 [3]; their exact epsilon is below the claim's (shift K = 3), which is
    itself exact for the inputs 0 and 3."""
    event = dp_event.PoissonSampledDpEvent(0.2, SkellamDpEvent(1.75, 1.75, 1.0, 2.0, dimension=1))
    composed = dp_event.SelfComposedDpEvent(event, 2)
    rounded = exact_epsilon(skellam_pairs(4.0, ([(0.2, 2), (0.8, 3)], [(0.7, 0), (0.3, 1)]), 0.2, 2), 1e-4)
    assert 0.5 * claim(composed, 1e-4) < rounded < claim(composed, 1e-4)


def test_several_coordinates_and_huge_variances_fall_back_to_the_rdp_bound():
    for event in (SkellamDpEvent(1.0, 32.0, 1.0, 100.0, dimension=1000), SkellamDpEvent(1.0, 1.0, 1.0, 100.0),
                  SkellamDpEvent(1.0, 1.0, 1e6, 100.0, dimension=1)):
        assert not pld.supports(event)
        assert claim(event, 1e-5) == claim(event, 1e-5, "rdp")
    assert not pld.supports(dp_event.PoissonSampledDpEvent(0.1, SkellamDpEvent(1.0, 1.0, 1.0, dimension=1)),
                            NEIGHBORING["replace_one"])


def joint_skellam(sigma: float, scale: float = 2.0**8):
    """dp-fedavg-joint with Skellam shares on a model of one coordinate: 10 clients of 100 records, q = 0.1, one
    local epoch (S = 10 steps), a trusted aggregator."""
    setting = Setting(client_rate=1.0, num_clients=10, train_counts=(100,) * 10, rounds=1, delta=1e-5, dimension=1)
    return build_calibrated("dp-fedavg-joint", JointNoiseConfig(
        noise="skellam", skellam_scale=scale, local_steps=10, noise_multiplier=sigma, sample_rate=0.1,
        trust="aggregator"), setting)


def run_epsilon(algorithm, rounds: int, accountant: str | None = None) -> float:
    release = algorithm.release(0, None, torch.tensor([100] * 10))
    event = observer_events(release, ClientSampler(10, 1.0).cohort(0), "secagg", "sound")["third_party"]
    ledger = PrivacyLedger(("third_party",), 1e-5, None, None, "sound", algorithm.neighboring,
                           accountant or algorithm.accountant)
    return ledger.epsilon_after([{"third_party": event}] * rounds, ["third_party"])["third_party"]


def test_one_epoch_over_forty_rounds_has_no_floor():
    """The issue's case (1 epoch over 40 rounds) on a 1-D model at s = 2^8: the run's default accountant (the exact
    PLD) is below the RDP bound at every noise level and falls like 1 / sigma, with no floor."""
    epsilons = {}
    for sigma in (8.0, 32.0, 128.0):
        algorithm = joint_skellam(sigma)
        assert algorithm.accountant == "tightest"
        epsilons[sigma] = run_epsilon(algorithm, 40)
        assert epsilons[sigma] < run_epsilon(algorithm, 40, "rdp")
    assert epsilons[128.0] < 0.3 * epsilons[32.0] < 0.09 * epsilons[8.0]


# -- the binomial summation (P_vec) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("trials, times, delta", [(60, 1, 1e-3), (60, 2, 1e-4), (6, 1, 0.2), (30, 3, 1e-3)])
def test_binomial_claim_covers_the_exact_epsilon_and_is_within_a_tenth(trials, times, delta):
    """d = 1, g = 2, S = 2 (L = C = 1): clipped vectors -1 and 1 are rounded to 0 and 2 with no randomness, so the
    worst shift K = 2 is attained; its outcomes outside the other support are an infinite loss, which the PLD
    carries exactly (no delta0). Claim >= exact, within 1.1, and below the approximate-RDP bound it replaces."""
    event = dp_event.SelfComposedDpEvent(BinomialSumDpEvent(trials, 0.5, 1, 2, 2.0), times)
    exact = exact_epsilon(binomial_pairs(trials, 2, times), delta)
    ours = claim(event, delta, neighboring="replace_one")
    assert exact <= ours <= 1.1 * exact, (exact, ours)
    assert claim(event, delta, "rdp", "replace_one") > ours


def test_binomial_participation_claim_covers_the_exact_mixture():
    """The owner's silo takes part with probability 0.3 (else a common law R = Bin(m, 1/2) + 1): the exact
    epsilon of the mixtures over both directions is below the claim."""
    event = ParticipationDpEvent(0.3, BinomialSumDpEvent(60, 0.5, 1, 2, 2.0))
    noise = stats.binom.pmf(np.arange(61), 60, 0.5)
    shifted = [np.concatenate([np.zeros(k), noise, np.zeros(2 - k)]) for k in range(3)]
    pairs = [(0.7 * shifted[1] + 0.3 * shifted[i], 0.7 * shifted[1] + 0.3 * shifted[j])
             for i in range(3) for j in range(3)]
    exact = exact_epsilon(pairs, 1e-3)
    assert 0.1 < exact <= claim(event, 1e-3, neighboring="replace_one")


def test_binomial_of_several_coordinates_or_other_p_falls_back_to_the_rdp_bound():
    for event in (BinomialSumDpEvent(60, 0.3, 1, 2, 2.0), BinomialSumDpEvent(60, 0.5, 3, 2, 2.0)):
        assert not pld.supports(event, NEIGHBORING["replace_one"])
        assert claim(event, 1e-3, neighboring="replace_one") == claim(event, 1e-3, "rdp", "replace_one")
