"""run.secure_noise end to end, and where it is refused.

A tiny dp-fedavg run (2 rounds) with secure noise trains, its ledger holds the discrete Gaussian events, every noisy
gradient a client releases lies on its grid (gamma_i Z^d: a hook on the mechanism), the noise comes from the ChaCha20
streams (the noisy gradients differ from the default mode's at the same noise key), and its epsilon is at least the
default mode's at the same noise multiplier. Every path whose accounting the secure mode does not cover is refused
at config time, naming the key.
"""

from __future__ import annotations

import json

import pytest
import torch
from dp_accounting import dp_event, privacy_accountant

from dpfl.accounting.accountants import PldAccountant
from dpfl.accounting.events import DiscreteGaussianDpEvent
from dpfl.audit.runs import check_audited_noise
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.resolved import resolve
from dpfl.experiments.runner import build_simulation
from dpfl.noise import DiscreteGaussianMechanism, grid_steps

#: A tiny dp-fedavg run: 6 clients of 40 records, 3 in each round, 2 local steps, no weight decay (so that the noisy
#: gradient the mechanism releases is what the local step uses).
TINY = ["algorithm.name='dp-fedavg'", "data.num_clients=6", "data.samples_per_client=40", "algorithm.client_rate=0.5",
        "algorithm.local_steps=2", "algorithm.sample_rate=0.25", "algorithm.noise_multiplier=1.0",
        "algorithm.weight_decay=0.0", "algorithm.lr=0.5", "algorithm.rounds=2", "run.threads=1", "run.noise_seed=3"]
SECURE = [*TINY, "run.secure_noise=true"]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def released_gradients(monkeypatch, mechanism_class) -> list:
    """A hook on ``mechanism_class.__call__``: every (released value, sensitivity) it returns, in order."""
    seen, call = [], mechanism_class.__call__

    def hooked(self, value, sensitivity, randomness):
        released, event = call(self, value, sensitivity, randomness)
        seen.append((released.clone(), sensitivity.clone()))
        return released, event

    monkeypatch.setattr(mechanism_class, "__call__", hooked)
    return seen


def test_a_secure_run_trains_on_the_grid_and_is_charged_the_discrete_events(tmp_path, monkeypatch):
    seen = released_gradients(monkeypatch, DiscreteGaussianMechanism)
    sim = build_simulation(load_config(None, SECURE), tmp_path / "run", noise_key=3)
    dimension = sim.model.numel()
    start = sim.evaluate().train_loss
    metrics = sim.run(2)
    assert metrics[-1].train_loss < start - 0.05  # it trains (log 2 = 0.69 at the start)
    # the ledger charges the discrete events, on the model's d coordinates at k = 9
    ledger = (tmp_path / "run" / "ledger.json").read_text()
    assert ledger.count("DiscreteGaussianDpEvent") >= 1 and '"grid_bits": 9' in ledger
    assert f'"dimension": {dimension}' in ledger and "\"GaussianDpEvent\"" not in ledger
    # 2 rounds x 2 local steps, each a chunk of 3 clients: every released gradient is on its client's grid
    assert len(seen) == 4
    for released, sensitivity in seen:
        gamma = grid_steps(sensitivity, 9).unsqueeze(1)
        assert torch.equal(gamma, 2.0 ** torch.round(torch.log2(gamma)))  # powers of two
        assert bool(((sensitivity.double() / gamma.squeeze(1)) <= 2**9).all())  # gamma >= Delta 2^-9
        units = released.double() / gamma
        assert released.dtype == torch.float32 and torch.equal(units, units.round())
    # epsilon: at least the default mode's at the same z (the rounding is charged, and no Gaussian-specific bound)
    default = build_simulation(load_config(None, TINY), noise_key=3)
    default.run(2)
    secure_eps, default_eps = sim.ledger.epsilon(), default.ledger.epsilon()
    assert set(secure_eps) == set(default_eps)
    assert all(secure_eps[o] >= default_eps[o] for o in secure_eps)
    assert secure_eps["server"] > default_eps["server"] * 1.001


def test_the_secure_noise_comes_from_the_chacha20_streams(monkeypatch):
    """The same run at the same noise key with the default mechanism releases other noisy gradients (its noise is the
    twister's): the secure mode's draws are not the default streams' normals rounded."""
    secure = released_gradients(monkeypatch, DiscreteGaussianMechanism)
    build_simulation(load_config(None, [*SECURE, "algorithm.rounds=1"]), noise_key=3).run(1)
    from dpfl.noise import GaussianMechanism
    default = released_gradients(monkeypatch, GaussianMechanism)
    build_simulation(load_config(None, [*TINY, "algorithm.rounds=1"]), noise_key=3).run(1)
    assert len(secure) == len(default) == 2
    difference = (secure[0][0] - default[0][0]).abs()
    assert float(difference.max()) > float(secure[0][1].max())  # far more than one sensitivity apart


def test_no_observer_is_credited_other_clients_discrete_noise():
    """dp-fedsgd's steps are all additive, so the default mode credits the cohort's other Gaussian shares to the third
    party; discrete Gaussian shares do not sum to a discrete Gaussian, so under secure noise every observer is charged
    the owner's own draws (``observers.scale_noise`` refuses, and the owner's noise is kept)."""
    fedsgd = [*TINY, "algorithm.name='dp-fedsgd'"]
    default = build_simulation(load_config(None, fedsgd), noise_key=3).round_privacy()
    secure = build_simulation(load_config(None, [*fedsgd, "run.secure_noise=true"]), noise_key=3).round_privacy()
    assert default["third_party"] != default["server"]
    assert secure["third_party"] == secure["server"]
    assert "DiscreteGaussianDpEvent" in repr(secure["third_party"])


def test_dp_fedavg_user_with_client_and_server_noise_draws_the_discrete_gaussian():
    for placement in ("client", "server"):
        config = load_config(None, ["algorithm.name='dp-fedavg-user'", "data.num_clients=6",
                                    "data.samples_per_client=30", "algorithm.client_rate=0.5", "algorithm.rounds=1",
                                    "algorithm.noise_multiplier=1.0", f"algorithm.noise_at='{placement}'",
                                    "run.threads=1", "run.secure_noise=true", "run.secure_noise_bits=8"])
        sim = build_simulation(config, noise_key=1)
        d = sim.model.numel()
        release = sim.algorithm.release(0, sim.state, sim.train.counts)
        drawn = release.server_events if placement == "server" else release.step_events
        assert drawn == (DiscreteGaussianDpEvent(1.0, 8, d),)
        before = sim.model.clone()
        sim.run(1)  # the simulator checks the drawn events against these declared ones
        assert not torch.equal(sim.model, before) and bool(torch.isfinite(sim.model).all())


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.name='dp-fedavg-joint'", "data.num_clients=6"], "run.secure_noise"),
    (["algorithm.name='fedsgd-dpc'", "privacy.epsilon=4.0"], "run.secure_noise"),
    (["algorithm.name='fedavg'"], "run.secure_noise"),
    (["algorithm.name='dp-fedavg'", "privacy.analysis='paper'"], "privacy.analysis"),
    (["algorithm.name='dp-fedavg-user'", "privacy.secure_aggregation=true"], "privacy.secure_aggregation"),
    (["algorithm.name='dp-fedavg-user'", "algorithm.noise_at='shares'", "data.num_clients=6"], "algorithm.noise_at"),
    (["algorithm.name='dp-fedavg-user'", "algorithm.noise_at='client'", "algorithm.target_quantile=0.5",
      "data.num_clients=6"], "algorithm.target_quantile"),
    (["algorithm.name='dp-scaffold'", "algorithm.noise_multiplier=100.0"], "run.secure_noise_bits"),
    (["algorithm.name='dp-fedavg'", "run.secure_noise_bits=0"], "run.secure_noise_bits"),
])
def test_what_the_secure_mode_does_not_cover_is_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as refused:
        resolve(load_config(None, [*overrides, "run.secure_noise=true"]))  # before any data is built
    assert refused.value.field == key


def test_z_out_of_the_samplers_range_names_the_largest_grid_exponent():
    """Noble et al.'s z = 60 fits the default k = 9 (z 2^9 = 30720); z = 100 needs k <= 8 (z 2^9 = 51200 > 3.9e4)."""
    resolve(load_config(None, ["algorithm.name='dp-scaffold'", "algorithm.noise_multiplier=60.0",
                               "run.secure_noise=true"]))
    with pytest.raises(ConfigError, match="at most 8 for the noise multiplier z = 100"):
        resolve(load_config(None, ["algorithm.name='dp-scaffold'", "algorithm.noise_multiplier=100.0",
                                   "run.secure_noise=true"]))
    resolve(load_config(None, ["algorithm.name='dp-scaffold'", "algorithm.noise_multiplier=100.0",
                               "run.secure_noise=true", "run.secure_noise_bits=8"]))


def test_the_pld_accountant_refuses_the_discrete_event_and_the_audit_refuses_the_run():
    event = dp_event.PoissonSampledDpEvent(0.1, DiscreteGaussianDpEvent(1.0, 10, 100))
    accountant = PldAccountant(privacy_accountant.NeighboringRelation.REPLACE_SPECIAL)
    assert not accountant.supports(event)
    with pytest.raises(privacy_accountant.UnsupportedEventError):
        accountant.compose(event)
    sim = build_simulation(load_config(None, [*SECURE, "algorithm.rounds=1"]), noise_key=3)
    with pytest.raises(ConfigError) as refused:
        check_audited_noise(sim)
    assert refused.value.field == "run.secure_noise"


def test_the_secure_keys_are_part_of_the_release_config():
    from dpfl.experiments.run_directory import release_hash

    hashes = {release_hash(load_config(None, o)) for o in (TINY, SECURE, [*SECURE, "run.secure_noise_bits=11"])}
    assert len(hashes) == 3
    assert json.dumps(load_config(None, SECURE)["run"]["secure_noise"]) == "true"


def test_the_memory_plan_counts_the_int64_draws():
    """A client's K = 2 draws of d coordinates take 8 bytes a coordinate under secure noise (int64), 4 by default."""
    default = build_simulation(load_config(None, TINY), noise_key=3)
    secure = build_simulation(load_config(None, SECURE), noise_key=3)
    assert secure.client_bytes() - default.client_bytes() == 2 * 4 * secure.model.numel()
