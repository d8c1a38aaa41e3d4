"""data.name = "clients": a folder of stacked client arrays (dpfl.data.stacked), memory-mapped when read; a run on
it is the run on the data it was written from, and a bad folder names data.path and what is wrong."""

import json
import os

import numpy as np
import pytest
import torch

from dpfl.data import stacked
from dpfl.data.federated import ClientArrays, FederatedDataset
from dpfl.data.footprint import check_data_memory
from dpfl.data.sources import build_dataset
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

SYNTHETIC = ["data.name='synthetic'", "data.num_clients=30", "data.samples_per_client=20", "data.beta=1.0"]
RUN = ["algorithm.name='dp-scaffold'", "algorithm.client_rate=0.2", "algorithm.local_steps=2", "algorithm.rounds=3",
       "run.noise_seed=0"]


@pytest.fixture
def folder(tmp_path):
    return stacked.save(build_dataset("synthetic", num_clients=30, samples_per_client=20, beta=1.0), tmp_path / "d")


def test_load_gives_back_the_arrays_saved_memory_mapped(folder):
    original = build_dataset("synthetic", num_clients=30, samples_per_client=20, beta=1.0)
    loaded = stacked.load(folder)
    for split in ("train", "test"):
        a, b = getattr(original, split), getattr(loaded, split)
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.counts, b.counts)
    assert loaded.num_classes == 10 and loaded.name == "synthetic"
    assert loaded.info["generator"] == original.info["generator"] and loaded.info["stored"]["memory_mapped"]


def test_a_run_on_the_folder_is_the_run_on_the_data_it_was_written_from(folder):
    direct = build_simulation(load_config(None, [*SYNTHETIC, *RUN]))
    mapped = build_simulation(load_config(None, ["data.name='clients'", f"data.path='{folder}'", *RUN]))
    direct.run(3)
    mapped.run(3)
    assert torch.equal(direct.model, mapped.model)
    assert [m.to_dict() for m in direct.history] == [m.to_dict() for m in mapped.history]


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc")
def test_the_records_are_mapped_not_read_until_touched(tmp_path):
    """64 MB of features: loading them leaves the resident set within a few MB (the counts and 2 MB of labels are
    read), summing every feature pages them in."""
    x = np.ones((500, 500, 64), np.float32)
    dataset = FederatedDataset(ClientArrays(torch.from_numpy(x), torch.zeros(500, 500, dtype=torch.long),
                                            torch.full((500,), 500)),
                               ClientArrays(torch.zeros(500, 1, 64), torch.zeros(500, 1, dtype=torch.long),
                                            torch.ones(500, dtype=torch.long)), 2, "ones", {})
    stacked.save(dataset, tmp_path / "big")
    del dataset, x
    before = _resident_bytes()
    loaded = stacked.load(tmp_path / "big")
    loaded_growth = _resident_bytes() - before
    assert float(loaded.train.x.sum()) == 500 * 500 * 64
    touched_growth = _resident_bytes() - before
    assert loaded_growth < 16 * 2**20 < 48 * 2**20 < touched_growth


@pytest.mark.parametrize("ragged", [True, False])
def test_flat_chunks_are_flat_in_pieces(folder, ragged):
    """Gathered pieces of padded clients; views (no copy) where no client is padded."""
    train = stacked.load(folder).train
    if ragged:
        train = type(train)(train.x, train.y, train.counts - torch.arange(30) % 3)
    x, y = train.flat()
    pieces = list(train.flat_chunks(chunk=7))
    assert [len(p[1]) for p in pieces[:-1]] == [7] * (len(pieces) - 1)
    assert torch.equal(torch.cat([p[0] for p in pieces]), x) and torch.equal(torch.cat([p[1] for p in pieces]), y)
    assert (pieces[0][0].data_ptr() == train.x.data_ptr()) == (not ragged)


def test_the_memory_estimate_counts_what_is_read_not_the_mapped_records(folder):
    config = load_config(None, ["data.name='clients'", f"data.path='{folder}'"])
    estimate = check_data_memory(config["data"])
    assert estimate.clients == 30 and estimate.peak_bytes == 2 * 8 * 30 + 8 * 30 * 16


def _break(folder, name, array):
    np.save(folder / name, array)


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / "train_y.npy").unlink(), "missing: train_y.npy"),
    (lambda f: _break(f, "train_x.npy", np.zeros((30, 16, 40), np.float64)), "train_x.npy of dtype float32 .found "
                                                                             "float64"),
    (lambda f: _break(f, "test_counts.npy", np.zeros(29, np.int64)), r"test arrays of shapes .* counts \(29,\)"),
    (lambda f: _break(f, "train_counts.npy", np.full(30, 17, np.int64)), r"within \[0, 16\].*found \[17, 17\]"),
    (lambda f: _break(f, "test_y.npy", np.full((30, 4), 10, np.int64)), r"labels in \[0, 10\).*found \[10, 10\]"),
    (lambda f: (f / "dataset.json").write_text(json.dumps({"format": "other"})), "format 'dpfl-stacked-clients-1' "
                                                                                 ".found 'other'"),
    (lambda f: (f / "test_x.npy").write_bytes(b"not an array"), "test_x.npy a .npy array file"),
])
def test_a_damaged_folder_is_refused_naming_data_path_and_the_problem(folder, damage, message):
    damage(folder)
    with pytest.raises(ConfigError, match=message) as info:
        stacked.load(folder)
    assert info.value.field == "data.path"


def test_a_missing_folder_names_the_files_expected(tmp_path):
    with pytest.raises(ConfigError, match=r"data.path = .*nowhere.* a folder written by dpfl.data.stacked.save, "
                                          r"holding dataset.json, train_x.npy.*no such folder"):
        build_dataset("clients", num_clients=None, path=str(tmp_path / "nowhere"))


@pytest.mark.parametrize("override, field", [
    ("data.samples_per_client=10", "data.samples_per_client"), ("data.test_fraction=0.5", "data.test_fraction"),
    ("data.standardize='client'", "data.standardize"), ("data.scale=0.5", "data.scale"),
    ("data.num_clients=31", "data.num_clients"),
])
def test_keys_that_would_rebuild_the_data_are_refused(folder, override, field):
    with pytest.raises(ConfigError) as info:
        build_simulation(load_config(None, ["data.name='clients'", f"data.path='{folder}'", override]))
    assert info.value.field == field


def test_save_refuses_labels_outside_the_classes(tmp_path):
    dataset = build_dataset("synthetic", num_clients=3, samples_per_client=10)
    dataset.train.y[0, 0] = 10
    with pytest.raises(ValueError, match=r"train labels must lie in \[0, 10\); found \[0, 10\]"):
        stacked.save(dataset, tmp_path)
