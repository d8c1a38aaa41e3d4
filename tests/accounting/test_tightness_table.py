"""benchmarks/tightness.py (the table of docs/accounting.md, "How tight is the default?") on its --quick subset: every
claim is at least the exact epsilon of its instance, every family it covers has a row, and --write-docs replaces
only the text between the markers. So the benchmark cannot rot, and a claim below its worst case fails here."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "tightness.py"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def load():
    spec = importlib.util.spec_from_file_location("tightness", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_quick_table_never_claims_less_than_the_exact_epsilon(tmp_path, capsys):
    tightness = load()
    found = tightness.main(["--quick", "--json", str(tmp_path / "rows.json")])
    assert {r.family for r in found} == {"dp-fedavg-user", "dp-fedsgd", "dp-fedavg", "dp-scaffold", "dp-scaffold-warm",
                                         "fedsgd-dpc", "dp-fedavg-joint", "sdp-prox-sgd", "isrl-prox-sgd", "dp-ftrl",
                                         "bandmf", "projected-noisy-sgd"}
    for row in found:
        assert math.isfinite(row.claim) and row.exact > 0, row
        assert row.claim >= row.exact * (1 - 1e-6), row  # the exact side is a lower bound: never above the claim
    # where dpfl's analysis charges exactly the instance, the ratio is 1 (the PLD side sits at most T 1e-4 below)
    fedsgd_server = next(r for r in found if r.family == "dp-fedsgd" and r.observer == "server")
    assert fedsgd_server.ratio == pytest.approx(1.0, abs=1e-6)
    secret = next(r for r in found if r.observer == "third_party" and "server noise, poisson cohort, cohort secret"
                  in r.instance)
    assert secret.ratio == pytest.approx(1.0, abs=0.02)  # the amplified epsilon, towards an observer it is secret from
    published = next(r for r in found if r.observer == "third_party" and "server noise, poisson cohort, cohort "
                     "published" in r.instance)
    assert published.ratio == pytest.approx(1.0, abs=0.02) and published.claim > 1.4 * secret.claim
    # exact where the ledger charges the instance itself: Eq. 25's Gaussian sum, P_vec's one coordinate (the lattice
    # PLD), the one Gaussian of isrl-prox-sgd; SCAFFOLD credits no other client's noise (c_i carries every draw)
    eq25 = next(r for r in found if r.instance.startswith("Eq. 25"))
    shuffled = next(r for r in found if r.family == "sdp-prox-sgd")
    prox = next(r for r in found if r.family == "isrl-prox-sgd")
    assert eq25.ratio == pytest.approx(1.0, abs=1e-4) and shuffled.ratio == pytest.approx(1.0, abs=1e-3)
    assert prox.ratio == pytest.approx(1.0, abs=1e-3)
    scaffold = {r.observer: r for r in found if r.family == "dp-scaffold"}
    assert scaffold["third_party"].claim == pytest.approx(scaffold["server"].exact, rel=1e-6)
    skellam = next(r for r in found if r.instance.startswith("Skellam"))
    assert 1.0 < skellam.ratio < 1.2  # the charged shift K = 3 against the realisable rounding of s D = 2.5
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 + len(found) and all(line.count("|") == 9 for line in printed)
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["claim"] for r in rows] == [r.claim for r in found] and all(r["ratio"] >= 1 - 1e-6 for r in rows)


def test_write_docs_replaces_only_the_text_between_the_markers(tmp_path):
    tightness = load()
    page = tmp_path / "page.md"
    page.write_text(f"before\n{tightness.BEGIN}\nold table\n{tightness.END}\nafter\n")
    tightness.write_docs("| new |", page)
    assert page.read_text() == f"before\n{tightness.BEGIN}\n| new |\n{tightness.END}\nafter\n"


def test_the_docs_page_holds_the_markers():
    tightness = load()
    page = tightness.DOCS.read_text()
    assert page.index(tightness.BEGIN) < page.index(tightness.END)
