"""The accounting test vectors of the shared notes (anchors.md), computed with dp_accounting 0.6.0 / prv_accountant.

Steps are ceil(epochs x N / B) as in TF-Privacy's compute_dp_sgd_privacy. The table's RDP column is dp_accounting's
(the modern conversion); the published TF-Privacy numbers 3.01 / 1.19 / 7.10 use the classic one.
"""

import math

import pytest
from dp_accounting import dp_event

from dpfl.accounting.accountant import account, gaussian_event, laplace_event
from dpfl.accounting.calibrate import calibrate_noise


def poisson(n, batch, sigma, steps):
    return gaussian_event(sigma, steps, "poisson", batch / n)


def epochs(n, batch, count):
    return math.ceil(count * n / batch)


# (setting, delta, RDP (modern conversion), PLD)
TABLE = [
    (poisson(60000, 256, 1.1, 14063), 1e-5, 2.597, 2.382),
    (poisson(60000, 256, 1.3, epochs(60000, 256, 15)), 1e-5, 0.955, 0.865),
    (poisson(60000, 256, 0.7, epochs(60000, 256, 45)), 1e-5, 6.320, 5.640),
    (poisson(60000, 150, 1.3, 6000), 1e-5, 0.72422, 0.6401),
    (poisson(10000, 64, 1.0, 782), 1e-6, 1.6164, 1.1987),
    (poisson(50000, 4096, 10.0, 875), 1e-5, 0.988, 0.903),
    (poisson(60000, 240, 1.3, epochs(60000, 240, 15)), 1e-5, 0.922, 0.834),
]


@pytest.mark.parametrize("event, delta, rdp, pld", TABLE)
def test_table_rdp(event, delta, rdp, pld):
    assert account(event, delta, "rdp", "modern").epsilon == pytest.approx(rdp, rel=1e-3)


@pytest.mark.parametrize("event, delta, rdp, pld", TABLE)
def test_table_pld(event, delta, rdp, pld):
    assert account(event, delta, "pld").epsilon == pytest.approx(pld, rel=1e-3)


@pytest.mark.parametrize("row, published", [(0, 3.01), (1, 1.19), (2, 7.10)])
def test_classic_conversion_reproduces_tf_privacy(row, published):
    event, delta, _, _ = TABLE[row]
    assert round(account(event, delta, "rdp", "classic").epsilon, 2) == published


def test_tf_privacy_order_19_vector():
    # TF-Privacy's test value; dp_accounting's (modern) conversion, optimal order 19.
    result = account(TABLE[3][0], 1e-5, "rdp", "modern")
    assert result.epsilon == pytest.approx(0.7242234026, rel=1e-9)
    assert result.order == 19


def test_single_gaussian():
    event = dp_event.GaussianDpEvent(1.0)
    assert account(event, 1e-5, "pld").epsilon == pytest.approx(4.3772, rel=1e-3)
    assert account(event, 1e-5, "rdp", "modern").epsilon == pytest.approx(4.7285, rel=1e-3)


def test_single_gaussian_calibration_is_the_analytic_sigma():
    sigma = calibrate_noise(dp_event.GaussianDpEvent, 1.0, 1e-5, "pld")
    assert sigma == pytest.approx(3.7306, rel=1e-3)  # the classical formula's 4.8448 is 30% loose


def test_laplace_ten_compositions():
    event = laplace_event(1.0, 1.0, 10)
    assert account(event, 1e-5, "pld").epsilon == pytest.approx(9.990, rel=1e-3)
    assert account(event, 1e-5, "rdp", "modern").epsilon == pytest.approx(9.990, rel=1e-3)


@pytest.mark.parametrize(
    "batch, steps, accountant, sigma",
    [
        (4096, 2500, "rdp", 2.730),
        (4096, 2500, "pld", 2.576),
        (256, 5859, "rdp", 0.634),
        (256, 5859, "pld", 0.610),
    ],
)
def test_calibration_vectors(batch, steps, accountant, sigma):
    make_event = lambda z: poisson(50000, batch, z, steps)  # noqa: E731
    assert calibrate_noise(make_event, 8.0, 1e-5, accountant, "modern") == pytest.approx(sigma, rel=1e-3)
