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
  (or a linear Gaussian mechanism) with mu derived in closed form and confirmed by the tests' engine measurements.

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

import exact as ex  # noqa: E402
import ftrl_worst_case  # noqa: E402
import joint_worst_case  # noqa: E402
import last_iterate_worst_case  # noqa: E402
import worst_case  # noqa: E402
from user_level_worst_case import UserLevelCase  # noqa: E402

from dpfl.accounting.theory import gdp_epsilon  # noqa: E402

logging.getLogger("absl").setLevel(logging.ERROR)

DOCS = ROOT / "docs" / "accounting.md"
BEGIN, END = "<!-- tightness:begin -->", "<!-- tightness:end -->"
#: the issue's instance (issue 34): M = 1000, q = 0.05, T = 200, z = 1, delta = 1e-6
ISSUE = UserLevelCase(clients=1000, rate=0.05, noise_multiplier=1.0, rounds=200, delta=1e-6)
KNOWS = "1-D Gaussian per round, the observer knows the cohort (PLD lower bound)"
SECRET = "the Gaussian mixture over the owner's participation, the observer does not know the cohort (PLD lower bound)"


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
    return rows


def local_sgd_rows(quick: bool) -> list[Row]:
    """dp-fedsgd and dp-fedavg: the review's instance (n = 20 clients all in the round, K = 50 steps, z = 10): the
    other clients' quadratic losses erase all but their last draw under FedAvg (tests/helpers/worst_case.py)."""
    rows = []
    views = {"third_party": "sum", "other_silo": "sum_minus_other", "server": "owner"}
    for instance, family in ((worst_case.FEDSGD, "dp-fedsgd"), (worst_case.FEDAVG, "dp-fedavg")):
        claims = worst_case.claimed_epsilon(instance, "plain", 1e-5)
        for observer, view in views.items():
            truth = gdp_epsilon(worst_case.analytic_mu(instance, view), 1e-5)
            rows.append(Row(family, "sound", observer, "n=20 K=50 z=10 T=1 d=1e-5", claims[observer], truth,
                            f"mu-GDP, mu = {worst_case.analytic_mu(instance, view):.4f} (engine-measured)"))
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
                            f"mu-GDP, mu = {mu:.4f} (engine-measured)"))
    return rows


def ftrl_rows(quick: bool) -> list[Row]:
    """dp-ftrl: 8 clients, cohorts of 2, epochs of 4 rounds, z = 0.8; round robin (three full trees: the owner in
    each epoch's first round) and disjoint batches (a last tree cut after 2 of its 4 rounds)."""
    rows = []
    cases = [("round_robin", 12)] + ([] if quick else [("disjoint", 10)])
    for sampling, rounds in cases:
        sim, mu, _ = ftrl_worst_case.worst_case_mu("trusted", sampling, rounds)
        claims, delta = sim.ledger.epsilon(), sim.ledger.delta
        for observer in ("third_party", "other_silo"):
            rows.append(Row("dp-ftrl", "sound", observer, f"M=8 n=2 epoch=4 z=0.8 T={rounds} {sampling}",
                            claims[observer], gdp_epsilon(mu, delta),
                            f"linear Gaussian mechanism of all T models, mu = {mu:.4f} (engine run)"))
    return rows


def last_iterate_rows(quick: bool) -> list[Row]:
    """projected-noisy-sgd, last-iterate analysis (Asoodeh et al. 2021, Thm 2): linear losses, n users, batches of m."""
    rows = []
    cases = [(8, 8, 1.5), (8, 2, 0.5)] + ([] if quick else [(64, 4, 0.5), (256, 4, 0.25)])
    for n, m, z in cases:
        alg = last_iterate_worst_case.algorithm(n, m, z)
        mu = last_iterate_worst_case.exact_mu(n, z)
        rows.append(Row("projected-noisy-sgd", "last-iterate", "third_party", f"n={n} m={m} z={z} T={n // m} d=1e-5",
                        last_iterate_worst_case.claimed_epsilon(alg, 1e-5),
                        last_iterate_worst_case.exact_epsilon(mu, 1e-5),
                        f"the last iterate, mu-GDP, mu = 1/(z sqrt n) = {mu:.4f}"))
    return rows


SECTIONS = (user_level_rows, local_sgd_rows, joint_rows, ftrl_rows, last_iterate_rows)


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
