"""Projected noisy SGD's unit of privacy is a client's whole data (``privacy_unit``, Asoodeh et al. 2021): the audit's
Dirac canary is then every record of the canary's client, which moves the client's mean gradient by the user-level
sensitivity 2L (one record would move it by 2L / n_i and certify nothing)."""

import pytest
import torch

from dpfl.audit import canary, response, runs
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DELTA = 1e-2


def projected(*extra):
    """10 users of 20 records, disjoint batches of one user, one pass (10 rounds), z = 1, L = 1, lr 0.1."""
    return build_simulation(load_config(None, [
        "algorithm.name='projected-noisy-sgd'", "data.num_clients=10", "data.samples_per_client=20",
        "algorithm.rounds=10", "algorithm.clip=1.0", "algorithm.noise_multiplier=1.0", "algorithm.lr=0.1",
        f"privacy.delta={DELTA!r}", "run.noise_seed=0", *extra]))


def test_a_user_level_claim_is_audited_with_every_record_of_the_client():
    """Every record of client 0 is marked (the canary in world 1, its opposite in world 0), no other client's; the
    user's message moves by lr x 2L = 0.2 along e (a single record's would be 0.01); a record-level algorithm's
    canary is one record."""
    sim = projected()
    assert runs.user_level(sim.algorithm)
    target = runs.make_canary(sim, "dirac")
    out, into = (world.y for world in target.worlds)
    assert bool((into[0] == canary.CANARY).all()) and bool((out[0] == canary.OPPOSITE).all())
    assert torch.equal(into[1:], sim.train.y[1:]) and torch.equal(out[1:], sim.train.y[1:])
    assert response.responses(sim, target, 0)["dw"] == pytest.approx(0.2, rel=1e-5)
    record_level = build_simulation(load_config("examples/audit_fedsgd.toml", ["run.noise_seed=0"]))
    assert not runs.user_level(record_level.algorithm)
    assert int((runs.make_canary(record_level, "dirac").worlds[1].y < 0).sum()) == 1


def test_the_user_level_canary_certifies_a_bound_below_the_claim_towards_another_silo():
    """One pass (10 rounds; each trial draws its own secret partition), 1000 runs per world: another silo, which
    sees every iterate but not which round holds the canary's user, finds 0.16 of the claim 2.32 (fixed seed; with
    one record as the canary: 0)."""
    sim = projected()
    result = runs.audit(sim, "other_silo", 1000, rounds=10, release="final")
    assert 0.05 < result.bound.epsilon <= result.claimed_epsilon == pytest.approx(2.318, abs=1e-3)


def test_the_probe_delivers_nothing_in_a_round_that_contacts_nobody():
    """The randomly stopped variant contacts nobody after its secret tau: the probe's and the trials' server steps
    get an empty delivery (count 0, as the engine's boundary delivers; they were handed a count with no message and
    raised KeyError 'dw'), and such rounds weigh 0."""
    sim = projected("algorithm.name='projected-noisy-sgd-random-stop'")
    stopped = [t for t in range(10) if not sim.algorithm.runs(t)]
    assert stopped  # tau < 10 for this seed
    weights = response.round_weights(sim, runs.make_canary(sim, "dirac"), 10)
    assert all(not any(weights[t].values()) for t in stopped)
    assert weights[0]["dw"] == pytest.approx(1 / 0.2, rel=1e-5)
    negatives, positives = runs.run_trials(sim, "other_silo", 8, rounds=10, release="final")
    assert negatives.shape == positives.shape == (8,)
