"""benchmarks/scale.py (W2: 10^5 clients): one case runs for real on a small stacked folder, and the README's Scale
table is the benchmark's output (header and the case columns)."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _bench():
    spec = importlib.util.spec_from_file_location("scale", ROOT / "benchmarks" / "scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_one_case_runs_a_stacked_population_and_reports_its_rows_held(tmp_path):
    bench = _bench()
    folder = bench.write_population(tmp_path / "pop", 200)
    got = bench.one_case(str(folder), 200, 10, "logreg", 2, "cpu", 1)
    assert got["clients"] == 200 and got["cohort"] == 10 and got["d"] == 410
    assert 10 <= got["held"] <= 30  # the distinct clients of 3 rounds (a warm-up and 2 timed) of 10
    assert got["s_round"] > 0 and got["evaluation_s"] > 0 and got["peak_mb"] > 0


def test_the_readme_scale_table_is_the_benchmarks_output(monkeypatch, capsys, tmp_path):
    bench = _bench()
    section = README[README.index("## Scale\n"):]
    section = section[:section.index("\n## ", 1)]
    assert "`python benchmarks/scale.py" in section
    monkeypatch.setattr(bench, "write_population", lambda folder, clients: folder)

    def case(command, **kwargs):
        clients, cohort, model = command[3:6]
        row = {"clients": int(clients), "cohort": int(cohort), "model": model, "d": 410 if model == "logreg" else 10210,
               "s_round": 1.0, "evaluation_s": 1.0, "held": 1, "peak_mb": 1.0}
        return SimpleNamespace(returncode=0, stdout=json.dumps(row), stderr="")

    monkeypatch.setattr(bench.subprocess, "run", case)
    bench.main(["--folder", str(tmp_path)])
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
    table = [ln for ln in section.splitlines() if ln.startswith("|")]
    assert printed[:2] == table[:2]
    assert [ln.split("|")[1:4] for ln in printed[2:]] == [ln.split("|")[1:4] for ln in table[2:]]
