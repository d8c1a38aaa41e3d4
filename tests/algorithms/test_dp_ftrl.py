"""DP-FTRL with a tree restarted every epoch (``dpfl.algorithms.dp_ftrl``): the tree's noise (one node per round
from the server's own stream, the prefix sums' covariance), the ledger's charge (the epoch's tree at its first
round) against the exact privacy of worst-case instances run through the real engine, the samplers it refuses, a
resume mid-tree, calibration to privacy.epsilon and `dpfl run` / `dpfl calibrate run` end to end."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event, privacy_accountant

from dpfl.accounting import accountants
from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY
from dpfl.accounting.theory import gdp_epsilon
from dpfl.algorithms.dp_ftrl import node_level, tree_depth
from dpfl.cli import main
from dpfl.engine import randomness
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import ServerContext
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
from ftrl_worst_case import decomposition, worst_case_mu

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NeighborRel = privacy_accountant.NeighboringRelation


def simulation(*extra: str, out=None, noise_key=None):
    return build_simulation(load_config(None, [
        "algorithm.name='dp-ftrl'", "data.num_clients=8", "data.samples_per_client=30", "run.seed=1",
        "algorithm.client_rate=0.25", "algorithm.rounds=8", *extra]), out, noise_key=noise_key)


def test_the_tree_depth_and_the_level_drawn_in_each_round():
    assert [tree_depth(e) for e in (1, 2, 3, 4, 7, 8, 9)] == [1, 2, 2, 3, 3, 4, 4]
    assert [node_level(t) for t in range(1, 9)] == [0, 1, 0, 2, 0, 1, 0, 3]
    for leaves in range(1, 40):  # a leaf lies in at most D drawn nodes: the node ending at t covers (t - 2^v(t), t]
        covering = [max(sum(1 for t in range(1, leaves + 1) if t - 2 ** node_level(t) < s <= t)
                        for s in range(1, leaves + 1))]
        assert covering == [tree_depth(leaves)]
    # dp_accounting's RDP of the restarted tree's epoch is that of Gaussian(z / sqrt(D)), as the PLD reads it
    for leaves in (1, 3, 4, 100):
        tree, gaussian = (accountants.make(name, NeighborRel.REPLACE_SPECIAL) for name in ("rdp", "rdp"))
        tree.compose(dp_event.SingleEpochTreeAggregationDpEvent(1.5, leaves))
        gaussian.compose(dp_event.GaussianDpEvent(1.5 / math.sqrt(tree_depth(leaves))))
        assert tree.get_epsilon(1e-6) == pytest.approx(gaussian.get_epsilon(1e-6), rel=1e-9)
        pld = accountants.make("pld", NeighborRel.REPLACE_SPECIAL)
        pld.compose(dp_event.SingleEpochTreeAggregationDpEvent(1.5, leaves))
        assert pld.get_epsilon(1e-6) <= tree.get_epsilon(1e-6)


def test_the_server_draws_one_node_per_round_from_its_stream_and_releases_the_noisy_prefix_sums():
    """Rows of independent trials, a tree of E = 8 rounds, nothing delivered: x_tau = x_0 - (eta / n) N_tau, N_tau the
    sum of the decomposition's nodes, node t = z C times the normals of stream (key, round t - 1, row, server_noise):
    exactly, and (fixed seed) the prefix sums' covariance (z C)^2 (shared nodes) over 4000 trials."""
    alg = simulation("algorithm.noise_multiplier=1.5", "algorithm.clip=0.5", "algorithm.global_lr=2.0").algorithm
    assert alg.epoch == 4 and alg.cohort_size == 2
    epoch, trials, P, key = 8, 4000, 3, 11
    alg = dataclasses.replace(alg, epoch=epoch)
    scale, std = alg.global_lr / alg.cohort_size, alg.noise_multiplier * alg.clip
    rows = torch.arange(trials)
    state = alg.init_state(torch.zeros(P), 8)
    server = {k: v.expand(trials, *v.shape).clone() for k, v in state.server.items()}
    prefix = []
    for t in range(epoch):
        ctx = ServerContext(key, t, stream_ids=rows)
        server = alg.server_update(t, server, Delivery({"u": torch.zeros(trials, P)}, 2, 8), ctx)
        assert ctx.events == [dp_event.SingleEpochTreeAggregationDpEvent(1.5, epoch)]
        prefix.append(-server["x"] / scale)
    nodes = {t + 1: std * torch.stack([torch.randn(P, generator=randomness.generator(key, t, int(r), "server_noise"))
                                       for r in rows[:5]]) for t in range(epoch)}
    for tau in range(1, epoch + 1):
        expected = sum(nodes[end] for end in decomposition(tau))
        torch.testing.assert_close(prefix[tau - 1][:5], expected, rtol=1e-5, atol=1e-5)
    flat = torch.stack(prefix).permute(1, 2, 0).reshape(-1, epoch).double() / std  # [trials * P, epoch]
    empirical = flat.T @ flat / flat.shape[0]
    shared = torch.tensor([[len(set(decomposition(a)) & set(decomposition(b))) for b in range(1, epoch + 1)]
                           for a in range(1, epoch + 1)], dtype=torch.float64)
    # each entry: a mean of 12000 products of unit-scale normals, std <= sqrt(2 * 4^2 / 12000) = 0.052
    assert (empirical - shared).abs().max() < 0.2
    assert torch.diagonal(shared).tolist() == [bin(t).count("1") for t in range(1, epoch + 1)]


def test_the_ledger_charges_each_epochs_tree_at_its_first_round_and_a_budget_stops_before_an_epoch():
    sim = simulation("algorithm.noise_multiplier=2.0", "run.epsilon_every=1")
    sim.run(8)
    tree = dp_event.SelfComposedDpEvent(dp_event.SingleEpochTreeAggregationDpEvent(2.0, 4), 1)
    for round_number in range(1, 9):
        charged = sim.ledger.charged(round_number)
        expected = tree if round_number in (1, 5) else dp_event.NoOpDpEvent()
        assert charged == {THIRD_PARTY: expected, OTHER_SILO: expected}, round_number
    spent = {m.round: m.epsilon[THIRD_PARTY] for m in sim.history}
    one_tree, two_trees = spent[1], spent[5]
    assert spent[1] == spent[4] < spent[5] == spent[8] == sim.ledger.epsilon()[THIRD_PARTY]
    budget = simulation("algorithm.noise_multiplier=2.0", f"privacy.budget={(one_tree + two_trees) / 2!r}")
    budget.run(8)
    assert budget.stopped_by == "budget"
    assert budget.next_round == 4  # the second epoch is refused before its first round draws anything


def test_a_sampler_that_breaks_the_participation_assumption_is_refused_naming_its_key():
    for scheme in ("fixed", "poisson"):
        with pytest.raises(ConfigError) as caught:
            simulation(f"algorithm.client_sampling='{scheme}'")
        assert caught.value.field == "algorithm.client_sampling" and "at most one round" in str(caught.value)
    with pytest.raises(ConfigError) as caught:  # 8 clients, cohorts of 3: client 0 is in rounds 1 and 3 of epoch 1
        simulation("algorithm.client_sampling='round_robin'", "algorithm.client_rate=0.375")
    assert caught.value.field == "algorithm.client_rate"
    assert simulation("algorithm.client_sampling='round_robin'").algorithm.epoch == 4
    with pytest.raises(ConfigError) as caught:
        simulation("privacy.analysis='paper'")
    assert caught.value.field == "privacy.analysis"


def test_a_run_resumed_mid_tree_draws_the_same_tree_noise(tmp_path):
    """A checkpoint at round 3 of a tree of 4 (nodes of levels 0 and 1 held): the resumed run ends where the
    uninterrupted one does, and no round is charged twice."""
    extra = ("run.checkpoint_every=3", "algorithm.rounds=8")
    first = simulation(*extra, out=tmp_path)
    reference = simulation(*extra, noise_key=first.seed)
    reference.run(8)
    first.run(3)
    assert bool(first.state.server["nodes"].abs().sum(-1).gt(0).any())
    resumed = simulation(*extra, out=tmp_path)
    resumed.load_checkpoint(tmp_path)
    assert resumed.next_round == 3
    resumed.run(8)
    assert torch.equal(resumed.model, reference.model)
    assert torch.equal(resumed.state.server["nodes"], reference.state.server["nodes"])
    assert resumed.ledger.to_dict()["journal"] == reference.ledger.to_dict()["journal"]


def test_a_cut_last_epoch_is_charged_its_own_tree_and_no_round_past_the_horizon_runs():
    """M = 8, cohorts of 2: E = 4. T = 6 cuts the second epoch after 2 rounds: its rounds declare (and draw) the
    tree of 2 leaves, the first epoch's the tree of 4, and the ledger charges D = 3 then D' = 2 nodes (mu^2 = 5 / z^2
    towards the third party, where two whole trees give 6 / z^2). Round 7 (index 6) would draw a node past the
    cut tree's leaves: refused, naming algorithm.rounds; so is a release config with other rounds (a resume cannot
    extend the run into the charged tree: algorithm.rounds is a release key)."""
    from dpfl.experiments.run_directory import release_hash

    sim = simulation("algorithm.rounds=6")
    assert [sim.algorithm.leaves(t) for t in range(6)] == [4, 4, 4, 4, 2, 2]
    assert sim.algorithm.release(4, None, sim.train.counts).server_events == (
        dp_event.SingleEpochTreeAggregationDpEvent(1.0, 2),)
    sim.run(6)
    spent, z = sim.ledger.epsilon()[THIRD_PARTY], sim.algorithm.noise_multiplier
    assert spent == pytest.approx(gdp_epsilon(math.sqrt(5) / z, sim.ledger.delta), rel=1e-3)
    assert spent < gdp_epsilon(math.sqrt(6) / z, sim.ledger.delta)
    with pytest.raises(ConfigError, match="algorithm.rounds"):
        sim.algorithm.release(6, None, sim.train.counts)
    configs = [load_config(None, ["algorithm.name='dp-ftrl'", f"algorithm.rounds={t}"]) for t in (6, 8)]
    assert release_hash(configs[0]) != release_hash(configs[1])


# -- the exact worst case (tests/helpers/ftrl_worst_case.py, shared with benchmarks/tightness.py) ------------------
@pytest.mark.parametrize("sampling, rounds", [("round_robin", 12), ("round_robin", 10), ("disjoint", 10)])
@pytest.mark.parametrize("boundary", ["trusted", "plain", "secagg"])
def test_the_ledger_is_never_below_the_exact_privacy_of_the_worst_case(boundary, sampling, rounds):
    """The linear instance: every update is the constant -C e_0 (the owner's 0 on its zero-out neighbour), so the
    released models are a linear Gaussian mechanism x = x_0 - (eta/n)(A s + G nu), nu ~ N(0, (z C)^2 I). The shift
    between the neighbours is measured through the engine with common random numbers (same noise key), the
    covariance is the oracle's G, and the exact privacy of all T models is mu-GDP with mu = ||Sigma^{-1/2} shift||.
    E = 4: three whole trees (T = 12), or two and the first 2 rounds of a third (T = 10), whose tree of 2 leaves is
    what the ledger charges (D' = 2 nodes where the whole tree has D = 3). Round robin puts the owner (client 0) at
    each epoch's first round, in D nodes of a whole tree and D' of the cut one: the ledger (PLD) is exact,
    mu = sqrt(3 + 3 + 3) / z or sqrt(3 + 3 + 2) / z; disjoint batches put it anywhere (the ledger charges the worst
    owner). The server sees the unnoised updates (plain) or their sum (secure aggregation): epsilon infinite."""
    sim, mu, nodes = worst_case_mu(boundary, sampling, rounds)
    alg = sim.algorithm
    assert (alg.epoch, alg.depth, alg.cohort_size) == (4, 3, 2)
    assert set(np.round(np.abs(nodes), 6)) <= {0.0, 1.0} and np.abs(nodes).sum() <= 3 * alg.depth
    exact = gdp_epsilon(mu, sim.ledger.delta)
    epsilon = sim.ledger.epsilon()
    for observer in (THIRD_PARTY, OTHER_SILO):
        assert epsilon[observer] >= exact, (observer, epsilon[observer], exact)
    if sampling == "round_robin":  # the owner in the first round of each epoch: the worst case, reached
        depths = [alg.depth] * (rounds // alg.epoch) + ([tree_depth(rounds % alg.epoch)] if rounds % alg.epoch else [])
        assert mu == pytest.approx(math.sqrt(sum(depths)) / alg.noise_multiplier, rel=1e-5)
        assert epsilon[THIRD_PARTY] <= exact * (1 + 1e-4)  # measured at T = 12: 17.894547521 against 17.894547516
    if boundary == "trusted":
        assert SERVER not in epsilon
    else:
        assert math.isinf(epsilon[SERVER])


# -- calibration and the command line -----------------------------------------------------------------------------
TINY = """
[data]
name = "synthetic"
num_clients = 8
samples_per_client = 40

[algorithm]
name = "dp-ftrl"
rounds = 6
client_rate = 0.25
local_steps = 2
noise_multiplier = 1.0
"""


def test_privacy_epsilon_sets_z_and_the_run_spends_its_target():
    sim = simulation("privacy.epsilon=3.0")
    z = sim.algorithm.noise_multiplier
    sim.run(8)
    spent = sim.ledger.epsilon()
    assert 3.0 - 1e-3 <= max(spent.values()) <= 3.0
    with pytest.raises(ConfigError, match="algorithm.noise_multiplier"):
        simulation("privacy.epsilon=3.0", "algorithm.noise_multiplier=1.0")
    less = simulation(f"algorithm.noise_multiplier={z * 0.99!r}")
    less.run(8)
    assert less.ledger.epsilon()[THIRD_PARTY] > 3.0


def test_dpfl_run_and_calibrate_run_answer_for_a_minimal_config(tmp_path, capsys):
    config = tmp_path / "ftrl.toml"
    config.write_text(TINY)
    capsys.readouterr()
    assert main(["calibrate", "run", str(config), "--target-epsilon", "4", "--json"]) == 0, capsys.readouterr().err
    calibrated = json.loads(capsys.readouterr().out)
    assert calibrated["noise_key"] == "algorithm.noise_multiplier" and calibrated["neighboring"] == "zero_out"
    z = calibrated["noise_multiplier"]
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--no-progress", "--json",
                 "--set", f"algorithm.noise_multiplier={z!r}"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert set(results["epsilon"]) == {THIRD_PARTY, OTHER_SILO}
    assert results["epsilon"][THIRD_PARTY] == pytest.approx(calibrated["epsilon"], rel=1e-9)
    assert calibrated["epsilon"] <= 4
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["privacy"]["unit"].startswith("one client's data")
