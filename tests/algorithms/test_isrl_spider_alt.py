"""Lowy et al.'s alternate SPIDER (2023, Algorithm 11), ``isrl-spider-alt``: with the noise off it is the paper's
recursion (a gradient round, then a difference on ONE batch at w and one step ahead); both streams are declared,
composed and calibrated with one multiplier; Lowy et al.'s code constants sit beside the calibrated stds; a
breast-cancer run through `dpfl run` meets privacy.epsilon towards the server and the other silos, and `dpfl plot`
draws its gradient mapping."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from dp_accounting import dp_event

from dpfl.accounting import accountants, theory
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.algorithms.isrl import ISRLKeys
from dpfl.experiments.noise_level import build_calibrated
from dpfl.algorithms.prox import Regularizer
from dpfl.algorithms.registry import Setting
from worst_case import LinearQuadraticOracle
from dpfl.engine.boundary import Delivery
from dpfl.noise import GaussianMechanism
from dpfl.engine.protocol import ClientContext, ClientData, ServerContext
from dpfl.engine.randomness import ClientStreams
from dpfl.engine.sampling import RecordSampler

DELTA = 1e-5
COUNTS = (20, 30, 25)


def build(rounds=9, epsilon=1.0, counts=COUNTS, **keys):
    setting = Setting(client_rate=1.0, num_clients=len(counts), train_counts=counts, rounds=rounds, delta=DELTA,
                      epsilon=epsilon)
    return build_calibrated("isrl-spider-alt", ISRLKeys(**{"sample_rate": 0.5, **keys}), setting)


def noiseless(alg):
    return dataclasses.replace(alg, checkpoint=GaussianMechanism(0.0), difference=GaussianMechanism(0.0))


def silos(values: torch.Tensor, quadratic: bool) -> ClientData:
    """Silos whose records are the rows of ``values`` [silos, n, P]; y = 1: the oracle's quadratic loss."""
    silos, n = values.shape[:2]
    return ClientData(values, torch.full((silos, n), int(quadratic), dtype=torch.long), torch.full((silos,), n))


def communicate(alg, oracle, data: ClientData, rounds: int):
    """The server states after each of ``rounds`` communication rounds, every silo in every round (plain sums)."""
    server, states = alg.init_state(torch.zeros(data.x.shape[-1], dtype=torch.float64), 1).server, []
    ids = torch.arange(data.counts.numel())
    for t in range(rounds):
        out = alg.client_round(t, server, {}, data, ClientContext(oracle, 0, t, ids))
        sums = {name: value.sum(0) for name, value in out.messages.items()}
        server = alg.server_update(t, server, Delivery(sums, ids.numel(), ids.numel()), ServerContext(0, t))
        states.append(server)
    return states


def test_noise_off_it_is_the_papers_recursion_with_a_prox_at_both_steps():
    """Two silos of quadratic records ||w - x_j||^2 / (2a) (gradient (w - x_j)/a, clipped at C: some are), batches of
    half a silo, l1 f1. Algorithm 11 in the paper's rounds, written out here with the batches the silos draw (paper
    round r's difference: communication round 2r - 1's batch at both points; its gradient: round 2r's), against the
    communication rounds: after round 2r - 1 the server holds w, after round 2r the next w_b."""
    torch.manual_seed(0)
    values = torch.randn(2, 8, 3, dtype=torch.float64) * 2.0
    eta, clip, a, rounds = 0.3, 1.5, 0.5, 4
    f1 = Regularizer("l1", 0.2)
    alg = noiseless(build(rounds=2 * rounds - 1, counts=(8, 8), lr=eta, clip=clip, sample_rate=0.5,
                          regularizer="l1", reg_strength=0.2))
    oracle = LinearQuadraticOracle(3, a)
    counts = torch.tensor([8, 8])

    def mean_clipped_gradient(w, t):  # (1/M) sum_i (1/K) sum_{j in B_i^t} clip_C((w - x_ij) / a)
        keys = ClientStreams(0, t, [0, 1], "records").uniform([(8,), (8,)])
        indices, _ = RecordSampler(0.5).sample(counts, keys)
        g = (w - torch.stack([values[i, indices[i]] for i in range(2)])) / a
        return (g * torch.clamp(clip / g.norm(dim=-1, keepdim=True), max=1.0)).mean(dim=(0, 1))

    w = torch.zeros(3, dtype=torch.float64)
    g2 = mean_clipped_gradient(w, 0)
    expected = [f1.prox(w - eta * g2, eta)]  # after round 0: the next w_b
    for r in range(1, rounds):
        w_a = w
        w_b = f1.prox(w_a - eta * g2, eta)
        v = g2 + mean_clipped_gradient(w_b, 2 * r - 1) - mean_clipped_gradient(w_a, 2 * r - 1)
        w = f1.prox(w_b - eta * v, eta)
        g2 = mean_clipped_gradient(w, 2 * r)
        expected += [w, f1.prox(w - eta * g2, eta)]
    states = communicate(alg, oracle, silos(values, quadratic=True), 2 * rounds - 1)
    assert oracle.clipped > 0 and expected[-1].abs().sum() > 0
    for state, want in zip(states, expected):
        assert state["x"].tolist() == pytest.approx(want.tolist(), abs=1e-12)


def test_the_difference_reuses_one_batch_at_both_points():
    """Linear records (gradient x_j at every w), half of each silo per batch, noise off: a difference on one batch is
    exactly 0, and the gradient round's mean is over a batch of the silo's records."""
    torch.manual_seed(1)
    values = torch.randn(3, 20, 2, dtype=torch.float64) / 4
    alg = noiseless(build(counts=(20, 20, 20), clip=10.0))
    server = alg.init_state(torch.zeros(2, dtype=torch.float64), 1).server
    server = {**server, "x": torch.ones(2, dtype=torch.float64)}  # w_b != w_a
    ids, data = torch.arange(3), silos(values, quadratic=False)
    oracle = LinearQuadraticOracle(2, 1.0)
    difference = alg.client_round(1, server, {}, data, ClientContext(oracle, 0, 1, ids)).messages["h"]
    assert difference.abs().max() == 0
    gradient = alg.client_round(0, server, {}, data, ClientContext(oracle, 0, 0, ids)).messages["h"]
    assert not torch.allclose(gradient, values.mean(1))  # a batch of 10, not the whole silo


def test_one_multiplier_for_both_streams_composed_over_every_round():
    alg = build()
    z = alg.checkpoint.noise_multiplier
    assert alg.difference.noise_multiplier == z and alg.period == 2
    counts = torch.tensor(COUNTS)
    event = RecordSampler(0.5).event(dp_event.GaussianDpEvent(z), counts)
    declared = [alg.release(t, None, counts) for t in range(9)]
    assert [r.step_events for r in declared] == [(event,)] * 9 and not any(a for r in declared for a in r.additive)
    accountant = accountants.make("tightest", NEIGHBORING["replace_one"])
    accountant.compose(event, 9)
    assert accountant.get_epsilon(DELTA) == pytest.approx(1.0, rel=1e-3)
    gradient_rounds = accountants.make("tightest", NEIGHBORING["replace_one"])
    gradient_rounds.compose(event, 5)  # the gradient stream alone: what calibrating it alone would claim
    assert gradient_rounds.get_epsilon(DELTA) < 0.8
    # the difference noise is twice the gradient noise: one z on sensitivities 4C/K and 2C/K
    gradient_std, difference_std = alg.noise_std(0, counts), alg.noise_std(1, counts)
    assert difference_std.tolist() == pytest.approx((2 * gradient_std).tolist())
    assert gradient_std.tolist() == pytest.approx([z * 2 / 10, z * 2 / 15, z * 2 / 12])


@pytest.mark.parametrize("n, rounds, batch, ratio", [(20, 9, 20, 1.013), (400, 49, 195, 1.068)])
def test_the_papers_code_constants_are_below_the_composed_calibration(n, rounds, batch, ratio):
    """Lowy et al.'s code: Var u1 = 32 C^2 R ln(2/delta)/(n^2 eps^2), Var u2 = 8 C^2 R ln(2/delta)/(n^2 eps^2), each
    stream calibrated as if it alone spent (eps, delta), R paper rounds = (T + 1) / 2, with their batch
    K = int(n sqrt(24) / (2 sqrt(R))) (capped at n). The calibrated stds (one z over all T draws of both streams) are
    larger: 1.3% at n = 20, R = 5 (the whole silo per batch), 6.8% at n = 400, R = 25, K = 195, where the code's
    1/n scaling assumes the amplification by sampling that a batch of half the silo gives (the PLD of sampling without
    replacement; Wang et al.'s RDP bound, the default before, asked for 2.35x)."""
    clip, epsilon, paper_rounds = 1.0, 1.0, (rounds + 1) // 2
    assert batch == min(n, int(n * math.sqrt(24) / (2 * math.sqrt(paper_rounds))))
    alg = build(rounds=rounds, counts=(n,), sample_rate=batch / n, clip=clip, epsilon=epsilon)
    gradient_std, difference_std = (float(alg.noise_std(r, torch.tensor([n]))[0]) for r in (0, 1))
    code_u1, code_u2 = theory.isrl_alternate_spider_code_sigmas(epsilon, DELTA, clip, paper_rounds, n)
    assert code_u1 == pytest.approx(2 * code_u2)
    assert code_u2 == pytest.approx(math.sqrt(8 * paper_rounds * math.log(2 / DELTA)) / (n * epsilon))
    assert difference_std / code_u1 == pytest.approx(gradient_std / code_u2)
    assert gradient_std / code_u2 == pytest.approx(ratio, abs=0.01)


def test_a_breast_cancer_run_meets_the_budget_towards_the_server_and_other_silos(tmp_path, capsys):
    from dpfl.cli import main

    config = tmp_path / "alt.toml"
    config.write_text("\n".join([
        "[data]", "name = 'breast_cancer'", "[model]", "name = 'mlp'", "[algorithm]", "name = 'isrl-spider-alt'",
        "rounds = 3", "[privacy]", "epsilon = 1.0"]) + "\n")
    assert main(["run", str(config), "--out", str(tmp_path / "run")]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    final = results["final"]
    for observer in ("server", "other_silo"):
        assert 0 < final["epsilon"][observer] <= 1.0
    assert [r["round"] for r in results["rounds"]] == [1, 2, 3]
    mapping = [r["gradient_mapping"] for r in results["rounds"]]
    assert all(m > 0 and math.isfinite(m) for m in mapping)
    # `dpfl plot` draws it in a panel of its own
    import matplotlib.pyplot as plt

    drawn, original = {}, plt.close
    plt.close = lambda fig: drawn.setdefault("fig", fig)
    try:
        assert main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "run.png")]) == 0
    finally:
        plt.close = original
    (panel,) = [ax for ax in drawn["fig"].axes if ax.get_title() == "Gradient mapping (train data)"]
    assert panel.get_yscale() == "log" and list(panel.get_lines()[0].get_ydata()) == pytest.approx(mapping)
    assert (tmp_path / "run.png").stat().st_size > 0
