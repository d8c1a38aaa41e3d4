"""ISRL-DP FedProx-SPIDER (Lowy et al. 2023, Alg. 3): both noise streams declared, composed and calibrated; a
declaration that leaves one out is caught by the simulator; the difference noise scales with ||w_r - w_{r-1}||."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from dp_accounting import dp_event

from dpfl.accounting import accountants, theory
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.accounting.observers import Release
from dpfl.algorithms.isrl_spider import SpiderConfig, stream_counts
from dpfl.experiments.noise_level import build_calibrated
from dpfl.algorithms.registry import Setting
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import DpflError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

DELTA = 1e-5
COUNTS = (20, 30, 25)


def build(rounds=10, period=4, epsilon=1.0, **keys):
    setting = Setting(client_rate=1.0, num_clients=3, train_counts=COUNTS, rounds=rounds, delta=DELTA,
                      epsilon=epsilon, model={"name": "logreg"}, num_classes=2)
    return build_calibrated("isrl-spider", SpiderConfig(period=period, sample_rate=0.5, **keys), setting)


def test_stream_counts():
    assert stream_counts(10, 4) == (3, 7) and stream_counts(8, 4) == (2, 6) and stream_counts(5, 1) == (5, 0)


def test_both_streams_are_declared_and_their_composition_meets_the_budget():
    alg = build()
    z1, z2 = alg.checkpoint.noise_multiplier, alg.difference.noise_multiplier
    assert z2 == pytest.approx(z1 * math.sqrt(7 / 3))  # equal zCDP halves
    counts = torch.tensor(COUNTS)
    sampler = RecordSampler(0.5)
    declared = [alg.release(r, None, counts).step_events for r in range(10)]
    assert declared == [(sampler.event(dp_event.GaussianDpEvent(z1 if r % 4 == 0 else z2), counts),)
                        for r in range(10)]
    assert not any(alg.release(1, None, counts).additive)  # ISRL-DP: no other silo's noise credited
    accountant = accountants.make("tightest", NEIGHBORING["replace_one"])
    for events in declared:
        accountant.compose(events[0])
    assert accountant.get_epsilon(DELTA) == pytest.approx(1.0, rel=1e-3)
    # each stream alone would spend less: dropping either understates the claim (Lowy et al.'s code)
    for kept in (z1, z2):
        alone = accountants.make("tightest", NEIGHBORING["replace_one"])
        alone.compose(sampler.event(dp_event.GaussianDpEvent(kept), counts), 3 if kept == z1 else 7)
        assert alone.get_epsilon(DELTA) < 0.9
    # the paper's closed form for the checkpoint stream (no amplification) is never below the calibrated z1
    paper = theory.isrl_spider_sigmas(1.0, DELTA, 1.0, 1.0, 10, 4, 10, 10)[0] / (2.0 / 10)
    assert paper == pytest.approx(2 * math.sqrt(2 * 3 * math.log(1 / DELTA)) / 1.0)
    assert z1 < paper


def spider_simulation():
    return build_simulation(load_config(None, [
        "algorithm.name='isrl-spider'", "data.num_clients=4", "data.samples_per_client=30", "algorithm.rounds=6",
        "algorithm.period=3", "algorithm.client_rate=1.0", "privacy.epsilon=2.0"]))


class OneStream:
    """``inner`` with a release that declares the checkpoint stream in every round (leaves the difference out)."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def release(self, round_index, state, counts):
        return dataclasses.replace(self._inner.release(0, state, counts))


def test_a_declaration_that_leaves_the_difference_stream_out_is_caught():
    sim = spider_simulation()
    sim.algorithm = OneStream(sim.algorithm)
    sim.step()  # round 1 is a checkpoint: declared as drawn
    with pytest.raises(DpflError, match="declared"):
        sim.step()  # round 2 draws the difference stream


def test_an_undeclared_draw_is_caught():
    sim = spider_simulation()
    inner = sim.algorithm

    class Silent(OneStream):
        def release(self, round_index, state, counts):
            return Release((), ())

    sim.algorithm = Silent(inner)
    with pytest.raises(DpflError, match="declared"):
        sim.step()


def test_the_difference_noise_scales_with_the_last_step_where_smoothness_is_verified():
    """Binary logistic regression on features of norm <= 1: beta = (1 + 1)/2 = 1; B_r = min(2C, beta ||dw||)."""
    alg = build(feature_clip=1.0, clip=2.0)
    assert alg.smoothness == pytest.approx(1.0)
    x_prev = torch.zeros(3)
    assert float(alg.difference_bound(torch.tensor([0.3, 0.4, 0.0]), x_prev)) == pytest.approx(0.5)
    assert float(alg.difference_bound(torch.tensor([30.0, 40.0, 0.0]), x_prev)) == pytest.approx(4.0)  # 2C
    unverified = build(clip=2.0)  # no feature bound: no smoothness, the 2C bound
    assert unverified.smoothness is None
    assert float(unverified.difference_bound(torch.tensor([0.3, 0.4, 0.0]), x_prev)) == pytest.approx(4.0)


def test_a_run_meets_the_budget_towards_server_and_other_silos():
    sim = spider_simulation()
    history = sim.run(6)
    for observer in ("server", "other_silo"):
        assert 0 < history[-1].epsilon[observer] <= 2.0
    assert history[-1].epsilon["server"] == pytest.approx(2.0, rel=1e-3)
