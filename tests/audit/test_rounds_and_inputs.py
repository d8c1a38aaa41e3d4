"""Multi-round audits (R rounds per trial, per-trial server models), the input-space canary and the black-box loss
score, through the real LocalSGD client_round, and their `dpfl audit` flags."""

import json

import numpy as np
import pytest
import torch

import dpfl.noise as noise
from dpfl.audit import response, runs
from dpfl.cli import main

DELTA = 1e-2


def test_input_canary_is_a_real_record_and_its_neighbour_follows_the_relation(make_sim):
    """Replace-one: world 1 holds the canary record in place of record 0 of client 0, world 0 the original record;
    zero-out (Poisson records): world 0 marks the record null (gradient 0), the client's count unchanged."""
    sim = make_sim(1.0, DELTA, 2)
    target = runs.make_canary(sim, "input")
    out, into = target.worlds
    assert torch.equal(out.x, sim.train.x) and torch.equal(out.y, sim.train.y)
    assert not torch.equal(into.x[0, 0], sim.train.x[0, 0]) and torch.equal(into.x[1], sim.train.x[1])
    assert into.x[0, 0].norm() > 2.9 * sim.train.x.flatten(2).norm(dim=2).max()  # far from the data
    response.responses(sim, target, 0)  # the algorithm calls the oracle: the canary learns its clip bound and norm
    g = target.gradient(into.grads.initial_params().unsqueeze(0))
    assert g.norm() == pytest.approx(1.0, rel=1e-5)  # clipped to C = 1 (its raw gradient is far larger)
    poisson = make_sim(1.0, DELTA, 2, "algorithm.record_sampling='poisson'", "algorithm.sample_rate=0.5")
    null = runs.make_canary(poisson, "input").worlds[0]
    assert int(null.y[0, 0]) == -3 and torch.equal(null.x, sim.train.x)


def test_input_canary_white_box_stays_below_the_claim_and_catches_a_tenth_of_the_noise(make_sim, monkeypatch):
    """One client, z = 1 (claim 2.32 towards the owner's server). The input canary replaces a real record, whose own
    clipped gradient is not the canary's opposite: the sum moves by less than the sensitivity 2C, so this audit is
    weaker than the Dirac canary's. Measured (1000 runs per world): correct code 0.26 (500 runs: 0.00); noise halved
    1.38, not caught; a tenth of the noise (the event unchanged): 4.78."""
    sim = make_sim(1.0, DELTA, 1)
    honest = runs.audit(sim, "server", 1000, canary_kind="input")
    assert honest.bound.epsilon <= honest.claimed_epsilon
    original = noise.gaussian_noise
    monkeypatch.setattr(noise, "gaussian_noise", lambda *args, **kwargs: 0.1 * original(*args, **kwargs))
    assert runs.audit(sim, "server", 1000, canary_kind="input").bound.epsilon > honest.claimed_epsilon


def test_mirror_canary_is_the_input_record_against_its_mirror_image(make_sim):
    """Replace-one: world 0 holds the canary's features negated (same label) where world 1 holds the canary; the
    score's direction is g(x) - g(-x), each clipped to C, whose weight parts are opposite for logistic regression at
    the initial model (norm close to 2C). Zero-out (Poisson records): the null record, as for ``input``."""
    sim = make_sim(1.0, DELTA, 2)
    target = runs.make_canary(sim, "mirror")
    out, into = target.worlds
    assert torch.equal(out.x[0, 0], -into.x[0, 0]) and int(out.y[0, 0]) == int(into.y[0, 0])
    assert torch.equal(out.x[1], sim.train.x[1]) and torch.equal(into.x[1], sim.train.x[1])
    response.responses(sim, target, 0)
    g = target.gradient(into.grads.initial_params().unsqueeze(0))
    assert 1.8 < float(g.norm()) <= 2.0 + 1e-5  # measured 1.89
    poisson = make_sim(1.0, DELTA, 2, "algorithm.record_sampling='poisson'", "algorithm.sample_rate=0.5")
    null = runs.make_canary(poisson, "mirror").worlds[0]
    assert int(null.y[0, 0]) == -3 and torch.equal(null.x, sim.train.x)


def test_mirror_canary_is_near_the_dirac_strength_and_catches_a_clip_on_the_wrong_tensor(make_sim, monkeypatch):
    """One client, z = 1 (claim 2.32 towards the owner's server), 1000 runs per world. Measured: correct code, Dirac
    1.75, mirror 1.61, input 0.51. The planted bug clips each record's gradient of the batch's MEAN loss (its norm
    divided by the batch's width b = 20: a record is clipped at 20 C): the Dirac canary, which states its clipped
    gradient, stays at 1.75; the mirror canary, whose gradient goes through the engine's norms, finds 8.04 (the input
    canary 3.00)."""
    from dpfl.engine import ghost, grads

    sim = make_sim(1.0, DELTA, 1)
    honest = runs.audit(sim, "server", 1000, canary_kind="mirror")
    assert 0.5 * honest.claimed_epsilon < honest.lower_bound <= honest.claimed_epsilon
    norms, sq_norms = grads._norms, ghost.sq_norms
    monkeypatch.setattr(grads, "_norms", lambda g, norm: norms(g, norm) / g.shape[1])
    monkeypatch.setattr(ghost, "sq_norms", lambda layers, clients: (lambda v: v / v.shape[-1] ** 2)(
        sq_norms(layers, clients)))
    dirac, mirror = (runs.audit(sim, "server", 1000, canary_kind=kind) for kind in ("dirac", "mirror"))
    assert dirac.lower_bound <= dirac.claimed_epsilon
    assert mirror.lower_bound > 2 * mirror.claimed_epsilon


@pytest.mark.slow
def test_input_canary_black_box_loss_stays_below_the_claim_and_catches_quartered_noise(make_sim, monkeypatch):
    """The black-box score (minus the canary's loss on the released model), third party, one client, z = 1 (claim
    2.32). Measured (1000 runs per world): correct code 0.06; noise quartered 2.69."""
    sim = make_sim(1.0, DELTA, 1)
    honest = runs.audit(sim, "third_party", 1000, canary_kind="input", score="loss")
    assert honest.bound.epsilon <= honest.claimed_epsilon
    original = noise.gaussian_noise
    monkeypatch.setattr(noise, "gaussian_noise", lambda *args, **kwargs: 0.25 * original(*args, **kwargs))
    buggy = runs.audit(sim, "third_party", 1000, canary_kind="input", score="loss")
    assert buggy.bound.epsilon > honest.claimed_epsilon


@pytest.mark.slow
def test_multi_round_claim_composes_and_the_audit_sees_more(make_sim):
    """Three rounds of one Gaussian release each: the claim is the 3-fold composition (4.90 at delta 1e-2), and the
    summed white-box scores certify more than one round can (measured, 300 runs: 2.33 against 0.93)."""
    sim = make_sim(1.0, DELTA, 1, "algorithm.rounds=3")
    one = runs.audit(sim, "server", 300)
    three = runs.audit(sim, "server", 300, rounds=3)
    assert three.claimed_epsilon == pytest.approx(4.904, abs=1e-2) and one.claimed_epsilon == pytest.approx(2.318,
                                                                                                            abs=1e-2)
    assert one.bound.epsilon < three.bound.epsilon <= three.claimed_epsilon


def test_trials_keep_their_own_models_across_rounds(make_sim):
    """Per-trial server states: with noise, two trials' models differ after round 0, and round 1 starts each trial
    from its own model (a trial's round-1 score is not that of a shared model)."""
    from dpfl.audit.trials import run_world

    sim = make_sim(1.0, DELTA, 2, "algorithm.rounds=2")
    world = runs.make_canary(sim, "input").worlds[1]
    starts = []
    final = run_world(sim, world, 1, 3, 2, lambda view: starts.append(view.before["x"].clone()))["x"]
    assert torch.equal(starts[0][0], starts[0][1])  # round 0: the common initial model
    assert not torch.equal(starts[1][0], starts[1][1])  # round 1: each trial's own model
    assert not torch.equal(final[0], final[1])


def test_release_final_scores_the_last_model_only(make_sim):
    """Dirac canary, no weight decay: the sum of the rounds' moves along e telescopes to x_R - x_0, so "final" and
    "every_round" give the same scores; for the input canary the gradient moves with the model and they differ."""
    sim = make_sim(1.0, DELTA, 1, "algorithm.rounds=2")
    every = runs.run_trials(sim, "third_party", 50, rounds=2)
    final = runs.run_trials(sim, "third_party", 50, rounds=2, release="final")
    np.testing.assert_allclose(every[1], final[1], rtol=1e-6, atol=1e-9)
    every = runs.run_trials(sim, "third_party", 50, rounds=2, canary_kind="input")
    final = runs.run_trials(sim, "third_party", 50, rounds=2, canary_kind="input", release="final")
    assert not np.allclose(every[1], final[1])


@pytest.mark.slow
def test_scaffold_warm_post_warm_up_rounds_and_dc_are_scored(make_sim):
    """dp-scaffold-warm at client_rate 1 has 4 warm rounds (dy = 0, only dc carries the canary): round 0 alone is
    still audited through dc, and 5 rounds (one past the warm-up) stay below their claim. Measured (300 runs):
    round 0: 1.90 of 3.71; 5 rounds: 2.21 of 11.6 (the later rounds add their noise to the summed score)."""
    sim = make_sim(1.0, DELTA, 1, "algorithm.name='dp-scaffold-warm'", "algorithm.local_steps=2",
                   "algorithm.rounds=5")
    first = runs.audit(sim, "server", 300)
    five = runs.audit(sim, "server", 300, rounds=5)
    assert 0 < first.bound.epsilon <= first.claimed_epsilon
    assert first.bound.epsilon < five.bound.epsilon <= five.claimed_epsilon


def test_cli_audit_input_canary_loss_rounds_roc_and_progress(tmp_path, capsys):
    from .test_audit import _config

    roc = tmp_path / "figures" / "roc.png"
    argv = ["audit", _config(tmp_path, "release = 'final'"), "--set", "algorithm.rounds=2", "--observer",
            "third_party", "--canary", "input", "--score", "loss", "--rounds", "2", "--trials", "50", "--progress",
            "--json",
            "--out", str(tmp_path / "out"), "--roc", str(roc)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert {"observer", "claimed_epsilon", "delta", "lower_bound", "confidence", "trials", "method"} <= set(printed)
    assert (printed["canary"], printed["score"], printed["rounds"], printed["release"]) == ("input", "loss", 2,
                                                                                             "final")
    assert 0 <= printed["lower_bound"] <= printed["claimed_epsilon"] and roc.stat().st_size > 0
    assert "audit: world 2/2, round 2/2, 50 trials" in captured.err
