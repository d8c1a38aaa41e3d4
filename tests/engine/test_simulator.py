"""The round loop end to end: reproducibility, checkpoints and resume, the ledger, budgets, learning."""

import json
import math

import pytest
import torch
from dp_accounting import dp_event

from dpfl.accounting.dp_scaffold import dp_scaffold_epsilon
from dpfl.accounting.events import ParticipationDpEvent
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import OBSERVERS, SERVER, THIRD_PARTY
from dpfl.algorithms.local_sgd import LocalSGD, build_local_sgd
from dpfl.data import build_dataset
from dpfl.engine.grads import CohortGradients
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.engine.simulator import Simulation
from dpfl.errors import DpflError, RunDirectoryError
from dpfl.models import build_model

# 6 clients of 40 training records (50 generated, 20% test), 40 features, 10 classes
M, R, L, S, K, Z, CLIP = 6, 40, 0.5, 0.2, 2, 1.0, 1.0


@pytest.fixture(scope="module")
def data():
    ds = build_dataset("synthetic", num_clients=M, samples_per_client=50, seed=0)
    assert ds.train.counts.tolist() == [R] * M
    return ds


def make_sim(ds, name="dp-scaffold", *, seed=0, model_seed=0, rounds_budget=None, noise=Z, client_rate=L,
             sample_rate=S, local_steps=K, lr=0.5, clip=CLIP, observers=OBSERVERS, delta=None, **kwargs):
    torch.manual_seed(model_seed)
    grads = CohortGradients(build_model("logreg", ds.num_features, ds.num_classes))
    algorithm = build_local_sgd(name, local_steps=local_steps, lr=lr, sampler=RecordSampler(sample_rate),
                                client_rate=client_rate, clip=clip, noise_multiplier=noise)
    ledger = PrivacyLedger(observers, delta or 1 / (ds.num_clients * R), budget=rounds_budget)
    return Simulation(ds.train, ds.test, grads, algorithm, ClientSampler(ds.num_clients, client_rate), ledger,
                      seed=seed, **kwargs)


def as_dicts(history):
    return [m.to_dict() for m in history]


# -- reproducibility -----------------------------------------------------------------------------------------------
def test_bit_for_bit_reproducible(data):
    a, b = make_sim(data), make_sim(data)
    ha, hb = a.run(4), b.run(4)
    assert torch.equal(a.state.x, b.state.x)
    assert torch.equal(a.state.c, b.state.c) and torch.equal(a.state.client_c, b.state.client_c)
    assert as_dicts(ha) == as_dicts(hb)
    assert len(ha) == 4 and [m.round for m in ha] == [1, 2, 3, 4]
    # the seed matters, and the model moved
    c = make_sim(data, seed=1)
    c.run(4)
    assert not torch.equal(a.state.x, c.state.x)
    assert not torch.equal(a.state.x, make_sim(data).state.x)


def test_chunking_does_not_change_a_deterministic_run(data):
    """Full batches, no noise: the cohort split into one-client chunks gives the same model as one chunk."""
    kwargs = dict(name="scaffold", sample_rate=1.0, noise=0.0, clip=None)
    whole, chunked = make_sim(data, **kwargs), make_sim(data, memory_budget_bytes=1, **kwargs)
    assert whole._chunk_size(3) == 3 and chunked._chunk_size(3) == 1
    whole.run(3)
    chunked.run(3)
    torch.testing.assert_close(chunked.state.x, whole.state.x, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked.state.client_c, whole.state.client_c, atol=1e-5, rtol=1e-5)


def test_eval_every(data):
    sim = make_sim(data, eval_every=2)
    history = sim.run(5)
    assert [m.round for m in history] == [2, 4, 5]
    assert sim.stopped_reason is None and sim.wall_seconds > 0


# -- checkpoints ---------------------------------------------------------------------------------------------------
def test_resume_from_checkpoint_matches_uninterrupted_run(data, tmp_path):
    reference = make_sim(data)
    reference.run(6)

    first = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3)
    first.run(3)
    assert (tmp_path / "checkpoint.pt").exists() and (tmp_path / "ledger.json").exists()
    resumed = make_sim(data, model_seed=123, checkpoint_dir=tmp_path, checkpoint_every=3)  # other initial model
    resumed.load_checkpoint(tmp_path)
    assert resumed.next_round == 3 and len(resumed.history) == 3
    resumed.run(6)
    assert torch.equal(resumed.state.x, reference.state.x)
    assert torch.equal(resumed.state.client_c, reference.state.client_c)
    assert as_dicts(resumed.history) == as_dicts(reference.history)
    assert resumed.ledger.epsilon() == reference.ledger.epsilon()
    assert resumed.ledger.compositions == 6
    # the checkpoint written at round 6 holds the final state
    on_disk = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert on_disk["next_round"] == 6 and torch.equal(on_disk["x"], reference.state.x)
    assert PrivacyLedger.load(tmp_path / "ledger.json").epsilon() == reference.ledger.epsilon()


def test_crash_after_checkpoint_does_not_double_count(data, tmp_path):
    reference = make_sim(data)
    reference.run(6)

    crashed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3)
    crashed.run(3)  # checkpoint at round 3
    crashed.step()  # round index 3 runs (its privacy already written to disk), then the process dies
    on_disk = PrivacyLedger.load(tmp_path / "ledger.json")
    assert on_disk.compositions == 4
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["next_round"] == 3

    resumed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3)
    resumed.load_checkpoint(tmp_path)
    assert resumed.ledger.compositions == 4  # the ledger on disk is ahead of the checkpoint: kept
    resumed.run(6)
    assert resumed.ledger.compositions == 6  # round 3 replayed with the same randomness: not counted twice
    assert resumed.ledger.epsilon() == reference.ledger.epsilon()
    assert resumed.history[-1].epsilon == reference.history[-1].epsilon
    assert torch.equal(resumed.state.x, reference.state.x)


def test_replay_with_other_randomness_counts_twice(data, tmp_path):
    crashed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3)
    crashed.run(3)
    crashed.step()
    released = crashed.state.x.clone()  # the model of round 4, possibly already observed

    resumed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3, memory_budget_bytes=1)  # 1-client chunks
    resumed.load_checkpoint(tmp_path)
    resumed.run(4)
    assert not torch.equal(resumed.state.x, released)  # round 3 was released twice, with different noise
    assert resumed.ledger.compositions == 5  # ... so it must be counted twice


# -- one accountant ------------------------------------------------------------------------------------------------
def test_run_epsilon_equals_dp_scaffold_accountant(data):
    sim = make_sim(data, "dp-scaffold")
    history = sim.run(3)
    reference = dp_scaffold_epsilon(M, R, L, S, K, 3, Z)
    assert sim.ledger.delta == reference["delta"] == 1 / (M * R)
    for observer in OBSERVERS:
        assert history[-1].epsilon[observer] == pytest.approx(reference["epsilon"][observer], rel=1e-9)
    # and round by round
    for t, metrics in enumerate(history, start=1):
        expected = dp_scaffold_epsilon(M, R, L, S, K, t, Z)["epsilon"][THIRD_PARTY]
        assert metrics.epsilon[THIRD_PARTY] == pytest.approx(expected, rel=1e-9)
    # the server sees one client's messages either way; towards the aggregate DP-FedAvg's last step earns the
    # cohort's noise, DP-SCAFFOLD's does not (its control variates carry the noise into later rounds)
    fedavg = make_sim(data, "dp-fedavg").run(3)[-1].epsilon
    assert fedavg[SERVER] == history[-1].epsilon[SERVER]
    assert fedavg[THIRD_PARTY] < history[-1].epsilon[THIRD_PARTY]
    assert fedavg[THIRD_PARTY] == pytest.approx(
        dp_scaffold_epsilon(M, R, L, S, K, 3, Z, algorithm="dp-fedavg")["epsilon"][THIRD_PARTY], rel=1e-9)
    step = dp_event.SampledWithoutReplacementDpEvent(R, 8, dp_event.GaussianDpEvent(Z))
    assert sim.round_privacy()[THIRD_PARTY] == ParticipationDpEvent(0.5, dp_event.SelfComposedDpEvent(step, K))


def test_budget_stops_before_the_round_that_would_exceed_it(data, tmp_path):
    two = dp_scaffold_epsilon(M, R, L, S, K, 2, Z)["epsilon"][THIRD_PARTY]
    three = dp_scaffold_epsilon(M, R, L, S, K, 3, Z)["epsilon"][THIRD_PARTY]
    budget = (two + three) / 2
    sim = make_sim(data, rounds_budget={THIRD_PARTY: budget}, checkpoint_dir=tmp_path)
    history = sim.run(10)
    assert sim.next_round == 2 and len(history) == 2
    assert sim.stopped_reason is not None and "privacy.budget.third_party" in sim.stopped_reason
    assert all(m.epsilon[THIRD_PARTY] <= budget for m in history)
    assert sim.ledger.compositions == 2 and sim.ledger.epsilon()[THIRD_PARTY] == pytest.approx(two, rel=1e-9)
    assert PrivacyLedger.load(tmp_path / "ledger.json").compositions == 2
    # no noise was drawn for the refused round: the model is that of an unbudgeted 2-round run
    reference = make_sim(data)
    reference.run(2)
    assert torch.equal(sim.state.x, reference.state.x)


def test_budget_below_one_round_runs_nothing(data):
    one = dp_scaffold_epsilon(M, R, L, S, K, 1, Z)["epsilon"][SERVER]
    sim = make_sim(data, rounds_budget={SERVER: one * 0.99})
    x0 = sim.state.x.clone()
    assert sim.run(5) == []
    assert sim.next_round == 0 and sim.ledger.compositions == 0
    assert "privacy.budget.server" in sim.stopped_reason
    assert torch.equal(sim.state.x, x0)


def test_non_private_run_reports_none(data):
    sim = make_sim(data, "fedavg")
    history = sim.run(2)
    assert all(m.epsilon == {o: None for o in OBSERVERS} for m in history)
    json.dumps(as_dicts(history))  # JSON-safe


def test_declared_noise_must_match_drawn_noise(data):
    class Misdeclared(LocalSGD):
        @property
        def step_noise_event(self):
            return dp_event.GaussianDpEvent(2 * self.mechanism.noise_multiplier)

    sim = make_sim(data)
    alg = sim.algorithm
    sim.algorithm = Misdeclared(alg.local_steps, alg.lr, alg.sampler, alg.mechanism, alg.clip,
                                control_variates=alg.control_variates)
    with pytest.raises(DpflError, match="declared"):
        sim.run(1)


@pytest.mark.parametrize("rate", [0.25, 0.04])
def test_poisson_cohort_is_accounted_without_amplification(data, rate):
    """Poisson cohorts are charged the unamplified individual view (never at a rate derived from round(l M))."""
    ds = build_dataset("synthetic", num_clients=10, samples_per_client=10, seed=0)
    torch.manual_seed(0)
    grads = CohortGradients(build_model("logreg", ds.num_features, ds.num_classes))
    algorithm = build_local_sgd("dp-fedavg", local_steps=1, lr=0.5, sampler=RecordSampler(0.5), client_rate=rate,
                                clip=1.0, noise_multiplier=1.0)
    sim = Simulation(ds.train, ds.test, grads, algorithm, ClientSampler(10, rate, "poisson"),
                     PrivacyLedger(OBSERVERS, 1e-3))
    events = sim.round_privacy()
    assert events[THIRD_PARTY] == events[SERVER]
    sim.run(2)
    assert 0 < sim.ledger.epsilon()[THIRD_PARTY] == sim.ledger.epsilon()[SERVER] < float("inf")


# -- learning ------------------------------------------------------------------------------------------------------
def test_dp_scaffold_warm_learns(data):
    ds = build_dataset("synthetic", num_clients=8, samples_per_client=60, seed=0)
    sim = make_sim(ds, "dp-scaffold-warm", client_rate=1.0, sample_rate=0.5, local_steps=5, lr=1.0,
                   observers=(THIRD_PARTY, SERVER))
    assert sim.algorithm.warm_rounds == 4
    x0 = sim.state.x.clone()
    _, initial_accuracy = sim.grads.loss_and_accuracy(x0, *ds.test.flat())
    history = sim.run(14)
    # the warm rounds leave x alone (and set the control variates)
    assert [m.test_accuracy for m in history[:4]] == [initial_accuracy] * 4
    assert sim.state.client_c.abs().sum(1).gt(0).all()
    assert history[-1].test_accuracy > initial_accuracy + 0.3
    assert history[-1].train_loss < history[3].train_loss
    # SCAFFOLD's control variates carry its noise forward: no other client's noise is credited, so the aggregate
    # is as revealing as one client's messages
    assert history[-1].epsilon[THIRD_PARTY] == history[-1].epsilon[SERVER] < float("inf")


def test_mlp_rounds_leave_no_autograd_graph_and_divergence_stops_the_run():
    ds = build_dataset("synthetic", num_clients=4, samples_per_client=50, seed=0)
    torch.manual_seed(0)
    grads = CohortGradients(build_model("mlp", ds.num_features, ds.num_classes, hidden=(16,)))
    calm = build_local_sgd("dp-fedavg", local_steps=3, lr=0.5, sampler=RecordSampler(0.5), client_rate=1.0,
                           clip=1.0, noise_multiplier=0.5)
    sim = Simulation(ds.train, ds.test, grads, calm, ClientSampler(4, 1.0), PrivacyLedger(OBSERVERS, 1e-3))
    sim.run(2)
    assert not sim.state.x.requires_grad  # the ghost path's hidden activations must not leak their graph
    wild = build_local_sgd("dp-fedavg", local_steps=3, lr=1e30, sampler=RecordSampler(0.5), client_rate=1.0,
                           clip=1.0, noise_multiplier=0.5)
    sim = Simulation(ds.train, ds.test, grads, wild, ClientSampler(4, 1.0), PrivacyLedger(OBSERVERS, 1e-3))
    history = sim.run(5)
    assert "diverged" in sim.stopped_reason and "algorithm.lr" in sim.stopped_reason
    assert all(math.isfinite(m.train_loss) for m in history)
    assert sim.ledger.compositions == sim.next_round  # the diverged round's privacy is still counted


def test_unequal_clients_get_only_the_noise_credit_their_sensitivities_allow():
    import numpy as np

    from dpfl.data.federated import ClientArrays

    rng = np.random.default_rng(0)
    sizes = [40, 20, 10, 20]  # batches at s = 0.5: 20, 10, 5, 10 -> sensitivity ratio 5 / 20
    train = ClientArrays.from_lists([rng.normal(size=(n, 3)).astype("float32") for n in sizes],
                                    [rng.integers(0, 2, n) for n in sizes])
    grads = CohortGradients(build_model("logreg", 3, 2))
    algorithm = build_local_sgd("dp-fedavg", local_steps=2, lr=0.5, sampler=RecordSampler(0.5), client_rate=0.5,
                                clip=1.0, noise_multiplier=3.0)
    sim = Simulation(train, train, grads, algorithm, ClientSampler(4, 0.5), PrivacyLedger(OBSERVERS, 1e-3))
    # Participation(l, Composed[SelfComposed(own step, K - 1), SelfComposed(SampledWOR(n, b, Gaussian(z credit)), 1)])
    last_step = sim.round_privacy()[THIRD_PARTY].event.events[-1].event
    credit = last_step.event.noise_multiplier / 3.0
    assert credit == pytest.approx(math.sqrt(1 + 1 * 0.25**2))  # cohort of 2, ratio 1/4


# -- fingerprints, resume checks, Ctrl-C, divergence messages ------------------------------------------------------
@pytest.mark.parametrize("change", ["model state", "release config"])
def test_a_replay_from_another_state_or_config_is_charged_again(data, tmp_path, change):
    """The fingerprint covers the round-start model state and the release config, not only the generator: a round
    replayed from another model (or under another config) releases something else and is counted again."""
    crashed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3, release="a" * 64)
    crashed.run(3)
    crashed.step()  # round index 3 is on the ledger, the checkpoint is at round 3
    release = "a" * 64
    if change == "model state":
        state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
        state["x"][0] += 1.0
        torch.save(state, tmp_path / "checkpoint.pt")
    else:  # the same checkpoint, resumed under another release hash (the runner refuses that earlier, via run.json)
        release = "b" * 64
    resumed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3, release="a" * 64)
    resumed.load_checkpoint(tmp_path)
    resumed.release = release
    resumed.run(4)
    assert resumed.ledger.compositions == 5


def test_an_identical_replay_is_free_whatever_the_eval_and_checkpoint_cadence(data, tmp_path):
    crashed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=2)
    crashed.run(2)
    crashed.step()
    crashed.step()
    resumed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=5, eval_every=3)
    resumed.load_checkpoint(tmp_path)
    resumed.run(4)
    assert resumed.ledger.compositions == 4


@pytest.mark.parametrize("problem, message", [
    ("other model", "x has shape"),
    ("other run", "written by a run with another release config"),
    ("older ledger", "records rounds only up to index 1"),
])
def test_resume_refuses_a_checkpoint_that_does_not_belong(data, tmp_path, problem, message):
    sim = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=1)
    sim.run(2)
    old_ledger = (tmp_path / "ledger.json").read_bytes()
    sim.run(4)
    if problem == "older ledger":
        (tmp_path / "ledger.json").write_bytes(old_ledger)
    other = make_sim(data, checkpoint_dir=tmp_path, release="other" if problem == "other run" else "")
    if problem == "other model":
        other.state.x = torch.zeros(3)
    x0 = other.state.x.clone()
    with pytest.raises(RunDirectoryError, match=message):
        other.load_checkpoint(tmp_path)
    assert other.next_round == 0 and torch.equal(other.state.x, x0)  # nothing restored


def test_ctrl_c_handling_only_in_the_main_thread():
    import signal
    import threading

    ds = build_dataset("synthetic", num_clients=4, samples_per_client=20, seed=0)
    sim = make_sim(ds, client_rate=1.0, sample_rate=0.5)
    handler = signal.getsignal(signal.SIGINT)
    errors = []
    worker = threading.Thread(target=lambda: errors.append(sim.run(2) and None))
    worker.start()
    worker.join()
    assert errors == [None] and sim.next_round == 2 and not sim.interrupted
    assert signal.getsignal(signal.SIGINT) is handler


# n_i = 40 training records, z = 0.5, C = 1: z 2C / 20 for fixed batches of 20, z C / (0.5 * 40) for Poisson
@pytest.mark.parametrize("scheme, formula, worst, absent", [
    ("fixed", "noise_multiplier * 2C / floor(s n_i), with fixed-size batches of floor(s n_i) records at s = 0.5",
     0.05, "q n_i"),
    ("poisson", "noise_multiplier * C / (q n_i), q n_i the expected batch size of Poisson record sampling at q = 0.5",
     0.025, "2C"),
])
def test_the_divergence_message_describes_the_sampler_in_use(scheme, formula, worst, absent):
    ds = build_dataset("synthetic", num_clients=4, samples_per_client=50, seed=0)
    torch.manual_seed(0)
    grads = CohortGradients(build_model("mlp", ds.num_features, ds.num_classes, hidden=(16,)))
    wild = build_local_sgd("dp-fedavg", local_steps=3, lr=1e30, sampler=RecordSampler(0.5, scheme), client_rate=1.0,
                           clip=1.0, noise_multiplier=0.5)
    sim = Simulation(ds.train, ds.test, grads, wild, ClientSampler(4, 1.0), PrivacyLedger(OBSERVERS, 1e-3))
    sim.run(5)
    assert "diverged" in sim.stopped_reason and formula in sim.stopped_reason and absent not in sim.stopped_reason
    assert f"up to {worst:g} here" in sim.stopped_reason
