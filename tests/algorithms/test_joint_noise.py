"""dp-fedavg-joint (Heikkilä et al.): share sizes per trust setting, the summed noise's statistics through the real
client_round, both analyses (Table 1 under the paper's, the sound one beside it), calibration to privacy.epsilon,
results.json's "unproven", a minimal config through the CLI, and bad configs."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from dp_accounting import dp_event

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import JOINT_PAPER_UNPROVEN, observer_events
from dpfl.algorithms.dp_fedavg_joint import JointNoiseConfig
from dpfl.experiments.noise_level import build_calibrated
from dpfl.algorithms.registry import Setting
from dpfl.cli import main
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.engine.sampling import ClientSampler
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.papers.heikkila2024.experiment import TABLE_1
from dpfl.experiments.runner import build_simulation

pytestmark = pytest.mark.usefixtures("one_torch_thread")
logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's fractional-order warnings


def setting(num_clients=10, records=100, rounds=1, epsilon=None, analysis="sound", delta=1e-5, conversion=None):
    return Setting(client_rate=1.0, num_clients=num_clients, train_counts=(records,) * num_clients, rounds=rounds,
                   delta=delta, epsilon=epsilon, analysis=analysis, conversion=conversion)


def build(config=None, **kw):
    return build_calibrated("dp-fedavg-joint", config or JointNoiseConfig(), setting(**kw))


def third_party_epsilon(algorithm, analysis, num_clients, rounds=1, conversion=None, delta=1e-5, records=100,
                        accountant="rdp-integer"):
    release = algorithm.release(0, None, torch.tensor([records] * num_clients))
    event = observer_events(release, ClientSampler(num_clients, 1.0).cohort(0), "secagg", analysis)["third_party"]
    ledger = PrivacyLedger(("third_party",), delta, None, conversion, analysis, algorithm.neighboring, accountant)
    return ledger.epsilon_after([{"third_party": event}] * rounds, ["third_party"])["third_party"]


# -- shares --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("trust, colluders, min_clients, expected", [
    ("aggregator", 1, None, 2.0 / math.sqrt(10)),
    ("clients", 1, None, 2.0 / math.sqrt(9)),
    ("coalition", 3, None, 2.0 / math.sqrt(7)),
    ("clients", 1, 6, 2.0 / math.sqrt(5)),  # 6 of 10 may finish, one of them curious
    ("coalition", 2, 6, 2.0 / math.sqrt(4)),
    ("local", 1, None, 2.0),
])
def test_each_share_is_sigma_over_the_root_of_the_shares_no_observer_can_remove(trust, colluders, min_clients,
                                                                                 expected):
    alg = build(JointNoiseConfig(noise_multiplier=2.0, trust=trust, colluders=colluders, min_clients=min_clients))
    assert alg.mechanism.noise_multiplier == pytest.approx(expected, rel=1e-12)
    release = alg.release(0, None, torch.tensor([100] * 10))
    assert release.contributors == (min_clients or 10) and release.paper == "heikkila"
    assert release.additive == (False,) * 9 + (True,)  # 10 local steps by default: only the last reaches the sum intact
    # the sound third party: the last step at the surviving cohort's summed shares, the others at the own share
    events = observer_events(release, ClientSampler(10, 1.0).cohort(0), "secagg", "sound")
    last = events["third_party"].events[-1].event.event
    assert last.noise_multiplier == pytest.approx(expected * math.sqrt(min_clients or 10))
    if trust in ("clients", "coalition"):  # the coalition the shares were sized against keeps exactly sigma
        assert events["other_silo"].events[-1].event.event.noise_multiplier == pytest.approx(2.0)


class ZeroGradients:
    """Duck-typed CohortGradients whose clipped sums are 0: a client's update is its noise alone."""

    def clipped_sum(self, theta, x, y, mask, clip):
        return torch.zeros(theta.shape[0], theta.shape[1], dtype=theta.dtype)


@pytest.mark.parametrize("trust, others_removed", [("aggregator", 0), ("clients", 1)])
def test_the_summed_shares_have_the_noise_sigma_of_the_central_mechanism(trust, others_removed):
    """One local step (gamma = 1, q = 0.5, n = 40, C = 1): each client's update is -xi with std sigma_i C / (q n), so
    the sum over the clients an observer cannot remove has std sigma C / (q n) = 0.1 for sigma = 2: checked on
    20,000 coordinates (the sample std's relative error is ~0.5%)."""
    n_clients, records, q, sigma = 8, 40, 0.5, 2.0
    alg = build(JointNoiseConfig(local_steps=1, lr=1.0, sample_rate=q, noise_multiplier=sigma, trust=trust),
                num_clients=n_clients, records=records)
    ids = torch.arange(n_clients)
    params = 20_000
    data = ClientData(torch.zeros(n_clients, records, 1), torch.zeros(n_clients, records, dtype=torch.long),
                      torch.full((n_clients,), records))
    out = alg.client_round(0, {"x": torch.zeros(params)}, {}, data, ClientContext(ZeroGradients(), 7, 0, ids))
    summed = out.messages["dy"][others_removed:].double().sum(0)
    assert float(summed.std()) == pytest.approx(sigma / (q * records), rel=0.02)
    assert abs(float(summed.mean())) < 4 * sigma / (q * records) / math.sqrt(params)


# -- the two analyses ------------------------------------------------------------------------------------------------
def test_one_local_step_is_accounted_alike_by_both_analyses_and_more_steps_are_not():
    for steps, same in ((1, True), (4, False)):
        alg = build(JointNoiseConfig(local_steps=steps, noise_multiplier=3.0, trust="aggregator"))
        release = alg.release(0, None, torch.tensor([100] * 10))
        cohort = ClientSampler(10, 1.0).cohort(0)
        sound, paper = (observer_events(release, cohort, "secagg", a)["third_party"] for a in ("sound", "paper"))
        assert (sound == paper) is same
        central = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(pytest.approx(3.0)))
        assert paper == dp_event.SelfComposedDpEvent(central, steps)  # every step: the central mechanism, sigma
        assert release.unproven == (() if same else JOINT_PAPER_UNPROVEN)


#: The same averaged models under the sound analysis (same accountant: RDP at orders 2..255, classic conversion): the
#: shares credited to the last step only. With more than one step averaging barely helps (docs/accounting.md, "Joint noise").
TABLE_1_SOUND = {1: [5.0, 2.78, 1.22, 0.64], 10: [5.0, 4.90, 4.89, 4.89], 50: [5.0, 4.97, 4.96, 4.96]}


@pytest.mark.parametrize("steps", sorted(TABLE_1))
def test_table_1_of_the_paper_under_its_analysis_and_the_sound_values_beside_it(steps):
    """sigma_LDP is calibrated by dp-fedavg-joint itself (one party, privacy.epsilon = 5, the paper's analysis);
    averaging N parties' models is one round of N clients whose shares, sized for a trusted aggregator, are sigma_LDP
    each, so sigma = sqrt(N) sigma_LDP."""
    config = JointNoiseConfig(local_steps=steps, trust="aggregator")
    sigma_ldp = build(config, num_clients=1, epsilon=5.0, analysis="paper").mechanism.noise_multiplier
    for (parties, sigma_total, epsilon), sound in zip(TABLE_1[steps], TABLE_1_SOUND[steps]):
        alg = build(JointNoiseConfig(local_steps=steps, trust="aggregator",
                                     noise_multiplier=math.sqrt(parties) * sigma_ldp), num_clients=parties)
        assert alg.mechanism.noise_multiplier == pytest.approx(sigma_ldp)  # each party's share: its LDP noise
        assert round(math.sqrt(parties) * sigma_ldp, 2) == sigma_total
        assert round(third_party_epsilon(alg, "paper", parties), 2) == epsilon
        assert round(third_party_epsilon(alg, "sound", parties, conversion="classic"), 2) == sound


@pytest.mark.slow  # ~5 s: two bracket-and-bisection solves (Table 1's test calibrates too, in the default run)
def test_privacy_epsilon_calibrates_sigma_to_the_ledger_of_the_run():
    for analysis, trust in (("paper", "aggregator"), ("sound", "clients")):
        alg = build(JointNoiseConfig(local_steps=3, trust=trust), epsilon=2.0, analysis=analysis, rounds=5)
        observer = "third_party" if trust == "aggregator" else "other_silo"
        release = alg.release(0, None, torch.tensor([100] * 10))
        event = observer_events(release, ClientSampler(10, 1.0).cohort(0), "secagg", analysis)[observer]
        ledger = PrivacyLedger((observer,), 1e-5, None, None, analysis, "zero_out", alg.accountant)
        assert ledger.epsilon_after([{observer: event}] * 5, [observer])[observer] == pytest.approx(2.0, rel=2e-3)
        assert ledger.epsilon_after([{observer: event}] * 6, [observer])[observer] > 2.0


# -- runs ------------------------------------------------------------------------------------------------------------
MINIMAL = """[data]
name = "synthetic"
num_clients = 8
samples_per_client = 60

[model]
name = "logreg"

[algorithm]
name = "dp-fedavg-joint"
local_steps = 3
rounds = 3

[privacy]
secure_aggregation = true
"""


def test_a_minimal_config_runs_through_the_cli_with_real_secure_aggregation(tmp_path):
    path = tmp_path / "joint.toml"
    path.write_text(MINIMAL)
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    privacy = results["privacy"]
    assert privacy["boundary"] == "secagg" and privacy["analysis"] == "sound" and privacy["unproven"] == []
    assert privacy["accountant"] == {o: "rdp" for o in ("third_party", "server", "other_silo")}
    eps = results["final"]["epsilon"]
    assert 0 < eps["third_party"] == eps["server"] < math.inf  # the server sees only the sum
    assert results["final"]["round"] == 3 and math.isfinite(results["final"]["train_loss"])


def test_results_label_the_papers_analysis_unproven_for_more_than_one_step(tmp_path):
    for steps, unproven in ((3, list(JOINT_PAPER_UNPROVEN)), (1, [])):
        path = tmp_path / f"joint{steps}.toml"
        path.write_text(MINIMAL.replace("local_steps = 3", f"local_steps = {steps}") + 'analysis = "paper"\n')
        assert main(["run", str(path), "--out", str(tmp_path / f"run{steps}"), "--no-progress"]) == 0
        results = json.loads((tmp_path / f"run{steps}" / "results.json").read_text())
        assert results["privacy"]["analysis"] == "paper" and results["privacy"]["unproven"] == unproven


@pytest.mark.parametrize("overrides, field, allowed", [
    (["algorithm.trust='everyone'"], "algorithm.trust", "one of"),
    (["algorithm.trust='coalition'", "algorithm.colluders=8"], "algorithm.colluders", "fewer than the 8"),
    (["algorithm.min_clients=4"], "algorithm.min_clients", "[5, 8]"),
    (["algorithm.noise_multiplier=1.0", "privacy.epsilon=1.0"], "algorithm.noise_multiplier", "None when"),
    (["privacy.secure_aggregation=true", "privacy.boundary='shuffler'"], "privacy.boundary", "'secagg'"),
    (["algorithm.name='dp-fedavg'", "privacy.secure_aggregation=true"], "privacy.secure_aggregation", "bounds"),
])
def test_a_bad_joint_config_names_its_key(overrides, field, allowed):
    base = ["algorithm.name='dp-fedavg-joint'", "data.num_clients=8", "data.samples_per_client=30",
            "algorithm.local_steps=2"]
    with pytest.raises(ConfigError) as caught:
        build_simulation(load_config(None, [*base, *overrides]))
    assert caught.value.field == field and allowed in str(caught.value)
