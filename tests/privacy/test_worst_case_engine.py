"""The review's worst-case instance, run through the real LocalSGD.client_round (tests/helpers/worst_case.py).

n = M = 20 clients, all in the cohort, s = 1, K = 50, sigma_g = 10, C = 1, eta_l = 0.01, one parameter. The owner
has linear losses; every other client a quadratic loss that jumps its iterate back to the start point after each
step, erasing all but its last noise draw (FedAvg). The measured Gaussian mechanisms must match the derivation:
third party (sum) mu = K / (sigma_g sqrt(K + n - 1)) = 0.602, another silo 0.606, the plain server sqrt(K)/sigma_g.
"""

import math

import pytest
import torch

import worst_case as ei

ANALYTIC = {
    "fedavg": {"sum": 0.60193, "sum_minus_other": 0.60634, "owner": 0.70711},
    "fedsgd": {"sum": 0.15811, "sum_minus_other": 0.16222, "owner": 0.70711},
}


@pytest.mark.parametrize("instance", [ei.FEDAVG, ei.FEDSGD], ids=lambda i: i.name)
def test_analytic_mu(instance):
    for view, value in ANALYTIC[instance.name].items():
        assert ei.analytic_mu(instance, view) == pytest.approx(value, abs=1e-5)
    assert ei.analytic_mu(instance, "owner") == pytest.approx(math.sqrt(50) / 10)


@pytest.mark.parametrize("instance", [ei.FEDAVG, ei.FEDSGD], ids=lambda i: i.name)
def test_measured_mu_matches_the_derivation(instance):
    measured = ei.measure(instance)
    for view in ei.VIEWS:
        m = measured[view]
        assert m.clipped == 0  # the quadratic clients' clipping never binds: their updates are Gaussian
        assert m.shift_spread <= 1e-5 * m.shift  # coupled runs differ by a constant: a pure translate
        assert m.shift == pytest.approx(instance.local_lr * instance.local_steps * 2 * instance.clip / instance.records,
                                        rel=1e-5)
        # (1 - 1e-4) chi-square interval of the std with 1200 trials: about +-8% on mu
        assert m.low <= ei.analytic_mu(instance, view) <= m.high, m
        assert m.high / m.low < 1.25


def test_fedavg_erases_the_other_clients_noise():
    """Crediting every step with the cohort's noise (the paper) claims mu = 0.158: far below what is measured."""
    measured = ei.measure(ei.FEDAVG)
    for view in ("sum", "sum_minus_other"):
        assert ei.paper_mu(ei.FEDAVG, view) < measured[view].low / 3
    assert ei.paper_mu(ei.FEDSGD, "sum") == pytest.approx(ei.analytic_mu(ei.FEDSGD, "sum"))


def test_twenty_records_would_bind_the_clipping():
    """Why FedAvg uses b = 120 records: at b = 20 the quadratic clients' gradient (std sigma_g 2C/b = 1 = C) is clipped
    on about a third of the steps, so their erasure is partial and the sum is not Gaussian."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, oracle = ei.run_round(ei.EngineInstance(records=20), trials=10, sign=1.0, seed=0)
    finally:
        torch.set_num_threads(threads)
    per_client_steps = 10 * 19 * 49 * 20  # trials x quadratic clients x steps after the first x records
    assert 0.2 < oracle.clipped / per_client_steps < 0.45


def test_oracle_clips_per_example_like_the_engine():
    oracle = ei.LinearQuadraticOracle(dim=2, eta=0.5)
    theta = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    x = torch.tensor([[[0.0, 0.0], [0.3, 0.4]], [[0.6, 0.8], [-0.1, 0.0]]])
    y = torch.tensor([[1, 0], [0, 1]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    got = oracle.clipped_sum(theta, x, y, mask, 1.0)
    # client 0: quadratic (1, 0)/0.5 = (2, 0) clipped to (1, 0), plus linear (0.3, 0.4); client 1: linear only
    torch.testing.assert_close(got, torch.tensor([[1.3, 0.4], [0.6, 0.8]]))
    assert oracle.clipped == 1
    torch.testing.assert_close(oracle.example_norms(theta, x, y, mask), torch.tensor([[2.0, 0.5], [1.0, 0.2]]))


@pytest.mark.parametrize("instance, base", [(ei.SCAFFOLD, ei.FEDAVG), (ei.SCAFFOLD_WARM, ei.FEDSGD)],
                         ids=lambda i: i.name)
def test_scaffolds_messages_are_a_function_of_the_base_instances_dy(instance, base):
    """DP-SCAFFOLD's first round (c = c_i = 0) and SCAFFOLD-warm's first warm round, on the same seed as FedAvg's and
    FedSGD's instance: dc = -dy_base / (K eta_l) to float round-off, and dy is dy_base (SCAFFOLD) or 0 (a warm round),
    so every observer sees a function of the base instance's dy: the same mu (``analytic_mu``)."""
    messages, _ = ei.round_messages(instance, 4, 1.0, 7)
    base_dy, _ = ei.run_round(base, 4, 1.0, 7)
    torch.testing.assert_close(ei.scaffold_view(instance, messages), base_dy, rtol=1e-5, atol=1e-9)
    if instance.warm_rounds:
        assert torch.count_nonzero(messages["dy"]) == 0
    else:
        torch.testing.assert_close(messages["dy"], base_dy, rtol=0, atol=0)
    for view in ei.VIEWS:
        assert ei.analytic_mu(instance, view) == ei.analytic_mu(base, view)
