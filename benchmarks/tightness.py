"""How tight is the default? claim / exact per family, analysis, observer and worst-case instance (docs/accounting.md,
"How tight is the default?", holds one run of it).

    python benchmarks/tightness.py                  # every row, a markdown table on stdout
    python benchmarks/tightness.py --quick          # the fast subset (tests/accounting/test_tightness_table.py)
    python benchmarks/tightness.py --json out.json --write-docs

Each row is one (family, analysis, observer, instance). The claim is the ledger's epsilon through the family's real
entry point (``declared_epsilon``, the simulator's declaration of a round and a fresh ledger of the run's accountant,
or the ledger / accountant the family's tests call); the exact epsilon is that of the instance, computed without the
accountant, by the oracles of tests/helpers (shared with the worst-case tests that run each instance through the
engine and confirm its law):

* ``exact.Instance.epsilon``: a certified lower bound from the instance's discretised privacy loss distribution
  (losses rounded down, so at most T x 1e-4 below the truth after T rounds; see tests/helpers/exact.py);
* ``gdp``: the closed form of mu-GDP (Dong, Roth, Su 2022, Cor. 2.13) of an instance whose view is one Gaussian
  (or a linear Gaussian mechanism) with mu derived in closed form and confirmed by the tests' engine measurements;
* ``lattice_exact.exact_epsilon``: the hockey-stick divergence summed over every outcome of an integer-valued view
  (Skellam shares, P_vec's binomial counts), its pmf computed exactly (bisection on epsilon to 1e-6, rounded up).

"exact" is exact FOR THE INSTANCE AND THE OBSERVER the row names: a lower bound on the family's privacy (the worst
case may be worse), and the truth for that instance. Each row says whether its observer knows who takes part
(privacy.cohort, ``observers.cohort_known_to``): one that does meets a Gaussian in the rounds the owner takes part;
one that does not, the server's noise as a Gaussian mixture over the owner's participation.
Every ratio must be >= 1 (up to the exact side's discretisation): tests/accounting/test_tightness_table.py checks it
on the --quick subset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

import exact as ex  # noqa: E402
import ftrl_worst_case  # noqa: E402
import isrl_worst_case  # noqa: E402
import joint_relaxations_worst_case as eq25  # noqa: E402
import joint_worst_case  # noqa: E402
import last_iterate_worst_case  # noqa: E402
import lattice_exact  # noqa: E402
import unequal_sizes_worst_case as unequal  # noqa: E402
import worst_case  # noqa: E402
from user_level_worst_case import UserLevelCase  # noqa: E402

from dpfl.accounting.theory import gdp_epsilon  # noqa: E402
from dpfl.engine.boundary import Boundary  # noqa: E402
from dpfl.engine.sampling import ClientSampler  # noqa: E402
from dpfl.experiments.noise_level import build_calibrated, declared_epsilon  # noqa: E402

logging.getLogger("absl").setLevel(logging.ERROR)

DOCS = ROOT / "docs" / "accounting.md"
BEGIN, END = "<!-- tightness:begin -->", "<!-- tightness:end -->"
#: the issue's instance (issue 34): M = 1000, q = 0.05, T = 200, z = 1, delta = 1e-6
ISSUE = UserLevelCase(clients=1000, rate=0.05, noise_multiplier=1.0, rounds=200, delta=1e-6)
KNOWS = "1-D Gaussian per round, the observer knows the cohort (PLD lower bound)"
SECRET = "the Gaussian mixture over the owner's participation, the observer does not know the cohort (PLD lower bound)"
EVERYONE = "every client takes part in every round, so every observer knows the cohort"


@dataclasses.dataclass(frozen=True)
class Row:
    family: str
    analysis: str
    observer: str
    instance: str
    claim: float
    exact: float
    assumes: str

    @property
    def ratio(self) -> float:
        """claim / exact: 1 where both are infinite (an observer that sees a message with too little noise)."""
        if math.isinf(self.exact) and math.isinf(self.claim):
            return 1.0
        return self.claim / self.exact if self.exact > 0 else math.inf


def user_level_rows(quick: bool) -> list[Row]:
    """dp-fedavg-user: every noise placement x cohort sampling x observer of the test's instance (M = 10, q = 0.4,
    z = 1.5, T = 3) and the issue's instance (M = 1000); server noise both with the cohort secret (privacy.cohort's
    default: the third party and, behind a plain boundary, another silo do not know it) and published."""
    from dpfl.accounting.observers import cohort_known_to

    rows = []
    cases = [(UserLevelCase(), "M=10 q=0.4 z=1.5 T=3 d=1e-5")]
    if not quick:
        cases.append((ISSUE, "M=1000 q=0.05 z=1 T=200 d=1e-6"))
    views = [("plain", "third_party"), ("plain", "other_silo"), ("plain", "server"), ("secagg", "server")]
    for case, label in cases:
        placements = ("server", "shares", "client") if case is not ISSUE else ("server", "shares")
        for placement in placements:
            for sampling in ("fixed", "poisson"):
                if quick and (placement, sampling) not in {("server", "poisson"), ("shares", "fixed")}:
                    continue
                alg = case.algorithm(placement, sampling)
                for cohort in ("secret", "published") if placement == "server" else ("secret",):
                    claims = {boundary: case.claimed(alg, boundary, sampling, cohort=cohort)
                              for boundary in ("plain", "secagg")}
                    for boundary, observer in views:
                        instance = case.exact_instance(placement, sampling, boundary, observer, cohort)
                        if instance is None or (case is ISSUE and observer == "server"):
                            continue
                        truth = instance.epsilon(case.delta, case.rounds)
                        name = f"{label}, {placement} noise, {sampling} cohort, cohort {cohort}"
                        shown = observer if observer != "server" else f"server ({boundary})"
                        knows = placement != "server" or observer in cohort_known_to(boundary, cohort)
                        rows.append(Row("dp-fedavg-user", "sound", shown, name, claims[boundary][observer], truth,
                                        KNOWS if knows else SECRET))
    return rows + adaptive_clipping_rows(quick)


def adaptive_clipping_rows(quick: bool) -> list[Row]:
    """dp-fedavg-user with adaptive clipping (Andrew et al. 2021; server noise, target quantile 1/2, sigma_b = 2): the
    update's and the count's draws at z_Delta and z_b with 1/z_Delta^2 + 1/z_b^2 = 1/z^2, so the pair is one
    Gaussian at z (Dong et al.'s mu^2 adding): the exact instance is the fixed clip's (the owner's clipped update and
    its count bit both move by their sensitivity; tests/privacy/test_dp_fedavg_user_worst_case.py measures both)."""
    from dpfl.accounting.observers import cohort_known_to

    case, rows = UserLevelCase(), []
    for sampling in ("poisson",) if quick else ("fixed", "poisson"):
        alg = case.algorithm("server", sampling, target_quantile=0.5, count_noise=2.0)
        for cohort in ("secret",) if quick else ("secret", "published"):
            claims = case.claimed(alg, "plain", sampling, cohort=cohort)
            for observer in ("third_party", "other_silo"):
                truth = case.exact_instance("server", sampling, "plain", observer, cohort).epsilon(case.delta,
                                                                                                  case.rounds)
                knows = observer in cohort_known_to("plain", cohort)
                rows.append(Row("dp-fedavg-user", "sound", observer,
                                f"M=10 q=0.4 z=1.5 T=3 d=1e-5, server noise, adaptive clip (gamma=0.5, sigma_b=2), "
                                f"{sampling} cohort, cohort {cohort}", claims[observer], truth,
                                KNOWS if knows else SECRET))
    return rows


def local_sgd_rows(quick: bool) -> list[Row]:
    """dp-fedsgd, dp-fedavg, dp-scaffold(-warm): the review's instance (n = 20 clients all in the round, K = 50 steps,
    z = 10): the other clients' quadratic losses erase all but their last draw under FedAvg; SCAFFOLD's first round
    and SCAFFOLD-warm's first warm round send functions of FedAvg's and FedSGD's dy (tests/helpers/worst_case.py)."""
    rows = []
    views = {"third_party": "sum", "other_silo": "sum_minus_other", "server": "owner"}
    instances = ((worst_case.FEDSGD, "dp-fedsgd", "T=1"), (worst_case.FEDAVG, "dp-fedavg", "T=1"),
                 (worst_case.SCAFFOLD, "dp-scaffold", "T=1 (round 1: c = 0)"),
                 (worst_case.SCAFFOLD_WARM, "dp-scaffold-warm", "T=1 (the first of 4 warm rounds)"))
    for instance, family, rounds in instances:
        claims = worst_case.claimed_epsilon(instance, "plain", 1e-5)
        for observer, view in views.items():
            truth = gdp_epsilon(worst_case.analytic_mu(instance, view), 1e-5)
            rows.append(Row(family, "sound", observer, f"n=20 K=50 z=10 {rounds} d=1e-5", claims[observer], truth,
                            f"mu-GDP, mu = {worst_case.analytic_mu(instance, view):.4f} (engine-measured); "
                            f"{EVERYONE}"))
    return rows


def unequal_size_rows(quick: bool) -> list[Row]:
    """Unequal client sizes and record sampling (tests/helpers/unequal_sizes_worst_case.py): fedsgd-dpc's weighted
    replies (Zhou et al. 2021; the issue's instances, both aggregations), dp-fedsgd, and dp-fedavg-joint with
    Heikkilä et al.'s client-specific learning rates (the appendix's steps proportional to size)."""
    rows = []
    cases = [c for c in unequal.CASES if c.counts == (7, 6) + (4,) * 8][:1] if quick else unequal.CASES
    for case in cases:
        for view in unequal.VIEWS[:1] if quick else unequal.VIEWS:
            observer, boundary = view
            owner, truth = unequal.worst_owner(case, view)
            counts = ",".join(f"{d}x{case.counts.count(d)}" for d in dict.fromkeys(case.counts))
            shown = observer if observer != "server" else f"server ({boundary})"
            sampling = "Poisson pair (zero-out)" if case.poisson else "without-replacement pair (replace-one)"
            rows.append(Row(case.family, "sound", shown, f"records {counts}, " + ", ".join(map(str, case.args)),
                            unequal.claimed_epsilon(case, view), truth,
                            f"the owner's record-sampling {sampling} at the observed shares' noise, the worst owner "
                            f"(n={case.counts[owner]}), PLD lower bound; {EVERYONE}"))
    return rows


def joint_rows(quick: bool) -> list[Row]:
    """dp-fedavg-joint, both analyses: Heikkilä's shares, S = 1 and S = 8 steps, the test's four views."""
    rows = []
    for steps in (1, 8):
        for name, trust, colluders, min_clients, observer, k in joint_worst_case.VIEWS:
            if quick and name != "third party":
                continue
            share = joint_worst_case.algorithm(steps, trust, colluders, min_clients).mechanism.noise_multiplier
            mu = joint_worst_case.exact_mu(share, steps, k)
            truth = gdp_epsilon(mu, joint_worst_case.DELTA)
            claim = joint_worst_case.claimed_epsilon(steps, trust, colluders, min_clients, observer, "sound")
            shown = observer if name.replace(" ", "_") == observer else f"{observer} ({name})"
            rows.append(Row("dp-fedavg-joint", "sound", shown,
                            f"n=10 S={steps} z=6 T=1 d=1e-5, trust={trust}", claim, truth,
                            f"mu-GDP, mu = {mu:.4f} (engine-measured); {EVERYONE}"))
    return rows


def joint_relaxation_rows(quick: bool) -> list[Row]:
    """dp-fedavg-joint's appendix relaxations, Eq. 25 (tests/helpers/joint_relaxations_worst_case.py): 4 clients of
    unequal sizes with their own learning rates, clips and noise factors, one step; the sum is one Gaussian."""
    rows = []
    for trust, observer in eq25.VIEWS[:1] if quick else eq25.VIEWS:
        alg = eq25.algorithm("sound", trust)
        mu = eq25.exact_mu(alg, observer)
        rows.append(Row("dp-fedavg-joint", "sound", observer,
                        f"Eq. 25: n_i={eq25.COUNTS} g_i={eq25.LR} C_i={eq25.CLIP} f_i={eq25.NOISE} S=1 q=1 "
                        f"z={eq25.SIGMA} T=1, trust={trust}", eq25.claimed_epsilon(alg, observer), gdp_epsilon(
                            mu, eq25.DELTA), f"mu-GDP, mu = {mu:.4f} (the worst owner; engine-measured); {EVERYONE}"))
    return rows


def skellam_rows(quick: bool) -> list[Row]:
    """dp-fedavg-joint with Skellam shares (Agarwal, Kairouz, Liu 2021; algorithm.noise = "skellam") on a 1-D model:
    10 clients, one step, sigma = 1 summed over the cohort (trusted aggregator), a scale putting one sensitivity at
    s D = 2.5 integer units. The third party sees one integer sum: the owner's rounded input round(o + s D) against
    round(o) (randomised rounding: a two-point law unless an integer; the other clients' inputs integers) plus
    Sk(lam, lam) of the summed shares' variance 2 lam = (s D)^2 sigma^2, the owner's record Poisson-sampled at q. Its
    exact epsilon is the worst over the offsets o of ``lattice_exact``'s sum over every outcome."""
    from dpfl.accounting.ledger import PrivacyLedger
    from dpfl.accounting.observers import observer_events
    from dpfl.algorithms.dp_fedavg_joint import JointNoiseConfig
    from dpfl.algorithms.registry import Setting

    rows, delta, unit = [], 1e-5, 2.5
    for q, records, rounds in [(1.0, 10, 1)] + ([] if quick else [(0.1, 100, 2)]):
        setting = Setting(client_rate=1.0, num_clients=10, train_counts=(records,) * 10, rounds=rounds, delta=delta,
                          dimension=1)
        alg = build_calibrated("dp-fedavg-joint", JointNoiseConfig(
            noise="skellam", skellam_scale=unit * q * records, local_steps=1, noise_multiplier=1.0, sample_rate=q,
            trust="aggregator"), setting)
        release = alg.release(0, None, torch.tensor([records] * 10))
        event = observer_events(release, ClientSampler(10, 1.0).cohort(0), "secagg", "sound")["third_party"]
        ledger = PrivacyLedger(("third_party",), delta, None, None, "sound", alg.neighboring, alg.accountant)
        claim = ledger.epsilon_after([{"third_party": event}] * rounds, ["third_party"])["third_party"]
        skellam = event.event.event  # SelfComposed(PoissonSampled(q, Skellam)): one step
        assert (skellam.scale, skellam.dimension) == (unit, 1), skellam
        variance = skellam.scale**2 * skellam.variance

        def law(y: float) -> list:  # randomised rounding of y: [(probability, integer)]
            low, up = math.floor(y), y - math.floor(y)
            return [(w, k) for w, k in ((1 - up, low), (up, low + 1)) if w > 0]

        truth = max(lattice_exact.exact_epsilon(lattice_exact.skellam_pairs(
            variance, (law(o + unit), law(o)), q, rounds), delta) for o in (0.0, 0.25, 0.5, 0.75))
        rows.append(Row("dp-fedavg-joint", "sound", "third_party",
                        f"Skellam shares, d=1 n=10 S=1 q={q} z=1 sD={unit} T={rounds} d=1e-5, trust=aggregator",
                        claim, truth,
                        "the exact lattice law of the Skellam sum, the owner's rounded input moved by s D from the "
                        f"worst offset (every outcome summed); {EVERYONE}"))
    return rows


def sdp_rows(quick: bool) -> list[Row]:
    """sdp-prox-sgd (Lowy et al. 2023 with Cheu et al. 2021's P_vec) on a 1-D model: 4 silos of 10 records, R = 2
    rounds of K = 5 records (one pass), b bits per user calibrated to epsilon = 2, grid g = 1, so a clipped gradient
    +-C rounds to 1 or 0 with no randomness. The owner's record moves the counts by 1 in the one round that uses it;
    the counts carry Bin(m, 1/2) noise of the bits in the view (the cohort's behind the real shuffler, less a silo's
    own for another silo, the owner's silo's own for a server that sees each silo's message). Exact: the binomial
    pair Bin(m, 1/2) + 1 against Bin(m, 1/2) summed over every outcome (``lattice_exact.binomial_pairs``)."""
    from dpfl.algorithms.registry import Setting
    from dpfl.algorithms.sdp import SDPConfig

    rows, delta = [], 1e-5
    setting = Setting(client_rate=1.0, num_clients=4, train_counts=(10,) * 4, rounds=2, delta=delta, epsilon=2.0,
                      dimension=1)
    shuffler = Boundary("shuffler", shuffle="real")
    alg = build_calibrated("sdp-prox-sgd", SDPConfig(lr=0.1, clip=1.0, sample_rate=1.0), setting, shuffler)
    own = alg.release(0, alg.init_state(torch.zeros(1), 4), torch.tensor([10] * 4)).step_events[0]
    assert (own.dimension, own.grid, own.l2_shift) == (1, 1, 1.0), own
    views = [(shuffler, "third_party", 4), (shuffler, "other_silo", 3), (Boundary("plain"), "server", 1)]
    for boundary, observer, silos in views[:1] if quick else views:
        claim = declared_epsilon(alg, setting, boundary, ClientSampler(4, 1.0))[observer]
        truth = lattice_exact.exact_epsilon(lattice_exact.binomial_pairs(silos * own.trials, 1, 1), delta)
        shown = f"{observer} ({'real shuffler' if boundary is shuffler else 'plain'})"
        rows.append(Row("sdp-prox-sgd", "sound", shown,
                        f"d=1 g=1 M=4 n_i=10 R=2 eps=2 d=1e-5, {own.trials} bits per silo", claim, truth,
                        f"Bin({silos * own.trials}, 1/2) + 1 vs Bin({silos * own.trials}, 1/2), every outcome summed; "
                        f"{EVERYONE}"))
    return rows


def isrl_rows(quick: bool) -> list[Row]:
    """The ISRL-DP family (Lowy et al. 2023): one silo of 12 records, linear losses, R = 4 rounds calibrated to
    epsilon = 1 (tests/helpers/isrl_worst_case.py), and for the SPIDER recursion a record whose gradient flips with
    the model (its difference rounds carry no signal under linear losses): with one silo the server and another silo
    see the same transcript; with 4 silos the third party and another silo see sums, credited the other silos'
    additive draws (Prox-SGD, minibatch SGD and Local SGD's last step)."""
    rows = []
    for name in isrl_worst_case.NAMES[:1] if quick else isrl_worst_case.NAMES:
        alg = isrl_worst_case.algorithm(name)
        flips = {"isrl-spider": (False, True), "isrl-spider-alt": (True,)}.get(name, (False,))
        for flipping in flips:
            mu = isrl_worst_case.exact_mu(name, alg, flipping)
            truth = gdp_epsilon(mu, isrl_worst_case.DELTA)
            instance = "a record whose gradient flips with the model" if flipping else "linear losses"
            for observer, claim in isrl_worst_case.claimed(alg).items():
                rows.append(Row(name, "sound", observer, f"n=12 R=4 eps=1 d=1e-5, {instance}", claim, truth,
                                f"mu-GDP, mu = {mu:.4f} (engine-measured); one silo, no cohort to know"))
    silos = 4  # the observers of the sum, credited the other silos' additive draws
    for name in () if quick else ("isrl-prox-sgd", "isrl-mb-sgd", "isrl-local-sgd"):
        alg = isrl_worst_case.algorithm(name, silos)
        claims = isrl_worst_case.claimed(alg, silos)
        for observer, shares in (("third_party", silos), ("other_silo", silos - 1)):
            mu = isrl_worst_case.sum_mu(name, alg, shares)
            rows.append(Row(name, "sound", observer, f"M={silos} silos of n=12, R=4 eps=1 d=1e-5, linear losses",
                            claims[observer], gdp_epsilon(mu, isrl_worst_case.DELTA),
                            f"mu-GDP of the rounds' sums of {shares} silos' messages, mu = {mu:.4f} "
                            "(engine-measured, tests/privacy/test_isrl_worst_case.py); every silo in every round"))
    return rows


def ftrl_rows(quick: bool) -> list[Row]:
    """dp-ftrl: 8 clients, cohorts of 2, epochs of 4 rounds, z = 0.8; round robin (three full trees: the owner in
    each epoch's first round; or a last tree cut after 2 of its 4 rounds, the partial last epoch) and disjoint
    batches (a last tree cut after 2 of its 4 rounds)."""
    rows = []
    cases = [("round_robin", 12)] + ([] if quick else [("round_robin", 10), ("disjoint", 10)])
    for sampling, rounds in cases:
        sim, mu, _ = ftrl_worst_case.worst_case_mu("trusted", sampling, rounds)
        claims, delta = sim.ledger.epsilon(), sim.ledger.delta
        cut = f", last epoch cut after {rounds % 4} of 4 rounds" if rounds % 4 else ""
        for observer in ("third_party", "other_silo"):
            rows.append(Row("dp-ftrl", "sound", observer, f"M=8 n=2 epoch=4 z=0.8 T={rounds} {sampling}{cut}",
                            claims[observer], gdp_epsilon(mu, delta),
                            f"linear Gaussian mechanism of all T models, mu = {mu:.4f} (engine run); the observer "
                            "knows the schedule (who takes part in each round)"))
    return rows


def bandmf_rows(quick: bool) -> list[Row]:
    """bandmf (the banded square root, b = 4, z = 0.8, 8 clients): round robin with cohorts of 2 (the owner in rounds
    1, 5, 9: the linear Gaussian mechanism of ``bandmf_worst_case_mu``), and amplified (partitioned Poisson, 4
    partitions, q = 0.5, every other client null: per block the Poisson subsampled Gaussian of
    ``amplified_bandmf_worst_case``, its exact epsilon from the densities), the cohort secret from the third party
    and another silo, or published; T = 12 (whole columns) or 10 (the last cut to 2 of its 4 rows)."""
    rows = []
    for rounds in (12,) if quick else (12, 10):
        cut = ", last column cut to 2 of 4 rows" if rounds % 4 else ""
        sim, mu, _ = ftrl_worst_case.bandmf_worst_case_mu("trusted", rounds, bands=4)
        claims, delta = sim.ledger.epsilon(), sim.ledger.delta
        for observer in ("third_party", "other_silo"):
            rows.append(Row("bandmf", "sound", observer, f"M=8 n=2 b=4 z=0.8 T={rounds} round_robin{cut}",
                            claims[observer], gdp_epsilon(mu, delta),
                            f"linear Gaussian mechanism of all T models, mu = {mu:.4f} (engine run); the observer "
                            "knows the schedule"))
        for cohort in ("secret", "published"):
            sim, moved, eligible = ftrl_worst_case.amplified_bandmf_worst_case(
                rounds, privacy={"cohort": cohort}, client_rate=0.125, bands=4)
            alg = sim.algorithm
            shifts = [float(np.linalg.norm(moved[j:j + 4])) / (alg.noise_multiplier * alg.column_norm)
                      for j in eligible]
            exact = ftrl_worst_case.subsampled_gaussian_epsilon(alg.partition_rate, shifts, sim.ledger.delta,
                                                                knows_cohort=cohort == "published")
            claims = sim.ledger.epsilon()
            for observer in ("third_party", "other_silo"):
                rows.append(Row("bandmf", "sound", observer, f"M=8 b=4 q=0.5 z=0.8 T={rounds} partitioned_poisson, "
                                f"cohort {cohort}{cut}", claims[observer], exact,
                                (SECRET if cohort == "secret" else KNOWS).replace(" (PLD lower bound)", "")
                                + "; per block of b rows (PLD lower bound from the densities), shifts "
                                + ", ".join(f"{m:.3f}" for m in shifts) + " (engine run)"))
    return rows


def last_iterate_rows(quick: bool) -> list[Row]:
    """projected-noisy-sgd, last-iterate analysis: linear losses, n users, batches of m; the sound claim (per secret
    batch the smaller of Asoodeh et al.'s Thm 2 and amplification by iteration, the losses being convex and 0-smooth:
    any beta with eta = 0.5 <= 2 / beta, here 1) and the paper's (Thm 2 alone)."""
    import dataclasses

    rows = []
    cases = [(8, 8, 1.5), (8, 2, 0.5)] + ([] if quick else [(64, 4, 0.5), (256, 4, 0.25)])
    for n, m, z in cases:
        sound = dataclasses.replace(last_iterate_worst_case.algorithm(n, m, z), smoothness=1.0)
        mu = last_iterate_worst_case.exact_mu(n, z)
        for analysis, alg in (("sound", sound), ("paper", dataclasses.replace(sound, analysis="paper"))):
            rows.append(Row("projected-noisy-sgd", analysis, "third_party", f"n={n} m={m} z={z} T={n // m} d=1e-5",
                            last_iterate_worst_case.claimed_epsilon(alg, 1e-5),
                            last_iterate_worst_case.exact_epsilon(mu, 1e-5),
                            f"the last iterate, mu-GDP, mu = 1/(z sqrt n) = {mu:.4f}"))
    return rows


SECTIONS = (user_level_rows, local_sgd_rows, unequal_size_rows, joint_rows, joint_relaxation_rows, skellam_rows,
            sdp_rows, isrl_rows, ftrl_rows, bandmf_rows, last_iterate_rows)


def rows(quick: bool = False) -> list[Row]:
    return [row for section in SECTIONS for row in section(quick)]


def table(found: list[Row]) -> str:
    lines = ["| family | analysis | observer | instance | claim | exact | claim/exact | what exact assumes |",
             "|---|---|---|---|---:|---:|---:|---|"]
    for r in found:
        lines.append(f"| {r.family} | {r.analysis} | {r.observer} | {r.instance} | {r.claim:.4g} | {r.exact:.4g} | "
                     f"{r.ratio:.2f} | {r.assumes} |")
    return "\n".join(lines)


def write_docs(text: str, path: Path = DOCS) -> None:
    """Replaces what lies between the markers in ``path`` by ``text``."""
    page = path.read_text()
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    path.write_text(page[:start] + "\n" + text + "\n" + page[end:])


def main(argv=None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the fast subset")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    parser.add_argument("--write-docs", action="store_true", help=f"replace the table in {DOCS.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    found = rows(args.quick)
    text = table(found)
    print(text)
    print(f"\n{len(found)} rows in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) | {"ratio": r.ratio} for r in found], indent=1))
    if args.write_docs:
        write_docs(text)
    return found


if __name__ == "__main__":
    main()
