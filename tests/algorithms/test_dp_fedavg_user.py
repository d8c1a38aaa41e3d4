"""dp-fedavg-user (user-level DP-FedAvg, McMahan et al. 2018; adaptive clipping, Andrew et al. 2021): the server step's
fixed denominator, bounded weights and their noise, the adaptive clip's convergence to its target quantile, bad keys,
and end-to-end runs through `dpfl run`, `dpfl.run` and `dpfl calibrate run` on data that ships. Its privacy against
exact worst cases: tests/privacy/test_dp_fedavg_user_worst_case.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import dpfl
from dpfl.accounting.units import USER_LEVEL
from dpfl.algorithms.dp_fedavg_user import NAME, DpFedAvgUserConfig, build
from dpfl.algorithms.registry import Setting
from dpfl.cli import main
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import ClientContext, ClientData, ServerContext
from dpfl.errors import ConfigError
from worst_case import LinearQuadraticOracle

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ETA = 0.5


def algorithm(clients=10, rate=0.4, sampling="fixed", counts=None, **keys):
    counts = counts or (3,) * clients
    config = DpFedAvgUserConfig(local_steps=1, sample_rate=1.0, lr=ETA, **{"noise_multiplier": 1.0, **keys})
    return build(NAME, config, Setting(client_rate=rate, client_sampling=sampling, num_clients=clients,
                                       train_counts=tuple(counts), rounds=1, delta=1e-5))


def client_messages(alg, updates, counts=None, clip=1.0, seed=0):
    """The messages of clients whose local update is ``updates`` [n] (1-D model: Delta_i = -eta v_i)."""
    updates = torch.as_tensor(updates, dtype=torch.float32)
    n = updates.shape[0]
    counts = torch.full((n,), 3) if counts is None else torch.as_tensor(counts)
    width = int(counts.max())
    x = (-updates / ETA).reshape(n, 1, 1).expand(n, width, 1).clone()
    data = ClientData(x, torch.zeros(n, width, dtype=torch.long), counts)
    server = {"x": torch.zeros(1), "clip": torch.tensor(clip)}
    ids = torch.arange(n)
    return alg.client_round(0, server, {}, data, ClientContext(LinearQuadraticOracle(1, ETA), seed, 0, ids))


@pytest.mark.parametrize("sampling, denominator", [("poisson", 0.35 * 20), ("fixed", 7.0)])
def test_the_server_steps_with_the_noisy_sum_over_a_fixed_denominator(sampling, denominator):
    """x + eta_g sum / D with D = qM (Poisson: McMahan et al.'s fixed-denominator estimator) or n, whoever came."""
    alg = algorithm(clients=20, rate=0.35, sampling=sampling, server_lr=0.8, noise_at="shares")
    assert alg.denominator == pytest.approx(denominator)
    out = client_messages(alg, [3.0, -0.25, 0.5])
    total = out.messages["u"].sum(0)
    new = alg.server_update(0, {"x": torch.ones(1), "clip": torch.tensor(1.0)},
                            Delivery({"u": total}, 3, 20), ServerContext(0, 0))
    assert torch.allclose(new["x"], 1 + 0.8 * total / denominator)


def test_updates_are_clipped_and_weighted_with_bounded_weights():
    """u_i = min(n_i / n_hat, w_max) Delta_i min(1, C / ||Delta_i||); client noise std z 2 w_max C (replace-one)."""
    alg = algorithm(noise_at="server", weighting="records", weight_records=4.0, max_weight=1.5, clip=1.0)
    out = client_messages(alg, [3.0, -0.5, 0.5], counts=[8, 2, 5])
    assert torch.allclose(out.messages["u"][:, 0], torch.tensor([1.5 * 1.0, 0.5 * -0.5, 1.25 * 0.5]))
    noisy = algorithm(noise_at="client", weighting="records", weight_records=4.0, max_weight=1.5, clip=1.0,
                      noise_multiplier=2.0)
    draws = client_messages(noisy, torch.zeros(4000), seed=3).messages["u"][:, 0]  # updates 0: noise alone
    assert float(draws.std()) == pytest.approx(2.0 * 2 * 1.5 * 1.0, rel=0.05)  # 4000 draws: std within ~2.2%


def test_the_adaptive_clip_moves_to_the_target_quantile():
    """A toy population of 50 clients whose update norms are 0.1, 0.2, ..., 5.0, every client in every round, the
    server noising the sum and the count: from C_0 = 0.05 and from C_0 = 20 the clip ends between the population's
    (gamma - 0.1)- and (gamma + 0.1)-quantiles (Andrew et al.'s geometric update), for gamma = 0.5 and 0.8."""
    norms = torch.arange(1, 51) * 0.1
    for gamma in (0.5, 0.8):
        alg = algorithm(clients=50, rate=1.0, noise_at="server", noise_multiplier=0.5, target_quantile=gamma,
                        clip_lr=0.2, count_noise=1.0)
        for start in (0.05, 20.0):
            server = {"x": torch.zeros(1), "clip": torch.tensor(start)}
            for t in range(150):
                out = client_messages(alg, norms, clip=float(server["clip"]), seed=t)
                delivered = Delivery({k: v.sum(0) for k, v in out.messages.items()}, 50, 50)
                server = alg.server_update(t, server, delivered, ServerContext(1, t))
            low, high = torch.quantile(norms, gamma - 0.1), torch.quantile(norms, gamma + 0.1)
            assert low <= server["clip"] <= high, (gamma, start, float(server["clip"]))


def test_bad_keys_name_themselves():
    with pytest.raises(ConfigError, match="algorithm.count_noise = 0.4 .*z_Delta"):
        algorithm(target_quantile=0.5, count_noise=0.4, noise_multiplier=0.5)  # fixed: z_b = sigma_b = 0.4 < z
    with pytest.raises(ConfigError, match="algorithm.weight_records"):
        algorithm(weighting="records")
    with pytest.raises(ConfigError, match="algorithm.client_sampling = 'round_robin'"):
        algorithm(sampling="round_robin")
    with pytest.raises(ConfigError, match="algorithm.noise_at = 'nowhere'"):
        algorithm(noise_at="nowhere")


MINIMAL = """
[algorithm]
name = "dp-fedavg-user"
rounds = 3

[data]
name = "synthetic"
num_clients = 20
samples_per_client = 30
"""


def test_a_minimal_config_runs_through_the_cli_and_the_api(tmp_path, capsys):
    path = tmp_path / "user.toml"
    path.write_text(MINIMAL)
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["privacy"]["unit"] == USER_LEVEL and results["privacy"]["neighboring"] == "replace_one"
    epsilon = results["final"]["epsilon"]
    assert set(epsilon) == {"third_party", "server", "other_silo"}
    assert all(math.isfinite(e) and e > 0 for e in epsilon.values())
    assert epsilon["server"] > epsilon["other_silo"] > epsilon["third_party"]  # one share < the cohort less one < all
    api = dpfl.run({"algorithm": {"name": NAME, "rounds": 3}, "data": {"name": "synthetic", "num_clients": 20,
                                                                       "samples_per_client": 30}})
    assert api.privacy["unit"] == USER_LEVEL
    assert api.final["epsilon"] == pytest.approx(epsilon)


def test_privacy_epsilon_sets_z_and_calibrate_run_answers(tmp_path, capsys):
    """Central DP behind a trusted server: privacy.epsilon = 2 is spent towards the third party and other silos
    (within 1e-3 below), and `dpfl calibrate run` at the run's keys finds the same z."""
    overrides = ["--set", "algorithm.noise_at='server'", "--set", "algorithm.client_sampling='poisson'",
                 "--set", "privacy.boundary='trusted'", "--set", "algorithm.target_quantile=0.5",
                 "--set", "algorithm.count_noise=5.0"]
    path = tmp_path / "user.toml"
    path.write_text(MINIMAL)
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress", *overrides,
                 "--set", "privacy.epsilon=2.0"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    spent = results["final"]["epsilon"]
    assert set(spent) == {"third_party", "other_silo"}
    assert 2.0 * (1 - 1e-3) <= spent["other_silo"] <= 2.0
    capsys.readouterr()
    assert main(["calibrate", "run", str(path), "--target-epsilon", "2", "--observer", "other_silo", "--json",
                 *overrides]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["noise_key"] == "algorithm.noise_multiplier"
    rerun = tmp_path / "at"
    assert main(["run", str(path), "--out", str(rerun), "--no-progress", *overrides,
                 "--set", f"algorithm.noise_multiplier={answer['noise_multiplier']!r}"]) == 0
    again = json.loads((rerun / "results.json").read_text())["final"]["epsilon"]
    assert again["other_silo"] <= 2.0 and again["other_silo"] == pytest.approx(spent["other_silo"], rel=1e-3)


def test_privacy_epsilon_solves_z_whatever_the_count_noise_and_names_the_smallest_that_works():
    """The pair of draws composes to z, so privacy.epsilon solves the z of plain clipping, and the search tries its
    levels on the default split (``searched_section``: sigma_b follows z), so no trial level is refused: before, the
    search started just below z_b and a target that needed z >= z_b was refused naming the search's start, not the
    answer. The run's own count_noise is then checked at the solved z: z_b = 2 sigma_b must exceed it, so the error
    names sigma_b > z s_b = z / 2 (Poisson), the bound just above which the run builds."""
    from dpfl.algorithms import registry
    from dpfl.engine.boundary import Boundary
    from dpfl.experiments.noise_level import build_calibrated, noise_for_epsilon

    spec = registry.spec_of(NAME)
    setting = Setting(client_rate=0.2, client_sampling="poisson", num_clients=20, train_counts=(24,) * 20, rounds=3,
                      delta=1e-5, epsilon=2.0)

    def config(**keys):
        return DpFedAvgUserConfig(noise_at="server", **keys)

    z = noise_for_epsilon(spec, NAME, config(), setting, Boundary("trusted"))
    assert 1 < z < 3  # the old start (0.5) walked 0.5, 1, 4: past 1.2 z
    solved = {noise_for_epsilon(spec, NAME, config(target_quantile=0.5, count_noise=count_noise), setting,
                                Boundary("trusted"))
              for count_noise in (None, 0.6 * z, 0.45 * z)}  # the default, z_b = 1.2 z, z_b = 0.9 z: one search
    assert len(solved) == 1 and solved.pop() == pytest.approx(z, rel=1e-6)  # the pair's PLD: z's to 1e-8
    z = noise_for_epsilon(spec, NAME, config(target_quantile=0.5), setting, Boundary("trusted"))
    low = 0.45 * z
    with pytest.raises(ConfigError, match=rf"algorithm.count_noise = {low!r} .*more than z s_b = {z / 2:.6g} "
                                          rf"\(z = {z:.6g}, the round's noise multiplier"):
        build_calibrated(NAME, config(target_quantile=0.5, count_noise=low), setting, Boundary("trusted"))
    just_above = build_calibrated(NAME, config(target_quantile=0.5, count_noise=z / 2 * (1 + 1e-6)), setting,
                                  Boundary("trusted"))
    assert just_above.mechanism.noise_multiplier == z and just_above.adaptive.count_multiplier > z


def test_the_default_count_noise_is_andrews_on_large_cohorts_and_leaves_room_on_small_ones():
    """sigma_b = max(m / 20, s_b z / sqrt(0.1)): Andrew et al.'s m / 20 at their cohorts (m = 100, z = 1, Poisson: 5,
    z_b = 10, z_Delta = 1.005 z), and on a cohort of 2 (10 clients at rate 0.2, replace-one) the count's share of
    the round's mu^2 capped at 0.1: z_b = z / sqrt(0.1), z_Delta = z / sqrt(0.9)."""
    from dpfl.algorithms.dp_fedavg_user import COUNT_SHARE, default_count_noise, update_multiplier

    assert COUNT_SHARE == 0.1
    assert default_count_noise(100, 1.0, 0.5) == 5.0
    assert update_multiplier(1.0, 10.0) == pytest.approx(1.0050378, abs=1e-7)
    small = algorithm(clients=10, rate=0.2, noise_multiplier=2.0, target_quantile=0.5)
    assert small.adaptive.count_noise == pytest.approx(2.0 / math.sqrt(0.1), rel=1e-15)  # m / 20 = 0.1 would refuse
    assert small.noise_multipliers == pytest.approx({"z": 2.0, "z_delta": 2.0 / math.sqrt(0.9),
                                                     "z_b": 2.0 / math.sqrt(0.1), "sigma_b": 2.0 / math.sqrt(0.1)},
                                                    rel=1e-12)


def test_adaptive_clipping_with_privacy_epsilon_runs_out_of_the_box_on_ten_clients():
    """Issue 35: 10 clients, cohorts of 5 (fixed size, the default), adaptive clipping at its defaults and
    privacy.epsilon = 2 was refused (count_noise = 5 / 20 = 0.25 against z ~ 3). It now runs and spends the target
    towards another silo; results.json reports the solved z and its split (privacy.noise_multipliers: z_b = z /
    sqrt(0.1), z_Delta = z / sqrt(0.9), sigma_b = z_b s_b with s_b = 1), and each round's clip C_t, from C_0 = 1."""
    config = {"algorithm": {"name": NAME, "rounds": 3, "client_rate": 0.5, "target_quantile": 0.5, "clip": 1.0},
              "data": {"name": "synthetic", "num_clients": 10, "samples_per_client": 30},
              "privacy": {"epsilon": 2.0}, "run": {"noise_seed": 0}}
    results = dpfl.run(config)
    assert results.status == "finished"
    assert 2.0 * (1 - 1e-3) <= results.final["epsilon"]["other_silo"] <= 2.0
    solved = results.privacy["noise_multipliers"]
    z = solved["z"]
    assert 1 < z < 10
    assert solved == pytest.approx({"z": z, "z_delta": z / math.sqrt(0.9), "z_b": z / math.sqrt(0.1),
                                    "sigma_b": z / math.sqrt(0.1)}, rel=1e-12)
    clips = [row["clip"] for row in results.rounds]
    assert len(clips) == 3 and clips[0] == 1.0 and all(c > 0 and c != 1.0 for c in clips[1:])


def test_calibrate_run_answers_z_and_names_the_count_noise_it_needs(tmp_path, capsys):
    """`dpfl calibrate run` searches the default split too: a config whose count_noise is below z s_b at the answer
    is refused naming algorithm.count_noise and that bound at the z the same config without it is given (before,
    the refusal named z = 1, the search's first trial)."""
    path = tmp_path / "user.toml"
    keys = ("[algorithm]\nname = 'dp-fedavg-user'\nrounds = 3\nclient_rate = 0.5\ntarget_quantile = 0.5\n"
            "[data]\nname = 'synthetic'\nnum_clients = 10\nsamples_per_client = 30\n")
    path.write_text(keys)
    command = ["calibrate", "run", str(path), "--target-epsilon", "2", "--observer", "other_silo", "--json"]
    assert main(command) == 0
    z = json.loads(capsys.readouterr().out)["noise_multiplier"]
    path.write_text(keys.replace("target_quantile = 0.5\n", "target_quantile = 0.5\ncount_noise = 0.25\n"))
    assert main(command) == 2
    assert f"algorithm.count_noise = 0.25 is not allowed: expected more than z s_b = {z:.6g} (z = {z:.6g}" in \
        capsys.readouterr().err


def test_each_row_reports_the_clip_its_round_used():
    """results.json's per-round "clip" is C_t, the clip in the server state the round started from (the next
    round's C_{t+1} is in the state after it); without adaptive clipping, the configured C in every row."""
    keys = {"algorithm": {"name": NAME, "rounds": 3, "client_rate": 0.5, "noise_multiplier": 1.0, "clip": 0.7},
            "data": {"name": "synthetic", "num_clients": 10, "samples_per_client": 20}, "run": {"noise_seed": 1}}
    adaptive = dpfl.build({**keys, "algorithm": {**keys["algorithm"], "target_quantile": 0.5, "clip_lr": 1.0}})
    used = []
    for _ in range(3):
        used.append(float(adaptive.state.server["clip"]))
        adaptive.step()
        assert adaptive.evaluate().to_dict()["clip"] == used[-1]
    assert used[0] == pytest.approx(0.7) and len(set(used)) == 3
    fixed = dpfl.build(keys)
    assert [m.to_dict()["clip"] for m in fixed.run(3)] == [pytest.approx(0.7)] * 3


def test_fixed_cohorts_on_data_that_brings_its_own_clients(tmp_path):
    """Issue 35: with data.num_clients unset (the data's own clients: an npz 'client' array, or dpfl.build's
    (x, y, ids)), the config check built the algorithm on a stand-in population of one client, where a fixed-size
    cohort at client_rate = 0.5 holds floor(0.5) = 0 clients, and refused it. The run now checks the real cohort."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((120, 3)).astype("float32"), rng.integers(0, 2, 120)
    ids = np.repeat(np.arange(10), 12)
    sim = dpfl.build({"algorithm": {"name": NAME, "rounds": 2, "client_rate": 0.5, "noise_multiplier": 1.0}},
                     data=(x, y, ids))
    assert (sim.algorithm.client_sampling, sim.algorithm.denominator, sim.algorithm.shares) == ("fixed", 5.0, 5)
    np.savez(tmp_path / "own.npz", x=x, y=y, client=ids)
    (tmp_path / "own.toml").write_text(f"[data]\nname = 'npz'\npath = '{tmp_path / 'own.npz'}'\n[algorithm]\n"
                                       f"name = '{NAME}'\nrounds = 2\nclient_rate = 0.5\nnoise_multiplier = 1.0\n")
    assert main(["run", str(tmp_path / "own.toml"), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "finished" and results["privacy"]["noise_multipliers"] == {"z": 1.0}


def test_shares_run_under_real_secure_aggregation():
    """Distributed DP as deployed: the real protocol sums the shares (clamped at w_max C + 12 share stds), giving the
    simulated sum's model up to its rounding; adaptive clipping has no fixed bound and is refused, naming the key."""
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import build_simulation

    keys = [f"algorithm.name='{NAME}'", "data.num_clients=6", "data.samples_per_client=30", "algorithm.client_rate=0.5",
            "algorithm.rounds=2", "algorithm.noise_multiplier=1.0", "privacy.boundary='secagg'", "run.noise_seed=3"]
    real = build_simulation(load_config(None, [*keys, "privacy.secure_aggregation=true"]))
    simulated = build_simulation(load_config(None, keys))
    assert real.boundary.secure is not None
    assert real.algorithm.message_bound(None)["u"] == pytest.approx(1.0 + 12 * 2.0 / 3**0.5)  # shares z 2C / sqrt(3)
    real.run(2)
    simulated.run(2)
    torch.testing.assert_close(real.model, simulated.model, rtol=0, atol=1e-5)
    with pytest.raises(ConfigError, match="privacy.secure_aggregation"):
        build_simulation(load_config(None, [*keys, "privacy.secure_aggregation=true", "algorithm.target_quantile=0.5",
                                            "algorithm.count_noise=5.0"]))


def amplified_setting(analysis: str, rounds: int = 200) -> Setting:
    """M = 1000, q = 0.05 (Poisson), T rounds, delta = 1e-6: docs/user-level.md's example."""
    return Setting(client_rate=0.05, client_sampling="poisson", num_clients=1000, train_counts=(1,) * 1000,
                   rounds=rounds, delta=1e-6, analysis=analysis)


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_paper_analysis_is_dp_accountings_poisson_subsampled_gaussian(adaptive):
    """privacy.analysis = 'paper' charges the third party and other silos of server noise McMahan et al.'s amplified
    epsilon: dp_accounting's PLD of PoissonSampledDpEvent(q, GaussianDpEvent(z)) composed T times (5.4859 at M = 1000,
    q = 0.05, T = 200, z = 1, delta = 1e-6), to its precision; with adaptive clipping the pair's draws share the
    owner's participation and compose to the one Gaussian at z. The default gives the same where the cohort is secret,
    and the participation mixture, 25.927, where it is published (docs/user-level.md)."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    from dpfl.engine.boundary import Boundary
    from dpfl.engine.sampling import ClientSampler
    from dpfl.experiments.noise_level import declared_epsilon

    keys = {"target_quantile": 0.5, "count_noise": 10.0} if adaptive else {}
    config = DpFedAvgUserConfig(noise_at="server", noise_multiplier=1.0, **keys)
    clients = ClientSampler(1000, 0.05, "poisson")
    spent = {analysis: declared_epsilon(build(NAME, config, amplified_setting(analysis)), amplified_setting(analysis),
                                        Boundary("trusted"), clients)
             for analysis in ("sound", "paper")}
    spent["published"] = declared_epsilon(build(NAME, config, amplified_setting("sound")), amplified_setting("sound"),
                                          Boundary("trusted", cohort="published"), clients)
    reference = pld_privacy_accountant.PLDAccountant()
    reference.compose(dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(1.0)), 200)
    assert reference.get_epsilon(1e-6) == pytest.approx(5.4859, abs=1e-4)
    for observer in ("third_party", "other_silo"):
        assert spent["paper"][observer] == pytest.approx(reference.get_epsilon(1e-6), rel=1e-6)
        assert spent["sound"][observer] == pytest.approx(reference.get_epsilon(1e-6), rel=1e-6)
        assert spent["published"][observer] == pytest.approx(25.9271, abs=1e-4)


def test_the_paper_analysis_is_refused_where_the_cohort_cannot_be_secret():
    """McMahan et al.'s amplification holds for the server's own noise under secret Poisson cohorts only: other noise
    placements, fixed-size cohorts and public cohorts are refused, naming the key."""
    from dp_accounting import dp_event

    from dpfl.engine.boundary import Boundary
    from dpfl.engine.sampling import ClientSampler
    from dpfl.engine.simulator import declare_round

    def paper(sampling="poisson", **keys):
        config = DpFedAvgUserConfig(**{"noise_multiplier": 1.0, **keys})
        return build(NAME, config, Setting(client_rate=0.4, client_sampling=sampling, num_clients=10,
                                           train_counts=(3,) * 10, rounds=1, delta=1e-5, analysis="paper"))

    for placement in ("shares", "client"):
        with pytest.raises(ConfigError, match=f"algorithm.noise_at = '{placement}' .*'server' under privacy.analysis"):
            paper(noise_at=placement)
    with pytest.raises(ConfigError, match="algorithm.client_sampling = 'fixed' .*'poisson' under privacy.analysis"):
        paper("fixed", noise_at="server")
    alg = paper(noise_at="server")
    counts = torch.full((10,), 3)
    public = ClientSampler(10, 0.4, "poisson", public_seed=0)
    with pytest.raises(ConfigError, match="privacy.analysis = 'paper' .*cohorts are public"):
        declare_round(alg, Boundary("trusted"), public, "paper", 0, alg.init_state(torch.zeros(1), 10), counts)
    secret = ClientSampler(10, 0.4, "poisson")
    _, views = declare_round(alg, Boundary("trusted"), secret, "paper", 0, alg.init_state(torch.zeros(1), 10), counts)
    amplified = dp_event.PoissonSampledDpEvent(0.4, dp_event.GaussianDpEvent(1.0))
    assert views == {"third_party": amplified, "other_silo": amplified}


def test_the_paper_analysis_states_its_assumption_in_results(tmp_path):
    """A run under the paper analysis reports McMahan et al.'s assumption (privacy.assumptions) and nothing unproven;
    the default run of the same keys states in privacy.cohort who the cohort is secret from and spends the same
    towards them, and a run whose cohort is published spends more."""
    from dpfl.accounting.observers import COHORT_SECRET

    config = {"algorithm": {"name": NAME, "rounds": 3, "noise_at": "server", "client_sampling": "poisson",
                            "noise_multiplier": 1.0},
              "data": {"name": "synthetic", "num_clients": 20, "samples_per_client": 30},
              "privacy": {"boundary": "trusted"}}
    sound = dpfl.run(config)
    paper = dpfl.run({**config, "privacy": {"boundary": "trusted", "analysis": "paper"}})
    assert paper.privacy["assumptions"] == {"cohort": COHORT_SECRET}
    assert "McMahan et al. 2018, Thm 1" in COHORT_SECRET and "secret from the third party" in COHORT_SECRET
    assert paper.privacy["analysis"] == "paper" and paper.privacy["unproven"] == []
    assert "assumptions" not in sound.privacy
    assert sound.privacy["cohort"]["setting"] == "secret"
    assert sound.privacy["cohort"]["secret_from"] == ["third_party", "other_silo"]
    published = dpfl.run({**config, "privacy": {"boundary": "trusted", "cohort": "published"}})
    assert published.privacy["cohort"]["known_to"] == ["third_party", "other_silo"]
    for observer in ("third_party", "other_silo"):
        assert paper.final["epsilon"][observer] == pytest.approx(sound.final["epsilon"][observer], rel=1e-9)
        assert sound.final["epsilon"][observer] < published.final["epsilon"][observer]
