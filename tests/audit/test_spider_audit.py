"""The audit of ISRL-DP FedProx-SPIDER (Lowy et al. 2023, Algorithm 3): its difference stream carries a canary only
if the canary's gradient moves with the model, so the planted bug "a noise stream left out of the accounting" needs
the flipping Dirac canary (``canary.DiracCanaryGradients``, flip): -C e at the initial model, +C e once the model
has moved along e. Two rounds, period 2: a checkpoint round (z1, sensitivity 2C/K) and a difference round (z2 = z1,
sensitivity 2 B_r / K, B_r = 2C), both at full sensitivity for this canary."""

import pytest
import torch

from dpfl.accounting.observers import Release
from dpfl.algorithms.isrl_spider import ISRLSpider
from dpfl.audit import response, runs

DELTA = 1e-2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def spider(epsilon: float = 2.0):
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import build_simulation

    return build_simulation(load_config(None, [
        "data.num_clients=1", "data.samples_per_client=20", "algorithm.name='isrl-spider'", "algorithm.rounds=2",
        "algorithm.period=2", "algorithm.sample_rate=1.0", "algorithm.client_rate=1.0",
        f"privacy.epsilon={epsilon!r}", f"privacy.delta={DELTA!r}", "run.noise_seed=0"]))


def omit_the_difference_stream(monkeypatch):
    """The planted bug: a difference round still DRAWS z2's noise but declares no event in its release and returns
    none from client_round, so the simulator's drawn == declared check passes and the ledger composes the checkpoint
    stream alone."""
    release, client_round = ISRLSpider.release, ISRLSpider.client_round

    def checkpoint_release_only(self, round_index, state, train):
        declared = release(self, round_index, state, train)
        return declared if self.is_checkpoint(round_index) else Release((), (), declared.sensitivity_ratio)

    def checkpoint_events_only(self, round_index, *args):
        out = client_round(self, round_index, *args)
        if not self.is_checkpoint(round_index):
            out.events.clear()
        return out

    monkeypatch.setattr(ISRLSpider, "release", checkpoint_release_only)
    monkeypatch.setattr(ISRLSpider, "client_round", checkpoint_events_only)


def test_the_flipping_canary_moves_the_difference_message_by_its_sensitivity():
    """Round 0 (checkpoint, from the initial model): h shifts by (-C - C) / K along e, against g = -C e; round 1
    (difference, probed from the probe's own round 0, where theta_e != 0): the canary's difference is C - (-C), its
    neighbour's the opposite, so h shifts by 4C / K = 2 B_r / K along g = +C e. The fixed Dirac canary's difference
    is 0 in round 1: it leaves the difference stream out of the score."""
    sim = spider()
    C, K = sim.algorithm.clip, int(sim.train.counts[0])
    flip = runs.make_canary(sim, "flip")
    assert response.responses(sim, flip, 0)["h"] == pytest.approx(2 * C * C / K, rel=1e-6)
    assert response.responses(sim, flip, 1)["h"] == pytest.approx(4 * C * C / K, rel=1e-6)
    assert response.responses(sim, runs.make_canary(sim, "dirac"), 1)["h"] == pytest.approx(0.0, abs=1e-6)
    theta = torch.zeros(3, flip.worlds[0].grads.num_params)
    theta[1, -1] = 1e-3
    assert flip.gradient(theta)[:, -1].tolist() == [-1.0, 1.0, -1.0]


@pytest.mark.slow  # 50 s on 2 cores: the default suite's largest item (python -m pytest -m slow runs it)
def test_planted_bug_difference_stream_left_out_of_the_accounting_is_caught(monkeypatch):
    """privacy.epsilon = 2, 10000 runs per world, the server's view of both rounds. Correct: claim 2.00, bound 1.64.
    The difference stream omitted: claim 1.26 (the checkpoint event alone), bound 1.48 > 1.26 with the flipping
    canary; with the fixed Dirac canary the omission is invisible (bound 0.96 at 5000 runs: its difference is 0)."""
    sim = spider()
    honest = runs.audit(sim, "server", 10000, rounds=2, canary_kind="flip")
    omit_the_difference_stream(monkeypatch)
    buggy = runs.audit(sim, "server", 10000, rounds=2, canary_kind="flip")
    assert honest.bound.epsilon <= honest.claimed_epsilon == pytest.approx(2.0, abs=1e-3)
    assert buggy.claimed_epsilon == pytest.approx(runs.claimed_epsilon(sim, "server"))  # round 0's event alone
    assert buggy.claimed_epsilon < 0.7 * honest.claimed_epsilon
    assert buggy.bound.epsilon > buggy.claimed_epsilon
    fixed = runs.audit(sim, "server", 5000, rounds=2, canary_kind="dirac")
    assert fixed.claimed_epsilon == buggy.claimed_epsilon and fixed.bound.epsilon < 0.8 * fixed.claimed_epsilon


def test_cli_audits_spider_with_the_flipping_canary(tmp_path, capsys):
    """`dpfl audit --canary flip` through the real entry point: two rounds of the correct SPIDER stay at or below the
    two-round claim (privacy.epsilon = 2)."""
    import json

    from dpfl.cli import main

    config = tmp_path / "spider.toml"
    config.write_text("\n".join([
        "[data]", "num_clients = 1", "samples_per_client = 20", "[algorithm]", "name = 'isrl-spider'", "rounds = 2",
        "period = 2", "sample_rate = 1.0", "client_rate = 1.0", "[privacy]", "epsilon = 2.0", "delta = 0.01"]) + "\n")
    assert main(["audit", str(config), "--observer", "server", "--canary", "flip", "--rounds", "2", "--trials", "1000",
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["canary"] == "flip" and printed["rounds"] == 2
    assert printed["claimed_epsilon"] == pytest.approx(2.0, abs=1e-3)
    assert 0.5 < printed["lower_bound"] <= printed["claimed_epsilon"]
