"""The Lowy et al. (2023) breast-cancer experiment in --quick mode: its outputs' shape, every private run's spent
epsilon at most its target, the non-private versions and the tuned table."""

from __future__ import annotations

import csv
import json

import pytest

from dpfl.experiments.papers import lowy2023

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_quick_mode_writes_every_run_the_tuned_table_and_the_figure(tmp_path, capsys):
    out = tmp_path / "out"
    result = lowy2023.main(["--out", str(out), "--quick"])
    with open(out / "runs.csv") as file:
        runs = list(csv.DictReader(file))
    # 3 private names x 2 eps x 2 step sizes x 1 clip, then isrl-spider at eps 1e6 (2), fedsgd (2), fedavg (2)
    assert len(runs) == 18
    assert [r["algorithm"] for r in runs[12:]] == ["isrl-spider"] * 2 + ["fedsgd"] * 2 + ["fedavg"] * 2
    assert result["setup"]["delta"] == pytest.approx(1 / 170 ** 2)  # the malignant silo's 170 training records
    for r in runs[:12]:
        assert float(r["epsilon"]) * 0.99 <= float(r["epsilon_spent"]) <= float(r["epsilon"]) + 1e-9
    assert all(r["epsilon_spent"] == "" for r in runs[14:])  # fedsgd / fedavg: no privacy claim
    errors = [float(r["test_error"]) for r in runs]
    assert all(0.0 <= e <= 1.0 for e in errors)
    # with (almost) no noise the MLP separates the classes well (113 test records: 0.9 is 11 mistakes)
    assert min(errors[12:]) < 0.1
    stored = json.loads((out / "results.json").read_text())
    assert stored["runs"] == result["runs"] and len(stored["summary"]) == 3 * 2 + 3
    assert "TEST error" in stored["nonprivate"] and "pooled" in stored["nonprivate"]
    assert set(stored["claim"]["per_epsilon"]) == {"1", "18"}
    table = (out / "table.md").read_text().splitlines()
    assert len(table) == 5 and table[2].startswith("| 1 | ") and table[4].startswith("| non-private | isrl-spider: ")
    assert (out / "lowy2023.png").read_bytes()[:4] == b"\x89PNG"
    assert table[4] in capsys.readouterr().out
