"""The server's side of the algorithm contract (``dpfl.engine.protocol.ServerContext``, ``Release.server_events``):
a family whose server adds the noise (``central-gaussian``, tests/helpers/server_noise.py) draws from the server's own
secret stream, its draws are checked against its declaration as the clients' are, the observers of the model are
charged them, and a resumed run replays them."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event

from dpfl.accounting.events import ParticipationDpEvent
from dpfl.audit.trials import TrialFailure, World, run_world
from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY, Cohort, Release, observer_events
from dpfl.engine import randomness
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import ServerContext
from dpfl.errors import DpflError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
from server_noise import NAME, register_central_gaussian

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def central(monkeypatch):
    register_central_gaussian(monkeypatch)


def simulation(*extra: str, out=None, noise_key=None):
    return build_simulation(load_config(None, [
        f"algorithm.name='{NAME}'", "data.num_clients=6", "data.samples_per_client=30", "run.seed=1",
        "algorithm.client_rate=0.5", "algorithm.rounds=4", *extra]), out, noise_key=noise_key)


class Declaring:
    """The algorithm ``inner`` with the server draws of its release replaced by ``server_events``."""

    def __init__(self, inner, server_events):
        self._inner, self._server_events = inner, tuple(server_events)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def release(self, round_index, state, counts):
        declared = self._inner.release(round_index, state, counts)
        return Release(declared.step_events, declared.additive, server_events=self._server_events)


def test_the_server_draws_from_its_own_stream_of_the_noise_key_and_reports_the_event(central):
    """x - lr (sum + z Delta N) / count, N the standard normals of stream (key, round, SERVER, "server_noise")."""
    alg = simulation().algorithm
    total, x = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.1, 0.2, 0.3])
    ctx = ServerContext(seed=7, round=3)
    updated = alg.server_update(3, {"x": x}, Delivery({"g": total}, 2, 6), ctx)["x"]
    normals = torch.randn(3, generator=randomness.generator(7, 3, randomness.SERVER, "server_noise"))
    expected = x - alg.lr * (total + alg.mechanism.noise_multiplier * alg.sensitivity * normals) / 2
    assert torch.allclose(updated, expected, atol=1e-6) and not torch.allclose(updated, x - alg.lr * total / 2)
    assert ctx.events == [dp_event.GaussianDpEvent(alg.mechanism.noise_multiplier)]


def test_the_simulator_hands_the_server_the_runs_secret_key_and_the_round(central):
    """Round 1 of a run with z = 1 and of its twin with z = 0 (the same cohort and minibatches: no client draws
    noise) differ by lr z Delta N / count, N the stream (the run's noise key, round 0, SERVER, "server_noise")."""
    noisy = simulation()
    plain = simulation("algorithm.noise_multiplier=0.0", noise_key=noisy.seed)
    noisy.step()
    plain.step()
    alg, count = noisy.algorithm, noisy.clients.sample(0, noisy.seed).numel()
    normals = (plain.model - noisy.model) * count / (alg.lr * alg.mechanism.noise_multiplier * alg.sensitivity)
    expected = torch.randn(normals.shape, generator=randomness.generator(noisy.seed, 0, randomness.SERVER,
                                                                          "server_noise"))
    assert torch.allclose(normals, expected, atol=1e-4)


def test_server_streams_are_the_servers_own_continue_across_draws_and_give_each_row_its_own():
    ctx = ServerContext(seed=7, round=0)
    first, second = ctx.streams().normal((4,)), ctx.streams().normal((4,))
    both = torch.randn(8, generator=randomness.generator(7, 0, randomness.SERVER, "server_noise"))
    assert torch.equal(torch.cat([first, second]), both)
    for purpose in ("noise", "cohort", "shuffle"):  # never a client's noise, the cohort draw or the shuffler's
        assert not torch.equal(first, torch.randn(4, generator=randomness.generator(7, 0, randomness.SERVER, purpose)))
    with pytest.raises(ValueError, match="not a server step's stream"):
        ctx.streams("shuffle")
    with pytest.raises(ValueError, match="the server step's stream, not a client's"):  # audit rows share client ids
        randomness.ClientStreams(7, 0, [0], "server_noise")
    rows = ServerContext(seed=7, round=0, stream_ids=torch.tensor([0, 1])).streams().normal((4,))
    assert rows.shape == (2, 4) and not torch.equal(rows[0], rows[1])
    assert torch.equal(rows[1], torch.randn(4, generator=randomness.generator(7, 0, 1, "server_noise")))


@pytest.mark.parametrize("declared", [(), (dp_event.GaussianDpEvent(2.0),),
                                      (dp_event.GaussianDpEvent(1.0), dp_event.GaussianDpEvent(1.0))],
                         ids=["undeclared", "other noise", "one draw too few"])
def test_a_server_draw_other_than_declared_stops_the_round_before_its_state_is_kept(central, declared):
    sim = simulation()
    x0 = sim.model.clone()
    sim.algorithm = Declaring(sim.algorithm, declared)
    with pytest.raises(DpflError, match="drawn by the server .* differs from the noise declared"):
        sim.step()
    assert torch.equal(sim.model, x0) and sim.next_round == 0


def test_an_existing_family_declares_and_draws_nothing_on_the_server():
    """The server stream is new: a family that declares no server draws is held to drawing none."""
    sim = build_simulation(load_config(None, [
        "algorithm.name='dp-fedavg'", "data.num_clients=6", "data.samples_per_client=30", "algorithm.local_steps=2",
        "algorithm.client_rate=0.5", "algorithm.noise_multiplier=1.0"]))
    assert sim.algorithm.release(0, sim.state, sim.train.counts).server_events == ()
    sim.algorithm = Declaring(sim.algorithm, (dp_event.GaussianDpEvent(1.0),))  # declared, never drawn
    with pytest.raises(DpflError, match="drawn by the server"):
        sim.step()


@pytest.mark.parametrize("boundary", ["plain", "trusted"])
def test_the_server_draws_reach_the_ledger_of_the_observers_that_see_the_model(central, boundary):
    """Third party and other silo: the server's record-sampled Gaussian within the owner's participation (p = 3/6;
    another silo: 3/5); the server (plain) sees the unnoised means: epsilon = inf; trusted: no server observer."""
    sim = simulation(f"privacy.boundary='{boundary}'")
    sim.step()
    charged = sim.ledger.charged(1)
    drawn = dp_event.SelfComposedDpEvent(  # one draw: floor(0.5 * 24) of a client's 24 train records
        dp_event.SampledWithoutReplacementDpEvent(24, 12, dp_event.GaussianDpEvent(1.0)), 1)
    assert charged[THIRD_PARTY] == ParticipationDpEvent(0.5, drawn)
    assert charged[OTHER_SILO] == ParticipationDpEvent(0.6, drawn)
    epsilon = sim.ledger.epsilon()
    assert math.isfinite(epsilon[THIRD_PARTY]) and math.isfinite(epsilon[OTHER_SILO])
    if boundary == "plain":
        assert math.isinf(epsilon[SERVER])
    else:
        assert SERVER not in charged


def test_server_events_replace_the_clients_towards_the_model_observers_only():
    """Behind secure aggregation the server sees the (unnoised) sum: it is charged the clients' draws, never its own
    noise; the third party and another silo are charged the server's draws (amplified by the secret cohort towards
    the third party; the members, another silo among them, know the cohort)."""
    gaussian = dp_event.GaussianDpEvent(0.5)
    release = Release((dp_event.GaussianDpEvent(3.0),), (True,), server_events=(gaussian, gaussian))
    events = observer_events(release, Cohort.fixed(10, 5), "secagg")
    assert events[THIRD_PARTY] == dp_event.SampledWithoutReplacementDpEvent(10, 5,
                                                                         dp_event.GaussianDpEvent((2 / 0.5**2) ** -0.5))
    assert events[OTHER_SILO] == ParticipationDpEvent(5 / 9, dp_event.SelfComposedDpEvent(gaussian, 2))
    summed = dp_event.GaussianDpEvent(3.0 * math.sqrt(5))  # the cohort's 5 shares of the additive draw
    assert events[SERVER] == ParticipationDpEvent(0.5, dp_event.SelfComposedDpEvent(summed, 1))
    without = observer_events(Release((dp_event.GaussianDpEvent(3.0),), (True,)), Cohort.fixed(10, 5), "secagg")
    assert events[SERVER] == without[SERVER] and events[THIRD_PARTY] != without[THIRD_PARTY]


def test_a_resumed_run_replays_the_server_noise(central, tmp_path):
    """Stopped after round 2 and resumed by a fresh simulation from the run directory: the same model as the
    uninterrupted run (the server's stream is named by the key and the round), and no round charged twice."""
    first = simulation("run.checkpoint_every=2", out=tmp_path)
    reference = simulation("run.checkpoint_every=2", noise_key=first.seed)
    reference.run(4)
    first.run(2)
    resumed = simulation("run.checkpoint_every=2", out=tmp_path)
    resumed.load_checkpoint(tmp_path)
    assert resumed.next_round == 2
    resumed.run(4)
    assert torch.equal(resumed.model, reference.model)
    assert resumed.ledger.compositions == reference.ledger.compositions == 4
    other_key = simulation("run.checkpoint_every=2", noise_key=first.seed + 1)
    other_key.run(4)
    assert not torch.equal(other_key.model, reference.model)


@pytest.mark.parametrize("declared", [None, ()], ids=["as declared", "undeclared"])
def test_the_audits_trials_give_each_trial_its_own_server_noise_and_check_it(central, declared):
    """The audit's independent trials (rows of the server state): trial k's server draws row k of the trials'
    batched stream (``randomness.batch_generator``: key, round, the first row id index * trials, "server_noise"), as
    the twin without server noise shows; a draw other than declared stops the trials as it stops a round."""
    noisy = simulation("algorithm.client_rate=1.0")
    plain = simulation("algorithm.client_rate=1.0", "algorithm.noise_multiplier=0.0", noise_key=noisy.seed)
    if declared is not None:
        noisy.algorithm = Declaring(noisy.algorithm, declared)
        with pytest.raises(TrialFailure, match="drawn by the server") as caught:  # the audit reports it, naming it
            run_world(noisy, World(noisy.train.x, noisy.train.y, noisy.grads), 1, 3, 1, lambda view: None)
        assert isinstance(caught.value.__cause__, DpflError)
        return
    with_noise, without = (run_world(sim, World(sim.train.x, sim.train.y, sim.grads), 1, 3, 1, lambda view: None)["x"]
                           for sim in (noisy, plain))
    alg = noisy.algorithm
    normals = (without - with_noise) * 6 / (alg.lr * alg.mechanism.noise_multiplier * alg.sensitivity)
    expected = torch.randn(normals.shape, generator=randomness.batch_generator(noisy.seed, 0, [3, 4, 5],
                                                                               "server_noise"))
    assert torch.allclose(normals, expected, atol=1e-4)
