"""The round loop end to end: reproducibility, chunking, checkpoints and resume, the ledger, budgets, boundaries,
learning."""

import json
import math
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_accounting import dp_event

from dpfl.accounting.dp_scaffold import dp_scaffold_epsilon
from dpfl.accounting import ledger as ledger_module
from dpfl.accounting.events import ParticipationDpEvent
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.engine.client_table import ClientTable
from states import states_equal
from dpfl.accounting.observers import BOUNDARIES, OBSERVERS, OTHER_SILO, SERVER, THIRD_PARTY
from dpfl.algorithms.local_sgd import LocalSGD, LocalSGDConfig, build_local_sgd
from dpfl.data import build_dataset
from dpfl.data.federated import ClientArrays
from dpfl.engine.boundary import Boundary
from dpfl.engine.grads import CohortGradients
from dpfl.engine.sampling import ClientSampler
from dpfl.engine.simulator import Simulation
from dpfl.errors import DpflError, RunDirectoryError
from dpfl.models import build_model

# 6 clients of 40 training records (50 generated, 20% test), 40 features, 10 classes
M, R, L, S, K, Z, CLIP = 6, 40, 0.5, 0.2, 2, 1.0, 1.0


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data():
    ds = build_dataset("synthetic", num_clients=M, samples_per_client=50, seed=0)
    assert ds.train.counts.tolist() == [R] * M
    return ds


def local_sgd(name, client_rate, *, local_steps=K, lr=0.5, sample_rate=S, record_sampling="fixed", clip=CLIP,
              noise=Z):
    """LocalSGD built through its config section (no weight decay, as the old builder's default)."""
    section = LocalSGDConfig(local_steps=local_steps, sample_rate=sample_rate, record_sampling=record_sampling, lr=lr,
                             weight_decay=0.0, clip=clip, noise_multiplier=noise)
    return build_local_sgd(name, section, client_rate)


def make_sim(ds, name="dp-scaffold", *, seed=0, model_seed=0, rounds_budget=None, noise=Z, client_rate=L,
             sample_rate=S, local_steps=K, lr=0.5, clip=CLIP, record_sampling="fixed", client_sampling="fixed",
             boundary="plain", observers=None, delta=None, train=None, accountant=None, **kwargs):
    torch.manual_seed(model_seed)
    grads = CohortGradients(build_model("logreg", ds.num_features, ds.num_classes))
    algorithm = local_sgd(name, client_rate, local_steps=local_steps, lr=lr, sample_rate=sample_rate,
                          record_sampling=record_sampling, clip=clip, noise=noise)
    train = ds.train if train is None else train
    ledger = PrivacyLedger(observers or Boundary(boundary).observers, delta or 1 / (ds.num_clients * R),
                           budget=rounds_budget, neighboring=algorithm.neighboring, accountant=accountant)
    return Simulation(train, ds.test, grads, algorithm, ClientSampler(train.num_clients, client_rate, client_sampling),
                      ledger, seed=seed, boundary=boundary, **kwargs)


def as_dicts(history):
    return [m.to_dict() for m in history]


# -- reproducibility -----------------------------------------------------------------------------------------------
def test_bit_for_bit_reproducible(data):
    a, b = make_sim(data), make_sim(data)
    assert a.model is a.state.server["x"]
    ha, hb = a.run(4), b.run(4)
    assert torch.equal(a.model, b.model)
    assert set(a.state.server) == {"x", "c"} and set(a.state.clients) == {"c"}
    assert states_equal(a.state, b.state)
    assert as_dicts(ha) == as_dicts(hb)
    assert len(ha) == 4 and [m.round for m in ha] == [1, 2, 3, 4]
    # the seed matters, and the model moved
    c = make_sim(data, seed=1)
    c.run(4)
    assert not torch.equal(a.model, c.model)
    assert not torch.equal(a.model, make_sim(data).model)


def unequal(arrays):
    """``arrays`` with clients cut to unequal record counts (40, 34, 28, 40, 22, 37)."""
    sizes = [40, 34, 28, 40, 22, 37]
    return ClientArrays.from_lists([arrays.x[i, :n].numpy() for i, n in enumerate(sizes)],
                                   [arrays.y[i, :n].numpy() for i, n in enumerate(sizes)])


@pytest.fixture
def threads(request):
    """Runs the test with ``request.param`` torch threads (the autouse fixture restores the count after)."""
    torch.set_num_threads(request.param)
    return request.param


# Float rounding is not chunk-independent in two cases, where the draws are the same but a client's sums are formed
# differently: with more than one thread (MKL's batched products round a one-client batch differently from a
# several-client one), and when the chunk's minibatches are ragged (unequal counts, Poisson batches: the batch is padded
# to the chunk's largest and ordered by key). There the models agree to float rounding; run.memory_mb and run.threads
# are therefore part of a run's release config (a resume must keep them, so a replay is always the same computation).
@pytest.mark.parametrize("name, case, threads, exact", [
    ("dp-scaffold", "equal counts", 1, True),
    ("dp-fedavg", "equal counts", 1, True),
    ("dp-fedsgd", "equal counts", 1, True),
    ("dp-scaffold", "equal counts", 2, False),
    ("dp-fedavg", "poisson records", 1, False),
    ("dp-scaffold", "unequal counts", 1, False),
], indirect=["threads"])
def test_a_private_run_does_not_depend_on_the_memory_chunking(data, name, case, threads, exact):
    """Noise, minibatches (s < 1) and partial participation (3 of 6 clients): each client draws from its own streams,
    so one-client chunks and one whole-cohort chunk give bit-identical models, states, metrics and ledgers (or, in
    the cases above, models equal to float rounding)."""
    ds = data
    kwargs = dict(name=name, sample_rate=0.5, accountant="rdp")  # rdp: fast for Poisson records too
    if case == "poisson records":
        kwargs["record_sampling"] = "poisson"
    if case == "unequal counts":
        kwargs["train"] = unequal(ds.train)
    chunked = make_sim(ds, memory_budget_bytes=1, **kwargs)
    whole = make_sim(ds, memory_budget_bytes=2**30, **kwargs)
    assert chunked.chunk_size(3) == 1 and whole.chunk_size(3) == 3
    assert chunked.clients.cohort_size == 3 < M
    history_chunked, history_whole = chunked.run(3), whole.run(3)
    assert not torch.equal(chunked.model, make_sim(ds, **kwargs).model)  # the model moved
    if not exact:
        torch.testing.assert_close(chunked.model, whole.model, rtol=1e-5, atol=1e-6)
        return
    assert torch.equal(chunked.model, whole.model)
    assert states_equal(chunked.state, whole.state)
    assert as_dicts(history_chunked) == as_dicts(history_whole)
    assert chunked.ledger.to_dict()["journal"] == whole.ledger.to_dict()["journal"]


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
    assert torch.equal(resumed.model, reference.model)
    assert states_equal(resumed.state, reference.state)
    assert as_dicts(resumed.history) == as_dicts(reference.history)
    assert resumed.ledger.epsilon() == reference.ledger.epsilon()
    assert resumed.ledger.compositions == 6
    # the checkpoint written at round 6 holds the final state (state.state_dict() under "state")
    on_disk = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert set(on_disk) == {"next_round", "release", "state", "history", "wall_seconds"}
    assert on_disk["next_round"] == 6 and torch.equal(on_disk["state"]["server"]["x"], reference.model)
    assert torch.equal(ClientTable.from_state_dict(on_disk["state"]["clients"]["c"]).dense(),
                       reference.state.clients["c"].dense())
    assert PrivacyLedger.load(tmp_path / "ledger.json").epsilon() == reference.ledger.epsilon()


def test_crash_after_checkpoint_does_not_double_count(data, tmp_path):
    reference = make_sim(data)
    reference.run(6)

    crashed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3)
    crashed.run(3)  # checkpoint at round 3
    crashed.step()  # round index 3 runs (its privacy already written to disk), then the process dies
    on_disk = PrivacyLedger.load(tmp_path / "ledger.json")
    assert on_disk.compositions == 4
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["next_round"] == 3

    resumed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3)
    resumed.load_checkpoint(tmp_path)
    assert resumed.ledger.compositions == 4  # the ledger on disk is ahead of the checkpoint: kept
    resumed.run(6)
    assert resumed.ledger.compositions == 6  # round 3 replayed with the same randomness: not counted twice
    assert resumed.ledger.epsilon() == reference.ledger.epsilon()
    assert resumed.history[-1].epsilon == reference.history[-1].epsilon
    assert torch.equal(resumed.model, reference.model)


def test_a_replay_with_other_chunking_is_identical_and_free(data, tmp_path):
    """Before per-client streams, other chunking reordered the generator's draws, so a replayed round released other
    noise and was charged again. Now the draws are named by (seed, round, client, purpose): the replayed round
    releases exactly the model released before, and is rightly not charged twice. (With one thread and equal counts;
    see test_a_private_run_does_not_depend_on_the_memory_chunking.)"""
    crashed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3, sample_rate=0.5)
    crashed.run(3)
    crashed.step()
    released = crashed.model.clone()  # the model of round 4, possibly already observed

    resumed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3, sample_rate=0.5,
                       memory_budget_bytes=1)  # 1-client chunks
    assert resumed.chunk_size(3) == 1
    resumed.load_checkpoint(tmp_path)
    resumed.run(4)
    assert torch.equal(resumed.model, released)  # round 3 released the same thing again...
    assert resumed.ledger.compositions == 4  # ... so it is counted once


# -- one accountant ------------------------------------------------------------------------------------------------
def test_run_epsilon_equals_dp_scaffold_accountant(data):
    """The run's RDP ledger is the DP-SCAFFOLD accountant's RDP (the default PLD is below it: section 2 of
    docs/accounting.md)."""
    sim = make_sim(data, "dp-scaffold", accountant="rdp")
    history = sim.run(3)
    reference = dp_scaffold_epsilon(M, R, L, S, K, 3, Z, accountant="rdp")
    assert sim.ledger.delta == reference["delta"] == 1 / (M * R)
    for observer in OBSERVERS:
        assert history[-1].epsilon[observer] == pytest.approx(reference["epsilon"][observer], rel=1e-9)
    # and round by round
    for t, metrics in enumerate(history, start=1):
        expected = dp_scaffold_epsilon(M, R, L, S, K, t, Z, accountant="rdp")["epsilon"][THIRD_PARTY]
        assert metrics.epsilon[THIRD_PARTY] == pytest.approx(expected, rel=1e-9)
    # the server sees one client's messages either way; towards the aggregate DP-FedAvg's last step earns the
    # cohort's noise, DP-SCAFFOLD's does not (its control variates carry the noise into later rounds)
    fedavg = make_sim(data, "dp-fedavg", accountant="rdp").run(3)[-1].epsilon
    assert fedavg[SERVER] == history[-1].epsilon[SERVER]
    assert fedavg[THIRD_PARTY] < history[-1].epsilon[THIRD_PARTY]
    assert fedavg[THIRD_PARTY] == pytest.approx(
        dp_scaffold_epsilon(M, R, L, S, K, 3, Z, algorithm="dp-fedavg", accountant="rdp")["epsilon"][THIRD_PARTY],
        rel=1e-9)
    # and the default PLD ledger is the accountant's default, as `dpfl account dp-scaffold` prints it
    pld = make_sim(data, "dp-scaffold", accountant="pld").run(3)[-1].epsilon
    assert pld == pytest.approx(dp_scaffold_epsilon(M, R, L, S, K, 3, Z)["epsilon"], rel=1e-9)
    step = dp_event.SampledWithoutReplacementDpEvent(R, 8, dp_event.GaussianDpEvent(Z))
    expected_event = ParticipationDpEvent(0.5, dp_event.SelfComposedDpEvent(step, K))
    assert sim.round_privacy()[THIRD_PARTY] == expected_event
    assert sim.round_privacy(0)[THIRD_PARTY] == sim.round_privacy(7)[THIRD_PARTY] == expected_event


def test_round_robin_cohorts_are_charged_only_in_the_rounds_client_0_takes_part(data):
    """Round robin (3 of 6 clients: {0, 1, 2}, {3, 4, 5}, ...): the worst-placed owner, client 0, takes part in the
    even rounds only, so the odd rounds cost nothing and 4 rounds cost what 2 unsampled rounds cost."""
    sim = make_sim(data, "dp-fedavg", client_sampling="round_robin")
    assert [sim.clients.sample(t, 0).tolist() for t in range(3)] == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]
    assert all(e == dp_event.NoOpDpEvent() for e in sim.round_privacy(1).values())
    charged = sim.round_privacy(0)
    assert not isinstance(charged[THIRD_PARTY], ParticipationDpEvent)  # p = 1: no amplification by sampling
    sim.run(4)
    reference = PrivacyLedger(OBSERVERS, sim.ledger.delta)
    for t in range(2):
        reference.record(t, charged)
    assert sim.ledger.compositions == 4
    assert sim.ledger.epsilon() == pytest.approx(reference.epsilon(), rel=1e-12)


def test_budget_stops_before_the_round_that_would_exceed_it(data, tmp_path):
    two = dp_scaffold_epsilon(M, R, L, S, K, 2, Z, accountant="rdp")["epsilon"][THIRD_PARTY]
    three = dp_scaffold_epsilon(M, R, L, S, K, 3, Z, accountant="rdp")["epsilon"][THIRD_PARTY]
    budget = (two + three) / 2
    sim = make_sim(data, rounds_budget={THIRD_PARTY: budget}, checkpoint_dir=tmp_path, accountant="rdp")
    history = sim.run(10)
    assert sim.next_round == 2 and len(history) == 2
    assert sim.stopped_reason is not None and "privacy.budget.third_party" in sim.stopped_reason
    assert all(m.epsilon[THIRD_PARTY] <= budget for m in history)
    assert sim.ledger.compositions == 2 and sim.ledger.epsilon()[THIRD_PARTY] == pytest.approx(two, rel=1e-9)
    assert PrivacyLedger.load(tmp_path / "ledger.json").compositions == 2
    saved = json.loads((tmp_path / "ledger.json").read_text())  # the summary written when the budget stopped it
    assert saved["epsilon"] == sim.ledger.epsilon() and saved["accountant"] == sim.ledger.accountants()
    # nothing of the refused round was released: the model and the client state are those of an unbudgeted 2-round
    # run (test_a_budget_stop_discards_the_work_computed_beside_the_check: its first chunk was computed, unused)
    reference = make_sim(data)
    reference.run(2)
    assert torch.equal(sim.model, reference.model) and states_equal(sim.state, reference.state)


# -- a round's record beside its client work ---------------------------------------------------------------------
class _Logged:
    """The algorithm ``inner`` with the start of each client round and server step noted in ``log``
    (("client work", r), ("server", r), r numbered from 1)."""

    def __init__(self, inner, log: list):
        self._inner, self._log = inner, log

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def client_round(self, t, *args):
        self._log.append(("client work", t + 1))
        return self._inner.client_round(t, *args)

    def server_update(self, t, *args):
        self._log.append(("server", t + 1))
        return self._inner.server_update(t, *args)


def _saves_after_the_work_starts(sim, log: list) -> None:
    """``sim``'s ledger saves its journal only once the round's client work has started (or after 10 s), noting
    ("on disk", r) once the entry of round r is on disk."""
    save = sim.ledger.save

    def save_after(path, summary=True):
        if not summary:
            _wait_for(lambda: log and log[-1][0] in ("client work", "workers"))
        save(path, summary)
        if not summary:
            log.append(("on disk", json.loads(Path(path).read_text())["journal"][-1]["round"]))

    sim.ledger.save = save_after


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)


def test_a_round_is_on_disk_before_anything_it_computed_is_used(data, tmp_path):
    """The round's record and durable save run beside its client work (the work starts before the save ends), and
    the boundary and the server step see the work only after the save; the model is the ordinary run's."""
    log = []
    sim = make_sim(data, checkpoint_dir=tmp_path)
    sim.algorithm = _Logged(sim.algorithm, log)
    _saves_after_the_work_starts(sim, log)
    sim.run(2)
    assert log == [("client work", 1), ("on disk", 1), ("server", 1), ("client work", 2), ("on disk", 2),
                   ("server", 2)]
    reference = make_sim(data)
    reference.run(2)
    assert torch.equal(sim.model, reference.model) and states_equal(sim.state, reference.state)


def test_work_done_elsewhere_starts_after_the_round_is_on_disk(data, tmp_path):
    """Client work outside this process (``Simulation.workers``: Flower nodes, other ranks) leaves it: it is asked
    for only once the round's entry is on disk."""
    log = []

    def workers(sim, t, cohort):
        log.append(("workers", t + 1))
        return sim.in_process(t, cohort)

    sim = make_sim(data, checkpoint_dir=tmp_path, workers=workers)
    _saves_after_the_work_starts(sim, log)
    sim.run(2)
    assert log == [("on disk", 1), ("workers", 1), ("on disk", 2), ("workers", 2)]


def test_a_budget_stop_discards_the_work_computed_beside_the_check(data):
    """The refused round's first chunk of client work is computed while the ledger checks it, and then dropped: no
    server step, no client state written, the model and state of the rounds before."""
    two = dp_scaffold_epsilon(M, R, L, S, K, 2, Z, accountant="rdp")["epsilon"][THIRD_PARTY]
    three = dp_scaffold_epsilon(M, R, L, S, K, 3, Z, accountant="rdp")["epsilon"][THIRD_PARTY]
    log = []
    sim = make_sim(data, rounds_budget={THIRD_PARTY: (two + three) / 2}, accountant="rdp")
    sim.algorithm = _Logged(sim.algorithm, log)
    round_3 = sim.algorithm.client_round

    def zeroing(t, *args):  # as if the refused round's records had non-finite gradients: 5 zeroed examples
        out = round_3(t, *args)
        if t == 2:
            sim.grads._nonfinite = torch.tensor(5)
        return out

    sim.algorithm.client_round = zeroing
    sim.run(10)
    assert sim.stopped_by == "budget" and sim.next_round == 2
    assert ("client work", 3) in log and ("server", 3) not in log
    assert sim.grads.take_nonfinite_examples() == 0  # nothing of the dropped work is reported, its count neither
    reference = make_sim(data)
    reference.run(2)
    assert torch.equal(sim.model, reference.model) and states_equal(sim.state, reference.state)


def test_a_mid_run_checkpoint_waits_for_no_read_and_a_resume_reads_it_again(data, tmp_path):
    """With the reads held up, the checkpoint after round 2 of 4 is written at once, its rows without epsilon and
    ledger.json without the summary; a run resumed from it reads those rows' epsilon again and ends with the
    uninterrupted run's history and ledger."""
    held, copied = threading.Event(), tmp_path / "after 2"
    ledger_module._READER.submit(held.wait, 60)  # the reader thread is busy until released

    def at_round(sim):
        if sim.next_round == 2:
            copied.mkdir()
            for name in ("checkpoint.pt", "ledger.json"):
                shutil.copy(tmp_path / "run" / name, copied / name)
            held.set()

    sim = make_sim(data, checkpoint_dir=tmp_path / "run", checkpoint_every=2)
    sim.run(4, on_evaluated=at_round)
    assert held.is_set() and all(m.epsilon is not None for m in sim.history)
    assert "epsilon" not in json.loads((copied / "ledger.json").read_text())

    resumed = make_sim(data, checkpoint_dir=copied, checkpoint_every=2)
    resumed.load_checkpoint(copied)
    assert resumed.next_round == 2 and resumed.settled == 0  # rows 1 and 2 are being read again
    resumed.run(4)
    assert as_dicts(resumed.history) == as_dicts(sim.history)
    assert resumed.ledger.to_dict() == sim.ledger.to_dict()


def test_budget_below_one_round_runs_nothing(data):
    one = dp_scaffold_epsilon(M, R, L, S, K, 1, Z, accountant="rdp")["epsilon"][SERVER]
    sim = make_sim(data, rounds_budget={SERVER: one * 0.99}, accountant="rdp")
    x0 = sim.model.clone()
    assert sim.run(5) == []
    assert sim.next_round == 0 and sim.ledger.compositions == 0
    assert "privacy.budget.server" in sim.stopped_reason
    assert torch.equal(sim.model, x0)


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
    x0 = sim.model.clone()
    with pytest.raises(DpflError, match="declared"):
        sim.run(1)
    assert torch.equal(sim.model, x0)  # nothing reached the server


@pytest.mark.parametrize("rate", [0.25, 0.04])
def test_poisson_cohort_is_accounted_without_amplification(data, rate):
    """Poisson cohorts are charged the participation mixture of the individual view (never at a rate derived from
    round(l M)) towards the server; the additive step's credit, mixed over the other members' number, towards the
    third party."""
    ds = build_dataset("synthetic", num_clients=10, samples_per_client=10, seed=0)
    torch.manual_seed(0)
    grads = CohortGradients(build_model("logreg", ds.num_features, ds.num_classes))
    algorithm = local_sgd("dp-fedavg", rate, local_steps=1, sample_rate=0.5)
    sim = Simulation(ds.train, ds.test, grads, algorithm, ClientSampler(10, rate, "poisson"),
                     PrivacyLedger(OBSERVERS, 1e-3))
    events = sim.round_privacy()
    assert events[THIRD_PARTY].probability == events[SERVER].probability == rate
    sim.run(2)
    assert 0 < sim.ledger.epsilon()[THIRD_PARTY] < sim.ledger.epsilon()[SERVER] < float("inf")


# -- boundaries ----------------------------------------------------------------------------------------------------
def test_every_boundary_gives_the_same_model_and_its_own_observers(data):
    """LocalSGD's server step reads only sums, so plain, secure aggregation, a shuffler and a trusted aggregator give
    bit-identical models; what changes is who observes (a trusted aggregator's server does not) and what they see."""
    runs = {}
    for boundary in BOUNDARIES:
        sim = make_sim(data, "dp-fedavg", boundary=boundary)
        assert isinstance(sim.boundary, Boundary) and sim.boundary.name == boundary  # a name string is accepted
        assert sim.ledger.observers == sim.boundary.observers
        sim.run(2)
        runs[boundary] = sim
    assert all(torch.equal(sim.model, runs["plain"].model) for sim in runs.values())
    assert runs["trusted"].ledger.observers == (THIRD_PARTY, OTHER_SILO)
    plain, secagg = runs["plain"].ledger.epsilon(), runs["secagg"].ledger.epsilon()
    assert secagg[SERVER] == pytest.approx(secagg[THIRD_PARTY]) and secagg[SERVER] < plain[SERVER]
    assert runs["shuffler"].ledger.epsilon() == plain  # charged as plain
    assert runs["trusted"].ledger.epsilon() == {o: plain[o] for o in (THIRD_PARTY, OTHER_SILO)}


# -- learning ------------------------------------------------------------------------------------------------------
def test_dp_scaffold_warm_learns(data):
    ds = build_dataset("synthetic", num_clients=8, samples_per_client=60, seed=0)
    sim = make_sim(ds, "dp-scaffold-warm", client_rate=1.0, sample_rate=0.5, local_steps=5, lr=1.0,
                   observers=(THIRD_PARTY, SERVER))
    assert sim.algorithm.warm_rounds == 4
    x0 = sim.model.clone()
    _, initial_accuracy = sim.grads.loss_and_accuracy(x0, *ds.test.flat())
    history = sim.run(14)
    # the warm rounds leave x alone (and set the control variates)
    assert [m.test_accuracy for m in history[:4]] == [initial_accuracy] * 4
    assert sim.state.clients["c"].dense().abs().sum(1).gt(0).all()
    assert history[-1].test_accuracy > initial_accuracy + 0.3
    assert history[-1].train_loss < history[3].train_loss
    # SCAFFOLD's control variates carry its noise forward: no other client's noise is credited, so the aggregate
    # is as revealing as one client's messages
    assert history[-1].epsilon[THIRD_PARTY] == history[-1].epsilon[SERVER] < float("inf")


def test_mlp_rounds_leave_no_autograd_graph_and_divergence_stops_the_run():
    ds = build_dataset("synthetic", num_clients=4, samples_per_client=50, seed=0)
    torch.manual_seed(0)
    grads = CohortGradients(build_model("mlp", ds.num_features, ds.num_classes, hidden=(16,)))
    calm = local_sgd("dp-fedavg", 1.0, local_steps=3, lr=0.5, sample_rate=0.5, noise=0.5)
    sim = Simulation(ds.train, ds.test, grads, calm, ClientSampler(4, 1.0), PrivacyLedger(OBSERVERS, 1e-3))
    sim.run(2)
    assert not sim.model.requires_grad  # the ghost path's hidden activations must not leak their graph
    assert not any(v.requires_grad for part in (sim.state.server, sim.state.clients) for v in part.values())
    wild = local_sgd("dp-fedavg", 1.0, local_steps=3, lr=1e30, sample_rate=0.5, noise=0.5)
    sim = Simulation(ds.train, ds.test, grads, wild, ClientSampler(4, 1.0), PrivacyLedger(OBSERVERS, 1e-3))
    history = sim.run(5)
    assert "diverged" in sim.stopped_reason and "algorithm.lr" in sim.stopped_reason
    assert all(math.isfinite(m.train_loss) for m in history)
    assert sim.ledger.compositions == sim.next_round  # the diverged round's privacy is still counted


def test_unequal_clients_get_only_the_noise_credit_their_sensitivities_allow():
    rng = np.random.default_rng(0)
    sizes = [40, 20, 10, 20]  # batches at s = 0.5: 20, 10, 5, 10 -> sensitivity ratio 5 / 20
    train = ClientArrays.from_lists([rng.normal(size=(n, 3)).astype("float32") for n in sizes],
                                    [rng.integers(0, 2, n) for n in sizes])
    grads = CohortGradients(build_model("logreg", 3, 2))
    algorithm = local_sgd("dp-fedavg", 0.5, local_steps=2, sample_rate=0.5, noise=3.0)
    sim = Simulation(train, train, grads, algorithm, ClientSampler(4, 0.5), PrivacyLedger(OBSERVERS, 1e-3))
    # per owner o (WorstOwnerDpEvent), and the single bound: Participation(l, Composed[SelfComposed(own step, K - 1),
    # SelfComposed(SampledWOR(n, b, Gaussian(z credit)), 1)]), the credit of one other share (a cohort of 2)
    declared = sim.round_privacy()[THIRD_PARTY]

    def credit(event):
        return event.event.events[-1].event.event.noise_multiplier / 3.0

    assert credit(declared.bound) == pytest.approx(math.sqrt(1 + 1 * 0.25**2))  # the weakest share, ratio 1/4
    # each owner the smallest other share in units of its own: the owner of 40 records (sensitivity 1/20) 1/10's,
    # 1 + 2^2; an owner of 20 (1/10) 1/20's, 1 + 1/4; the owner of 10 (1/5) 1/20's, 1 + 1/16, as the bound
    assert [credit(e) for e in declared.events] == pytest.approx([math.sqrt(5), math.sqrt(1.25), math.sqrt(1 + 1 / 16),
                                                                  math.sqrt(1.25)])


# -- fingerprints, resume checks, Ctrl-C, divergence messages ------------------------------------------------------
@pytest.mark.parametrize("change", ["model state", "client state", "release config", "seed"])
def test_a_replay_from_another_state_or_config_is_charged_again(data, tmp_path, change):
    """The fingerprint is (release hash, round index, round-start state): a round replayed from another model or
    client state, or under another release config or seed (hence other streams), releases something else and is
    counted again. (This replaces the old "a replay with another generator state counts twice": there is no run
    generator any more, and chunking no longer changes any draw.)"""
    crashed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3, release="a" * 64)
    crashed.run(3)
    crashed.step()  # round index 3 is on the ledger, the checkpoint is at round 3
    released = crashed.model.clone()
    release, seed = "a" * 64, 0
    if change == "release config":  # the same checkpoint, resumed under another release hash (the runner refuses
        release = "b" * 64          # that earlier, via run.json)
    elif change == "seed":
        seed = 1
    else:
        payload = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
        if change == "model state":
            payload["state"]["server"]["x"][0] += 1.0
        else:  # the row of a client of round index 3's cohort (no other row enters the round)
            table = ClientTable.from_state_dict(payload["state"]["clients"]["c"])
            member = crashed.clients.sample(3, crashed.seed)[:1]
            table[member] = table[member] + 1.0
            payload["state"]["clients"]["c"] = table.state_dict()
        torch.save(payload, tmp_path / "checkpoint.pt")
    resumed = make_sim(data, checkpoint_dir=tmp_path, checkpoint_every=3, release="a" * 64, seed=seed)
    resumed.load_checkpoint(tmp_path)
    resumed.release = release
    resumed.run(4)
    if change != "release config":  # (another release string alone names the same streams)
        assert not torch.equal(resumed.model, released)  # round 3 released something else...
    assert resumed.ledger.compositions == 5  # ... so it is counted again


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
    ("older ledger", "records rounds only up to round 2"),
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
        other.state.server["x"] = torch.zeros(3)
    x0 = other.model.clone()
    with pytest.raises(RunDirectoryError, match=message):
        other.load_checkpoint(tmp_path)
    assert other.next_round == 0 and torch.equal(other.model, x0)  # nothing restored


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
    wild = local_sgd("dp-fedavg", 1.0, local_steps=3, lr=1e30, sample_rate=0.5, record_sampling=scheme, noise=0.5)
    sim = Simulation(ds.train, ds.test, grads, wild, ClientSampler(4, 1.0),  # rdp: PLD takes seconds for Poisson
                     PrivacyLedger(OBSERVERS, 1e-3, neighboring=wild.neighboring, accountant="rdp"))
    sim.run(5)
    assert "diverged" in sim.stopped_reason and formula in sim.stopped_reason and absent not in sim.stopped_reason
    assert f"up to {worst:g} here" in sim.stopped_reason


def test_the_round_fingerprint_hashes_the_server_state_and_the_cohorts_rows_of_client_state(data):
    """The fingerprint hashes each server tensor's own memory and the round's cohort's rows of client state (no other
    client's row enters the round): a write to a client outside the next cohort leaves it as it was, a write to one
    inside changes it, and its digest is the length-prefixed SHA-256 of those parts (SCAFFOLD's control variates of
    10^5 clients are not hashed at every round)."""
    import hashlib

    sim = make_sim(data)
    sim.run(2)
    cohort = sim.clients.sample(2, sim.seed)
    digest = hashlib.sha256()
    parts = [sim.release.encode(), str(sim.seed).encode(), b"2"]
    for part_state in (sim.state.server, {name: value[cohort] for name, value in sim.state.clients.items()}):
        parts += [name.encode() + value.numpy().tobytes() for name, value in sorted(part_state.items())]
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    before = sim._fingerprint(2, cohort)
    assert before == digest.hexdigest()
    outside = next(i for i in range(data.num_clients) if i not in cohort.tolist())
    sim.state.clients["c"][torch.tensor([outside])] = torch.ones(1, sim.state.clients["c"].shape[1])
    assert sim._fingerprint(2, cohort) == before
    sim.state.clients["c"][cohort[:1]] = torch.ones(1, sim.state.clients["c"].shape[1])
    assert sim._fingerprint(2, cohort) != before
