"""FedSGD-DPC (Zhou et al. 2021): the reply schedule, the calibration, worst-case instances through the real
client_round, the aggregation and the config's errors."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event
from scipy import stats

from dpfl.accounting import accountants
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.accounting.theory import gdp_epsilon
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import observer_events
from dpfl.algorithms.fedsgd_dpc import FedSGDDPCConfig, ReplySchedule
from dpfl.algorithms.registry import Setting
from dpfl.cli import main
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.engine.sampling import ClientSampler
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.noise_level import build_calibrated
from dpfl.experiments.runner import build_simulation

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def setting(num_clients=4, records=10, rounds=6, epsilon=2.0, seed=0, delta=1e-5, **kw) -> Setting:
    return Setting(client_rate=1.0, num_clients=num_clients, train_counts=(records,) * num_clients, rounds=rounds,
                   delta=delta, epsilon=epsilon, seed=seed, **kw)


def build(config: FedSGDDPCConfig | None = None, **kw):
    return build_calibrated("fedsgd-dpc", config or FedSGDDPCConfig(), setting(**kw))


# -- the schedule --------------------------------------------------------------------------------------------------
def test_round_robin_replies_are_exact_and_a_round_is_charged_per_new_reply_count():
    schedule = ReplySchedule.draw(ClientSampler(10, 0.3, "round_robin"), 10, seed=0)
    assert schedule.replies == (3,) * 10 and schedule.most == 3  # bT / N = 3 for every client
    # cohorts 0-2, 3-5, 6-8, {9,0,1}: the first new maximum is round 0, then round 3 (clients 0, 1), then round 6
    assert [t for t, c in enumerate(schedule.charged) if c] == [0, 3, 6]


def test_round_robin_charges_the_worst_client_its_own_replies_round_by_round():
    """b = 1 of N = 10 for T = 22 rounds (Zhou et al.'s Alg. 1 cohorts): clients 0 and 1 reply 3 times, the others
    twice; every client is calibrated to m = 3 = ceil(bT/N) replies of eps / 3 (Laplace scale m / eps), and after
    round t the ledger has charged the worst client its ceil((t + 1) / 10) replies so far, eps at the end."""
    alg = build(FedSGDDPCConfig(clients_per_round=1, selection="round-robin"), num_clients=10, rounds=22)
    assert alg.schedule.replies == (3, 3) + (2,) * 8 and alg.schedule.most == 3
    assert torch.allclose(alg.noise, torch.full((10,), 3 / 2.0, dtype=torch.float64), rtol=1e-4, atol=0.0)
    counts = torch.tensor(setting(num_clients=10).train_counts)
    ledger = PrivacyLedger(("server",), 1e-5, accountant=alg.accountant)
    spent = []
    for t in range(22):
        release = alg.release(t, None, counts)
        ledger.record(t, {"server": observer_events(release, release.cohort, "plain")["server"]})
        spent.append(ledger.epsilon()["server"])
    per_reply = 1 / float(alg.noise.min())  # pure epsilon of one reply: Delta / (its Laplace scale, m / eps x Delta)
    for t, eps in enumerate(spent):
        assert eps == pytest.approx(math.ceil((t + 1) / 10) * per_reply, rel=1e-9)
    assert spent[-1] == pytest.approx(2.0, rel=1e-4) and spent[-1] <= 2.0


def test_random_selection_is_calibrated_to_the_client_picked_most_not_the_expected_count():
    schedule = ReplySchedule.draw(ClientSampler(10, 0.5, "fixed"), 20, seed=3)
    assert sum(schedule.replies) == 5 * 20 and sum(schedule.charged) == schedule.most
    assert schedule.most > 10  # bT / N = 10 expected; some client is picked more often, and is covered
    alg = build(FedSGDDPCConfig(clients_per_round=5), num_clients=10, rounds=20, seed=3)
    assert alg.schedule == schedule  # m / eps per reply scale multiplier, solved to 1e-4 and never below it
    assert bool((alg.noise >= schedule.most / 2.0).all()) and torch.allclose(
        alg.noise, torch.full((10,), schedule.most / 2.0, dtype=torch.float64), rtol=1e-4, atol=0.0)


# -- worst-case instances through the real client_round --------------------------------------------------------------
class LinearOracle:
    """Duck-typed CohortGradients: record j's loss is <theta, x_j>, its gradient x_j (one parameter, so l1 = l2)."""

    def clipped_sum(self, theta, x, y, mask, clip, norm="l2"):
        g = x.to(theta.dtype)
        g = g * torch.clamp(clip / (g.abs().sum(-1, keepdim=True) + 1e-12), max=1.0)
        return (g * mask.unsqueeze(-1).to(g.dtype)).sum(1)


def replies(alg, trials: int, records: int, sign: float, seed: int = 0) -> torch.Tensor:
    """One reply of ``trials`` copies of the owner (client rows): all records have gradient 0 but record 0, whose
    gradient is sign x xi; returns each reply's noisy mean gradient (the message over -eta d_i)."""
    x = torch.zeros(trials, records, 1)
    x[:, 0, 0] = sign * alg.clip
    data = ClientData(x, torch.zeros(trials, records, dtype=torch.long), torch.full((trials,), records))
    ids = torch.arange(trials)  # every row a client of the run, with its own stream
    out = alg.client_round(0, {"x": torch.zeros(1)}, {}, data, ClientContext(LinearOracle(), seed, 0, ids))
    return (out.messages["dx"] / (-alg.step_size(0) * records)).double().reshape(-1)


def ledger_epsilon(alg, observer: str, delta: float, boundary="plain") -> float:
    counts = torch.tensor(setting().train_counts)
    ledger = PrivacyLedger((observer,), delta, accountant=alg.accountant)
    for t in range(len(alg.schedule.charged)):
        release = alg.release(t, None, counts)
        ledger.record(t, {observer: observer_events(release, release.cohort, boundary)[observer]})
    return ledger.epsilon()[observer]


def test_laplace_reply_is_exactly_the_calibrated_mechanism_and_the_claim_is_its_m_fold_epsilon():
    """Owner's message: Lap shifted by Delta = 2 xi / d between the neighbours (coupled draws: the same noise), scale
    m Delta / eps. The exact pure epsilon of m replies is m Delta / scale; the ledger's claim must not be below it."""
    alg = build(FedSGDDPCConfig(clients_per_round=2, selection="round-robin"), rounds=6)
    m, delta_1 = alg.schedule.most, 2 * alg.clip / 10
    assert m == 3
    # the same calibration for 40,000 clients that all reply 3 times: one row each (its own noise stream)
    rows = build(FedSGDDPCConfig(), num_clients=40_000, rounds=3)
    assert rows.schedule.most == m
    plus, minus = (replies(rows, 40_000, 10, s, seed=5) for s in (1.0, -1.0))
    shift = (plus - minus)
    assert float(shift.std()) < 1e-6 and float(shift.mean()) == pytest.approx(delta_1, rel=1e-5)
    noise = plus - alg.clip / 10
    scale = float(noise.abs().mean())  # E|Lap(b)| = b; std of |X| is b, so +-4 sigma is 2% at 40k draws
    assert scale == pytest.approx(m * delta_1 / 2.0, rel=0.02)
    assert stats.kstest(noise.numpy() / (m * delta_1 / 2.0), "laplace").pvalue > 1e-3
    exact = m * delta_1 / (scale * 1.02)  # the lower end of the measured epsilon
    for observer in ("server", "third_party", "other_silo"):
        assert ledger_epsilon(alg, observer, 1e-5) >= exact
    assert ledger_epsilon(alg, "server", 1e-5) == pytest.approx(2.0, rel=1e-4)


def test_gaussian_claims_are_never_below_the_measured_mechanisms():
    """q = 1, N = 4 clients all in every round: the owner's reply is N(shift Delta, (z Delta)^2), m = 6 replies,
    exactly mu = sqrt(m) / z GDP towards the server; the cohort's sum (third party) adds the other 3 shares,
    mu = sqrt(m) / (z sqrt(4)). The ledger's claims must not be below the exact epsilons."""
    alg = build(FedSGDDPCConfig(mechanism="gaussian"), rounds=6)
    z, m, delta = float(alg.noise[0]), alg.schedule.most, 1e-5
    rows = build(FedSGDDPCConfig(mechanism="gaussian"), num_clients=20_000, rounds=6)  # one row per client stream
    assert float(rows.noise[0]) == z
    plus, minus = (replies(rows, 20_000, 10, s, seed=7) for s in (1.0, -1.0))
    shift = float((plus - minus).mean())
    std = float((plus - alg.clip / 10).std())
    assert math.sqrt(m) * shift / std == pytest.approx(math.sqrt(m) / z, rel=0.03)
    high_std = std * math.sqrt(20_000 / stats.chi2.ppf(1e-4, 20_000))  # the (1 - 1e-4) upper end
    mu_server = math.sqrt(m) * shift / high_std  # the lower end of the measured mu: a claim below it is refuted
    assert ledger_epsilon(alg, "server", delta) >= gdp_epsilon(mu_server, delta)
    assert ledger_epsilon(alg, "server", delta) == pytest.approx(2.0, rel=1e-3)
    assert ledger_epsilon(alg, "third_party", delta) >= gdp_epsilon(mu_server / 2, delta)


def test_the_gaussian_noise_is_the_smallest_that_meets_the_budget():
    alg = build(FedSGDDPCConfig(mechanism="gaussian", sample_rate=0.5), rounds=8, epsilon=1.5)
    event = alg.release(0, None, torch.full((4,), 10)).step_events[0]
    assert isinstance(event, dp_event.SampledWithoutReplacementDpEvent) and (event.source_dataset_size,
                                                                             event.sample_size) == (10, 5)

    def epsilon(z: float) -> float:
        accountant = accountants.make("tightest", NEIGHBORING["replace_one"])
        accountant.compose(dp_event.SampledWithoutReplacementDpEvent(10, 5, dp_event.GaussianDpEvent(z)), 8)
        return accountant.get_epsilon(1e-5)

    z = float(alg.noise[0])
    assert epsilon(z) <= 1.5 < epsilon(z * (1 - 1e-3))


def test_each_client_budget_gets_the_noise_of_a_run_where_every_client_had_it():
    """algorithm.client_epsilons: client i's multiplier is the one solved for a run in which every client had budget
    eps_i (one level per distinct budget, ``Calibration.budgets``), so client i spends at most eps_i, and not
    measurably less, by the m-fold sampled Gaussian at the largest sampling ratio."""
    budgets = [1.0, 2.0, 2.0, 4.0]
    config = FedSGDDPCConfig(mechanism="gaussian", sample_rate=0.5, client_epsilons=budgets)
    alg = build(config, rounds=8, epsilon=None)
    uniform = {eps: float(build(FedSGDDPCConfig(mechanism="gaussian", sample_rate=0.5), rounds=8, epsilon=eps).noise[0])
               for eps in set(budgets)}
    assert alg.noise.tolist() == [uniform[eps] for eps in budgets]

    def epsilon(z: float) -> float:
        accountant = accountants.make("tightest", NEIGHBORING["replace_one"])
        accountant.compose(dp_event.SampledWithoutReplacementDpEvent(10, 5, dp_event.GaussianDpEvent(z)), 8)
        return accountant.get_epsilon(1e-5)

    for z, eps in zip(alg.noise.tolist(), budgets):
        assert eps * (1 - 1e-3) <= epsilon(z) <= eps


# -- runs --------------------------------------------------------------------------------------------------------
DPC = ["algorithm.name='fedsgd-dpc'", "data.name='digits'", "data.num_clients=10", "data.partition='k_labels'",
       "data.partition_param=2", "algorithm.rounds=6", "algorithm.clients_per_round=3", "privacy.epsilon=1.0"]


def config_file(tmp_path) -> str:
    """DPC as a TOML file."""
    sections: dict[str, list[str]] = {}
    for item in DPC:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        sections.setdefault(section, []).append(f"{name} = {value}")
    path = tmp_path / "dpc.toml"
    path.write_text("".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items()))
    return str(path)


def sets(*overrides: str) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_a_minimal_config_runs_within_its_budget(mechanism, tmp_path):
    import json

    assert main(["run", config_file(tmp_path), "--out", str(tmp_path / "run"),
                 *sets(f"algorithm.mechanism='{mechanism}'")]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    final = results["final"]["epsilon"]
    assert final["server"] <= 1.0 and final["server"] == pytest.approx(1.0, rel=1e-3)
    assert results["privacy"]["accountant"]["server"] == ("pure" if mechanism == "laplace" else "pld")


def test_with_equal_client_sizes_both_aggregations_agree():
    runs = []
    for aggregation in ("normalized", "paper"):
        sim = build_simulation(load_config(None, ["algorithm.name='fedsgd-dpc'", "data.num_clients=6",
                                                  "data.samples_per_client=30", "algorithm.rounds=3",
                                                  "algorithm.clients_per_round=2", "privacy.epsilon=5.0",
                                                  f"algorithm.aggregation='{aggregation}'", "run.noise_seed=0"]))
        sim.run(3)
        runs.append(sim.model)
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-5, atol=1e-7)


def test_a_resume_with_other_rounds_is_refused_since_the_noise_depends_on_them(tmp_path, capsys):
    args = ["run", config_file(tmp_path), "--out", str(tmp_path / "run")]
    assert main(args) == 0
    assert main([*args, *sets("algorithm.rounds=12"), "--resume"]) == 2
    assert "algorithm.rounds = 6, this config has 12" in capsys.readouterr().err


@pytest.mark.parametrize("overrides, field, allowed", [
    ([], "privacy.epsilon", "calibrates each client's noise"),
    (["privacy.epsilon=1.0", "algorithm.client_rate=0.5"], "algorithm.client_rate", "names its cohort"),
    (["privacy.epsilon=1.0", "privacy.analysis='paper'"], "privacy.analysis", "bT/N expected replies"),
    (["privacy.epsilon=1.0", "algorithm.lr_schedule='inverse'"], "algorithm.mu", "estimates it"),
    (["privacy.epsilon=1.0", "algorithm.client_epsilons=[1.0, 2.0]"], "privacy.epsilon", "None when"),
    (["algorithm.client_epsilons=[1.0, 2.0]"], "algorithm.client_epsilons", "a list of 6 positive numbers"),
])
def test_bad_configs_name_their_key(overrides, field, allowed):
    with pytest.raises(ConfigError) as caught:
        build_simulation(load_config(None, ["algorithm.name='fedsgd-dpc'", "data.num_clients=6",
                                            "data.samples_per_client=30", "algorithm.rounds=3", *overrides]))
    assert caught.value.field == field and allowed in str(caught.value)
