"""dp-fedavg-joint with integer Skellam shares (algorithm.noise = "skellam", dpfl.algorithms.joint_skellam): the
accounting against the Gaussian path and against worst-case 1-D instances summed exactly from the Skellam pmf, the
integer sum through the real secure aggregation (exact, overflow refused), Heikkilä et al.'s Table 1 with Skellam at
a 32-bit scale, and runs through the CLI."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from scipy import optimize, stats
from scipy.special import gammaln, logsumexp

from dpfl.accounting.conversion import rdp_to_epsilon
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import observer_events
from dpfl.accounting.rdp import NeighborRel, rdp_curve
from dpfl.accounting.skellam import poisson_subsampled_rdp, skellam_rdp
from dpfl.algorithms.dp_fedavg_joint import JointNoiseConfig
from dpfl.experiments.noise_level import build_calibrated
from dpfl.algorithms.joint_skellam import JointSkellam, SkellamRounding
from dpfl.algorithms.registry import Setting
from dpfl.cli import main
from dpfl.engine.boundary import Boundary
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.engine.sampling import ClientSampler
from dpfl.engine.secure_sum import SecureAggregation
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
from dpfl.protocols.quantize import OverflowRiskError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
logging.getLogger("absl").setLevel(logging.ERROR)

INTS = np.arange(2, 33, dtype=float)


def build(noise="skellam", scale=2.0**16, steps=2, sigma=1.0, q=0.1, clients=10, records=100, dimension=1000,
          **config):
    setting = Setting(client_rate=1.0, num_clients=clients, train_counts=(records,) * clients, rounds=1, delta=1e-5,
                      dimension=dimension)
    return build_calibrated("dp-fedavg-joint", JointNoiseConfig(
        noise=noise, skellam_scale=scale, local_steps=steps, noise_multiplier=sigma, sample_rate=q, **config), setting)


def third_party_epsilon(algorithm, clients=10, records=100):
    release = algorithm.release(0, None, torch.tensor([records] * clients))
    event = observer_events(release, ClientSampler(clients, 1.0).cohort(0), "secagg", "sound")["third_party"]
    ledger = PrivacyLedger(("third_party",), 1e-5, None, None, "sound", algorithm.neighboring, algorithm.accountant)
    return ledger.epsilon_after([{"third_party": event}], ["third_party"])["third_party"]


# -- accounting ------------------------------------------------------------------------------------------------------
def test_the_step_event_holds_the_rounding_in_its_sensitivities():
    """D_min = C / (q n) = 0.1; at s = 2^16 the integer unit is s D_min = 6553.6 and rounding adds sqrt(d) to the
    integer l2 sensitivity, sqrt(d') of it to the l1 (d = 1000, d' = 1024)."""
    alg = build()
    assert isinstance(alg, JointSkellam)
    step = alg.release(0, None, torch.tensor([100] * 10)).step_events[0]
    assert isinstance(step, dp_event.PoissonSampledDpEvent) and step.sampling_probability == 0.1
    event = step.event
    unit = 2.0**16 * 0.1
    assert event.scale == pytest.approx(unit)
    assert event.l2_sensitivity == pytest.approx((unit + math.sqrt(1000)) / unit)
    assert event.l1_sensitivity == pytest.approx((unit + math.sqrt(1000)) * 32 / unit)
    assert event.variance == pytest.approx(alg.mechanism.noise_multiplier**2)  # the share, in units of D_min


def test_both_analyses_declare_skellam_events():
    """Sound: the last of 3 steps credited with the cohort's shares (variance sigma^2 = 4), the others at the owner's
    share sigma_i^2 = 4 / 10; the paper's analysis (Heikkilä et al., Thm 4.7): every step at sigma^2."""
    alg = build(steps=3, sigma=2.0, trust="aggregator")
    release = alg.release(0, None, torch.tensor([100] * 10))
    cohort = ClientSampler(10, 1.0).cohort(0)
    sound, paper = (observer_events(release, cohort, "secagg", a)["third_party"] for a in ("sound", "paper"))
    own, credited = (part.event.event for part in sound.events)
    assert sound.events[0].count == 2 and sound.events[1].count == 1
    assert own.variance == pytest.approx(0.4) and credited.variance == pytest.approx(4.0)
    assert own.scale == credited.scale == alg.step_noise_event.scale
    assert paper.count == 3 and paper.event.event.variance == pytest.approx(4.0)


def test_a_huge_scale_costs_what_the_gaussian_curve_costs_under_the_same_subsampling_bound():
    """As s grows the rounding and discretisation vanish: the Skellam run's RDP curve is, to 1e-3, the curve of
    Gaussian shares with Poisson sampling bounded as for Skellam (Zhu & Wang 2019 Thm 6, min the mixture bound), and
    its epsilon is the limit's to 1e-3 from s = 2^40 on. It stays above the Gaussian run's epsilon (dp_accounting's
    exact Poisson-subsampled Gaussian): by 4.4% here (q = 0.1, S = 2), the price of a subsampling bound that holds
    for Skellam."""
    gaussian, skellam = build("gaussian"), build(scale=2.0**40)
    release = skellam.release(0, None, torch.tensor([100] * 10))
    event = observer_events(release, ClientSampler(10, 1.0).cohort(0), "secagg", "sound")["third_party"]
    curve = rdp_curve(event, INTS, NeighborRel.REPLACE_SPECIAL)
    by_hand = 0
    for part in event.events:  # the first step at the owner's share, the last at the cohort's
        inner = INTS / (2 * part.event.event.variance)
        mixture = np.logaddexp(math.log(0.9), math.log(0.1) + (INTS - 1) * inner) / (INTS - 1)
        by_hand = by_hand + np.minimum(poisson_subsampled_rdp(0.1, inner), mixture)
    np.testing.assert_allclose(curve, by_hand, rtol=1e-3)
    eps_skellam, eps_gaussian = third_party_epsilon(skellam), third_party_epsilon(gaussian)
    assert third_party_epsilon(build(scale=2.0**46)) == pytest.approx(eps_skellam, rel=1e-3)
    assert eps_skellam / eps_gaussian == pytest.approx(1.0443, abs=1e-3)


def test_a_coarser_scale_is_charged_more():
    """s D_min against sqrt(d): the rounding's sqrt(d) and the discretisation terms grow as the scale shrinks."""
    epsilons = [third_party_epsilon(build(scale=s)) for s in (2.0**40, 2.0**16, 2.0**10, 2.0**6)]
    assert all(coarse > fine for fine, coarse in zip(epsilons, epsilons[1:]))
    assert epsilons[1] < 1.01 * epsilons[0] and epsilons[-1] > 3 * epsilons[0]


def skellam_logpmf(k: np.ndarray, lam: float) -> np.ndarray:
    """log P(Sk(lam, lam) = k) = log sum_n Pois(n + |k|; lam) Pois(n; lam), in log space (finite far in the tails,
    where scipy's pmf underflows)."""
    n = np.arange(int(lam + 30 * math.sqrt(lam) + 60))[None, :]
    k = np.abs(k)[:, None]
    return logsumexp((2 * n + k) * math.log(lam) - 2 * lam - gammaln(n + 1) - gammaln(n + k + 1), axis=1)


def exact_rdp(lam: float, shift: float, offset: float, q: float, orders) -> np.ndarray:
    """The exact RDP, both directions, of one step of the 1-D worst case: the integer input round(offset + shift)
    against round(offset) (randomised rounding, so a two-point mixture each), Sk(lam, lam) noise, the record in the
    Poisson sample with probability q (mixture (1 - q) Q + q P against Q). Summed over the integers, far enough out
    that the largest order's integrand (centred near a (shift + 1)) is inside."""
    half = int(max(orders) * (shift + 1) + 30 * math.sqrt(2 * lam) + 60)
    support = np.arange(-half, half + 1)

    def rounded(y):  # log pmf of round(y) + Sk(lam, lam): the two rounding outcomes' shifted pmfs
        low, p_up = math.floor(y), y - math.floor(y)
        parts = [np.log1p(-p_up) + skellam_logpmf(support - low, lam)] if p_up < 1 else []
        if p_up > 0:
            parts.append(math.log(p_up) + skellam_logpmf(support - low - 1, lam))
        return logsumexp(parts, axis=0)

    log_q, log_p = rounded(offset), rounded(offset + shift)
    log_mix = np.logaddexp(math.log1p(-q) + log_q, math.log(q) + log_p) if q < 1 else log_p
    curves = []
    for a in orders:
        forward = logsumexp(a * log_mix + (1 - a) * log_q) / (a - 1)
        backward = logsumexp(a * log_q + (1 - a) * log_mix) / (a - 1)
        curves.append(max(forward, backward))
    return np.array(curves)


@pytest.mark.parametrize("unit, offset", [(0.5, 0.0), (0.5, 0.7), (2.5, 0.3), (7.0, 0.0), (7.0, 0.5)])
@pytest.mark.parametrize("q", [1.0, 0.1])
def test_the_claim_is_never_below_the_exact_curve_of_a_worst_case_1d_instance(unit, offset, q):
    """A 1-D model (d = 1) of 10 clients of 100 records, 2 local steps, sigma = 1 summed over the cohort (trusted
    aggregator), at a scale giving s D_min = ``unit`` integer units per sensitivity: the third party's two declared
    step events (the first at the owner's share, the last with the cohort's shares summed in). The exact instance
    for each: the owner's integer input moves by the full sensitivity (a record whose clipped gradient is C) from any
    offset, the other clients' rounded inputs are fixed, and the noise is Sk(lam, lam) of the event's variance; the
    claim is at least the exact curve at every order 2..32."""
    orders = np.arange(2, 33, dtype=float)
    records = 100 if q < 1 else 10  # D_min = C / (q n) = 0.1
    alg = build(scale=unit / 0.1, q=q, records=records, dimension=1, trust="aggregator")
    release = alg.release(0, None, torch.tensor([records] * 10))
    event = observer_events(release, ClientSampler(10, 1.0).cohort(0), "secagg", "sound")["third_party"]
    for part in event.events:
        step = part.event  # PoissonSampled(q, Skellam)
        assert step.event.scale == pytest.approx(unit)
        lam = step.event.scale**2 * step.event.variance / 2
        claim = rdp_curve(step, orders, NeighborRel.REPLACE_SPECIAL)
        exact = exact_rdp(lam, unit, offset, q, orders)
        assert np.all(claim >= exact * (1 - 1e-9)), (claim - exact).min()


class ZeroGradients:
    """Duck-typed CohortGradients whose clipped sums are 0: a client's message is its integer noise alone."""

    def clipped_sum(self, theta, x, y, mask, clip):
        return torch.zeros(theta.shape[0], theta.shape[1], dtype=theta.dtype)


def test_the_drawn_integer_shares_have_the_declared_variance():
    """3 local steps, zero gradients: client i's message is the sum of its 3 shares, of variance 3 (s sigma_i D_i)^2
    in integer units, D_i = C / (q n_i) (clients of 50 and 100 records: D_i / D_min = 2 and 1); checked on 8,000
    coordinates (the sample std's relative error is ~0.8%), and the sum over the cohort is Sk of the summed variance."""
    counts = torch.tensor([50, 100, 100, 100])
    setting = Setting(client_rate=1.0, num_clients=4, train_counts=tuple(counts.tolist()), rounds=1, delta=1e-5,
                      dimension=8_000)
    alg = build_calibrated("dp-fedavg-joint", JointNoiseConfig(noise="skellam", skellam_scale=16.0, local_steps=3,
                                                                noise_multiplier=2.0, trust="aggregator"), setting)
    data = ClientData(torch.zeros(4, 100, 1), torch.zeros(4, 100, dtype=torch.long), counts)
    out = alg.client_round(0, {"x": torch.zeros(8_000)}, {}, data, ClientContext(ZeroGradients(), 3, 0,
                                                                                    torch.arange(4)))
    assert out.events == [alg.step_noise_event] * 3
    message = out.messages["dy"].double()
    share_std = 16.0 * 1.0 * 0.1  # s sigma_i D_min: sigma_i = 2 / sqrt(4), D_min = 1 / (0.1 * 100)
    expected = torch.tensor([2.0, 1.0, 1.0, 1.0]) * share_std * math.sqrt(3)
    assert message.std(1).tolist() == pytest.approx(expected.tolist(), rel=0.04)
    assert float(message.sum(0).std()) == pytest.approx(float(expected.square().sum().sqrt()), rel=0.04)


@pytest.mark.slow  # ~4 s: a bracket-and-bisection solve over Skellam curves
def test_privacy_epsilon_calibrates_the_skellam_shares_to_the_ledger_of_the_run():
    """sigma from privacy.epsilon = 2 over 5 rounds: the Skellam run's ledger spends 2.0 (and needs more noise than
    the Gaussian path: 4.72 against 3.95 here, S = 3, q = 0.1)."""
    setting = Setting(client_rate=1.0, num_clients=10, train_counts=(100,) * 10, rounds=5, delta=1e-5, epsilon=2.0,
                      dimension=1000)
    alg = build_calibrated("dp-fedavg-joint", JointNoiseConfig(noise="skellam", local_steps=3), setting)
    release = alg.release(0, None, torch.tensor([100] * 10))
    event = observer_events(release, ClientSampler(10, 1.0).cohort(0), "secagg", "sound")["other_silo"]
    ledger = PrivacyLedger(("other_silo",), 1e-5, None, None, "sound", alg.neighboring, alg.accountant)
    assert ledger.epsilon_after([{"other_silo": event}] * 5, ["other_silo"])["other_silo"] == pytest.approx(2.0,
                                                                                                         rel=2e-3)
    assert alg.shares.noise_multiplier == pytest.approx(4.72, abs=0.01)


# -- Heikkilä et al., Table 1, Skellam at 32 bits ---------------------------------------------------------------------
#: Heikkilä et al., Table 1: local steps -> the averaged model's epsilon for 1, 2, 5, 10 parties (q = 0.1, delta =
#: 1e-5, each party's model (5, 1e-5)-DP), and sigma_total = sqrt(N) sigma_LDP to two decimals.
TABLE_1 = {1: ([5.0, 2.78, 1.22, 0.64], [0.69, 0.98, 1.54, 2.18]),
           10: ([5.0, 2.61, 1.19, 0.72], [0.90, 1.28, 2.02, 2.85]),
           50: ([5.0, 2.85, 1.55, 1.03], [1.18, 1.67, 2.64, 3.73])}
ORDERS = np.arange(2, 256, dtype=float)


def expanded_poisson_rdp(q, inner):
    """The Poisson amplification Heikkilä et al.'s accounting code applies to the Skellam curve: the binomial
    expansion of E_Q[((1 - q) + q P/Q)^a], i.e. Zhu & Wang's Thm 6 WITHOUT the factor 3 (the exact value for the
    record's removal direction; dpfl keeps the factor 3, which also covers the addition direction)."""
    inner = np.asarray(inner, dtype=float)
    a = np.arange(2, inner.size + 2, dtype=float)[:, None]
    j = a.T
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(j <= a, stats.binom.logpmf(j, a, q) + (j - 1) * inner[None, :], -np.inf)
    first = (a[:, 0] - 1) * math.log1p(-q) + np.log1p((a[:, 0] - 1) * q)
    return np.logaddexp(first, logsumexp(terms, axis=1)) / (a[:, 0] - 1)


def table_1_epsilon(steps, sigma, bound=expanded_poisson_rdp):
    """The averaged model's epsilon: ``steps`` Skellam steps at noise multiplier sigma, Heikkilä et al.'s linear model
    (d = 10250) at a 32-bit scale (2^20 integer units per C), Poisson q = 0.1, classic conversion at orders 2..255."""
    inner = skellam_rdp(SkellamRounding(scale=2.0**20, dimension=10250, unit=1.0).event(sigma), ORDERS)
    return rdp_to_epsilon(ORDERS, steps * bound(0.1, inner), 1e-5, "classic")[0]


@pytest.mark.parametrize("steps", sorted(TABLE_1))
def test_table_1_with_skellam_at_32_bits(steps):
    """The paper's Table 1 ("Skellam mechanism, no quantization"): sigma_LDP calibrated to (5, 1e-5) for one party,
    N parties' averaged model at sqrt(N) sigma_LDP: the published epsilons and sigma_total to two decimals. dpfl's own
    Poisson bound (the factor 3) charges every row more."""
    sigma_ldp = optimize.brentq(lambda z: table_1_epsilon(steps, z) - 5.0, 0.3, 3.0, xtol=1e-6)
    epsilons, sigmas = TABLE_1[steps]
    for parties, epsilon, sigma_total in zip((1, 2, 5, 10), epsilons, sigmas):
        sigma = math.sqrt(parties) * sigma_ldp
        assert round(sigma, 2) == sigma_total
        assert round(table_1_epsilon(steps, sigma), 2) == epsilon
        assert table_1_epsilon(steps, sigma, poisson_subsampled_rdp) > table_1_epsilon(steps, sigma)


# -- the integer sum -------------------------------------------------------------------------------------------------
BASE = ["algorithm.name='dp-fedavg-joint'", "data.num_clients=8", "data.samples_per_client=40",
        "algorithm.local_steps=2", "privacy.boundary='secagg'", "algorithm.noise_multiplier=1.0",
        "algorithm.noise='skellam'", "run.noise_seed=0"]  # the same draws in every simulation (research mode)


def simulation(*extra):
    return build_simulation(load_config(None, [*BASE, *extra]))


def test_the_integer_sum_is_exact_through_the_real_secure_aggregation():
    """The same model, bit for bit, whether secure aggregation or the simulated int64 sum adds the messages; the
    messages are integers within their declared bound."""
    real, simulated = simulation("privacy.secure_aggregation=true"), simulation()
    assert real.round_privacy() == simulated.round_privacy()
    out = next(real.in_process(0, real.clients.sample(0, real.seed)))[1]
    assert out.messages["dy"].dtype == torch.int64
    assert float(out.messages["dy"].abs().max()) <= real.boundary.secure.bounds["dy"]
    real.run(2)
    simulated.run(2)
    assert torch.equal(real.model, simulated.model)


def test_integer_messages_sum_exactly_and_overflow_is_refused():
    top = 2**28 - 1  # 8 clients of bound 2^28 - 1 sum to at most 2^31 - 8: the edge of 32 bits
    rows = {"dy": torch.tensor([[top, -5, 7]] * 7 + [[top, 3, -top]], dtype=torch.int64)}
    ids = torch.arange(8)
    secure = SecureAggregation({"dy": float(top)}, bits=32)
    delivered = Boundary("secagg", secure).collect([rows], 8, seed=0, round_index=0, clients=ids)
    assert delivered.sum("dy").dtype == torch.int64
    assert delivered.sum("dy").tolist() == [8 * top, -32, 49 - top]  # exact, at the edge
    with pytest.raises(OverflowRiskError, match=r"9 clients' integer messages .* privacy.secagg_bits = 32"):
        SecureAggregation({"dy": float(top)}, bits=32).sum({"dy": torch.zeros(9, 3, dtype=torch.int64)},
                                                             torch.arange(9), 0, 0)
    with pytest.raises(OverflowRiskError, match="exceeds the bound it declared"):
        SecureAggregation({"dy": 10.0}, bits=32).sum({"dy": torch.full((2, 3), 11, dtype=torch.int64)},
                                                     torch.arange(2), 0, 0)


def test_a_scale_too_large_for_the_ring_is_refused_with_a_clear_error():
    sim = simulation("privacy.secure_aggregation=true", "algorithm.skellam_scale=1e8")
    x0 = sim.model.clone()
    with pytest.raises(OverflowRiskError, match="lower the algorithm's scale \\(algorithm.skellam_scale\\)"):
        sim.step()
    assert torch.equal(sim.model, x0)


# -- runs and configs ------------------------------------------------------------------------------------------------
def test_a_tiny_noise_run_follows_the_gaussian_run_at_a_huge_scale():
    """Noise multiplier 1e-6 and s = 2^36: both runs take the same minibatches (the records stream), so their models
    agree to the noise and the rounding (1e-6 relative)."""
    common = ("algorithm.noise_multiplier=1e-6", "algorithm.skellam_scale=68719476736.0")
    skellam, gaussian = simulation(*common), simulation(*common, "algorithm.noise='gaussian'")
    skellam.run(2)
    gaussian.run(2)
    assert float((skellam.model - gaussian.model).abs().max()) < 1e-5
    assert not torch.equal(skellam.model, gaussian.model)


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
noise = "skellam"

[privacy]
secure_aggregation = true
"""


def test_a_skellam_config_runs_through_the_cli_with_real_secure_aggregation(tmp_path):
    path = tmp_path / "joint.toml"
    path.write_text(MINIMAL)
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    eps = results["final"]["epsilon"]
    assert results["privacy"]["boundary"] == "secagg" and results["privacy"]["unproven"] == []
    assert 0 < eps["third_party"] == eps["server"] < math.inf
    assert results["final"]["round"] == 3 and math.isfinite(results["final"]["train_loss"])
    ledger = (tmp_path / "run" / "ledger.json").read_text()
    assert "SkellamDpEvent" in ledger and "GaussianDpEvent" not in ledger


@pytest.mark.parametrize("overrides, field, allowed", [
    (["algorithm.noise='laplace'"], "algorithm.noise", "one of"),
    (["algorithm.weight_decay=0.01"], "algorithm.weight_decay", "0 with algorithm.noise = 'skellam'"),
    (["algorithm.skellam_scale=0.0"], "algorithm.skellam_scale", "(0.0, inf)"),
    (["algorithm.skellam_scale=1e20"], "algorithm.skellam_scale", "below 2^52"),
])
def test_a_bad_skellam_config_names_its_key(overrides, field, allowed):
    with pytest.raises(ConfigError) as caught:
        simulation(*overrides)
    assert caught.value.field == field and allowed in str(caught.value)
