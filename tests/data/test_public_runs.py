"""Runs on the public data sets' real formats, end to end: `dpfl run` on a small FEMNIST (LEAF JSON) with the CNN of
Zhou et al. 2021 and on MNIST (IDX) with every registered algorithm, results.json recording where the data came from,
and a missing data set refused with exit status 2, naming its files, and no traceback.

The runs need models that take image-shaped records ([C, H, W]); they are skipped, saying so, where the models do
not (a probe builds logistic regression on a 1 x 4 x 4 record)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpfl.algorithms import registry
from dpfl.cli import main
from dpfl.experiments.config import key_schema, load_config
from dpfl.experiments.runner import run_experiment
from dpfl.models import build_model

from .conftest import femnist_writer, mnist_records, write_leaf, write_mnist

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _models_take_images() -> bool:
    try:
        build_model("logreg", (1, 4, 4), 2)
    except TypeError:
        return False
    return True


images = pytest.mark.skipif(not _models_take_images(), reason="the models do not take image-shaped records [C, H, W] "
                                                              "yet (build_model on a record shape)")


@pytest.fixture
def study(tmp_path):
    """A study folder: LEAF's femnist/data (4 writers of 8..11 records, 2 of each in test/) and a config beside it
    naming it relatively, with the CNN."""
    folder = tmp_path / "study"
    for part, users in enumerate(([0, 1], [2, 3])):
        writers = {f"f{i:04d}_{i:02d}": femnist_writer(i, 8 + i) for i in users}
        write_leaf(folder / "leaf" / "train", f"all_data_{part}_train_9.json",
                   {u: (x[:-2], y[:-2]) for u, (x, y) in writers.items()})
        write_leaf(folder / "leaf" / "test", f"all_data_{part}_test_9.json",
                   {u: (x[-2:], y[-2:]) for u, (x, y) in writers.items()})
    (folder / "femnist.toml").write_text(
        "[data]\nname = 'femnist'\npath = 'leaf'\n[model]\nname = 'femnist-cnn'\n"
        "[algorithm]\nname = 'dp-fedavg'\nrounds = 2\nlocal_steps = 1\nclient_rate = 1.0\nlr = 0.1\n"
        "noise_multiplier = 1.0\n")
    return folder


@images
def test_femnist_runs_with_its_cnn_and_results_record_the_files(study, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    code = main(["run", str(study / "femnist.toml"), "--out", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    data = results["data"]
    assert data["source"]["title"] == "FEMNIST" and data["source"]["path"] == str(study / "leaf")
    assert [f["file"] for f in data["source"]["files"]] == ["train/all_data_0_train_9.json",
                                                            "train/all_data_1_train_9.json",
                                                            "test/all_data_0_test_9.json", "test/all_data_1_test_9.json"]
    assert len(data["classes"]) == 62 and data["partition"]["client_ids"] == ["f0000_00", "f0001_01", "f0002_02",
                                                                              "f0003_03"]
    assert results["status"] == "finished" and math.isfinite(results["final"]["epsilon"]["third_party"])
    assert 0 <= results["final"]["test_accuracy"] <= 1


def _tiny(name: str) -> list[str]:
    """A tiny run of ``name``: the keys it has of a short run (6 rounds: past a warm start of round(4 / client_rate)
    rounds; a family calibrated to a target epsilon gets one; the shuffle-DP families run the count path of their
    simulated shuffler)."""
    keys = key_schema(name, "logreg")["algorithm"]
    values = {"rounds": 6, "local_steps": 1, "client_rate": 1.0, "noise_multiplier": 1.0, "lr": 0.1}
    spec = registry.spec_of(name)
    calibrated = spec.private(name) and "noise_multiplier" not in keys
    counts = ["privacy.shuffler='simulated'"] if spec.privacy_defaults.get("shuffler") == "real" else []
    return [f"algorithm.name='{name}'", *(f"algorithm.{k}={v!r}" for k, v in values.items() if k in keys),
            *(["privacy.epsilon=2.0"] if calibrated else []), *counts]


#: Names whose tiny run takes over 10 s (sdp-spider: about 30 s on a 2-core machine), run with -m slow.
SLOW = ("sdp-spider",)


@images
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in registry.names()])
def test_every_algorithm_runs_on_mnist(tmp_path, name):
    write_mnist(tmp_path / "mnist", mnist_records(60, 12, side=8))
    config = load_config(None, ["data.name='mnist'", f"data.path='{tmp_path / 'mnist'}'", "data.num_clients=6",
                                *_tiny(name)])
    spec = registry.spec_of(name)
    if spec.max_rounds is not None:  # a one-pass family: each of the 6 clients in one round
        config["algorithm"]["rounds"] = min(6, spec.max_rounds(spec.section(config["algorithm"]), 6))
    results = run_experiment(config)
    rounds = results["rounds"]
    assert rounds and all(math.isfinite(r["train_loss"]) for r in rounds), name
    assert results["data"]["source"]["title"] == "MNIST" and results["data"]["classes"] == [str(d) for d in range(10)]


def test_a_missing_data_set_is_refused_with_its_files_and_no_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "none"))
    (tmp_path / "cifar.toml").write_text("[data]\nname = 'cifar10'\nnum_clients = 2\n[algorithm]\nclient_rate = 1.0\n")
    code = main(["run", str(tmp_path / "cifar.toml"), "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "data_batch_1" in err and str(tmp_path / "none" / "cifar10") in err and "never downloads" in err
    assert not (tmp_path / "run").exists()


def test_a_public_data_set_resolves_its_clients_and_split_from_the_data():
    femnist = load_config(None, ["data.name='femnist'"])["data"]
    assert femnist["num_clients"] is None and femnist["test_fraction"] is None  # its writers, its own split
    pooled = load_config(None, ["data.name='femnist'", "data.partition='dirichlet'", "data.partition_param=0.3"])
    assert pooled["data"]["num_clients"] == 100
    mnist = load_config(None, ["data.name='mnist'"])["data"]
    assert mnist["num_clients"] == 100 and mnist["test_fraction"] is None and mnist["path"] is None
    assert np.isclose(load_config(None, ["data.name='mnist'", "data.test_fraction=0.2"])["data"]["test_fraction"], 0.2)
