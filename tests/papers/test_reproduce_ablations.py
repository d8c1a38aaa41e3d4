"""The pieces `dpfl reproduce` adds for the papers' choices and figures: Lowy et al.'s SPIDER streams each given the
whole budget (the authors' code: unsound, never the default) and the least-training-loss iterate (data-dependent),
Zhou et al.'s loss curves and data portions, and Heikkilä et al.'s rounds a local step needs to match a local epoch."""

from __future__ import annotations

import json
import math

import pytest

from dpfl.accounting.theory import dp_to_zcdp_rho
from dpfl.papers.lowy2023 import experiment as lowy2023
from dpfl.papers.zhou2021 import experiment as zhou2021
from dpfl.papers.heikkila2024.items import rounds_to_match
from dpfl.papers.lowy2023.items import paired, relative_improvement

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_each_stream_given_the_whole_budget_doubles_the_zcdp_budget():
    """eps' composes two streams that each spend (eps, delta) as zCDP: rho(eps') = 2 rho(eps); eps' = 2.1513 at the
    breast cancer setting's eps = 1.5, delta = 1 / 170^2 (a run calibrated to it spent 2.15125 by dpfl's ledger)."""
    delta = 1 / 170**2
    for eps in (0.75, 1.5, 6.0, 18.0):
        wider = lowy2023.each_stream_epsilon(eps, delta)
        assert dp_to_zcdp_rho(wider, delta) == pytest.approx(2 * dp_to_zcdp_rho(eps, delta), rel=1e-12)
        assert eps < wider < 2 * eps
    assert lowy2023.each_stream_epsilon(1.5, delta) == pytest.approx(2.15125, abs=1e-4)


def _breast_cancer(rounds: int) -> tuple[lowy2023.Setup, float]:
    spec = lowy2023.SETTINGS["breast_cancer"]
    setup = lowy2023.Setup("breast_cancer", spec["data"], spec["num_clients"], spec["num_clients"], rounds)
    return setup, setup.delta()


def test_the_whole_budget_per_stream_is_labelled_and_its_ledger_spends_more_than_eps():
    setup, delta = _breast_cancer(4)
    sound = lowy2023.run_one(setup, delta, "isrl-spider", 1.5, 1.0, 0.1, {"period": 2}, 0)
    unsound = lowy2023.run_one(setup, delta, "isrl-spider", 1.5, 1.0, 0.1, {"period": 2}, 0,
                               lowy2023.EACH_STREAM_WHOLE_BUDGET)
    assert "stream_budget" not in sound and sound["epsilon_spent"] <= 1.5 + 1e-9
    assert "UNSOUND" in unsound["stream_budget"] and unsound["epsilon"] == 1.5
    assert unsound["epsilon_calibrated"] == pytest.approx(lowy2023.each_stream_epsilon(1.5, delta))
    assert 1.5 * 1.2 < unsound["epsilon_spent"] <= unsound["epsilon_calibrated"] + 1e-9
    mb_sgd = lowy2023.run_one(setup, delta, "isrl-mb-sgd", 1.5, 1.0, 0.1, {}, 0, lowy2023.EACH_STREAM_WHOLE_BUDGET)
    assert "stream_budget" not in mb_sgd and mb_sgd["epsilon_spent"] <= 1.5 + 1e-9  # one stream: nothing to give
    with pytest.raises(ValueError, match="stream_budget"):
        lowy2023.run_one(setup, delta, "isrl-spider", 1.5, 1.0, 0.1, {}, 0, "paper")


def test_spider_at_period_1_is_mb_sgd_run_for_run_and_its_grids_include_it():
    """Lowy et al. (2023), Sec. 4: FedProx-SPIDER with q = 1 is MB-SGD, so q = 1 belongs in SPIDER's tuning grid."""
    setup, delta = _breast_cancer(6)
    for seed, (lr, clip) in enumerate(((1.0, 0.1), (0.3, 1.0))):
        spider = lowy2023.run_one(setup, delta, "isrl-spider", 1.5, lr, clip, {"period": 1}, seed)
        mb_sgd = lowy2023.run_one(setup, delta, "isrl-mb-sgd", 1.5, lr, clip, {}, seed)
        assert spider["test_error"] == mb_sgd["test_error"]
        assert spider["train_loss"] == pytest.approx(mb_sgd["train_loss"], rel=1e-3)
    assert 1 in lowy2023.ALGORITHMS["isrl-spider"].tuned["period"] and 1 in lowy2023.SETTINGS["digits"]["periods"]


def test_the_improvement_is_relative_as_the_paper_computes_it_and_paired_by_split():
    # errors 0.2 -> 0.1 (50%) and 0.1 -> 0.1 (0%): the mean of the percentages, 25%, not the points' 5
    assert relative_improvement([0.2, 0.1], [0.1, 0.1]) == pytest.approx(25.0)
    runs = [{"setup": "s", "algorithm": a, "epsilon": 1.0, "lr": lr, "clip": 1.0, "params": "", "seed": seed,
             "test_error": e}
            for a, lr, errors in (("isrl-mb-sgd", 0.1, (0.30, 0.20)), ("isrl-mb-sgd", 1.0, (0.9, 0.9)),
                                  ("isrl-spider", 1.0, (0.25, 0.19)))
            for seed, e in enumerate(errors)]
    summary = lowy2023.tuned(runs)
    (mean, se), = paired(runs, summary, "s", "isrl-mb-sgd", [1.0])
    assert mean == pytest.approx(3.0) and se == pytest.approx(2.0)  # differences 5 and 1 points


def test_the_least_training_loss_iterate_is_the_round_of_least_loss_and_leaves_the_last_as_it_is():
    setup, delta = _breast_cancer(6)
    last = lowy2023.run_one(setup, delta, "isrl-mb-sgd", 1.5, 1.0, 0.1, {}, 0)
    every = lowy2023.run_one(setup, delta, "isrl-mb-sgd", 1.5, 1.0, 0.1, {}, 0, every_round=True)
    assert every["test_error"] == last["test_error"] and every["train_loss"] == last["train_loss"]
    assert 1 <= every["least_train_loss_round"] <= 6
    assert every["least_train_loss_round"] < 6 or every["test_error_at_least_train_loss"] == every["test_error"]


def test_a_loss_curve_runs_from_the_initial_model_to_the_last_round():
    setup = zhou2021.Setup(weight_decay=1.0)
    point = zhou2021.Point("laplace", 5.0, 1, 4, ("test",))
    run = zhou2021.run_point(setup, point, 0, 2.5, eval_every=2)
    assert [t for t, _ in run["curve"]] == [0, 2, 4] and run["curve"][-1][1] == run["train_loss"]
    assert "curve" not in zhou2021.run_point(setup, point, 0, 2.5)
    assert math.isfinite(run["curve"][0][1]) and json.dumps(run)


def test_a_data_portion_trims_every_client_to_the_same_records():
    setup = zhou2021.Setup()
    most = zhou2021.smallest_client(setup)
    assert 170 <= most <= 180  # 1,797 digits over 10 clients of two digits each
    trimmed = zhou2021.Setup(samples_per_client=most // 2)
    assert "data.samples_per_client=" + str(most // 2) in trimmed.overrides()
    assert not any("samples_per_client" in o for o in setup.overrides())
    assert zhou2021.smallest_client(trimmed) == most  # the portion is of the untrimmed partition


def test_rounds_of_a_local_step_to_match_a_local_epoch():
    losses = {"1 local step": {1: 2.0, 3: 1.5, 10: 1.0, 30: 0.6}, "1 local epoch": {1: 1.2, 3: 0.9, 10: 0.5}}
    assert rounds_to_match(losses) == [(1, 10), (3, 30), (10, None)]
    accuracies = {"1 local step": {1: 0.2, 3: 0.5, 10: 0.7, 30: 0.8}, "1 local epoch": {1: 0.6, 3: 0.8, 10: 0.9}}
    assert rounds_to_match(accuracies, higher=True) == [(1, 10), (3, 30), (10, None)]
