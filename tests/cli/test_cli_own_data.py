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
