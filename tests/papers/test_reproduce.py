"""`dpfl reproduce`: the list of items with their status, the cache (a rerun computes nothing; a changed setting
recomputes; an interrupted run leaves nothing to reuse), the report's table, and the refusals (an unknown item, a
full run without its data set). The slow test regenerates docs/reproduction.md's numbers in quick mode."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dpfl.cli import main
from dpfl.errors import ConfigError
from dpfl.papers import ITEMS, item
from dpfl.reproduction import report, runner
from dpfl.reproduction.item import Item, Row, about, agrees, fmt

ROOT = Path(__file__).resolve().parents[2]
PAPERS = ("Noble", "Zhou", "Heikkilä", "Asoodeh", "Lowy")


@pytest.fixture
def no_data(tmp_path, monkeypatch):
    """$DPFL_DATA pointing at an empty folder: no public data set is there."""
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def test_list_shows_every_item_with_its_status_and_where_its_data_set_goes(no_data, capsys):
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for it in ITEMS.values():
        assert f"{it.id}  [{it.status}]" in out and it.why in out
        if it.no_full_run:
            assert f"full run: none yet ({it.no_full_run})" in out
        elif it.data is not None:
            assert f"full run: needs the data set {it.data} at {no_data / it.data} (not there; --quick runs it " \
                   f"on {it.substitute})" in out
    assert all(any(it.paper.startswith(p) for it in ITEMS.values()) for p in PAPERS)
    wanted = ("noble2022-epsilon", "noble2022-fig1", "noble2022-table4", "noble2022-fig1-grid", "noble2022-fig9",
              "noble2022-fig10", "noble2022-mlp", "zhou2021-table1", "zhou2021-loss", "heikkila2024-table1",
              "heikkila2024-local-steps", "heikkila2024-heterogeneous", "asoodeh2021-fig2", "asoodeh2021-utility",
              "lowy2023-wbcd", "lowy2023-wbcd-grid", "lowy2023-mnist", "lowy2023-shuffle")
    assert set(wanted) <= set(ITEMS)
    assert {it.status for it in ITEMS.values()} <= {"reproduced", "differs"}


def _counting(calls: list, value: float = 1.0) -> Item:
    def compute(settings, folder):
        calls.append(settings)
        (folder / "figure.png").write_bytes(b"\x89PNG")
        return {"rows": [Row("a | b", "1.0", f"{settings['x']:.1f}", None, settings["x"] == 1.0, "why")],
                "extra": settings["x"]}

    return Item("test-item", "Someone (2020)", "a table", "Table 9", "reproduced", "it matches",
                lambda quick: {"x": value, "quick": quick}, compute)


def test_a_rerun_computes_nothing_and_a_changed_setting_recomputes(tmp_path):
    calls = []
    first = runner.reproduce(_counting(calls), True, tmp_path)
    again = runner.reproduce(_counting(calls), True, tmp_path)
    assert len(calls) == 1 and not first["cached"] and again["cached"]
    assert again["rows"] == first["rows"] and again["config_sha256"] == first["config_sha256"]
    folder = Path(first["folder"])
    assert folder == tmp_path / "test-item" / first["config_sha256"] and (folder / "figure.png").is_file()
    stored = json.loads((folder / "results.json").read_text())
    assert stored["settings"] == {"x": 1.0, "quick": True} and stored["details"] == {"extra": 1.0}
    assert stored["mode"] == "quick" and stored["figure"] == "figure.png"
    assert (folder / "table.md").read_text().splitlines()[:2] == list(runner.HEADER)
    runner.reproduce(_counting(calls), False, tmp_path)  # the full settings differ: computed
    runner.reproduce(_counting(calls, 2.0), True, tmp_path)  # a changed setting: computed
    assert len(calls) == 3 and len(list((tmp_path / "test-item").iterdir())) == 3


def test_an_interrupted_run_leaves_nothing_to_reuse(tmp_path):
    def broken(settings, folder):
        raise KeyboardInterrupt

    item = dataclasses.replace(_counting([]), compute=broken)
    with pytest.raises(KeyboardInterrupt):
        runner.reproduce(item, True, tmp_path)
    calls = []
    assert not runner.reproduce(_counting(calls), True, tmp_path)["cached"] and len(calls) == 1


def test_the_cli_runs_an_item_then_reads_it_from_the_cache(tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setitem(ITEMS, "test-item", _counting(calls))
    for _ in range(2):
        assert main(["reproduce", "test-item", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert len(calls) == 1 and out.count("(cached: nothing recomputed)") == 1
    assert "| a \\| b | 1.0 | 1.0 | – | yes | why |" in out


def test_the_report_table_puts_the_paper_beside_dpfl_per_paper(tmp_path):
    calls = []
    item = _counting(calls)
    result = runner.reproduce(item, True, tmp_path)
    text = report.render([item], {item.id: result}, quick=True, figures="figures/reproduction")
    lines = text.splitlines()
    assert lines[0] == report.TITLE and "`dpfl reproduce --report --quick`" in lines[2]
    assert "| [test-item](#test-item) | Someone (2020) | a table | reproduced: it matches |" in lines
    at = lines.index("## Someone (2020)")
    assert lines[at + 2] == "### test-item"
    start = lines.index(runner.HEADER[0])
    assert lines[start + 1] == runner.HEADER[1]
    assert lines[start + 2] == "| a \\| b | 1.0 | 1.0 | – | yes | why |"
    assert "![test-item](figures/reproduction/test-item.png)" in lines
    written = report.write(tmp_path / "docs" / "reproduction.md", [item], {item.id: result}, True)
    assert written.read_text() == text
    assert (tmp_path / "docs" / "figures" / "reproduction" / "test-item.png").read_bytes() == b"\x89PNG"


def test_values_print_to_the_papers_precision():
    assert agrees(13.0, 12.906, 0) and agrees(4.2, 4.15, 1) and not agrees(4.2, 4.1, 1)
    assert agrees(0.64, 0.6449, 2) and not agrees(0.64, 0.6551, 2)
    # "about x" within the row's tolerance: noble2022-fig1's +19.8 points is not "about 10" within 5
    assert about(10, 15.0, 5) and about(20, 15.0, 5) and not about(10, 19.8, 5) and not about(20, 14.9, 5)
    assert [fmt(None), fmt(True), fmt(False), fmt(2.0), fmt(0.5), fmt(1.23e-5), fmt(12345.0), fmt("x")] == [
        "–", "holds", "does not hold", "2.00", "0.500", "1.230e-05", "1.23e+04", "x"]


def test_an_unknown_item_names_the_known_ones(capsys):
    assert main(["reproduce", "noble2021-table9"]) == 2
    err = capsys.readouterr().err
    assert "noble2021-table9" in err and all(item_id in err for item_id in ITEMS)
    with pytest.raises(ConfigError, match="dpfl reproduce --list"):
        item("nope")


def test_exactly_one_of_list_report_or_an_item(capsys):
    assert main(["reproduce"]) == 2
    assert main(["reproduce", "--list", "zhou2021-table1"]) == 2
    assert "exactly one of --list, --report or an ITEM" in capsys.readouterr().err


def test_a_full_run_without_its_data_set_names_the_folder_and_the_quick_substitute(no_data, tmp_path, capsys):
    assert main(["reproduce", "zhou2021-loss", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(no_data / "mnist") in err and "dpfl reproduce zhou2021-loss --quick" in err
    assert "scikit-learn's digits" in err and not (tmp_path / "out").exists()


def test_an_item_without_a_full_run_refuses_one_naming_why_and_the_quick_run(tmp_path, capsys):
    assert main(["reproduce", "lowy2023-mnist", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "lowy2023-mnist has no full run: the Lowy et al. experiment has no MNIST setting" in err
    assert "dpfl reproduce lowy2023-mnist --quick" in err and not (tmp_path / "out").exists()


def test_an_accounting_item_matches_the_paper_exactly(tmp_path):
    result = runner.reproduce(ITEMS["asoodeh2021-fig2"], True, tmp_path)
    assert len(result["rows"]) == 13 and all(r["match"] for r in result["rows"][:12])
    assert result["rows"][12]["match"] is None and float(result["rows"][12]["paper_analysis"]) < 1e-3
    assert all(float(r["sound"]) < float(r["paper_analysis"]) for r in result["rows"][:12])
    assert (Path(result["folder"]) / "figure.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # every item's quick run: about 10 minutes on 2 shared cores
def test_the_committed_report_is_what_quick_mode_computes(tmp_path):
    committed = (ROOT / "docs" / "reproduction.md").read_text()
    results = {it.id: runner.reproduce(it, True, tmp_path / "cache") for it in ITEMS.values()}
    assert report.render(list(ITEMS.values()), results, True, "figures/reproduction") == committed
