"""The exact samplers (dpfl.exact_noise, Canonne, Kamath, Steinke 2020) driven by ChaCha20 streams: the uniform draw
and Bernoulli(exp(-gamma)) are exact (their laws computed by enumerating every coin, with fractions), and the
discrete Laplace and discrete Gaussian draws match their pmfs computed from the definition (chi-square at a fixed
stream; the same test rejects a pmf 10% off in variance)."""

from collections import Counter
from fractions import Fraction

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpfl import exact_noise
from dpfl.engine.secure_streams import SecureStream
from dpfl.exact_noise import bernoulli_exp, discrete_gaussian, discrete_laplace, gaussian_scale, uniform_below


class ScriptedWords:
    """A source that yields the given words, in order."""

    def __init__(self, words):
        self.left = list(words)

    def words(self, count):
        taken, self.left = self.left[:count], self.left[count:]
        assert len(taken) == count, "the scripted words ran out"
        return np.array(taken, dtype=np.uint64)


def test_uniform_below_reads_the_masked_low_bits_and_redraws_above_the_bound():
    """Bound 5 (mask 7): the words carry values 0..7 in bits 1-3 (bit 0 and bits past the mask set at random, which
    must be ignored); 0..4 are taken as they are, 5..7 are redrawn from the next words, in order."""
    rng = np.random.default_rng(0)
    noise = [int(x) for x in rng.integers(0, 2**60, 11)]
    value = [0, 1, 2, 3, 4, 5, 6, 7, 3, 6, 0]  # the last three: the redraws of rows 5, 6, 7 (6 is rejected again)
    words = [(noise[i] << 4) | (v << 1) | (noise[i] & 1) for i, v in enumerate(value)]
    source = ScriptedWords(words + [2 << 1])
    assert uniform_below(source, np.full(8, 5, np.int64)).tolist() == [0, 1, 2, 3, 4, 3, 2, 0]
    assert source.left == []


def test_uniform_below_is_uniform_for_every_bound():
    source = SecureStream(3, 0, 0, "noise")
    for bound in (1, 2, 3, 7, 8, 9, 1000, 2**62):
        draws = uniform_below(source, np.full(40_000, bound, np.int64))
        assert draws.min() >= 0 and draws.max() < bound
        if bound <= 9:
            counts = np.bincount(draws, minlength=bound)
            assert bound == 1 or stats.chisquare(counts).pvalue > 1e-3
    with pytest.raises(ValueError, match=r"\[1, 2\^62\]"):
        uniform_below(source, np.array([0]))


class Branch(Exception):
    pass


def exact_law(monkeypatch, run, cutoff=Fraction(1, 10**8)):
    """{outcome: probability} of ``run()`` with ``uniform_below`` replaced by an enumeration of all its values
    (each of a call's rows uniform on its bound): paths of weight below ``cutoff`` are left unfinished, and their
    total weight is returned too."""
    law, unfinished, stack = Counter(), Fraction(0), [((), Fraction(1))]
    while stack:
        script, weight = stack.pop()
        calls = iter(script)

        def scripted(source, bound):
            values = next(calls, None)
            if values is None:
                raise Branch([int(b) for b in bound])
            assert len(values) == len(bound)
            return np.array(values, dtype=np.int64)

        monkeypatch.setattr(exact_noise, "uniform_below", scripted)
        try:
            outcome = run()
        except Branch as branch:
            bounds = branch.args[0]
            child = weight / math.prod(bounds)
            if child < cutoff:
                unfinished += weight
                continue
            for values in np.ndindex(*bounds):
                stack.append(((*script, values), child))
            continue
        law[outcome] += weight
    return law, unfinished


@pytest.mark.parametrize("numerator, denominator", [(0, 1), (1, 4), (1, 2), (1, 1), (5, 4), (4, 3), (2, 1)])
def test_bernoulli_exp_accepts_with_probability_exp_minus_gamma(monkeypatch, numerator, denominator):
    """Every coin of Algorithm 1 enumerated: the exact probability of 1 over the finished paths is within the
    unfinished weight of exp(-gamma) (mpmath, 40 digits), and that weight is below 10^-5."""
    law, unfinished = exact_law(
        monkeypatch, lambda: bool(bernoulli_exp(None, np.array([numerator]), np.array([denominator]))[0]))
    assert unfinished < Fraction(1, 10**5)
    assert law[True] + law[False] + unfinished == 1
    with mpmath.workdps(40):
        target = mpmath.exp(-mpmath.mpf(numerator) / denominator)
        assert mpmath.mpf(law[True].numerator) / law[True].denominator <= target
        assert target <= mpmath.mpf((law[True] + unfinished).numerator) / (law[True] + unfinished).denominator


def pmf_test(draws: np.ndarray, pmf, low: int, high: int) -> float:
    """The chi-square p-value of ``draws`` against ``pmf(y)`` (the probabilities of low..high, the tails beyond them
    lumped into the end bins), merging neighbouring values until each bin expects at least 20 draws."""
    probabilities = np.array([pmf(y) for y in range(low, high + 1)], dtype=float)
    probabilities[0] += max(0.0, 1 - probabilities.sum()) / 2
    probabilities[-1] = 1 - probabilities[:-1].sum()
    counts = np.bincount(np.clip(draws, low, high) - low, minlength=high - low + 1).astype(float)
    expected = probabilities * draws.size
    merged_expected, merged_counts, e, c = [], [], 0.0, 0.0
    for ex, co in zip(expected, counts):
        e, c = e + ex, c + co
        if e >= 20:
            merged_expected.append(e)
            merged_counts.append(c)
            e, c = 0.0, 0.0
    merged_expected[-1] += e
    merged_counts[-1] += c
    return stats.chisquare(merged_counts, merged_expected).pvalue


def discrete_gaussian_pmf(sigma2: Fraction):
    """P(y) = exp(-y^2 / (2 sigma^2)) / sum over all integers z of exp(-z^2 / (2 sigma^2)) (mpmath, 30 digits;
    terms past 40 sigma are below 10^-340 and left out)."""
    with mpmath.workdps(30):
        s2 = mpmath.mpf(sigma2.numerator) / sigma2.denominator
        reach = 40 * (int(mpmath.sqrt(s2)) + 1)
        normaliser = mpmath.fsum(mpmath.exp(-mpmath.mpf(z * z) / (2 * s2)) for z in range(-reach, reach + 1))
    return lambda y: float(mpmath.exp(-mpmath.mpf(y * y) / (2 * s2)) / normaliser)


@pytest.mark.parametrize("sigma2, draws", [(Fraction(1, 4), 200_000), (Fraction(9), 200_000),
                                           (Fraction(2500), 200_000), (Fraction(10**4 + 1, 3), 200_000)])
def test_discrete_gaussian_has_the_exact_pmf(sigma2, draws):
    sample = discrete_gaussian(SecureStream(11, 0, 0, "noise"), sigma2, draws)
    sigma = math.sqrt(sigma2)
    low, high = -math.ceil(6 * sigma) - 1, math.ceil(6 * sigma) + 1
    assert pmf_test(sample, discrete_gaussian_pmf(sigma2), low, high) > 1e-3
    # the same test rejects the law of a variance 10% larger (its power at this many draws)
    assert pmf_test(sample, discrete_gaussian_pmf(sigma2 * Fraction(11, 10)), low, high) < 1e-6


def binned_p_value(sample: np.ndarray, sigma2: int, width: int, reach: int) -> float:
    """The chi-square p-value of ``sample`` in bins of ``width`` values on [-reach, reach) (the rest one bin) against
    the discrete Gaussian's pmf summed from its definition in float64 over |y| <= 12 sigma (the mass left out, below
    e^-72, and the sums' relative error, about 10^-13, are far below the test's resolution)."""
    inside = (sample >= -reach) & (sample < reach)
    counts = np.bincount((sample[inside] + reach) // width, minlength=2 * reach // width)
    observed = np.append(counts, (~inside).sum())
    limit = 12 * math.isqrt(sigma2)
    support = np.arange(-limit, limit + 1)
    weights = np.exp(-(support.astype(np.float64) ** 2) / (2 * sigma2))
    bins = weights[(support >= -reach) & (support < reach)].reshape(-1, width).sum(axis=1) / math.fsum(weights)
    return stats.chisquare(observed, np.append(bins, 1 - bins.sum()) * sample.size).pvalue


def test_discrete_gaussian_has_the_exact_pmf_near_its_int64_reach():
    """sigma^2 = 10^9 (sigma = 31623, near the 2^62 bound): candidates past about 3.15 sigma (about 4% of them) have
    their acceptance exponent reduced with Python integers. 2 * 10^5 draws in bins of 2000 on +-3 sigma (each bin
    expects at least 50); a variance 5% larger is rejected."""
    sample = discrete_gaussian(SecureStream(14, 0, 0, "noise"), 10**9, 200_000)
    assert binned_p_value(sample, 10**9, 2000, 94_000) > 1e-3
    assert binned_p_value(sample, 105 * 10**7, 2000, 94_000) < 1e-6


def test_discrete_gaussian_has_the_exact_pmf_at_sigma_10_4():
    """sigma = 10^4: 10^6 draws in bins of 200 on +-3 sigma (each bin expects at least 80); a variance 5% larger is
    rejected."""
    sample = discrete_gaussian(SecureStream(12, 0, 0, "noise"), 10**8, 10**6)
    assert binned_p_value(sample, 10**8, 200, 30_000) > 1e-3
    assert binned_p_value(sample, 105 * 10**6, 200, 30_000) < 1e-6


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(3), Fraction(5, 2), Fraction(40)])
def test_discrete_laplace_has_the_exact_pmf(scale):
    """P(y) = (1 - e^(-1/b)) / (1 + e^(-1/b)) e^(-|y| / b), b = scale (Canonne et al. 2020, Def. 28)."""
    sample = discrete_laplace(SecureStream(13, 0, 0, "noise"), scale, 200_000)

    def pmf(b):
        with mpmath.workdps(30):
            r = mpmath.exp(-1 / (mpmath.mpf(b.numerator) / b.denominator))
            return lambda y: float((1 - r) / (1 + r) * r ** abs(y))

    reach = math.ceil(12 * scale) + 1
    assert pmf_test(sample, pmf(scale), -reach, reach) > 1e-3
    assert pmf_test(sample, pmf(scale * Fraction(11, 10)), -reach, reach) < 1e-6


def test_the_gaussian_scale_is_floor_sigma_plus_one_exactly():
    variances = (Fraction(1, 4), 1, Fraction(99, 100), 9, Fraction(10**8 - 1), 10**8)
    assert [gaussian_scale(Fraction(s)) for s in variances] == [1, 2, 1, 4, 10**4, 10**4 + 1]


def test_draws_are_reproducible_from_the_stream_and_differ_between_streams():
    first = discrete_gaussian(SecureStream(5, 1, 2, "noise"), 9, 1000)
    assert np.array_equal(first, discrete_gaussian(SecureStream(5, 1, 2, "noise"), 9, 1000))
    assert not np.array_equal(first, discrete_gaussian(SecureStream(5, 1, 3, "noise"), 9, 1000))
    assert first.dtype == np.int64


@pytest.mark.parametrize("sigma2, match", [(0, "sigma2 = 0"), (Fraction(-1, 2), "sigma2 = -1/2"),
                                           (Fraction(0.3), "2 p q"), (10**10, "2 p q")])
def test_parameters_out_of_reach_are_refused(sigma2, match):
    with pytest.raises(ValueError, match=match):
        discrete_gaussian(SecureStream(5, 1, 2, "noise"), sigma2, 10)


def test_the_samplers_use_no_floating_point():
    """The module's source has no float literal, no float() and no float dtype: it computes with integers only."""
    import inspect
    import re

    source = inspect.getsource(exact_noise)
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("#",)))
    code = re.sub(r'""".*?"""', "", code, flags=re.S)
    assert not re.search(r"\bfloat|\d\.\d|\bmath\.(exp|log|sqrt)|np\.(exp|log|sqrt)|\d+e-?\d", code)
