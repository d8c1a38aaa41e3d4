"""The audits deliver through the run's boundary (dpfl.engine.cohort_round): behind real secure aggregation each
trial's messages go through the protocol (the audited server sees the protocol's decoded sum), and behind a
simulated stage the trials' fast sums are what ``Boundary.collect`` delivers to each trial."""

from __future__ import annotations

import logging

import pytest
import torch

from dpfl.audit import runs
from dpfl.audit.trials import World, run_world
from dpfl.engine.boundary import Boundary
from dpfl.engine.secure_sum import SecureAggregation
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

pytestmark = pytest.mark.usefixtures("one_torch_thread")
logging.getLogger("absl").setLevel(logging.ERROR)

SECURE = ["algorithm.name='dp-fedavg-joint'", "data.num_clients=4", "data.samples_per_client=20",
          "algorithm.local_steps=1", "algorithm.sample_rate=1.0", "privacy.boundary='secagg'", "run.noise_seed=0"]
TRIALS = 3


def simulation(*extra):
    return build_simulation(load_config(None, [*SECURE, *extra]))


def counted_secure_sums(monkeypatch) -> list[int]:
    """The number of clients in each call of the real secure sum, in call order."""
    calls, real_sum = [], SecureAggregation.sum

    def counting(self, rows, clients, *args, **kwargs):
        calls.append(int(clients.numel()))
        return real_sum(self, rows, clients, *args, **kwargs)

    monkeypatch.setattr(SecureAggregation, "sum", counting)
    return calls


def trial_views(sim, rounds: int = 2):
    views = []
    final = run_world(sim, World(sim.train.x, sim.train.y, sim.grads), 0, TRIALS, rounds, views.append)
    return views, final


def test_the_trials_behind_real_secure_aggregation_deliver_the_protocols_sums(monkeypatch):
    """2 rounds of 3 trials of 4 clients: the protocol runs once per trial and round; each trial's delivered sum is
    its rows' sum up to the discretisation (n^2 B / 2^(bits-1) per coordinate), yet not bit for bit, and the
    model follows it, as the simulated boundary's trials follow the rows' sums."""
    calls = counted_secure_sums(monkeypatch)
    real = simulation("privacy.secure_aggregation=true")
    views, final = trial_views(real)
    assert calls == [4] * (TRIALS * 2)
    step = 4 * 4 * real.boundary.secure.bounds["dy"] / 2**31
    for view in views:
        rows = torch.zeros_like(view.delivered["dy"]).index_add_(0, view.trial_of_row, view.messages["dy"])
        assert float((view.sums("dy") - rows).abs().max()) <= step + 1e-6
        assert not torch.equal(view.sums("dy"), rows)  # the protocol's sum, rounded: not the rows' own sum
    simulated_views, simulated = trial_views(simulation("privacy.secure_aggregation=false"))
    assert calls == [4] * (TRIALS * 2)  # the simulated boundary never calls it
    assert torch.equal(simulated_views[0].messages["dy"], views[0].messages["dy"])  # the same draws
    assert float((final["x"] - simulated["x"]).abs().max()) <= 2 * step + 1e-6


def test_the_trials_round_from_streams_of_their_own_behind_real_secure_aggregation():
    """Each trial's row of a client rounds from that row's streams: two trials whose clients sent the same messages
    would still round them differently (the simulator's rounding, per client, is trial 0's of world 0)."""
    secure = simulation("privacy.secure_aggregation=true").boundary.secure
    rows = {"dy": torch.full((2, 5), 0.3)}
    ids = torch.tensor([0, 1])
    by_ids = secure.encode(rows, ids, 0, 0)
    assert torch.equal(secure.encode(rows, ids, 0, 0, stream_ids=ids), by_ids)
    assert not torch.equal(secure.encode(rows, ids, 0, 0, stream_ids=ids + 4), by_ids)


def test_the_one_run_audit_behind_real_secure_aggregation_reads_the_protocols_sum(monkeypatch):
    """The server's one-run scores behind real secure aggregation are the protocol's decoded sum along each canary's
    coordinate: the protocol runs on the audited cohort, and the scores are the simulated sum's up to the rounding,
    not bit for bit."""
    calls = counted_secure_sums(monkeypatch)
    included, real = runs.one_run_scores(simulation("privacy.secure_aggregation=true"), "server", 20)
    assert calls == [4]  # the audited round's cohort, through the protocol
    same, simulated = runs.one_run_scores(simulation("privacy.secure_aggregation=false"), "server", 20)
    assert (included == same).all() and calls == [4]
    assert not (real == simulated).all() and abs(real - simulated).max() < 1e-4 * abs(simulated).max()


@pytest.mark.parametrize("boundary", ["shuffler", "secagg", "plain"])
def test_the_trials_fast_sums_are_what_collect_delivers_to_each_trial(boundary):
    """Behind a simulated stage the trials' sums are added up in one pass over the rows: each trial's is the sum
    ``Boundary.collect`` delivers for that trial's rows alone (with its count)."""
    sim = build_simulation(load_config(None, ["data.num_clients=5", "data.samples_per_client=20",
                                              "algorithm.name='dp-fedavg'", "algorithm.local_steps=2",
                                              "algorithm.client_rate=0.6", f"privacy.boundary='{boundary}'",
                                              "run.noise_seed=0"]))
    assert not sim.boundary.real
    views, _ = trial_views(sim)
    for view in views:
        for trial in range(TRIALS):
            mine = view.trial_of_row == trial
            delivery = Boundary(boundary).collect([{name: value[mine] for name, value in view.messages.items()}],
                                                  5, sim.seed, view.round, view.client_of_row[mine])
            assert delivery.count == int(view.counts[trial]) == 3
            for name, value in delivery.sums.items():
                torch.testing.assert_close(view.sums(name)[trial], value, rtol=1e-6, atol=1e-6)
