"""Our PLD epsilon lies inside prv_accountant's [lower, upper] bounds (Gopi, Lee, Wutschitz 2021) for Poisson
Gaussian settings: an independent numerical method as oracle."""

import pytest

from dpfl.accounting.accountant import account, gaussian_event

prv = pytest.importorskip("prv_accountant")


@pytest.mark.parametrize(
    "q, sigma, steps, delta",
    [(0.01, 1.0, 1000, 1e-5), (0.05, 2.0, 500, 1e-6), (256 / 60000, 1.3, 3516, 1e-5), (0.1, 5.0, 200, 1e-5)],
)
def test_pld_inside_prv_bounds(q, sigma, steps, delta):
    mechanism = prv.PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)
    oracle = prv.PRVAccountant(prvs=mechanism, max_self_compositions=steps, eps_error=0.01, delta_error=delta / 1000)
    lower, _, upper = oracle.compute_epsilon(delta=delta, num_self_compositions=[steps])
    assert lower <= account(gaussian_event(sigma, steps, "poisson", q), delta, "pld").epsilon <= upper
