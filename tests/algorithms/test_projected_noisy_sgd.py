"""Projected noisy SGD over disjoint batches (Asoodeh et al. 2021, Algorithm 1 and random stopping): the partition,
one round against the equations, the random stop, the schedules and diameters, the accounting in results.json (the
last-iterate accountant beside composition) through `dpfl run`, the calibration to privacy.epsilon, bad configs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.accounting import last_iterate as li
from dpfl.algorithms import projected_noisy_sgd as pns
from dpfl.algorithms.registry import Setting
from dpfl.cli import main
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.engine.randomness import ClientStreams
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAME, STOP = pns.NAMES


def simulation(*overrides: str, name: str = NAME, clients: int = 12, records: int = 10):
    return build_simulation(load_config(None, [f"algorithm.name='{name}'", f"data.num_clients={clients}",
                                               f"data.samples_per_client={records}", "algorithm.noise_multiplier=1.0",
                                               *overrides]))


def test_each_user_takes_part_exactly_once_in_a_secret_random_partition():
    cohorts = {}
    for seed in (0, 1):
        sim = simulation("algorithm.clients_per_round=3", "algorithm.rounds=4", f"run.seed={seed}")
        cohorts[seed] = [sim.clients.sample(t, seed).tolist() for t in range(4)]
        assert all(len(c) == 3 for c in cohorts[seed])
        assert sorted(i for c in cohorts[seed] for i in c) == list(range(12))
    assert cohorts[0] != cohorts[1]  # the partition is drawn from the run's seed


def test_one_round_is_the_projected_noisy_step():
    sim = simulation("algorithm.clients_per_round=3", "algorithm.rounds=4", "algorithm.radius=0.05",
                     "algorithm.lr=0.5", "algorithm.weight_decay=0.1")
    algorithm, w0 = sim.algorithm, sim.model.clone()
    assert float(w0.norm()) <= 0.05 * (1 + 1e-6)  # W_0 is projected too
    ids = sim.clients.sample(0, sim.seed)
    sim.step()
    # by hand: each user's mean of clipped per-record gradients, + lambda W, + sigma Z from its own stream
    data = ClientData(sim.train.x[ids], sim.train.y[ids], sim.train.counts[ids])
    mask = torch.ones(3, data.x.shape[1])
    g = sim.grads.clipped_sum(w0.expand(3, -1), data.x, data.y, mask, 1.0) / data.counts.unsqueeze(1)
    assert bool((g.norm(dim=1) <= 1.0 + 1e-6).all())
    z = ClientStreams(sim.seed, 0, ids, "noise").normal((w0.numel(),))
    sent = 0.5 * (g + 0.1 * w0 + 2 * 1.0 * 1.0 * z)  # eta (g + lambda W + sigma Z), sigma = 2 L z_mult
    expected = pns.project(w0 - sent.mean(0), 0.05)
    torch.testing.assert_close(sim.model, expected, rtol=1e-5, atol=1e-7)
    assert float(sim.model.norm()) == pytest.approx(0.05, rel=1e-5)  # the projection binds at this radius
    assert algorithm.sigma == 2.0


def _tau(key: int, rounds: int = 5) -> int:
    """tau drawn from the noise key ``key`` (secret: Setting.secret, never run.seed)."""
    setting = Setting(client_rate=0.1, num_clients=10, rounds=rounds, delta=1e-5, secret=key)
    return pns.build(STOP, pns.ProjectedNoisySGDConfig(noise_multiplier=1.0), setting).stop


def test_random_stop_is_uniform_and_releases_w_tau():
    taus = [_tau(seed) for seed in range(400)]
    counts = np.bincount(taus, minlength=6)[1:]
    assert counts.sum() == 400 and stats.chisquare(counts).pvalue > 1e-3  # tau ~ U{1..5}
    seed = next(s for s in range(50) if _tau(s, 6) == 2)
    sim = simulation("algorithm.rounds=6", f"run.noise_seed={seed}", clients=6, name=STOP)
    assert sim.algorithm.stop == 2 and _tau(seed, 6) == _tau(seed, 6)
    contacted = []
    original = sim.algorithm.client_round

    def spy(t, server, clients, data, ctx: ClientContext):
        out = original(t, server, clients, data, ctx)
        contacted.append((t, bool(out.messages)))
        return out

    object.__setattr__(sim, "algorithm", _Spy(sim.algorithm, spy))
    models = []
    for _ in range(6):
        sim.step()
        models.append(sim.model.clone())
    assert contacted == [(t, t < 2) for t in range(6)]  # nobody after tau = 2
    assert all(torch.equal(m, models[1]) for m in models[2:]) and not torch.equal(models[0], models[1])
    # the third party's charge is the same in every round (it must not reveal tau), for Corollary 3 over T = 6
    hidden = [sim.algorithm.release(t, sim.state, sim.train.counts).hidden for t in range(6)]
    assert len(set(hidden)) == 1 and hidden[0].random_stop and hidden[0].horizon == 6
    expected = li.epsilon(sim.ledger.delta, 0.1, 2.0, 6, 1, 1.0, 5.0, nonconvex=True, random_stop=True)
    assert sim.ledger.epsilon()["third_party"] == pytest.approx(expected, rel=1e-9)


class _Spy:
    def __init__(self, inner, client_round):
        self._inner, self.client_round = inner, client_round

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_inverse_schedule_uses_the_convex_diameter_where_eta_is_small_enough():
    # logreg, features of norm <= 1, clip 2 >= sqrt(2 (1 + 1)): verified, beta = 1 + 0.25 = 1.25; eta_t = 1/(0.25 t)
    # > 2/beta = 1.6 for t = 1, 2: those two rounds keep the non-convex diameter
    sim = simulation("algorithm.lr_schedule='inverse'", "algorithm.weight_decay=0.25", "algorithm.convex=true",
                     "algorithm.feature_clip=1.0", "algorithm.clip=2.0", "algorithm.rounds=8", clients=8)
    algorithm = sim.algorithm
    assert algorithm.smoothness == pytest.approx(1.25)
    lrs = [algorithm.step_size(t) for t in range(8)]
    assert lrs == pytest.approx([1 / (0.25 * t) for t in range(1, 9)])
    flags = [algorithm.release(t, sim.state, sim.train.counts).hidden.nonconvex for t in range(8)]
    assert flags == [True, True] + [False] * 6
    assert "2 rounds" in algorithm.assumptions["diameter"]
    sim.run(8)
    accountant = li.LastIterateAccountant(n=8, batch_size=1, lipschitz=2.0, radius=5.0)
    for lr, flag in zip(lrs, flags):
        accountant.step(lr, 4.0, nonconvex=flag)
    assert sim.ledger.epsilon()["third_party"] == pytest.approx(accountant.epsilon(sim.ledger.delta), rel=1e-9)


def test_results_report_the_last_iterate_beside_composition(tmp_path):
    # n = 40 users, m = 1, L = rho = 1, eta = 0.5, sigma = 4 (z = 2): hiding the iterates pays
    out = tmp_path / "run"
    argv = ["run", str(_config(tmp_path)), "--out", str(out), "--no-progress", "--set", "data.num_clients=40",
            "--set", "data.samples_per_client=3", "--set", "algorithm.rounds=40", "--set", "algorithm.radius=1.0",
            "--set", "algorithm.lr=0.5", "--set", "algorithm.noise_multiplier=2.0", "--set", "privacy.delta=1e-5",
            "--set", "run.eval_every=40"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    final, privacy = results["final"], results["privacy"]
    hidden = li.epsilon(1e-5, 0.5, 4.0, 40, 1, 1.0, 1.0, nonconvex=True)
    composed = li.composition_epsilon(1e-5, 4.0, 40, 1, 1.0)
    assert final["epsilon"]["third_party"] == pytest.approx(hidden, rel=1e-9)
    assert final["epsilon_composition"]["third_party"] == pytest.approx(composed, rel=2e-3)  # PLD vs exact
    assert final["epsilon"]["third_party"] < 0.9 * final["epsilon_composition"]["third_party"]
    assert final["epsilon"]["other_silo"] == final["epsilon_composition"]["other_silo"]  # it sees iterates
    assert privacy["accountant"] == {"third_party": "last_iterate", "other_silo": "pld"}
    assert privacy["boundary"] == "trusted" and privacy["release"] == "final"
    assert privacy["unit"].startswith("one client's data (user-level DP")
    assert privacy["assumptions"]["diameter"] == "2 (rho + eta_t L)"
    assert "not stated" in privacy["assumptions"]["convex_smooth"]


@pytest.mark.parametrize("analysis", ["sound", "paper"])
def test_verified_convexity_claims_the_smaller_of_the_proven_bounds(tmp_path, analysis):
    # logreg on features of norm <= 1 with clip L = 2 >= sqrt(2 (1 + 1)): verified, beta = 1 + 0.01, eta = 0.5 <= 2/beta
    out = tmp_path / "run"
    argv = ["run", str(_config(tmp_path)), "--out", str(out), "--no-progress", "--set", "data.num_clients=40",
            "--set", "data.samples_per_client=3", "--set", "algorithm.rounds=40", "--set", "algorithm.radius=5.0",
            "--set", "algorithm.lr=0.5", "--set", "algorithm.noise_multiplier=1.0", "--set", "privacy.delta=1e-5",
            "--set", "algorithm.convex=true", "--set", "algorithm.feature_clip=1.0", "--set", "algorithm.clip=2.0",
            "--set", f"privacy.analysis='{analysis}'", "--set", "run.eval_every=40"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    claim, bounds = results["final"]["epsilon"]["third_party"], results["privacy"]["assumptions"]["bounds"]
    args = (1e-5, 0.5, 4.0, 40, 1, 2.0, 5.0)  # sigma = 2 L z = 4
    assert claim == pytest.approx(li.epsilon(*args, analysis=analysis), rel=1e-9)
    if analysis == "sound":
        assert claim < 0.85 * li.epsilon(*args)  # amplification by iteration beats Theorem 2 here
        assert bounds["Feldman et al. 2018, Theorem 22 (amplification by iteration)"].startswith(
            "applies: a user's shift 2 eta_t L / m is spread over the noise of its round and of the contracting "
            "rounds after it (40 of 40 rounds contract")
    else:
        assert bounds == {"claim": "Asoodeh et al. 2021, Theorem 2 alone (privacy.analysis = 'paper'; the other "
                                   "observers: classic conversion)"}


def _config(tmp_path):
    path = tmp_path / "pns.toml"
    path.write_text(f'[algorithm]\nname = "{NAME}"\n')
    return path


def test_an_unverifiable_convexity_claim_falls_back_and_says_so(tmp_path):
    out = tmp_path / "run"
    argv = ["run", str(_config(tmp_path)), "--out", str(out), "--no-progress", "--set", "data.num_clients=6",
            "--set", "data.samples_per_client=4", "--set", "algorithm.rounds=2", "--set", "algorithm.convex=true",
            "--set", "model.name='mlp'", "--set", "model.hidden=[4]", "--set", "algorithm.noise_multiplier=1.0"]
    with pytest.warns(UserWarning, match=r"algorithm.convex = true is not verified \(model.name = 'mlp'"):
        assert main(argv) == 0  # a Python warning: on stderr outside pytest
    assumptions = json.loads((out / "results.json").read_text())["privacy"]["assumptions"]
    assert "not verified" in assumptions["convex_smooth"] and assumptions["diameter"] == "2 (rho + eta_t L)"


def test_multiclass_convexity_needs_a_clip_that_never_binds():
    config = pns.ProjectedNoisySGDConfig(noise_multiplier=1.0, convex=True, feature_clip=1.0, clip=1.0)
    setting = Setting(client_rate=0.1, num_clients=10, rounds=10, delta=1e-5, model={"name": "logreg"},
                      num_classes=10)
    beta, why = pns.verified_smoothness(config, setting)
    assert beta is None and "sqrt(2 (R^2 + b)) = 2" in why
    two = Setting(client_rate=0.1, num_clients=10, rounds=10, delta=1e-5, model={"name": "logreg", "bias": False},
                  num_classes=2)
    assert pns.verified_smoothness(config, two)[0] == pytest.approx(0.5 + 0.01)  # a clipped GLM: any clip


def test_noise_is_calibrated_to_privacy_epsilon_by_the_run_s_own_accountant():
    base = ("privacy.epsilon=2.0", "privacy.delta=1e-5", "algorithm.rounds=12", "algorithm.radius=0.5",
            "algorithm.lr=0.5")
    final = build_simulation(load_config(None, [f"algorithm.name='{NAME}'", "data.num_clients=12",
                                                "data.samples_per_client=3", *base]))
    every = build_simulation(load_config(None, [f"algorithm.name='{NAME}'", "data.num_clients=12",
                                                "data.samples_per_client=3", "privacy.release='every_round'", *base]))
    final.run(12, progress=False)
    assert 2.0 * (1 - 2e-3) <= final.ledger.epsilon()["third_party"] <= 2.0
    z_final, z_every = (s.algorithm.mechanism.noise_multiplier for s in (final, every))
    assert z_final < z_every  # hiding the iterates needs less noise for the same epsilon
    assert li.composition_epsilon(1e-5, 2 * z_every, 12, 1, 1.0) == pytest.approx(2.0, rel=2e-3)


@pytest.mark.parametrize("overrides, field, message", [
    (("algorithm.clients_per_round=5",), "algorithm.clients_per_round", "drop_remainder = true to leave the 2"),
    (("algorithm.rounds=13",), "algorithm.rounds", "at most 12 for 'projected-noisy-sgd'"),
    (("algorithm.lr=3.0", "algorithm.weight_decay=1.0"), "algorithm.lr", "at most 2 / weight_decay"),
    (("algorithm.lr_schedule='inverse'", "algorithm.weight_decay=0.0"), "algorithm.weight_decay", "positive lambda"),
    (("privacy.epsilon=1.0",), "privacy.epsilon", "None when algorithm.noise_multiplier is set"),
    (("algorithm.radius=0.0",), "algorithm.radius", "(0.0, inf)"),
])
def test_bad_configs_name_their_key(overrides, field, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        simulation("algorithm.rounds=12", *overrides)
    assert caught.value.field == field


def test_no_noise_and_no_epsilon_is_refused_naming_the_noise():
    with pytest.raises(ConfigError) as caught:
        build_simulation(load_config(None, [f"algorithm.name='{NAME}'", "data.num_clients=4",
                                            "data.samples_per_client=5", "algorithm.rounds=4"]))
    assert caught.value.field == "algorithm.noise_multiplier" and "privacy.epsilon" in str(caught.value)


def test_drop_remainder_leaves_the_left_over_users_out():
    sim = simulation("algorithm.clients_per_round=5", "algorithm.drop_remainder=true", "algorithm.rounds=2")
    used = sorted(i for t in range(2) for i in sim.clients.sample(t, sim.seed).tolist())
    assert len(used) == 10 and len(set(used)) == 10
    assert math.isfinite(sim.algorithm.release(0, sim.state, sim.train.counts).hidden.sigma)
