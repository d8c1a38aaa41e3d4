"""dp-fedavg-joint's appendix relaxations (Heikkilä et al. 2024, "Loosening assumptions"): the local recursion they
define (noise off, a quadratic loss, by hand), the noise each client draws, their accounting under both analyses
(Eq. 20: unchanged; Eq. 24: exact; Eq. 25: a worst-case 1-D Gaussian sum whose exact curve the claim never goes
below), fused steps (paper only), bad values, and each through ``dpfl.cli.main`` with results.json's epsilons."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

import pytest
import torch
from dp_accounting import dp_event

import exact as ex
import joint_relaxations_worst_case as eq25
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import JOINT_PAPER_UNPROVEN, observer_events
from dpfl.algorithms.dp_fedavg_joint import JointNoiseConfig
from dpfl.experiments.noise_level import build_calibrated
from dpfl.algorithms.joint_relaxations import FUSED_UNPROVEN
from dpfl.algorithms.registry import Setting
from dpfl.cli import main
from dpfl.noise import GaussianMechanism
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.engine.sampling import ClientSampler
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

pytestmark = pytest.mark.usefixtures("one_torch_thread")
logging.getLogger("absl").setLevel(logging.ERROR)

DELTA = 1e-5


def build(counts, analysis="sound", **keys):
    setting = Setting(client_rate=1.0, num_clients=len(counts), train_counts=tuple(counts), rounds=1, delta=DELTA,
                      analysis=analysis)
    return build_calibrated("dp-fedavg-joint", JointNoiseConfig(**keys), setting)


class Quadratic:
    """Per-example loss ||theta - x_j||^2 / 2: gradient theta - x_j, clipped to ``clip``."""

    def clipped_sum(self, theta, x, y, mask, clip):
        g = theta.unsqueeze(1) - x
        bound = torch.as_tensor(clip, dtype=g.dtype).reshape(-1, 1, 1)
        g = g * torch.clamp(bound / g.norm(dim=-1, keepdim=True).clamp_min(1e-30), max=1.0)
        return (g * mask.unsqueeze(-1)).sum(1)


def noiseless_round(alg, x, theta0):
    """dy of one round with the noise off, every record in every batch (q = 1)."""
    alg = dataclasses.replace(alg, mechanism=GaussianMechanism(0.0))
    n, records = x.shape[0], x.shape[1]
    data = ClientData(x, torch.zeros(n, records, dtype=torch.long), torch.full((n,), records))
    ctx = ClientContext(Quadratic(), 3, 0, torch.arange(n))
    return alg.client_round(0, {"x": theta0}, {}, data, ctx).messages["dy"]


# -- the recursion --------------------------------------------------------------------------------------------------
def test_per_step_and_per_client_learning_rates_and_fused_steps_follow_the_hand_computed_recursion():
    """2 steps, gamma = 0.5, l = (1, 0.2); client 0: g = 1; client 1: g = 0.5, fused k = 2 (both paper-only k > 1).
    One record per client at x_i (clip large): each local step is theta <- theta - gamma_s g_i (theta - x_i)."""
    x = torch.tensor([[[2.0]], [[-4.0]]])
    alg = build((1, 1), "paper", local_steps=2, sample_rate=1.0, lr=0.5, clip=100.0, noise_multiplier=1.0,
                trust="aggregator", local_lr_schedule=[1.0, 0.2], client_lr=[1.0, 0.5], client_local_steps=[1, 2])
    dy = noiseless_round(alg, x, torch.zeros(1))
    theta = [0.0, 0.0]
    for i, (g, k) in enumerate(((1.0, 1), (0.5, 2))):
        for gamma in (0.5 * 1.0, 0.5 * 0.2):
            for _ in range(k):
                theta[i] -= gamma * g * (theta[i] - float(x[i, 0, 0]))
    # client 0: 0 -> 1 -> 1.1; client 1 (gamma_s g = 0.25, 0.25, 0.05, 0.05): 0 -> -1 -> -1.75 -> -1.8625 -> -1.969375
    assert dy[:, 0].tolist() == pytest.approx(theta, abs=1e-6)
    assert theta == pytest.approx([1.1, -1.969375])


def test_client_clips_bound_each_fused_local_step_at_c_i_over_k_i():
    """Far-away records (every gradient clipped): each local step moves client i by gamma g_i C_i / k_i."""
    x = torch.full((2, 1, 1), 1e6)
    alg = build((1, 1), "paper", local_steps=1, sample_rate=1.0, lr=1.0, noise_multiplier=1.0, trust="aggregator",
                client_clip=[0.5, 3.0], client_local_steps=[1, 3])
    assert noiseless_round(alg, x, torch.zeros(1))[:, 0].tolist() == pytest.approx([0.5, 3.0])


# -- the noise drawn --------------------------------------------------------------------------------------------------
class ZeroGradients:
    def clipped_sum(self, theta, x, y, mask, clip):
        return torch.zeros(theta.shape[0], theta.shape[1], dtype=theta.dtype)


def test_each_client_draws_its_share_f_i_sigma_prime_at_its_sensitivity_gamma_g_i_c_i_over_q_n_i():
    """One step, q = 0.5, shares sigma' = 2 / sqrt(4) = 1: client i's update has std gamma g_i f_i C_i / (q n_i),
    measured on 20,000 coordinates (relative error of a sample std ~0.5%)."""
    counts, q = (40, 80, 40, 20), 0.5
    lr, clip, noise = [1.0, 0.5, 2.0, 1.0], [1.0, 2.0, 0.5, 1.0], [1.0, 1.5, 0.8, 2.0]
    alg = build(counts, local_steps=1, sample_rate=q, lr=0.3, noise_multiplier=2.0, trust="aggregator",
                client_lr=lr, client_clip=clip, client_noise=noise)
    assert alg.mechanism.noise_multiplier == pytest.approx(0.8)  # z = min sigma_i: every client's own draw
    records = max(counts)
    data = ClientData(torch.zeros(4, records, 1), torch.zeros(4, records, dtype=torch.long), torch.tensor(counts))
    out = alg.client_round(0, {"x": torch.zeros(20_000)}, {}, data, ClientContext(ZeroGradients(), 5, 0,
                                                                                  torch.arange(4)))
    expected = [0.3 * g * f * c / (q * n) for g, f, c, n in zip(lr, noise, clip, counts)]
    assert out.messages["dy"].double().std(1).tolist() == pytest.approx(expected, rel=0.02)
    assert len(out.events) == 1 and out.events[0] == dp_event.GaussianDpEvent(pytest.approx(0.8))


# -- accounting -------------------------------------------------------------------------------------------------
def events(alg, counts, analysis, boundary="secagg"):
    return observer_events(alg.release(0, None, torch.tensor(counts)), ClientSampler(len(counts), 1.0).cohort(0),
                           boundary, analysis)


@pytest.mark.parametrize("analysis", ["sound", "paper"])
def test_a_per_step_learning_rate_schedule_leaves_the_release_unchanged(analysis):
    keys = dict(local_steps=3, noise_multiplier=2.0)
    constant = build((50,) * 5, analysis, **keys)
    scheduled = build((50,) * 5, analysis, **keys, local_lr_schedule=[1.0, 0.5, 0.25])
    assert scheduled.release(0, None, torch.tensor([50] * 5)) == constant.release(0, None, torch.tensor([50] * 5))
    assert events(scheduled, [50] * 5, analysis) == events(constant, [50] * 5, analysis)


def last_multiplier(event):
    last = event.events[-1] if isinstance(event, dp_event.ComposedDpEvent) else event
    last = last.event if isinstance(last, dp_event.SelfComposedDpEvent) else last
    return last.event.noise_multiplier


@pytest.mark.parametrize("analysis", ["sound", "paper"])
def test_client_specific_learning_rates_are_credited_the_noise_of_eq_24(analysis):
    """gamma_i = gamma_1 / l_i, l = (1, 2, 4, 1): the sum-dominating mechanism has multiplier
    sigma' sqrt(1 + sum_{i >= 2} 1 / l_i^2) at sensitivity max gamma_i (Heikkilä et al., Eq. 24), on the last step
    (sound) or every step (paper); the other steps (sound) at the owner's own sigma'."""
    alg = build((100,) * 4, analysis, local_steps=3, noise_multiplier=2.0, trust="aggregator",
                client_lr=[1.0, 0.5, 0.25, 1.0])
    share = alg.mechanism.noise_multiplier
    assert share == pytest.approx(1.0)
    eq_24 = share * math.sqrt(1 + 1 / 4 + 1 / 16 + 1)
    third_party = events(alg, [100] * 4, analysis)["third_party"]
    if analysis == "sound":  # each owner's release declared; with equal f_i the worst owner's (l = 1) is the bound
        assert third_party.events[0] == third_party.events[3] == third_party.bound
        third_party = third_party.bound
    assert last_multiplier(third_party) == pytest.approx(eq_24)
    if analysis == "sound":
        assert third_party.events[0].event.event.noise_multiplier == pytest.approx(share)
    else:
        assert third_party == dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(pytest.approx(eq_24))), 3)


def test_the_proportional_to_size_rule_sets_g_i_to_n_i_over_the_largest():
    alg = build((50, 100, 25), client_lr="proportional_to_size", noise_multiplier=1.0, trust="aggregator")
    assert alg.relaxations.lr == (0.5, 1.0, 0.25)
    # Delta_i = g_i C / (q n_i) is the same for every client (1 / (0.1 * 100)), and so is s_i = sigma' Delta_i
    shares = alg.release(0, None, torch.tensor([50, 100, 25])).shares
    assert [v for share in shares for v in share] == pytest.approx([0.1 / math.sqrt(3), 0.1] * 3)


# -- Eq. 25's worst case (tests/helpers/joint_relaxations_worst_case.py, shared with benchmarks/tightness.py) -----
@pytest.mark.parametrize("analysis", ["sound", "paper"])
@pytest.mark.parametrize("trust, observer", eq25.VIEWS)
def test_client_specific_clips_and_shares_are_never_credited_more_than_the_worst_instance_has(analysis, trust,
                                                                                              observer):
    """The sum of one step's updates is a 1-D Gaussian: a record of client o shifts it by Delta_o, the noise is
    sqrt(sum_j s_j^2) (less the silo's own share), so the exact curve is mu-GDP with the largest Delta_o / std; the
    claim (PLD accountant) is never below it, and here equals it (Eq. 25 credits every other share; the silo
    subtracts the largest), so any larger credit would fall below."""
    alg = eq25.algorithm(analysis, trust)
    truth = ex.gdp_epsilon(eq25.exact_mu(alg, observer), DELTA)
    assert truth * (1 - 1e-6) <= eq25.claimed_epsilon(alg, observer, analysis) <= truth * (1 + 1e-4)


def test_each_owner_is_charged_its_own_share_before_the_last_step_and_its_own_credit_on_it():
    """Eq. 25's instance with S = 2 (q = 1): owner o's first draw at its own f_o sigma', its last credited with the
    others' shares (``owner_mu``), where the single bound took the least f_i with the worst owner's credit
    (``bound_mu``): third party 3.8268 -> 3.6196, never below what a linear loss attains (1.7371). Equal clients
    declare no owners (the bound is each one's release)."""
    alg = eq25.algorithm(steps=2)
    release = alg.release(0, None, torch.tensor(eq25.COUNTS))
    assert [[e.event for e in r.step_events] for r in release.owners] == [
        [dp_event.GaussianDpEvent(f / min(eq25.NOISE) * alg.mechanism.noise_multiplier)] * 2 for f in eq25.NOISE]
    cohort = ClientSampler(len(eq25.COUNTS), 1.0).cohort(0)
    single = observer_events(dataclasses.replace(release, owners=()), cohort, "secagg", "sound")["third_party"]
    ledger = PrivacyLedger(("third_party",), DELTA, None, None, "sound", alg.neighboring, "pld")
    bound = ledger.epsilon_after([{"third_party": single}], ["third_party"])["third_party"]
    claim = eq25.claimed_epsilon(alg, "third_party")
    assert claim == pytest.approx(ex.gdp_epsilon(eq25.owner_mu(alg), DELTA), rel=1e-4)
    assert bound == pytest.approx(ex.gdp_epsilon(eq25.bound_mu(alg), DELTA), rel=1e-4)
    assert (ex.gdp_epsilon(eq25.linear_mu(alg), DELTA), claim, bound) == pytest.approx((1.7371, 3.6196, 3.8268),
                                                                                        abs=1e-4)
    assert build((50,) * 5, local_steps=3, client_noise=[2.0] * 5).release(0, None, torch.tensor([50] * 5)).owners == ()


class Linear:
    """Per-example loss <theta, x_j>: gradient x_j whatever theta, clipped to ``clip``."""

    def clipped_sum(self, theta, x, y, mask, clip):
        bound = torch.as_tensor(clip, dtype=x.dtype).reshape(-1, 1, 1)
        g = x * torch.clamp(bound / x.norm(dim=-1, keepdim=True).clamp_min(1e-30), max=1.0)
        return (g * mask.unsqueeze(-1)).sum(1)


def summed_updates(alg, owner: int, value: float, trials: int, seed: int) -> torch.Tensor:
    """The sum over the 4 clients of one round's dy, for ``trials`` copies (rows with the clients' ids and streams
    of their own); the owner's record 0 is ``value`` (clipped to C_owner), every other record 0."""
    ids = torch.arange(4).repeat(trials)
    x = torch.zeros(4 * trials, max(eq25.COUNTS), 1)
    x[ids == owner, 0, 0] = value
    data = ClientData(x, torch.zeros(4 * trials, max(eq25.COUNTS), dtype=torch.long), torch.tensor(eq25.COUNTS)[ids])
    ctx = ClientContext(Linear(), seed, 0, ids, torch.arange(4 * trials))
    return alg.client_round(0, {"x": torch.zeros(1)}, {}, data, ctx).messages["dy"].double().reshape(trials, 4).sum(1)


def test_the_eq_25_instance_run_through_client_round_has_the_exact_mu():
    """The third party's view of the instance above, measured: for each owner the coupled shift (same noise, the
    record present or zeroed) is Delta_o, and the sum's std over 4,000 copies sqrt(sum s_i^2) (within 5%)."""
    alg = eq25.algorithm()
    delta = eq25.sensitivities(alg)
    std = math.sqrt(sum((f * alg.shares.share * d) ** 2 for f, d in zip(eq25.NOISE, delta)))
    for owner in range(4):
        shift = summed_updates(alg, owner, 1e3, 2, 9) - summed_updates(alg, owner, 0.0, 2, 9)
        assert shift.abs().tolist() == pytest.approx([delta[owner]] * 2, rel=1e-4)
    assert float(summed_updates(alg, 0, 0.0, 4000, 1).std()) == pytest.approx(std, rel=0.05)
    assert max(delta) / std == pytest.approx(eq25.exact_mu(alg, "third_party"))


# -- fused local steps ---------------------------------------------------------------------------------------------
def test_fused_steps_are_refused_under_the_sound_analysis_and_labelled_unproven_under_the_paper():
    with pytest.raises(ConfigError) as caught:
        build((30,) * 3, local_steps=2, client_local_steps=[1, 2, 1])
    assert caught.value.field == "algorithm.client_local_steps" and "sensitivity is not C_i" in str(caught.value)
    alg = build((30,) * 3, "paper", local_steps=2, sample_rate=0.1, client_local_steps=[1, 2, 3])
    release = alg.release(0, None, torch.tensor([30] * 3))
    share = dp_event.GaussianDpEvent(pytest.approx(1.0 / 2**0.5))  # sigma / sqrt(3 - 1)
    assert release.step_events[0] == dp_event.PoissonSampledDpEvent(pytest.approx(1 - 0.9**3), share)
    assert release.unproven == JOINT_PAPER_UNPROVEN + FUSED_UNPROVEN


# -- bad values -------------------------------------------------------------------------------------------------------
BASE = ["algorithm.name='dp-fedavg-joint'", "data.num_clients=4", "data.samples_per_client=30",
        "algorithm.local_steps=2"]


@pytest.mark.parametrize("override, field, allowed", [
    ("algorithm.local_lr_schedule=[1.0]", "algorithm.local_lr_schedule", "a list of 2 positive factors"),
    ("algorithm.local_lr_schedule=[1.0, -1.0]", "algorithm.local_lr_schedule", "a list of 2 positive factors"),
    ("algorithm.client_lr='by_size'", "algorithm.client_lr", "['proportional_to_size']"),
    ("algorithm.client_lr=[1.0, 1.0, 1.0]", "algorithm.client_lr", "a list of 4 positive learning-rate factors"),
    ("algorithm.client_clip=[1.0, 1.0, 0.0, 1.0]", "algorithm.client_clip", "a list of 4 positive clip norms"),
    ("algorithm.client_noise=[1, 1, 1, true]", "algorithm.client_noise", "a list of 4 positive factors"),
    ("algorithm.client_local_steps=[1, 2, 1.5, 1]", "algorithm.client_local_steps", "privacy.analysis = 'sound'"),
    ("algorithm.client_local_steps=[1, 2, 1.5, 1]", "algorithm.client_local_steps", "positive integers"),
])
def test_a_bad_relaxation_names_its_key(override, field, allowed):
    extra = ["privacy.analysis='paper'"] if allowed == "positive integers" else []
    with pytest.raises(ConfigError) as caught:
        build_simulation(load_config(None, [*BASE, override, *extra]))
    assert caught.value.field == field and allowed in str(caught.value)


# -- through the CLI ---------------------------------------------------------------------------------------------
RUN = """[data]
name = "breast_cancer"
num_clients = 4

[model]
name = "logreg"

[algorithm]
name = "dp-fedavg-joint"
local_steps = 3
sample_rate = 0.2
rounds = 2
noise_multiplier = 2.0
trust = "aggregator"
{extra}
[privacy]
secure_aggregation = true
analysis = "{analysis}"
"""


def run(tmp_path: Path, name: str, extra: str = "", analysis: str = "sound") -> dict:
    path = tmp_path / f"{name}.toml"
    path.write_text(RUN.format(extra=extra, analysis=analysis))
    assert main(["run", str(path), "--out", str(tmp_path / name), "--no-progress"]) == 0
    return json.loads((tmp_path / name / "results.json").read_text())


def expected_epsilon(results: dict, last: float, own: float, steps: int = 3, rate: float = 0.2) -> float:
    """The third party's epsilon after 2 rounds of (S - 1) own draws and a last draw at ``last`` (sound, RDP)."""
    step = lambda z: dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(z))  # noqa: E731
    event = dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(step(own), steps - 1), step(last)])
    ledger = PrivacyLedger(("third_party",), results["privacy"]["delta"], None, None, "sound", "zero_out", "rdp")
    return ledger.epsilon_after([{"third_party": event}] * 2, ["third_party"])["third_party"]


@pytest.mark.slow  # ~15 s: five short runs on breast_cancer
def test_each_relaxation_runs_through_the_cli_with_the_epsilons_its_accounting_gives(tmp_path):
    plain = run(tmp_path, "plain")  # breast_cancer over 4 clients: 114 train records each
    scheduled = run(tmp_path, "schedule", "local_lr_schedule = [1.0, 0.5, 0.25]\n")
    assert scheduled["final"]["epsilon"] == plain["final"]["epsilon"]  # Eq. 20: privacy unchanged
    assert scheduled["final"]["train_loss"] != plain["final"]["train_loss"]
    share = 2.0 / 2  # sigma / sqrt(4)
    by_client = run(tmp_path, "client_lr", "client_lr = [1.0, 0.5, 0.25, 1.0]\n")
    assert by_client["final"]["epsilon"]["third_party"] == pytest.approx(  # Eq. 24 on the last step
        expected_epsilon(by_client, share * math.sqrt(1 + 1 / 4 + 1 / 16 + 1), share), rel=1e-6)
    assert by_client["final"]["epsilon"]["third_party"] > plain["final"]["epsilon"]["third_party"]
    shares = run(tmp_path, "client_noise", "client_clip = [1.0, 2.0, 1.0, 1.0]\nclient_noise = [0.5, 1, 1, 1]\n")
    # Eq. 25, in units of C / (q n): s_i = sigma' (0.5, 2, 1, 1), Delta_i = (1, 2, 1, 1). Each owner is charged its
    # own release (owners.declare_owners): its own draws at z = s_o / Delta_o, the last step at
    # sqrt(sum s_i^2) / Delta_o; the claim is the worst owner's, owner 0 here (12.420), not the mix of owner 0's own
    # draws with owner 1's last step (12.476) that no single owner releases
    last = share * math.sqrt(0.25 + 4 + 1 + 1)
    per_owner = [expected_epsilon(shares, last / d, share * s / d) for s, d in ((0.5, 1), (2, 2), (1, 1))]
    assert shares["final"]["epsilon"]["third_party"] == pytest.approx(max(per_owner), rel=1e-6)
    assert max(per_owner) == per_owner[0] < expected_epsilon(shares, last / 2, share / 2)
    fused = run(tmp_path, "fused", "client_local_steps = [1, 2, 1, 1]\n", "paper")
    assert fused["privacy"]["unproven"] == list(JOINT_PAPER_UNPROVEN + FUSED_UNPROVEN)
    assert math.isfinite(fused["final"]["train_loss"]) and 0 < fused["final"]["epsilon"]["third_party"] < math.inf
