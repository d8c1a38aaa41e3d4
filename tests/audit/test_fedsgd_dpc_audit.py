"""The audit of FedSGD-DPC (Zhou et al. 2021) through the protocol alone: the canaries wrap ctx.grads, the scores read
its messages {dx, weight}, trials carry a leading axis on its server state. Planted bugs (Laplace noise halved,
l1 clipping skipped, one noise draw reused by every client) are caught; the correct algorithm stays at or below its
claim (Laplace and Gaussian, every observer)."""

import dataclasses

import pytest
import torch

import dpfl.noise as noise
from dpfl.audit import response, runs
from dpfl.engine.grads import CohortGradients
from dpfl.engine.protocol import ClientContext, ClientData, ServerContext
from dpfl.errors import ConfigError
from shared_noise import share_noise_streams

DELTA = 1e-2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def dpc(mechanism: str, clients: int = 1, epsilon: float = 1.0, *extra):
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import build_simulation

    return build_simulation(load_config(None, [
        f"data.num_clients={clients}", "data.samples_per_client=20", "algorithm.name='fedsgd-dpc'",
        f"algorithm.mechanism='{mechanism}'", "algorithm.rounds=1", f"privacy.epsilon={epsilon!r}",
        f"privacy.delta={DELTA!r}", "run.noise_seed=0", *extra]))


def test_the_score_weights_its_messages_by_the_canarys_measured_shift():
    """dx = -eta d_i (g_i + w_i): the Dirac canary (C e) against its replace-one neighbour (-C e) shifts the mean
    gradient by Delta = 2C / |B| along e, so dx by -eta d_i Delta; the count message 'weight' has no parameter axis
    and is left out; the model moves by dx / d_i (normalized aggregation of one reply)."""
    sim = dpc("laplace")
    d = int(sim.train.counts[0])
    shift = response.responses(sim, runs.make_canary(sim, "dirac"), 0)
    assert set(shift) == {"dx", "x"}
    assert shift["dx"] == pytest.approx(-sim.algorithm.lr * d * 2 * sim.algorithm.clip / d, rel=1e-6)
    assert shift["x"] == pytest.approx(shift["dx"] / d, rel=1e-6)
    weights = response.score_weights(shift)
    assert weights["dx"] == pytest.approx(1 / shift["dx"])


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_client_round_takes_a_server_state_per_row(mechanism):
    """Rows with their own server models (the audit's trial axis) give what one call per row gives."""
    sim = dpc(mechanism, 3)
    algorithm, train = sim.algorithm, sim.train
    models = torch.randn(3, sim.grads.initial_params().shape[0])
    rows = torch.arange(3)
    data = ClientData(train.x, train.y, train.counts)
    batched = algorithm.client_round(0, {"x": models}, {}, data, ClientContext(sim.grads, 0, 0, rows))
    for i in range(3):
        one = algorithm.client_round(0, {"x": models[i]}, {}, ClientData(train.x[[i]], train.y[[i]],
                                                                         train.counts[[i]]),
                                     ClientContext(sim.grads, 0, 0, rows[[i]]))
        assert torch.allclose(batched.messages["dx"][i], one.messages["dx"][0], atol=1e-6)
    stepped = algorithm.server_update(0, {"x": models}, type("D", (), {
        "count": 1, "population": 3, "sum": lambda self, name: batched.messages[name]})(), ServerContext(0, 0))
    assert torch.allclose(stepped["x"], models + batched.messages["dx"] / batched.messages["weight"])


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_correct_fedsgd_dpc_stays_at_or_below_its_claim(mechanism):
    """Four clients, privacy.epsilon = 1, every observer, 1000 runs per world. The server sees the owner's reply: a
    single Laplace (pure epsilon 1, the claim) or Gaussian release, so its audit is the tightest; the Laplace shares of
    the other clients are not credited to the third party (the claim stays 1), the Gaussian ones are."""
    sim = dpc(mechanism, 4)
    results = runs.audit_all(sim, ("third_party", "server", "other_silo"), 1000)
    for result in results.values():
        assert result.bound.epsilon <= result.claimed_epsilon
    assert results["server"].claimed_epsilon == pytest.approx(1.0, abs=1e-3)
    assert results["server"].bound.epsilon > 0.3


def test_planted_bug_laplace_noise_halved_is_caught(monkeypatch):
    """One client, epsilon 1: the mechanism draws Laplace noise of half the scale its event declares (the ledger is
    unchanged): true epsilon 2. Measured (1000 runs per world): correct 0.65, halved 1.60."""
    sim = dpc("laplace")
    honest = runs.audit(sim, "server", 1000)
    original = noise.laplace_noise
    monkeypatch.setattr(noise, "laplace_noise", lambda *args, **kwargs: 0.5 * original(*args, **kwargs))
    buggy = runs.audit(sim, "server", 1000)
    assert honest.bound.epsilon <= honest.claimed_epsilon == buggy.claimed_epsilon
    assert buggy.bound.epsilon > buggy.claimed_epsilon


def test_planted_bug_l1_clipping_skipped_is_caught(monkeypatch):
    """The per-example gradients are summed unclipped whenever the l1 norm is asked for. An input canary (a real
    record far from the data, raw l1 gradient norm 31 xi) replaces a record of the owner; the white-box score reads
    dx along the canary's clipped gradient. One client, epsilon 4 (a smaller epsilon puts the bug's effect below
    what 1000 runs can certify through this projection). Measured: correct 0.00, clipping skipped 4.91."""
    sim = dpc("laplace", 1, 4.0)
    honest = runs.audit(sim, "server", 1000, canary_kind="input")
    original = CohortGradients.clipped_sum

    def unclipped_l1(self, theta, x, y, mask, clip, norm="l2"):
        return original(self, theta, x, y, mask, None if norm == "l1" else clip, norm)

    monkeypatch.setattr(CohortGradients, "clipped_sum", unclipped_l1)
    buggy = runs.audit(sim, "server", 1000, canary_kind="input")
    assert honest.bound.epsilon <= honest.claimed_epsilon == buggy.claimed_epsilon == pytest.approx(4.0)
    assert buggy.bound.epsilon > buggy.claimed_epsilon


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_planted_bug_one_noise_draw_reused_by_every_client_is_caught(mechanism, monkeypatch):
    """Every client of a trial draws the SAME noise (the stream named without the client). Another silo knows its
    own draw, hence everyone's: with equal counts, dx_j = -eta d (g_j + w), so sum - M own (``silo_weight`` = M) is
    noise-free. Four clients, epsilon 1; claims 1.00 (Laplace: no credit) and 0.48 (Gaussian: credited). Measured
    (500 runs per world): correct 0.00 and 0.00; reused 4.51 and 4.72."""
    clients = 4
    sim = dpc(mechanism, clients)
    honest = runs.audit(sim, "other_silo", 500, silo_weight=clients)
    share_noise_streams(monkeypatch, clients)
    buggy = runs.audit(sim, "other_silo", 500, silo_weight=clients)
    assert honest.claimed_epsilon == buggy.claimed_epsilon <= 1.0 + 1e-9
    assert honest.bound.epsilon <= honest.claimed_epsilon
    assert buggy.bound.epsilon > 3 * buggy.claimed_epsilon


def test_two_rounds_compose_and_each_trial_keeps_its_model():
    """Two rounds: each client replies twice (eps / 2 per reply), so the claim of both rounds is the budget and that
    of round 0 half of it; the summed white-box scores stay below the 2-round claim."""
    sim = dpc("laplace", 1, 2.0, "algorithm.rounds=2")
    one, two = runs.claimed_epsilon(sim, "server"), runs.claimed_epsilon(sim, "server", rounds=2)
    assert (one, two) == (pytest.approx(1.0), pytest.approx(2.0))
    result = runs.audit(sim, "server", 300, rounds=2)
    assert result.bound.epsilon <= result.claimed_epsilon == pytest.approx(2.0)


class OwnGradients:
    """The model's gradients computed past the oracle an algorithm is handed: the canary's marks read as plain labels
    and its extra coordinates get no gradient."""

    def __init__(self, oracle):
        self.base = getattr(oracle, "base", oracle)

    def clipped_sum(self, theta, x, y, mask, clip, **kwargs):
        params = self.base.initial_params().shape[0]
        own = self.base.clipped_sum(theta[:, :params], x, y.clamp(min=0), mask, clip, **kwargs)
        return torch.cat([own, torch.zeros(theta.shape[0], theta.shape[1] - params, dtype=own.dtype)], dim=1)


class Bypass:
    """FedSGD-DPC with its gradients from ``OwnGradients``."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def client_round(self, round_index, server, clients, data, ctx):
        own = dataclasses.replace(ctx, grads=OwnGradients(ctx.grads))
        return self._inner.client_round(round_index, server, clients, data, own)


def test_an_algorithm_that_does_not_carry_the_canary_is_named(monkeypatch):
    """Its messages never move with the canary: a ConfigError naming what is missing, not a bound of 0."""
    sim = dpc("gaussian", 2)
    monkeypatch.setattr(sim, "algorithm", Bypass(sim.algorithm))
    with pytest.raises(ConfigError, match="no message moved with the canary"):
        runs.audit(sim, "server", 20)
