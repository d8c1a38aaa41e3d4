"""The figures the examples' comments state are what `dpfl run` prints (slow: each runs the example), and the flwr
version docs/flower.md names.

examples/budgeted_digits.toml: DP-FedSGD stops after 43 rounds at test accuracy 0.8412 with the server at 11.6, and
DP-FedAvg after 6 rounds at 0.6490 (the comment's numbers, parsed from it). examples/api.py runs cell after cell."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest

from dpfl.cli import main

ROOT = Path(__file__).resolve().parents[2]
BUDGETED = ROOT / "examples" / "budgeted_digits.toml"


@pytest.mark.slow
def test_budgeted_digits_comment(tmp_path, capsys):
    comment = BUDGETED.read_text()
    fedsgd = re.search(r"\((\d+) rounds, test accuracy (\d\.\d{4})\)", comment)
    server = re.search(r"the server,\n# which sees each silo's update, is at (\d+\.\d)", comment)
    fedavg = re.search(r'"dp-fedavg" stops after (\d+) rounds at accuracy (\d\.\d{4})', comment)
    assert fedsgd and server and fedavg, "the comment no longer states its figures: update this test with it"
    assert "--set run.noise_seed=0" in comment  # its accuracies are the research mode's (secret noise varies)
    for name, (rounds, accuracy) in (("dp-fedsgd", fedsgd.groups()), ("dp-fedavg", fedavg.groups())):
        assert main(["run", str(BUDGETED), "--set", f"algorithm.name='{name}'", "--set", "run.noise_seed=0",
                     "--out", str(tmp_path / name), "--no-progress", "--json"]) == 3  # stopped by the budget
        summary = json.loads(capsys.readouterr().out)
        assert (summary["round"], f"{summary['test_accuracy']:.4f}") == (int(rounds), accuracy), name
        if name == "dp-fedsgd":
            assert f"{summary['epsilon']['server']:.1f}" == server.group(1)
            assert summary["budget"] == {"third_party": 4.0}


def test_the_flower_page_names_the_flwr_version_the_extra_installs():
    """docs/flower.md says which flwr the `flower` extra resolves; where flwr is installed, that version is named."""
    from importlib import metadata

    try:
        installed = metadata.version("flwr")
    except metadata.PackageNotFoundError:
        pytest.skip("flwr is not installed here")
    assert f"installs the newest: {installed}" in (ROOT / "docs" / "flower.md").read_text()


@pytest.mark.slow
def test_the_api_example_runs(capsys):
    """examples/api.py runs cell after cell (its own assert: a user's module spends the built-in model's epsilon) and
    prints the refusals and the published figures it states."""
    runpy.run_path(str(ROOT / "examples" / "api.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert "refused: model = '1 (BatchNorm1d)' is not allowed" in printed
    assert "refused: loss = 'CrossEntropyLoss' is not allowed" in printed
    assert "PLD: 2.38177" in printed and "RDP: 3.00838" in printed


@pytest.mark.slow
def test_the_user_level_experiment_page_is_what_the_script_prints(tmp_path):
    """docs/experiments/user_level.md's table is what examples/user_level_experiment.py computes (research mode:
    the same draws every time; about 2.5 minutes)."""
    module = runpy.run_path(str(ROOT / "examples" / "user_level_experiment.py"))
    module["main"](["--out", str(tmp_path)])
    assert (tmp_path / "table.md").read_text() in (ROOT / "docs" / "experiments" / "user_level.md").read_text()


@pytest.mark.slow
def test_the_notebook_example_runs_to_its_target_epsilon(capsys):
    """examples/notebook.py: a torch module on arrays split into clients in Python, calibrated and run from Python for
    record-level and user-level DP (two rounds here); each run spends its target towards the observers it bounds."""
    notebook = runpy.run_path(str(ROOT / "examples" / "notebook.py"))  # not as __main__: its main is called below
    results = notebook["main"](rounds=2)
    printed = capsys.readouterr().out
    record, user = results["dp-fedavg"], results["dp-fedavg-user"]
    for run in (record, user):
        assert run.status == "finished" and run.config["model"]["name"] == "custom"
        assert run.config["data"]["name"] == "arrays" and run.config["privacy"]["epsilon"] is None
    assert 8.0 * (1 - 1e-3) <= max(record.epsilon.values()) <= 8.0  # every observer, the worst at the target
    assert 8.0 * (1 - 1e-3) <= user.epsilon["other_silo"] <= 8.0  # the observer user-level shares protect
    assert "dp-fedavg: algorithm.noise_multiplier = " in printed and "towards other_silo" in printed
    assert printed.count("epsilon per observer: third_party") == 2


@pytest.mark.slow
def test_the_cross_device_comparison_runs_every_algorithm_to_its_epsilon(tmp_path):
    """examples/cross_device_comparison.py at a tiny size (40 users, 3 rounds, one epsilon; 42 s on the shared
    machine, 10 runs with their calibrations): on both tasks every
    algorithm's run spends its target towards the third party (calibrated through privacy.epsilon), the reference
    spends none, and the table and the plot are written."""
    module = runpy.run_path(str(ROOT / "examples" / "cross_device_comparison.py"))
    rows = module["main"](["--out", str(tmp_path), "--users", "40", "--rounds", "3", "--epsilons", "4"])
    labels = [*module["algorithms"](), module["REFERENCE"]]
    assert sorted((r["task"], r["algorithm"]) for r in rows) == sorted(
        (task, label) for task in ("next-word", "next-character") for label in labels)
    for row in rows:
        if row["algorithm"] == module["REFERENCE"]:
            assert row["epsilon_target"] is None and row["noise_level"] == 0.0
        else:
            assert 4.0 * (1 - 1e-3) <= row["epsilon"]["third_party"] <= 4.0 * (1 + 1e-9), row
            assert row["noise_level"] > 0 and 0.0 <= row["test_accuracy"] <= 1.0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["rows"] == rows and saved["size"]["users"] == 40
    assert (tmp_path / "cross_device.png").stat().st_size > 0
    assert "| BandMF (amplified, b = 4) |" in (tmp_path / "table.md").read_text()
