"""The reasons `dpfl reproduce` gives where Noble et al. (2022)'s printed numbers are not dpfl's own: epsilons rounded
up, and a Table 1 row repeated from the row above it."""

from __future__ import annotations

import numpy as np
import pytest

from dpfl.experiments.reproduce import noble2022


def test_rounding_up_at_the_printed_digit():
    assert noble2022.rounded_up(11.4321, 1) == 11.5 and noble2022.rounded_up(7.1494, 1) == 7.2
    assert noble2022.rounded_up(12.9063, 0) == 13 and noble2022.rounded_up(4.2, 1) == 4.2


def test_every_printed_epsilon_is_the_papers_accountant_rounded_up(tmp_path):
    rows = noble2022._epsilon(noble2022._epsilon_settings(True), tmp_path)["rows"]
    assert len(rows) == 6 and all(r.match for r in rows)
    explained = {r.paper: r.note for r in rows if "rounds epsilon up" in r.note}
    assert set(explained) == {"11.5", "7.2"}  # to nearest these two would print 11.4 and 7.1
    assert "11.4321 would print as 11.4" in explained["11.5"] and "7.1494 would print as 7.1" in explained["7.2"]


def test_the_sigma_160_entries_off_by_one_are_the_sigma_80_row_repeated(tmp_path):
    rows = noble2022._table1(noble2022._table1_settings(True), tmp_path)["rows"]
    off = [r for r in rows if not r.match]
    assert [(r.quantity.split(":")[0], r.paper, r.paper_analysis) for r in off] == [
        ("sigma_g = 160, K = 5", 506, 507), ("sigma_g = 160, K = 10", 458, 459), ("sigma_g = 160, K = 20", 362, 363)]
    assert all("authors' own script" in r.note and "repeats its sigma_g = 80 row" in r.note for r in off)
    assert "eps(507) = 2.99993 <= 3" in off[0].note and "eps(507) = 3.00031 > 3" in off[0].note
    # the printed T at sigma_g = 10, K = 20 has a larger epsilon than the rejected 459: no stopping rule gives both
    assert "sigma_g = 10, K = 20 has eps = 2.99980" in off[1].note
    assert "not explained" not in " ".join(r.note for r in rows)


def test_the_centralised_fit_reaches_a_gradient_norm_below_1e_6():
    from dpfl.experiments.reproduce import noble2022_utility as utility

    overrides = [*utility._common((5, 40), 1.0, 0.005), "data.alpha=1", "data.beta=1", "algorithm.name='dp-scaffold'"]
    objective, x0 = utility.pooled_objective(overrides)
    x, f_star, norm = utility.centralised_optimum(objective, x0)
    assert norm < 1e-6 and f_star == objective(x)[0] and f_star < objective(x0)[0]
    rng = np.random.default_rng(0)  # strongly convex (lambda = 0.005): every nearby point is worse
    assert all(objective(x + 1e-3 * rng.standard_normal(x.shape))[0] > f_star for _ in range(5))


def test_the_grid_covers_every_heterogeneity_k_and_private_algorithm():
    from dpfl.experiments.reproduce import noble2022_utility as utility

    for quick in (True, False):
        settings = utility._grid_settings(quick)
        cells = utility.grid_runs(settings)
        assert len(cells) == len(set(cells)) == 3 * 2 * 4
        assert {(h, k) for h, k, _ in cells} == {(h, k) for h in ("0,0", "1,1", "5,5") for k in (50, 100)}
        assert {n for _, _, n in cells} == {"dp-fedavg", "dp-fedsgd", "dp-scaffold", "dp-scaffold-warm"}
    assert utility._grid_settings(False)["data"] == [100, 5000] and utility._grid_settings(False)["rounds"] == 400


def test_table4_trains_each_cell_for_the_papers_t_and_averages_the_last_tenth():
    from dpfl.experiments.reproduce import noble2022_utility as utility

    assert utility._table4_settings(False)["sigmas"] == [10, 20, 40, 80, 160]
    assert utility._table4_settings(False)["data"] == [100, 5000]
    rounds = [{"round": r, "test_accuracy": r / 100} for r in range(10, 101, 10)]
    assert utility.last_fraction_accuracy(rounds, 100, 0.1) == 1.0  # only round 100 is past 90
    assert utility.last_fraction_accuracy(rounds, 100, 0.25) == pytest.approx(0.9)  # rounds 80, 90, 100
