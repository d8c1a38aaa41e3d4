"""SDP algorithms (Lowy et al. 2023) with Cheu et al.'s binomial vector summation through a real shuffler."""

import json
import math

import pytest
import torch

from dpfl.accounting.events import BinomialSumDpEvent
from dpfl.accounting.observers import Cohort, Release, observer_events, scale_noise
from dpfl.cli import main
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
from dpfl.protocols.shuffler import BinomialVectorSum

import survivors

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["data.num_clients=6", "data.samples_per_client=30", "algorithm.rounds=3", "algorithm.client_rate=0.5",
        "privacy.epsilon=4.0", "run.noise_seed=0"]  # the same draws in every simulation (research mode)


def run_cli(tmp_path, name: str, *overrides: str) -> dict:
    path = tmp_path / "run.toml"
    path.write_text(f'[data]\nname = "breast_cancer"\nnum_clients = 5\nscale = 0.001\n[algorithm]\nname = "{name}"\n'
                    'rounds = 4\nclient_rate = 0.6\nlr = 0.5\n[privacy]\nepsilon = 3.0\nboundary = "shuffler"\n'
                    'shuffler = "real"\n')
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress",
                 *(a for o in overrides for a in ("--set", o))]) == 0
    return json.loads((tmp_path / "run" / "results.json").read_text())


@pytest.mark.parametrize("name", ["sdp-prox-sgd", "sdp-spider"])
def test_breast_cancer_through_the_real_shuffler_meets_the_budget(name, tmp_path):
    """dpfl run end to end: every observer of the shuffled messages within privacy.epsilon, the model trains. Its
    noise is fixed (run.noise_seed): with a fresh secret key the train loss is random, and one draw in a full run
    ended at 0.755 (noise seeds 0..11 end between 0.596 and 0.647, below log 2 = 0.693)."""
    results = run_cli(tmp_path, name, "run.noise_seed=0")
    final = results["final"]
    for observer in ("third_party", "server", "other_silo"):
        assert 0 < final["epsilon"][observer] <= 3.0
    assert final["epsilon"]["server"] == final["epsilon"]["third_party"]  # the server sees the shuffled sum only
    if name == "sdp-prox-sgd":
        assert final["train_loss"] < math.log(2)  # below the initial model's (w = 0)
    else:  # every round composed: the charge grows round by round (4 noisy rounds barely move SPIDER here)
        assert results["rounds"][0]["epsilon"]["server"] < final["epsilon"]["server"]
        assert math.isfinite(final["train_loss"])


def test_the_count_path_and_the_real_shuffler_train_the_same_model():
    """privacy.shuffler = 'real' expands the silos' counts into labelled bits, shuffles and counts them again: the same
    sums as the simulated shuffler's, so the same model; only the server's charge differs (it sees one silo's row
    behind the simulated shuffler)."""
    real = build_simulation(load_config(None, ["algorithm.name='sdp-prox-sgd'", *TINY, "privacy.boundary='shuffler'",
                                               "privacy.shuffler='real'"]))
    simulated = build_simulation(load_config(None, ["algorithm.name='sdp-prox-sgd'", *TINY,
                                                    "privacy.boundary='shuffler'", "privacy.shuffler='simulated'"]))
    real.run(2)
    simulated.run(2)
    assert torch.equal(real.model, simulated.model)
    eps_real, eps_simulated = real.ledger.epsilon(), simulated.ledger.epsilon()
    assert eps_real["server"] <= 4.0 < eps_simulated["server"]
    assert eps_real["other_silo"] == pytest.approx(eps_simulated["other_silo"])


def trials(event) -> int:
    """The noise bits of the one binomial summation inside an observer's event."""
    while not isinstance(event, BinomialSumDpEvent):
        event = event.event
    return event.trials


def test_other_silos_are_credited_with_the_cohorts_bits_but_not_their_own():
    own = BinomialSumDpEvent(40, 0.5, 10, 4, 4.0)
    views = observer_events(Release((own,), (True,)), Cohort.fixed(10, 5), "secagg")
    assert trials(views["server"]) == trials(views["third_party"]) == 5 * 40
    assert trials(views["other_silo"]) == 4 * 40
    assert scale_noise(own, math.sqrt(2.5)).trials == 100
    plain = observer_events(Release((own,), (True,)), Cohort.fixed(10, 5), "plain")
    assert trials(plain["server"]) == 40


def test_the_shuffle_model_is_the_default_and_meets_the_target_towards_every_observer():
    """sdp-* default to the real shuffler (their privacy_defaults), so a minimal config's server epsilon, like the
    other silos', is within privacy.epsilon."""
    sim = build_simulation(load_config(None, ["algorithm.name='sdp-prox-sgd'", *TINY]))
    assert sim.boundary.name == "shuffler" and sim.boundary.shuffle == "real"
    assert sim.algorithm.noise.trials == 442  # pinned (tests/accounting/test_binomial_values.py pins the curve)
    sim.run(2)
    assert all(0 < eps <= 4.0 + 1e-9 for eps in sim.ledger.epsilon().values())
    assert sim.ledger.epsilon() == pytest.approx({"third_party": 3.074548416854337, "server": 3.074548416854337,
                                                  "other_silo": 3.939101629021404}, rel=1e-10)


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError) as caught:
        build_simulation(load_config(None, ["algorithm.name='sdp-prox-sgd'", *TINY, "privacy.boundary='plain'",
                                            "privacy.shuffler='real'"]))
    assert caught.value.field == "privacy.boundary"
    sim = build_simulation(load_config(None, ["algorithm.name='dp-fedavg'", "algorithm.noise_multiplier=1.0",
                                              "privacy.boundary='shuffler'", "privacy.shuffler='real'"]))
    with pytest.raises(ConfigError) as caught:
        sim.step()
    assert caught.value.field == "privacy.shuffler"
    with pytest.raises(ConfigError) as caught:
        build_simulation(load_config(None, ["algorithm.name='sdp-prox-sgd'", *TINY, "algorithm.rounds=25"]))
    assert caught.value.field == "algorithm.rounds"


def test_spider_streams_share_the_budget_and_compose_to_the_target():
    """sdp-spider: Q = 2 checkpoint rounds with b1 bits, D = 1 difference round with b2 = ceil(b1 D / Q); after all
    R = 3 rounds every shuffle-model observer is within privacy.epsilon, and the difference round's P_vec bound is
    B_r = 2C (no verified smoothness)."""
    sim = build_simulation(load_config(None, ["algorithm.name='sdp-spider'", *TINY, "algorithm.period=2",
                                              "algorithm.clip=0.5", "privacy.boundary='shuffler'",
                                              "privacy.shuffler='real'"]))
    algorithm = sim.algorithm
    b1, b2 = algorithm.trials(0), algorithm.trials(1)
    assert b2 == math.ceil(b1 / 2) and algorithm.trials(2) == b1
    per_silo = algorithm.model.per_silo
    declared = [algorithm.release(r, sim.state, sim.train.counts).step_events[0].trials for r in range(3)]
    assert declared == [per_silo * b1, per_silo * b2, per_silo * b1]
    assert (b1, b2) == (3199, 1600)  # pinned (tests/accounting/test_binomial_values.py pins the curve)
    sim.run(3)
    assert all(0 < eps <= 4.0 for eps in sim.ledger.epsilon().values())
    assert sim.ledger.epsilon() == pytest.approx({"third_party": 3.004504501972047, "server": 3.004504501972047,
                                                  "other_silo": 3.9590542330855896}, rel=1e-10)
    assert algorithm.summation(1, {"x": sim.model, "x_prev": sim.model + 1.0}).bound == 1.0  # 2C
    assert algorithm.summation(0, sim.state.server).bound == 0.5  # C


def test_spider_with_period_one_has_no_difference_rounds():
    """q = 1: every round is a checkpoint (Lowy et al.'s FedProx-SPIDER with q = 1 is MB-SGD), so b1 is calibrated
    over the R checkpoint rounds alone; it crashed before the first round composing an empty difference stream."""
    sim = build_simulation(load_config(None, ["algorithm.name='sdp-spider'", *TINY, "algorithm.period=1"]))
    algorithm = sim.algorithm
    b1 = algorithm.trials(0)
    assert [algorithm.trials(r) for r in range(3)] == [b1] * 3
    declared = [algorithm.release(r, sim.state, sim.train.counts).step_events[0].trials for r in range(3)]
    assert declared == [algorithm.model.per_silo * b1] * 3
    sim.run(3)
    assert all(0 < eps <= 4.0 for eps in sim.ledger.epsilon().values())


def largest_randomiser_input(name: str, monkeypatch) -> float:
    """The largest ||x|| / L over the vectors x that enter P_vec's local randomiser (``BinomialVectorSum.counts``)
    in two real rounds of ``name`` (sdp-spider: a checkpoint round, then a difference round), every record's
    features scaled 1000x (raw gradient norms ~10^3 C)."""
    period = ["algorithm.period=2"] if name == "sdp-spider" else []
    sim = build_simulation(load_config(None, [f"algorithm.name='{name}'", *TINY, *period, "algorithm.clip=0.5",
                                              "privacy.shuffler='simulated'"]))  # the same vectors as 'real'
    sim.train.x.mul_(1000.0)
    ratios = []
    counts = BinomialVectorSum.counts

    def recording(self, x, rounding, noise):
        ratios.append(float(x.double().norm(dim=-1).max()) / self.bound)
        return counts(self, x, rounding, noise)

    monkeypatch.setattr(BinomialVectorSum, "counts", recording)
    sim.run(2)
    assert ratios
    return max(ratios)


@pytest.mark.parametrize("name", ["sdp-prox-sgd", "sdp-spider"])
def test_every_vector_entering_the_local_randomiser_is_in_its_l2_ball(name, monkeypatch):
    """The shuffle-DP families' events assume each user's vector lies in the l2 ball of radius L (l2_shift g:
    replacing a record moves it by <= 2L), while P_vec's randomiser itself only refuses coordinates outside [-L, L]:
    every vector has l2 norm <= L, and the clip bites (the largest is L)."""
    assert 0.999 < largest_randomiser_input(name, monkeypatch) <= 1 + 1e-5


def test_the_l2_ball_test_catches_examples_left_unclipped(monkeypatch):
    survivors.unclipped_examples(monkeypatch)
    assert largest_randomiser_input("sdp-prox-sgd", monkeypatch) > 2
