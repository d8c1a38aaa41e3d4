"""The Lowy et al. (2023) experiments in --quick mode, both settings (breast cancer in 2 one-class silos, digits in 25
(even, odd) silos): their outputs' shape, every private run's spent epsilon at most its target for every observer,
the non-private versions, the tuned tables and figures; and the skipping of algorithms dpfl has not registered."""

from __future__ import annotations

import csv
import json

import pytest

from dpfl.papers.lowy2023 import experiment as lowy2023

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAMES = ("isrl-spider", "isrl-mb-sgd", "isrl-local-sgd")
#: per setting: SPIDER, MB-SGD, Local SGD at eps 0.75 and 1.5, then their non-private versions (one grid point each)
ORDER = ["isrl-spider"] * 2 + ["isrl-mb-sgd"] * 2 + ["isrl-local-sgd"] * 2 + ["isrl-spider", "fedsgd", "fedavg"]


@pytest.mark.slow  # 18 calibrated runs: 1-6 minutes on 2 cores; the grid and the skips are checked below by default
def test_quick_mode_runs_both_settings_and_writes_every_run_the_tuned_tables_and_the_figures(tmp_path, capsys):
    out = tmp_path / "out"
    result = lowy2023.main(["--out", str(out), "--quick", "--setting", "both", "--algorithms", ",".join(NAMES)])
    with open(out / "runs.csv") as file:
        runs = list(csv.DictReader(file))
    assert [r["setup"] for r in runs] == ["breast_cancer R=10 M=2"] * 9 + ["digits R=10 M=12"] * 9
    assert [r["algorithm"] for r in runs] == ORDER * 2
    breast, digits = result["setups"]
    assert breast["delta"] == pytest.approx(1 / 170 ** 2)  # the malignant silo's 170 training records
    assert (digits["num_clients"], digits["cohort"]) == (25, 12)
    assert digits["delta"] == pytest.approx(1 / 56 ** 2)  # the smallest (even, odd) silo keeps 56 of its 70 records
    private = [r for r in runs if r["epsilon"] and float(r["epsilon"]) < 1e3]
    assert len(private) == 12
    for r in private:
        spent = json.loads(r["spent"])
        assert set(spent) == {"third_party", "server", "other_silo"}
        assert max(spent.values()) == float(r["epsilon_spent"]) <= float(r["epsilon"]) + 1e-9
        if r["setup"].startswith("breast"):  # every silo every round: the noise is calibrated to spend all of eps
            assert float(r["epsilon_spent"]) >= 0.99 * float(r["epsilon"])
    assert result["budget_check"]["all_within"] and result["budget_check"]["private_runs"] == 12
    assert all(r["epsilon_spent"] == "" for r in runs if r["algorithm"] in ("fedsgd", "fedavg"))  # no claim
    errors = {(r["setup"].split()[0], r["algorithm"], r["epsilon"]): float(r["test_error"]) for r in runs}
    assert all(0.0 <= e <= 1.0 for e in errors.values())
    # without noise the MLPs learn: breast cancer's 113 test records (0.1 is 11 mistakes); digits' parity, 358 records
    assert errors[("breast_cancer", "fedavg", "")] < 0.1 and errors[("digits", "fedavg", "")] < 0.3
    stored = json.loads((out / "results.json").read_text())
    assert stored["runs"] == result["runs"] and len(stored["summary"]) == 2 * (3 * 2 + 3)
    assert "TEST error" in stored["nonprivate"]["breast_cancer"] and "pooled" in stored["nonprivate"]["breast_cancer"]
    assert "no PCA" in stored["nonprivate"]["digits"] and "1/16" in stored["nonprivate"]["digits"]
    assert set(stored["claim"]["per_point"]) == {f"{s} eps={e}" for s in ("breast_cancer R=10 M=2", "digits R=10 M=12")
                                                 for e in ("0.75", "1.5")}
    table = (out / "table.md").read_text().splitlines()
    assert table[0] == "breast_cancer R=10 M=2" and table[4].startswith("| 0.75 | ")
    assert table[6].startswith("| non-private | isrl-spider: ") and table[8] == "digits R=10 M=12"
    assert table[-1].startswith("NOT PRIVATE: ")
    for setting in ("breast_cancer", "digits"):
        assert (out / f"{setting}.png").read_bytes()[:4] == b"\x89PNG"
    assert table[6] in capsys.readouterr().out
    # --merge: the outputs of earlier folders' runs together, no new run (here one folder: the same outputs)
    merged = lowy2023.main(["--out", str(tmp_path / "merged"), "--merge", str(out)])
    assert merged["runs"] == result["runs"] and merged["summary"] == result["summary"]
    assert merged["merged_from"] == [str(out)] and merged["setups"] == stored["setups"]
    assert (tmp_path / "merged" / "table.md").read_text() == (out / "table.md").read_text()


def test_unregistered_algorithms_are_skipped_with_a_note_and_unknown_ones_refused(monkeypatch):
    monkeypatch.setattr(lowy2023.registry, "names", lambda: ["isrl-mb-sgd", "isrl-spider"])
    names, notes = lowy2023.available(("isrl-spider", "sdp-spider", "isrl-mb-sgd"))
    assert names == ["isrl-spider", "isrl-mb-sgd"]
    assert notes == ["sdp-spider: not registered in dpfl.algorithms.registry, skipped"]
    with pytest.raises(SystemExit, match=r"--algorithms: \['fedprox'\] not in \['isrl-spider'"):
        lowy2023.available(("fedprox",))


def test_grid_tunes_eta_clip_and_the_algorithms_own_keys():
    points = lowy2023.grid("isrl-spider", 3.0, (0.1, 1.0), (0.3,), {"period": (2, 5)})
    assert points == [("isrl-spider", 3.0, 0.1, 0.3, {"period": 2}), ("isrl-spider", 3.0, 0.1, 0.3, {"period": 5}),
                      ("isrl-spider", 3.0, 1.0, 0.3, {"period": 2}), ("isrl-spider", 3.0, 1.0, 0.3, {"period": 5})]
    assert lowy2023.grid("fedsgd", None, (0.1,), (0.3, 1.0), {}) == [("fedsgd", None, 0.1, None, {})]  # no clip
