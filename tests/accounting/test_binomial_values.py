"""The binomial summation's approximate-RDP curve (dpfl.accounting.binomial) pinned to the values it had when every
term of its sums was evaluated (before the sums skipped the blocks of terms whose exp underflows to 0): the speed-up
cannot move the curve, hence the bits the shuffle-DP families calibrate (tests/algorithms/test_sdp.py pins those)."""

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

from dpfl.accounting import binomial
from dpfl.accounting.binomial import binomial_sum_rdp, binomial_sum_tail
from dpfl.accounting.shuffle import binomial_summation_parameters

ORDERS = (2, 3, 8, 16, 33, 64)

#: (trials m, p, d, g, l2_shift) -> eps at ORDERS and the tail, by the code that summed every term (repr digits);
#: m = 866736, d = 441, g = 21 is one of the calibration's trials for sdp-spider in tests/algorithms/test_contract.py
PINNED = {
    (866736, 0.5, 441, 21, 21.0): ([0.008127134836782623, 0.012190609564283417, 0.03250818184223662,
                                    0.06501634350804035, 0.13498509510386403, 0.2600653612817117], 0.0),
    (50000, 0.3, 20, 5, 5.0): ([0.008254704288532366, 0.012382728892205819, 0.03302959192775272, 0.06608799264409113,
                                0.13734123114407465, 0.26505029379443645], 0.0),
    (5000, 0.5, 100, 10, 10.0): ([0.3176002460200831, 0.4764009774939937, 1.2704229113706487, 2.5409953060624444,
                                  5.276988718231722, 20.078732666601862], 0.0),
    (1000, 0.3, 5, 2, 2.0): ([0.06693195227467363, 0.10064237385340635, 0.2718008992859977, 0.5558257880679596,
                              2.218530998811357, 18.83020831583846], 2.6918162259833404e-152),
    (300, 0.7, 30, 6, 4.5): ([1.4485496603654502, 2.1922317942062985, 9.701822588710945, 51.06090943383524,
                              135.73263451018246, 181.57419183294115], 1.1693201505724337e-38),
    (60, 0.5, 2, 8, 8.0): ([6.500350139329476, 15.644898080987364, 31.399948253274435, 34.851795116446944,
                            36.456364904264674, 37.15302685695866], 7.671918274276823e-10),
}


@pytest.mark.parametrize("fields", PINNED)
def test_the_curve_and_tail_are_the_ones_every_term_gave(fields):
    curve, tail = PINNED[fields]
    assert binomial_sum_rdp(*fields, ORDERS) == pytest.approx(curve, rel=1e-12)
    assert binomial_sum_tail(*fields) == pytest.approx(tail, rel=1e-12)
    assert math.isinf(binomial_sum_rdp(*fields, [65])[0])


def whole_sum_divergence(trials: int, p: float, shift: int, reverse: bool, orders) -> np.ndarray:
    """D_a(G || Q') of ``binomial._one_direction`` with every term of the sum evaluated (scipy's logsumexp)."""
    logq = stats.binom(trials, p).logpmf(np.arange(trials + 1))
    shifted, unshifted = logq[: trials + 1 - shift], logq[shift:]
    numerator, denominator = (unshifted, shifted) if reverse else (shifted, unshifted)
    tail = stats.binom(trials, p).cdf(shift - 1) if reverse else stats.binom(trials, p).sf(trials - shift)
    a = np.asarray(orders, dtype=float)
    terms = a[:, None] * numerator[None, :] + (1 - a[:, None]) * denominator[None, :]
    return (logsumexp(terms, axis=1) - a * math.log1p(-tail)) / (a - 1)


@pytest.mark.parametrize("trials, p", [(4095, 0.5), (4097, 0.5), (30000, 0.3), (100003, 0.5)])
def test_the_sums_over_the_kept_blocks_are_the_whole_sums(trials, p):
    """Around the block size (4096 x's) and far above it, both directions, shifts 1 and 4, orders 2..64."""
    orders = (2, 3, 5, 8, 13, 21, 34, 64)
    for shift in (1, 4):
        for reverse in (False, True):
            found, _ = binomial._one_direction(trials, p, shift, reverse, orders)
            assert found == pytest.approx(whole_sum_divergence(trials, p, shift, reverse, orders), rel=1e-11,
                                          abs=1e-14)


def test_a_sum_with_no_finite_top_is_not_a_number_as_before():
    """Terms all -inf (no valid p gives them; a NaN curve reads as "no bound" in the accountant, never as 0)."""
    assert np.isnan(binomial._log_moments(np.full(5000, -np.inf), np.zeros(5000), (2, 3))).all()


@pytest.mark.parametrize("arguments, trials", [((2.0, 1e-5, 20, 9, 1.0), 31), ((1.0, 1e-6, 50, 100, 1.0), 671),
                                               ((4.0, 1e-5, 10, 441, 0.5), 948)])
def test_binomial_summation_parameters_keep_their_bits(arguments, trials):
    assert binomial_summation_parameters(*arguments).trials == trials
