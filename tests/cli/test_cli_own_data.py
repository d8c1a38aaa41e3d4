"""`dpfl run` on the user's own csv and npz files, end to end through the real entry point: private and non-private
runs, results.json recording where the data came from, and bad files refused with exit status 2 and no traceback."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dpfl.cli import main

N = 240


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def study(tmp_path):
    """A study folder: clinics.csv and clinics.npz (the same 240 records: 3 features, a label that depends on the
    first, 4 clinics, every 5th record marked test), and a config per format that names its file relatively."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 3)).round(4)
    y = (x[:, 0] + 0.2 * rng.standard_normal(N) > 0).astype(int)
    clinic = np.array(["clinic_a", "clinic_b", "clinic_c", "clinic_d"])[np.arange(N) % 4]
    split = np.where(np.arange(N) % 5 == 0, "test", "train")
    folder = tmp_path / "study"
    (folder / "data").mkdir(parents=True)
    rows = ["age,weight,dose,clinic,split,outcome"] + [
        f"{x[i, 0]},{x[i, 1]},{x[i, 2]},{clinic[i]},{split[i]},{y[i]}" for i in range(N)]
    (folder / "data" / "clinics.csv").write_text("\n".join(rows) + "\n")
    np.savez(folder / "data" / "clinics.npz", x=x, y=y, client=clinic, split=split)
    algorithm = "[algorithm]\nrounds = 3\nlocal_steps = 2\nclient_rate = 1.0\nlr = 0.5\n"
    (folder / "csv.toml").write_text(
        "[data]\nname = 'csv'\npath = 'data/clinics.csv'\nlabel_column = 'outcome'\nclient_column = 'clinic'\n"
        "split_column = 'split'\n" + algorithm)
    (folder / "npz.toml").write_text("[data]\nname = 'npz'\npath = 'data/clinics.npz'\n" + algorithm)
    return folder


@pytest.mark.parametrize("fmt", ["csv", "npz"])
@pytest.mark.parametrize("algorithm", ["fedavg", "dp-fedavg"])
def test_a_run_on_the_users_own_file(study, tmp_path, capsys, fmt, algorithm, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config names its file relative to its own folder, not to the cwd
    out = tmp_path / "run"
    code = main(["run", str(study / f"{fmt}.toml"), "--out", str(out), "--no-progress", "--json",
                 "--set", f"algorithm.name='{algorithm}'"])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    source = results["data"]["source"]
    assert source["format"] == fmt and source["path"] == str(study / "data" / f"clinics.{fmt}")
    if fmt == "csv":
        assert source["feature_columns"] == ["age", "weight", "dose"] and source["split_column"] == "split"
    assert results["data"]["partition"]["client_ids"] == ["clinic_a", "clinic_b", "clinic_c", "clinic_d"]
    assert results["data"]["split"] == {"given": True, "per_client": True, "test_records": N // 5}
    assert results["final"]["round"] == 3 and results["config"]["data"]["test_fraction"] is None
    eps = results["final"]["epsilon"]["third_party"]
    if algorithm == "fedavg":
        assert results["final"]["test_accuracy"] > 0.8  # the label follows the first feature
        assert eps is None  # not private: infinite
    else:
        assert eps is not None and math.isfinite(eps) and eps > 0


@pytest.mark.parametrize("override, message", [
    ("data.path='data/missing.csv'", "data/missing.csv' is not allowed: expected an existing .csv file (found no such "
                                     "file)"),
    ("data.label_column='label'", "data.label_column = 'label' is not allowed: expected a column of"),
    ("data.test_fraction=0.3", "data.test_fraction = 0.3 is not allowed: expected no value: data.split_column"),
    ("data.num_clients=3", "data.num_clients = 3 is not allowed: expected None or 4, the number of distinct client"),
])
def test_a_bad_file_or_key_exits_2_naming_it_without_a_traceback(study, tmp_path, capsys, override, message,
                                                                 monkeypatch):
    monkeypatch.chdir(study)
    code = main(["run", str(study / "csv.toml"), "--out", str(tmp_path / "bad"), "--no-progress",
                 "--set", "algorithm.name='fedavg'", "--set", override])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "bad").exists()


def test_raw_clinical_columns_are_warned_about_and_public_bounds_train_them(tmp_path, capsys):
    """Ages and blood pressures as they are: a one-line warning naming both columns, and a poor model; the same file
    with public bounds (data.bounds, clipped and mapped onto [-1, 1], recorded in results.json) trains well, unwarned."""
    rng = np.random.default_rng(0)
    age, bp = rng.uniform(20, 90, N).round(), rng.uniform(90, 180, N).round()
    y = (age + 0.5 * (bp - 135) + rng.normal(0, 5, N) > 55).astype(int)
    (tmp_path / "clinical.csv").write_text("age,blood_pressure,outcome\n" + "".join(
        f"{a:g},{b:g},{c}\n" for a, b, c in zip(age, bp, y)))
    (tmp_path / "study.toml").write_text(
        "[data]\nname = 'csv'\npath = 'clinical.csv'\nlabel_column = 'outcome'\nnum_clients = 4\n"
        "[algorithm]\nname = 'dp-fedavg'\nrounds = 10\nlocal_steps = 5\nclient_rate = 1.0\nlr = 0.5\n"
        "noise_multiplier = 1.0\n[run]\nnoise_seed = 0\n")  # research mode: the same draws every time
    losses = {}
    for name, extra in (("raw", []), ("bounded", ["--set", "data.bounds={age = [0, 120], blood_pressure = [50, 250]}"])):
        assert main(["run", str(tmp_path / "study.toml"), "--out", str(tmp_path / name), "--no-progress", *extra]) == 0
        err = capsys.readouterr().err
        results = json.loads((tmp_path / name / "results.json").read_text())
        losses[name] = results["final"]["train_loss"]
        warned = [line for line in err.splitlines() if "far from unit scale" in line]
        if name == "raw":
            assert len(warned) == 1 and warned[0].startswith(
                "dpfl run: warning: clinical.csv: 2 feature(s) far from unit scale (largest |value| above 10: "
                "blood_pressure 18") and "data.bounds = {blood_pressure = [low, high], age = [low, high]}" in warned[0]
        else:
            assert warned == []
            assert results["data"]["preprocessing"][0] == {
                "step": "bounds", "range": [-1.0, 1.0], "private": True, "clipped": True,
                "bounds": {"age": [0.0, 120.0], "blood_pressure": [50.0, 250.0]}}
    assert losses["raw"] > 2 and losses["bounded"] < 0.7, losses
