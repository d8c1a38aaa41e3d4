"""ISRL-DP Prox-SVRG and Prox-PL-SVRG (Lowy et al. 2023, Alg. 1, 2): without noise the exact proximal SVRG recursion
with restarts and the uniform output rule; the variance-reduced estimate is unbiased; both streams declared, composed
and calibrated below the paper's closed form; end-to-end runs through ``dpfl.cli.main`` meet the budget."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import pytest
import torch
from dp_accounting import dp_event

from dpfl.accounting import accountants, theory
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.algorithms.isrl_svrg import SVRGConfig, output_positions, run_starts, stream_counts
from dpfl.experiments.noise_level import build_calibrated
from dpfl.algorithms.registry import Setting
from worst_case import LinearQuadraticOracle
from dpfl.cli import main
from dpfl.engine.boundary import Delivery
from dpfl.noise import GaussianMechanism
from dpfl.engine.protocol import ClientContext, ClientData, ServerContext
from dpfl.engine.randomness import ClientStreams
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import ConfigError, DpflError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

DELTA = 1e-5
COUNTS = (4, 6)
DATA = torch.tensor([[[0.5, -1.0], [2.0, 0.0], [-0.5, 0.5], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]],
                              [[3.0, 1.0], [-1.0, -2.0], [0.2, 0.4], [1.5, -0.5], [0.0, 2.5], [-2.0, 1.0]]])


def build(name="isrl-prox-pl-svrg", rounds=7, epsilon=1.0, counts=COUNTS, seed=0, **keys):
    setting = Setting(client_rate=1.0, num_clients=len(counts), train_counts=counts, rounds=rounds, delta=DELTA,
                      epsilon=epsilon, seed=seed, model={"name": "logreg"}, num_classes=2)
    return build_calibrated(name, SVRGConfig(**keys), setting)


def test_runs_epochs_and_stream_counts():
    assert run_starts(7, 2) == (0, 3) and run_starts(10, 4) == (0, 2, 5, 7)
    assert stream_counts((0, 3), 7, 3) == (3, 4)  # runs of 3 and 4 rounds: snapshots in rounds 0 | 3, 6
    alg = build(period=3, restarts=2)
    assert [alg.is_checkpoint(r) for r in range(7)] == [True, False, False, True, False, False, True]
    assert [alg.run_of(r)[:2] for r in (2, 3, 6)] == [(0, 2), (1, 0), (1, 3)]
    single = build("isrl-prox-svrg", period=3)
    assert single.starts == (0,) and [single.is_checkpoint(r) for r in range(7)] == [True, False, False] * 2 + [True]


def test_output_positions_are_uniform_over_each_run():
    positions = torch.tensor([output_positions((0, 5), 9, seed) for seed in range(2000)])
    assert positions[:, 0].bincount(minlength=5).tolist() == pytest.approx([400] * 5, abs=4 * 20)  # 4 sd
    assert positions[:, 1].bincount(minlength=4).tolist() == pytest.approx([500] * 4, abs=4 * 22)
    assert output_positions((0, 5), 9, 3) == output_positions((0, 5), 9, 3)  # from run.seed: reproducible


def clipped(theta: torch.Tensor, x: torch.Tensor, clip: float) -> torch.Tensor:
    """clip_C(theta - x), the clipped gradient of ||theta - x||^2 / 2."""
    g = theta - x
    return g * min(1.0, clip / float(g.norm())) if float(g.norm()) > 0 else g


def soft(z: torch.Tensor, t: float) -> torch.Tensor:
    return torch.sign(z) * torch.clamp(z.abs() - t, min=0.0)


def test_without_noise_it_is_the_proximal_svrg_recursion_with_restarts():
    """Quadratic per-record losses ||w - x_j||^2 / 2 (some clipped at C = 1.5), l1 f1, s = 0.5 (K = 2 and 3), Q = 3,
    S = 2 runs of 3 and 4 rounds; the reference is written out record by record."""
    eta, clip, lam = 0.3, 1.5, 0.1
    alg = build(rounds=7, period=3, restarts=2, lr=eta, clip=clip, sample_rate=0.5, regularizer="l1",
                reg_strength=lam)
    alg = dataclasses.replace(alg, checkpoint=GaussianMechanism(0.0), difference=GaussianMechanism(0.0))
    counts = torch.tensor(COUNTS)
    data = ClientData(DATA.double(), torch.ones(2, 6, dtype=torch.long), counts)
    oracle, ids = LinearQuadraticOracle(2, 1.0), torch.arange(2)
    server = alg.init_state(torch.tensor([0.4, -0.3], dtype=torch.float64), 2).server
    assert alg.outputs == (1, 0)  # run.seed 0: neither run outputs its last iterate

    w = torch.tensor([0.4, -0.3], dtype=torch.float64)
    snapshot, g, output, trajectory, reference = w, None, None, [], []
    for r in range(7):
        run, position, length = alg.run_of(r)
        if position % 3 == 0:  # snapshot: w~ = w, g = mean_i (1/n_i) sum_j clip(grad f0(w~, x_ij))
            snapshot = w
            g = sum(sum(clipped(w, DATA[i, j].double(), clip) for j in range(n)) / n
                    for i, n in enumerate(COUNTS)) / 2
            v = g
        else:  # v = g + mean_i (1/K_i) sum_{j in B_i} [clip(grad f0(w, x)) - clip(grad f0(w~, x))]
            keys = ClientStreams(0, r, ids, "records").uniform([(n,) for n in COUNTS])
            batches, _ = RecordSampler(0.5).sample(counts, keys)
            diffs = []
            for i, k in enumerate((2, 3)):
                terms = [clipped(w, DATA[i, j].double(), clip) - clipped(snapshot, DATA[i, j].double(), clip)
                         for j in batches[i, :k].tolist()]
                diffs.append(sum(terms) / k)
            v = g + sum(diffs) / 2
        w = soft(w - eta * v, eta * lam)
        if position == alg.outputs[run]:
            output = w
        if position == length - 1:
            w = output
        reference.append(w)

        out = alg.client_round(r, server, {}, data, ClientContext(oracle, 0, r, ids))
        server = alg.server_update(r, server, Delivery({"h": out.messages["h"].sum(0)}, 2, 2),
                                   ServerContext(0, r))
        trajectory.append(server["x"])
    assert torch.stack(trajectory).flatten().tolist() == pytest.approx(torch.stack(reference).flatten().tolist(),
                                                                       abs=1e-12)
    assert len({tuple(x.tolist()) for x in trajectory}) >= 5  # the steps move (the test is not vacuous)
    assert trajectory[2].tolist() == trajectory[1].tolist()  # run 0 ends at its output, w after its 2nd step


def test_the_variance_reduced_estimate_is_unbiased():
    """g + v_i over many independent minibatches and noise draws (one stream per row) averages to the full clipped
    mean gradient at w, for a snapshot w~ away from w."""
    trials, clip = 4000, 1.5
    alg = build("isrl-prox-svrg", counts=(6,), rounds=6, period=3, lr=0.3, clip=clip, sample_rate=0.5)
    assert not alg.is_checkpoint(1)
    z = alg.difference.noise_multiplier
    x = DATA[1:].double().expand(trials, 6, 2)
    data = ClientData(x, torch.ones(trials, 6, dtype=torch.long), torch.full((trials,), 6))
    w, snapshot = torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([-0.5, 1.0], dtype=torch.float64)
    g = sum(clipped(snapshot, DATA[1, j].double(), clip) for j in range(6)) / 6  # exact (noise-free) snapshot mean
    server = {"x": w, "snapshot": snapshot, "g": g, "output": w}
    ctx = ClientContext(LinearQuadraticOracle(2, 1.0), 5, 1, torch.zeros(trials, dtype=torch.long),
                        stream_ids=torch.arange(trials))
    estimate = g + alg.client_round(1, server, {}, data, ctx).messages["h"]
    truth = sum(clipped(w, DATA[1, j].double(), clip) for j in range(6)) / 6
    standard_error = estimate.std(0) / math.sqrt(trials)
    assert ((estimate.mean(0) - truth).abs() <= 4 * standard_error).all(), (estimate.mean(0), truth)
    # the noise is z times the difference's sensitivity 4C/K (K = 3); the sampling spread adds to it
    assert (estimate.std(0) >= 0.97 * z * 4 * clip / 3).all()


def test_both_streams_are_declared_composed_and_below_the_papers_closed_form():
    counts = torch.tensor([100, 120])
    alg = build(rounds=12, period=4, restarts=2, counts=(100, 120), sample_rate=0.2)
    z = alg.checkpoint.noise_multiplier
    assert alg.difference.noise_multiplier == z  # one noise multiplier, in units of each stream's sensitivity
    releases = [alg.release(r, None, counts) for r in range(12)]
    inner = RecordSampler(0.2).event(dp_event.GaussianDpEvent(z), counts)
    snapshots = [0, 4, 6, 10]  # runs of 6 rounds, Q = 4
    assert [rel.step_events for rel in releases] == [
        (dp_event.GaussianDpEvent(z) if r in snapshots else inner,) for r in range(12)]
    assert not any(a for rel in releases for a in rel.additive)  # ISRL-DP: no other silo's noise credited
    accountant = accountants.make("tightest", NEIGHBORING["replace_one"])
    for rel in releases:
        accountant.compose(rel.step_events[0])
    assert accountant.get_epsilon(DELTA) == pytest.approx(1.0, rel=1e-3)
    # Lowy et al.'s closed form for the same transcript (smallest silo, K = 20): each stream's z is larger
    with warnings.catch_warnings():
        warnings.simplefilter("error", theory.ValidityWarning)  # its conditions hold here
        sigma_1, sigma_2 = theory.isrl_svrg_sigmas(1.0, DELTA, 1.0, 100, 20, 4, 8)
    eps0 = 0.5 / (2 * math.sqrt(2 * 4 * math.log(4 / DELTA)))
    assert theory.advanced_composition(eps0, DELTA / 16, 4, DELTA / 4)[0] <= 0.5  # eps/2 for the snapshots
    assert sigma_2 ** 2 == pytest.approx(256 * 4 * math.log(4 / DELTA) * math.log(5 * 4 / DELTA) / 100 ** 2)
    assert sigma_1 ** 2 == pytest.approx(4096 * 8 * math.log(4 / DELTA) * math.log(5 * 20 * 8 / (100 * DELTA))
                                         / 100 ** 2)
    assert z < sigma_1 / (4 / 20) and z < sigma_2 / (2 / 100)


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError, match="algorithm.restarts"):
        build("isrl-prox-svrg", restarts=2)
    with pytest.raises(ConfigError, match="algorithm.restarts"):
        build(rounds=3, restarts=4)
    with pytest.raises(ConfigError, match="algorithm.period"):
        build(period=0)
    with pytest.raises(ConfigError, match="privacy.epsilon"):
        build(epsilon=None)
    assert build(rounds=3).starts == (0, 1, 2)  # default S = min(4, R)


def test_a_minimal_breast_cancer_run_meets_the_budget(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[data]\nname = "breast_cancer"\n[algorithm]\nname = "isrl-prox-pl-svrg"\nrounds = 6\n'
                    '[privacy]\nepsilon = 1.5\n')
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    final = json.loads((tmp_path / "run" / "results.json").read_text())["final"]
    for observer in ("server", "other_silo"):
        assert 0 < final["epsilon"][observer] <= 1.5 and math.isfinite(final["epsilon"][observer])
    assert math.isfinite(final["train_loss"])


@pytest.mark.parametrize("stream", ["checkpoint", "difference"])
def test_a_mechanism_swapped_after_the_declaration_is_caught(stream):
    """The contract's swap test looks for a ``mechanism`` field; these have one per stream (the same z)."""
    sim = build_simulation(load_config(None, ["algorithm.name='isrl-prox-svrg'", "data.num_clients=4",
                                              "data.samples_per_client=30", "algorithm.rounds=4",
                                              "algorithm.period=2", "algorithm.client_rate=1.0",
                                              "privacy.epsilon=2.0"]))
    inner = sim.algorithm
    other = dataclasses.replace(inner, **{stream: GaussianMechanism(2 * inner.checkpoint.noise_multiplier)})

    class Swapped:
        def __getattr__(self, attribute):
            return getattr(inner, attribute)

        def client_round(self, *args):
            return other.client_round(*args)

    sim.algorithm = Swapped()
    if stream == "difference":
        sim.step()  # round 1 is a snapshot: drawn as declared
    with pytest.raises(DpflError, match="declared"):
        sim.step()
