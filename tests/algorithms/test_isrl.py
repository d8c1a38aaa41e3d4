"""The ISRL-DP algorithms (Lowy et al. 2023): calibration against the paper's closed forms, disjoint batches, the prox
on the server, and end-to-end runs through ``dpfl.cli.main`` whose server and other-silo epsilons meet the budget."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from dp_accounting import dp_event

from dpfl.accounting import accountants, theory
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.accounting.theory import gdp_epsilon
from dpfl.algorithms.isrl import ISRLConfig, disjoint_keys, zcdp_noise_multiplier
from dpfl.experiments.noise_level import build_calibrated
from dpfl.algorithms.registry import Setting
from dpfl.cli import main
from dpfl.engine.boundary import Delivery
from dpfl.noise import GaussianMechanism
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import ConfigError, DpflError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
from dpfl.engine.protocol import ServerContext

DELTA = 1e-5


def build(name: str, epsilon=1.0, rounds=5, records=(20, 30, 25), **keys):
    setting = Setting(client_rate=1.0, num_clients=len(records), train_counts=records, rounds=rounds, delta=DELTA,
                      epsilon=epsilon)
    return build_calibrated(name, ISRLConfig(**keys), setting)


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
def test_prox_sgd_noise_is_the_exact_gaussians_and_below_the_papers_closed_form(epsilon):
    """z solves eps(z) = epsilon for ONE Gaussian (parallel composition); the paper's z = 2 sqrt(ln(1/delta))/eps
    (its sigma over the sensitivity 2L/K) is larger: sound but looser."""
    z = build("isrl-prox-sgd", epsilon).steps.mechanism.noise_multiplier
    assert gdp_epsilon(1 / z, DELTA) == pytest.approx(epsilon, rel=1e-3)
    assert gdp_epsilon(1 / z, DELTA) <= epsilon * (1 + 1e-9)
    assert gdp_epsilon(1 / (0.99 * z), DELTA) > epsilon  # the smallest such z
    paper = theory.isrl_prox_sgd_sigma(epsilon, DELTA, lipschitz=1.0, batch=4) / (2.0 / 4)
    assert paper == pytest.approx(zcdp_noise_multiplier(epsilon, DELTA, 1)) == pytest.approx(
        2 * math.sqrt(math.log(1 / DELTA)) / epsilon)
    assert z < paper and gdp_epsilon(1 / paper, DELTA) <= epsilon


@pytest.mark.parametrize("name, draws", [("isrl-mb-sgd", 5), ("isrl-local-sgd", 5 * 3)])
def test_baselines_compose_every_draw_and_stay_below_the_closed_form(name, draws):
    alg = build(name, 1.0, sample_rate=0.5, local_steps=3)
    z = alg.steps.mechanism.noise_multiplier
    counts = torch.tensor([20, 30, 25])
    accountant = accountants.make("tightest", NEIGHBORING["replace_one"])
    accountant.compose(RecordSampler(0.5).event(dp_event.GaussianDpEvent(z), counts), draws)
    assert accountant.get_epsilon(DELTA) == pytest.approx(1.0, rel=1e-3)
    assert z < zcdp_noise_multiplier(1.0, DELTA, draws)
    release = alg.release(0, None, counts)
    assert len(release.step_events) == draws // 5
    # the draws that enter the round's sum with nothing computed after them are credited towards its observers: the
    # one step of minibatch SGD, the last of Local SGD's three (the earlier ones move the silo's iterate)
    assert release.additive == ((True,) if name == "isrl-mb-sgd" else (False, False, True))


def test_disjoint_batches_cover_each_record_once():
    counts = torch.tensor([10, 7, 12])
    keys = torch.rand(3, 12, generator=torch.Generator().manual_seed(0))
    keys[0, 10:], keys[1, 7:] = float("inf"), float("inf")  # padding, as ClientStreams.uniform fills it
    sampler = RecordSampler(1 / 3)
    batches = [sampler.sample(counts, disjoint_keys(keys, counts, r, sampler.batch_sizes(counts)))[0]
               for r in range(3)]
    for client, (n, k) in enumerate(zip(counts.tolist(), sampler.batch_sizes(counts).tolist())):
        used = torch.cat([b[client, :k] for b in batches])
        assert used.numel() == 3 * k == 3 * (n // 3) and used.unique().numel() == used.numel()
        assert int(used.max()) < n  # never a padding slot
        # round r's block is ranks [r k, (r + 1) k) of the silo's permutation
        order = torch.argsort(keys[client, :n])
        assert used.tolist() == order[: 3 * k].tolist()


def test_the_server_takes_the_prox_of_the_averaged_step():
    alg = build("isrl-prox-sgd", regularizer="l1", reg_strength=2.0, lr=0.1)
    delivered = Delivery({"dy": torch.tensor([0.3, -0.05])}, count=2, population=3)
    x = alg.server_update(0, {"x": torch.tensor([1.0, 0.0])}, delivered, ServerContext(0, 0))["x"]
    # prox_{0.1 * 2 |.|}(x + mean dy) = soft([1.15, -0.025], 0.2)
    assert x.tolist() == pytest.approx([0.95, 0.0])


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError, match="algorithm.rounds"):
        build("isrl-prox-sgd", rounds=21)  # the smallest silo has 20 records
    with pytest.raises(ConfigError, match="privacy.epsilon"):
        build("isrl-mb-sgd", epsilon=None)
    with pytest.raises(ConfigError, match="algorithm.regularizer"):
        build("isrl-mb-sgd", regularizer="l0")


@pytest.mark.parametrize("name", ["isrl-prox-sgd", "isrl-mb-sgd", "isrl-local-sgd"])
def test_a_minimal_config_runs_and_meets_the_budget_towards_server_and_other_silos(name, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(f'[data]\nnum_clients = 10\nsamples_per_client = 30\n[algorithm]\nname = "{name}"\nrounds = 4\n'
                    '[privacy]\nepsilon = 1.5\n')
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress",
                 "--set", "algorithm.regularizer='l2_ball'", "--set", "algorithm.radius=0.5"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    final, rounds = results["final"], results["rounds"]
    for observer in ("server", "other_silo"):
        assert 0 < final["epsilon"][observer] <= 1.5
    if name == "isrl-prox-sgd":  # every record's one Gaussian, charged in round 1
        assert rounds[0]["epsilon"]["server"] == final["epsilon"]["server"] == pytest.approx(1.5, rel=1e-3)


@pytest.mark.parametrize("name", ["isrl-prox-sgd", "isrl-mb-sgd", "isrl-local-sgd"])
def test_a_mechanism_swapped_after_the_declaration_is_caught(name):
    """The contract's swap test reaches the mechanism through the algorithm's own field; ISRL's is in its steps."""
    sim = build_simulation(load_config(None, [f"algorithm.name='{name}'", "data.num_clients=4",
                                              "data.samples_per_client=30", "algorithm.rounds=3",
                                              "algorithm.client_rate=1.0", "privacy.epsilon=2.0"]))
    inner = sim.algorithm
    mechanism = GaussianMechanism(2 * inner.steps.mechanism.noise_multiplier)
    other = dataclasses.replace(inner, steps=dataclasses.replace(inner.steps, mechanism=mechanism))

    class Swapped:
        def __getattr__(self, attribute):
            return getattr(inner, attribute)

        def client_round(self, *args):
            return other.client_round(*args)

    sim.algorithm = Swapped()
    with pytest.raises(DpflError, match="declared"):
        sim.step()
