"""Which of Heikkilä et al. (2024)'s Table 1 numbers dpfl's Skellam accountant gives (item heikkila2024-table1)."""

from __future__ import annotations

import pytest

from dpfl.papers.heikkila2024 import experiment as heikkila2024


def test_table_1_is_computed_through_dp_fedavg_joint():
    """table_1 builds dp-fedavg-joint (it once imported the builder from a module it had left)."""
    got = heikkila2024.table_1(1, (1, 2), 100)
    assert [round(r["sigma_total"], 2) for r in got["rows"]] == [0.69, 0.98]
    assert round(got["rows"][1]["paper"], 2) == 2.78


@pytest.mark.parametrize("steps, gaussian, skellam", [(1, 0.69, 0.7240), (10, 0.90, 1.0003), (50, 1.18, 1.4022)])
def test_skellam_shares_need_more_noise_than_table_1s_gaussian_column(steps, gaussian, skellam):
    """Table 1's sigma_LDP is the Gaussian one; dpfl's Skellam accountant (Zhu & Wang's factor 3) needs more."""
    assert heikkila2024.table_1(steps, (1,), 100)["sigma_ldp"] == pytest.approx(gaussian, abs=5e-3)
    assert heikkila2024.skellam_sigma_ldp(steps) == pytest.approx(skellam, abs=1e-3)
