"""The papers' closed forms, checked against hand computations and the notes' reference numbers."""

import math
import warnings

import numpy as np
import pytest
from scipy import special

from dpfl.accounting import theory
from dpfl.errors import ConfigError


def test_basic_composition():
    assert theory.basic_composition(0.5, 1e-6, 10) == pytest.approx((5.0, 1e-5))


def test_advanced_composition_by_hand():
    # sqrt(2 * 100 * ln(1e5)) * 0.1 = 4.7985259..., 100 * 0.1 * (e^0.1 - 1) = 1.0517092...
    epsilon, delta = theory.advanced_composition(0.1, 1e-7, 100, 1e-5)
    assert epsilon == pytest.approx(4.7985259 + 1.0517092, abs=1e-6)
    assert delta == pytest.approx(100 * 1e-7 + 1e-5)


def _randomized_response_delta(epsilon, k, total_epsilon):
    """Exact delta of k-fold eps-randomized response at total_epsilon (m = number of agreeing answers)."""
    m = np.arange(k + 1)
    log_norm = k * np.logaddexp(0.0, epsilon)
    log_binom = special.gammaln(k + 1) - special.gammaln(m + 1) - special.gammaln(k - m + 1)
    p = np.exp(log_binom + m * epsilon - log_norm)
    q = np.exp(log_binom + (k - m) * epsilon - log_norm)
    return np.maximum(p - math.exp(total_epsilon) * q, 0.0).sum()


@pytest.mark.parametrize("epsilon, k", [(0.5, 10), (0.1, 101), (1.0, 7)])
def test_kairouz_composition_is_attained_by_randomized_response(epsilon, k):
    for i in range(k // 2 + 1):
        exact = _randomized_response_delta(epsilon, k, (k - 2 * i) * epsilon)
        assert theory.kairouz_composition_delta(epsilon, 0.0, k, i) == pytest.approx(exact, rel=1e-9, abs=1e-15)


def test_kairouz_composition_is_tighter_than_advanced_and_basic():
    optimal = theory.kairouz_composition_epsilon(0.1, 0.0, 100, 1e-5)
    assert optimal == pytest.approx(4.4)  # (100 - 2 * 28) * 0.1
    assert optimal < theory.advanced_composition(0.1, 0.0, 100, 1e-5)[0] < 100 * 0.1
    assert theory.kairouz_composition_delta(0.1, 1e-6, 100, 0) == pytest.approx(1 - (1 - 1e-6) ** 100)


def test_zcdp_conversion_and_gaussian_sigma():
    # 0.5 + 2 sqrt(0.5 ln(1e5)) = 0.5 + 2 * 2.3992630...
    assert theory.zcdp_to_dp_epsilon(0.5, 1e-5) == pytest.approx(5.298526, abs=1e-6)
    rho = theory.dp_to_zcdp_rho(3.0, 1e-6)
    assert theory.zcdp_to_dp_epsilon(rho, 1e-6) == pytest.approx(3.0)
    assert theory.gaussian_sigma_for_zcdp(2.0, 0.5) == pytest.approx(2.0)  # Delta / sqrt(2 rho)


def test_classical_gaussian_sigma_anchor_with_validity_warning():
    with pytest.warns(theory.ValidityWarning):
        assert theory.classical_gaussian_sigma(1.0, 1e-5) == pytest.approx(4.8448, abs=1e-4)  # anchors.md
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert theory.classical_gaussian_sigma(0.5, 1e-5, sensitivity=2.0) == pytest.approx(4 * 4.844805, rel=1e-6)


def test_dp_scaffold_theorem_4_1_is_asymptotic_order():
    # notes 000: the Thm 4.1 expression gives ~1.52 for the synthetic setting where the experiments use 60
    sigma = theory.dp_scaffold_sigma_order(13.0, 1 / (100 * 4000), rounds=400, local_steps=50, user_rate=0.2,
                                           data_rate=0.2, users=100)
    assert sigma == pytest.approx(1.52, abs=0.01)
    eps_s, delta_s = theory.dp_scaffold_server_guarantee(1.0, 1e-5, 0.2, 100)
    assert (eps_s, delta_s) == pytest.approx((math.sqrt(500), 0.5e-5 * 6))


def test_wang_lemma_b7_at_order_two_by_hand():
    # 1/(2-1) log(1 + 2 q^2 C(2,2) min{2(e - 1), e}) with q = 0.2, sigma = 1
    expected = math.log(1 + 2 * 0.04 * min(2 * (math.e - 1), math.e))
    assert theory.wang_subsampled_gaussian_rdp(2, 0.2, 1.0) == pytest.approx(expected)


def test_dp_scaffold_strong_composition_route():
    setting = dict(rounds=100, local_steps=10, user_rate=0.2, data_rate=0.2, users=100, delta=1e-5)
    values = [theory.dp_scaffold_strong_composition_epsilon(sigma, **setting) for sigma in (5.0, 10.0, 20.0)]
    assert values[0] > values[1] > values[2] > 0
    # the minimum is at most the paper's choice x = 1/2 at any single order, e.g. a = 8
    a, sigma_a = 8, 10.0 * math.sqrt(0.2 * 100)
    eps_a = 10 * theory.wang_subsampled_gaussian_rdp(a, 0.2, sigma_a) + math.log(2 * 100 * 0.2 / 1e-5) / (a - 1)
    eps_star = math.log1p(0.2 * math.expm1(eps_a))
    by_hand = eps_star * math.sqrt(2 * 100 * math.log(2 / 1e-5)) + 100 * eps_star * math.expm1(eps_star)
    assert values[1] <= by_hand


def test_zhou_formulas():
    # s_i = 2 b T xi_1 / (N d_i eps_i) = 2 * 5 * 10 * 300 / (10 * 6000 * 1)
    assert theory.zhou_laplace_scale(1.0, 5, 10, 10, 300.0, 6000) == pytest.approx(0.5)
    assert theory.zhou_replies_per_client(3, 10, 7) == 5  # ceil(30 / 7)
    assert theory.zhou_gaussian_sigma(1.1, 10.0, 0.01, 6000) == pytest.approx(1.1 * 10 / 60)


def test_isrl_prox_sgd_sigma():
    sigma = theory.isrl_prox_sgd_sigma(1.0, 1e-5, lipschitz=1.0, batch=10)
    assert sigma**2 == pytest.approx(16 * math.log(1e5) / 100)  # 16 L^2 ln(1/delta) / (eps^2 K^2)


def test_isrl_spider_sigmas():
    sigma_1, sigma_2hat = theory.isrl_spider_sigmas(1.0, 1e-5, lipschitz=1.0, smoothness=2.0, rounds=10, period=3,
                                                   checkpoint_batch=100, difference_batch=100)
    assert sigma_1**2 == pytest.approx(32 * 1 * 4 * math.log(1e5) / 100**2)  # ceil(10/3) = 4 checkpoints
    assert sigma_2hat**2 == pytest.approx(32 * 4 * 10 * math.log(1e5) / 100**2)


def test_isrl_zcdp_budget_implies_the_target():
    rho = theory.isrl_zcdp_budget(2.0, 1e-6)
    assert theory.zcdp_to_dp_epsilon(rho, 1e-6) <= 2.0
    with pytest.raises(ConfigError) as err:
        theory.isrl_zcdp_budget(30.0, 1e-6)  # eps > 2 ln(1/delta) = 27.6
    assert err.value.field == "epsilon"


def test_isrl_code_constants():
    base = theory.isrl_mbsgd_code_sigma(1.0, 1e-5, clip=1.0, rounds=25, n=1238)
    assert base**2 == pytest.approx(8 * 25 * math.log(2e5) / 1238**2)
    assert theory.isrl_local_sgd_code_sigma(1.0, 1e-5, 1.0, 25, 1238, local_steps=4) == pytest.approx(2 * base)
    assert theory.isrl_alternate_spider_code_sigmas(1.0, 1e-5, 1.0, 25, 1238) == pytest.approx((2 * base, base))


@pytest.mark.parametrize("call, field", [
    (lambda: theory.advanced_composition(0.1, 0.0, 0, 1e-5), "k"),
    (lambda: theory.advanced_composition(0.1, 0.0, 10, 0.0), "delta_prime"),
    (lambda: theory.classical_gaussian_sigma(0.5, 1.5), "delta"),
    (lambda: theory.zcdp_to_dp_epsilon(-1.0, 1e-5), "rho"),
    (lambda: theory.isrl_prox_sgd_sigma(1.0, 1e-5, 1.0, 0), "batch"),
    (lambda: theory.zhou_laplace_scale(1.0, 5, 10, 3, 1.0, 10), "clients"),
    (lambda: theory.kairouz_composition_delta(0.1, 0.0, 10, 6), "i"),
])
def test_bad_input_names_the_parameter(call, field):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field
