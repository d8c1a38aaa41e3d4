"""Cheu et al.'s (2021) binomial vector summation P_vec with a real shuffler (dpfl.protocols.shuffler)."""

import math

import pytest
import torch

from dpfl.engine import randomness
from dpfl.errors import ConfigError
from dpfl.protocols.shuffler import BinomialVectorSum, shuffle

X = torch.tensor([[0.5, -0.25, 1.0], [-1.0, 0.1, 0.3], [0.0, 0.7, -0.6], [0.2, -0.9, 0.0], [0.45, 0.45, -0.45]],
                 dtype=torch.float64)
PROTOCOL = BinomialVectorSum(bound=1.0, grid=4, trials=6, probability=0.3)


def streams(seed):
    return (randomness.generator(seed, 0, 0, "rounding"), randomness.generator(seed, 0, 0, "noise"),
            randomness.generator(seed, 0, randomness.SERVER, "shuffle"))


def test_estimate_is_unbiased_with_the_stated_variance():
    """2,000 runs: every coordinate's error has mean 0 (z-test, |z| < 4) and the exact variance
    (2L/g)^2 (sum_users w(1 - w) + U b p (1 - p)), w the fractional part of g (x + L)/(2L) (chi-square, 4 sd)."""
    reps = 2000
    rounding, noise, _ = streams(1)
    counts = PROTOCOL.counts(X.repeat(reps, 1), rounding, noise).view(reps, *X.shape)
    estimates = PROTOCOL.estimate(counts.sum(1), X.shape[0])
    error = estimates - X.sum(0)
    scaled = (X + 1.0) / 2.0 * PROTOCOL.grid
    fraction = scaled - scaled.floor()
    variance = (2.0 / PROTOCOL.grid) ** 2 * ((fraction * (1 - fraction)).sum(0) + X.shape[0] * 6 * 0.3 * 0.7)
    z = error.mean(0) / (variance / reps).sqrt()
    assert z.abs().max() < 4
    relative = error.var(0) / variance - 1
    assert relative.abs().max() < 4 * math.sqrt(2 / (reps - 1))
    assert float(variance.max()) <= PROTOCOL.variance_bound(X.shape[0])


def test_message_path_and_count_path_give_the_same_estimate():
    rounding, noise, order = streams(7)
    counts = PROTOCOL.counts(X, rounding, noise)
    messages = PROTOCOL.messages(counts)
    assert messages.shape == (5 * 3 * (4 + 6), 2)
    assert torch.equal(messages[:, 1].view(5, 3, 10).sum(-1), counts)  # user i emits r_j + eta_j ones per j
    shuffled = shuffle(messages, order)
    assert not torch.equal(shuffled, messages)
    assert torch.equal(PROTOCOL.analyse_messages(shuffled, 3, 5), PROTOCOL.analyse_counts(counts))


def test_output_does_not_depend_on_the_order_of_the_messages():
    rounding, noise, _ = streams(3)
    messages = PROTOCOL.messages(PROTOCOL.counts(X, rounding, noise))
    outputs = [PROTOCOL.analyse_messages(shuffle(messages, torch.Generator().manual_seed(s)), 3, 5) for s in range(4)]
    outputs.append(PROTOCOL.analyse_messages(messages.flip(0), 3, 5))
    assert all(torch.equal(o, outputs[0]) for o in outputs)


def test_shuffle_is_a_uniform_permutation_of_all_messages():
    """Every row lands in every position equally often (chi-square over 3,000 shuffles of 6 rows)."""
    rows = torch.arange(6).unsqueeze(1).repeat(1, 2)
    generator = torch.Generator().manual_seed(0)
    first = torch.zeros(6)
    for _ in range(3000):
        out = shuffle(rows, generator)
        assert torch.equal(out[:, 0].sort().values, torch.arange(6))
        first[out[0, 0]] += 1
    chi2 = float(((first - 500) ** 2 / 500).sum())
    assert chi2 < 20.5  # 0.999 quantile of chi-square with 5 degrees of freedom


def test_draws_are_reproducible_from_the_streams():
    a = PROTOCOL.counts(X, *streams(5)[:2])
    b = PROTOCOL.counts(X, *streams(5)[:2])
    c = PROTOCOL.counts(X, *streams(6)[:2])
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("value", [1.5, -1.01, float("nan")])
def test_out_of_range_inputs_are_refused(value):
    x = X.clone()
    x[1, 2] = value
    with pytest.raises(ConfigError) as err:
        PROTOCOL.counts(x, *streams(0)[:2])
    assert err.value.field == "x" and "[-1.0, 1.0]" in str(err.value)


@pytest.mark.parametrize("field, kwargs", [("bound", {"bound": 0.0}), ("grid", {"grid": 0}),
                                           ("trials", {"trials": 0}), ("probability", {"probability": 1.0})])
def test_bad_parameters_are_refused(field, kwargs):
    with pytest.raises(ConfigError) as err:
        BinomialVectorSum(**({"bound": 1.0, "grid": 4, "trials": 6} | kwargs))
    assert err.value.field == field


def test_message_count_mismatch_is_refused():
    with pytest.raises(ConfigError) as err:
        PROTOCOL.analyse_messages(torch.zeros(7, 2, dtype=torch.int64), 3, 5)
    assert err.value.field == "messages"
