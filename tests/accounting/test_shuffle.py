"""Amplification by shuffling (FMT21) and the binomial vector-summation parameters (Cheu et al. 2021)."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from dpfl.accounting.shuffle import binomial_summation_parameters, shuffle_delta, shuffle_epsilon
from dpfl.cli import main
from dpfl.errors import ConfigError

# github.com/apple/ml-shuffling-amplification README.md (example.py defaults: n = 1e5, eps0 = 4, delta = 1e-6,
# 10 bisection steps started at the closed form, step = 100): "eps between 0.1675385583317841 and
# 0.172790550755978"; "According to our closed form analysis ... eps is at most 0.5378040242374512".
README_N, README_EPS0, README_DELTA = 10**5, 4.0, 1e-6
README_NUMERICAL_LOWER, README_NUMERICAL_UPPER = 0.1675385583317841, 0.172790550755978
README_CLOSED_FORM = 0.5378040242374512


def test_numerical_epsilon_reproduces_the_authors_readme_interval():
    epsilon = shuffle_epsilon(README_EPS0, README_N, README_DELTA)
    bisection_resolution = README_CLOSED_FORM / 2**10  # their bisection stops at this resolution
    assert README_NUMERICAL_LOWER - bisection_resolution <= epsilon <= README_NUMERICAL_UPPER
    assert epsilon == pytest.approx(0.16977, abs=1e-5)  # dpfl's exact value of the same divergence


def test_closed_form_is_the_theorem_and_at_most_the_readme_code_variant():
    e0 = math.exp(README_EPS0)
    spread = 8 * math.sqrt(e0 * math.log(4 / README_DELTA) / README_N) + 8 * e0 / README_N
    theorem = math.log1p((e0 - 1) / (e0 + 1) * spread)  # FMT21 main theorem, by hand
    closed_form = shuffle_epsilon(README_EPS0, README_N, README_DELTA, method="closed_form")
    assert closed_form == pytest.approx(theorem, rel=1e-12)
    assert closed_form == pytest.approx(0.534634, abs=1e-6)
    # the public code's closedformanalysis uses denominator 1 + e^{-eps0}/(1 + spread) instead of 1 + e^{-eps0};
    # that looser variant is what the README prints
    code_variant = math.log1p((1 - 1 / e0) / (1 + 1 / (e0 * (1 + spread))) * spread)
    assert code_variant == pytest.approx(README_CLOSED_FORM, rel=1e-12)
    assert closed_form <= code_variant


def _brute_force_delta(epsilon, epsilon0, n):
    """Hockey-stick divergence of FMT21's (A + Delta, C) vs (A + 1 - Delta, C), summed over every outcome."""
    alpha = math.exp(epsilon0) / (math.exp(epsilon0) + 1)
    total = 0.0
    for c in range(n):
        b = stats.binom.pmf(np.arange(c + 2), c, 0.5)
        b_shift = np.concatenate(([0.0], b[:-1]))
        p = alpha * b_shift + (1 - alpha) * b
        q = (1 - alpha) * b_shift + alpha * b
        total += stats.binom.pmf(c, n - 1, math.exp(-epsilon0)) * np.maximum(p - math.exp(epsilon) * q, 0).sum()
    return total


@pytest.mark.parametrize("epsilon, epsilon0, n", [(0.3, 1.0, 30), (0.05, 2.0, 50), (1.0, 3.0, 40), (0.7, 0.8, 25)])
def test_numerical_delta_is_the_exact_divergence(epsilon, epsilon0, n):
    assert shuffle_delta(epsilon, epsilon0, n) == pytest.approx(_brute_force_delta(epsilon, epsilon0, n), rel=1e-10)


@pytest.mark.parametrize("epsilon0", [0.1, 0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize("n, delta", [(10**3, 1e-4), (10**4, 1e-6), (10**5, 1e-8)])
def test_numerical_is_between_zero_and_closed_form_and_eps0(epsilon0, n, delta):
    numerical = shuffle_epsilon(epsilon0, n, delta)
    assert 0.0 <= numerical <= epsilon0
    try:
        closed_form = shuffle_epsilon(epsilon0, n, delta, method="closed_form")
    except ConfigError:
        return  # outside the closed form's validity range
    assert numerical <= closed_form


def test_epsilon_decreases_with_n_and_increases_with_eps0():
    by_n = [shuffle_epsilon(2.0, n, 1e-6) for n in (10**3, 10**4, 10**5, 10**6)]
    by_eps0 = [shuffle_epsilon(eps0, 10**4, 1e-6) for eps0 in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(by_n, by_n[1:]))
    assert all(a < b for a, b in zip(by_eps0, by_eps0[1:]))


def test_epsilon_and_delta_are_inverse():
    epsilon = shuffle_epsilon(1.0, 5000, 1e-6)
    assert shuffle_delta(epsilon, 1.0, 5000) <= 1e-6
    assert shuffle_delta(epsilon * (1 - 1e-6), 1.0, 5000) > 1e-6


def test_approximate_ldp_adds_theorem_3_8_term():
    epsilon, epsilon0, n, delta0 = 0.2, 2.0, 10**4, 1e-12
    extra = (math.exp(epsilon) + 1) * (1 + math.exp(-epsilon0) / 2) * n * delta0
    assert shuffle_delta(epsilon, epsilon0, n, delta0) == pytest.approx(shuffle_delta(epsilon, epsilon0, n) + extra)
    for method in ("numerical", "closed_form"):
        approximate = shuffle_epsilon(epsilon0, n, 1e-6, delta0, method)
        assert approximate >= shuffle_epsilon(epsilon0, n, 1e-6, method=method)
        assert shuffle_delta(approximate, epsilon0, n, delta0, method) <= 1e-6


def test_large_delta0_falls_back_to_the_trivial_guarantee_or_fails():
    # n delta0 = 1e-4 > delta: no amplified guarantee, but the shuffled reports are still (eps0, delta0)-DP
    assert shuffle_epsilon(4.0, 10**5, 1e-6, delta0=1e-9) == 4.0
    with pytest.raises(ConfigError) as err:
        shuffle_epsilon(4.0, 10**5, 1e-6, delta0=1e-5)
    assert err.value.field == "delta0"


def test_closed_form_outside_validity_names_epsilon0():
    with pytest.raises(ConfigError) as err:
        shuffle_epsilon(8.0, 1000, 1e-6, method="closed_form")
    assert err.value.field == "epsilon0"


@pytest.mark.parametrize("kwargs, field", [
    ({"n": 0}, "n"), ({"n": 10.5}, "n"), ({"epsilon0": 0.0}, "epsilon0"), ({"delta": 0.0}, "delta"),
    ({"delta": 1.0}, "delta"), ({"delta0": -1e-9}, "delta0"), ({"method": "exact"}, "method"),
])
def test_bad_input_names_the_parameter(kwargs, field):
    arguments = {"epsilon0": 1.0, "n": 100, "delta": 1e-6} | kwargs
    with pytest.raises(ConfigError) as err:
        shuffle_epsilon(**arguments)
    assert err.value.field == field


def test_binomial_summation_parameters_meet_the_target_with_few_trials_to_spare():
    """b is the smallest (within 5%) for which the accountant gives epsilon <= target; the error formula follows."""
    from dpfl.accounting import accountants
    from dpfl.accounting.accountant import NEIGHBORING
    from dpfl.accounting.shuffle import binomial_event

    params = binomial_summation_parameters(2.0, 1e-5, 20, 9, 1.0)
    assert (params.grid, params.probability) == (3, 0.5)  # ceil(sqrt(9))

    def epsilon(trials):
        accountant = accountants.make("tightest", NEIGHBORING["replace_one"])
        accountant.compose(binomial_event(20, trials, 0.5, 9, 3))
        return accountant.get_epsilon(1e-5)

    assert epsilon(params.trials) <= 2.0 < epsilon(math.floor(params.trials / 1.06))
    variance = (2.0 / 3) ** 2 * 20 * params.trials / 4
    assert params.noise_variance_per_coordinate == pytest.approx(variance)
    assert params.mean_squared_error == pytest.approx(9 * ((2.0 / 3) ** 2 * 20 / 4 + variance))
    assert params.messages_per_user == 9 * (3 + params.trials)


def test_binomial_summation_epsilon_decreases_in_the_trials():
    from dpfl.accounting import accountants
    from dpfl.accounting.accountant import NEIGHBORING
    from dpfl.accounting.shuffle import binomial_event

    epsilons = []
    for trials in (20, 40, 80, 160):
        accountant = accountants.make("rdp", NEIGHBORING["replace_one"])
        accountant.compose(binomial_event(10, trials, 0.5, 4, 2))
        epsilons.append(accountant.get_epsilon(1e-6))
    assert all(a > b for a, b in zip(epsilons, epsilons[1:]))


def test_cli_prints_json(capsys):
    assert main(["account", "shuffle", "--epsilon0", "4", "--n", "100000", "--delta", "1e-6", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"epsilon", "delta", "epsilon0", "delta0", "n", "method", "epsilon_closed_form"}
    assert result["epsilon"] == pytest.approx(0.16977, abs=1e-5)
    assert result["epsilon_closed_form"] == pytest.approx(0.534634, abs=1e-6)
    assert (result["method"], result["n"], result["delta0"]) == ("numerical", 100000, 0.0)


def test_cli_reports_null_closed_form_outside_its_validity(capsys):
    assert main(["account", "shuffle", "--epsilon0", "8", "--n", "1000", "--delta", "1e-6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon_closed_form"] is None
    assert main(["account", "shuffle", "--epsilon0", "8", "--n", "1000", "--delta", "1e-6",
                 "--method", "closed_form"]) == 2
    assert "epsilon0" in capsys.readouterr().err
