"""The user's own files (dpfl.data.files): npz and csv written here in their real formats, a given split kept record
for record, and every refusal naming the file, what was expected and what was found."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dpfl.data.files import load_csv, load_npz, shape_of
from dpfl.errors import ConfigError

SITES = np.array(["north", "south", "east"])


def _records(n=60, seed=0):
    """n records, 3 features whose first is the record's index (so a record can be found again), 2 classes, 3 sites,
    a split marking every 4th record test."""
    rng = np.random.default_rng(seed)
    x = np.column_stack([np.arange(n), rng.standard_normal((n, 2))])
    y = np.arange(n) % 2
    site = SITES[np.arange(n) % 3]
    test = np.arange(n) % 4 == 0
    return x, y, site, test


def _write_csv(path, x, y, site=None, split=None, header=None):
    columns = header or ["index", "a", "b"] + (["site"] if site is not None else []) + \
        (["part"] if split is not None else []) + ["label"]
    lines = [",".join(columns)]
    for i in range(len(y)):
        fields = [repr(float(v)) for v in x[i]] + ([site[i]] if site is not None else []) + \
            ([("test" if split[i] else "train")] if split is not None else []) + [str(y[i])]
        lines.append(",".join(fields))
    path.write_text("\n".join(lines) + "\n")
    return path


def _client_records(arrays, i):
    """The record indices (feature 0) of client i's real rows, sorted."""
    return sorted(arrays.x[i, : arrays.counts[i], 0].round().long().tolist())


def _expected(site, test, name, marked):
    return sorted(np.flatnonzero((site == name) & (test == marked)).tolist())


@pytest.mark.parametrize("fmt", ["npz", "csv"])
def test_a_given_split_is_kept_record_for_record(tmp_path, fmt):
    x, y, site, test = _records()
    if fmt == "npz":
        np.savez(tmp_path / "d.npz", x=x, y=y, client=site, split=np.where(test, "test", "train"))
        dataset = load_npz(tmp_path / "d.npz", seed=3)
    else:
        dataset = load_csv(_write_csv(tmp_path / "d.csv", x, y, site, test), "label", "site", "part", seed=3)
    ids = dataset.info["partition"]["client_ids"]
    assert ids == ["east", "north", "south"]
    for i, name in enumerate(ids):
        assert _client_records(dataset.train, i) == _expected(site, test, name, False)
        assert _client_records(dataset.test, i) == _expected(site, test, name, True)
    assert dataset.info["split"] == {"given": True, "per_client": True, "test_records": int(test.sum())}
    assert dataset.info["source"]["format"] == fmt and len(dataset.info["source"]["sha256"]) == 64
    json.dumps(dataset.info)


@pytest.mark.parametrize("split", [np.arange(60) % 4 == 0, (np.arange(60) % 4 == 0).astype(int),
                                   (np.arange(60) % 4 == 0).astype(float)], ids=["bool", "int", "float"])
def test_an_npz_split_may_be_booleans_or_0_1(tmp_path, split):
    x, y, _, test = _records()
    np.savez(tmp_path / "d.npz", x=x, y=y, split=split)
    dataset = load_npz(tmp_path / "d.npz", num_clients=2, seed=0)
    assert int(dataset.test.counts.sum()) == int(test.sum()) == 15
    tested = sorted(t for i in range(2) for t in _client_records(dataset.test, i))
    assert tested == np.flatnonzero(test).tolist()


def test_with_a_split_and_a_partition_each_client_keeps_its_records_marks(tmp_path):
    x, y, _, test = _records(80)
    dataset = load_csv(_write_csv(tmp_path / "d.csv", x, y, split=test), "label", split_column="part",
                       num_clients=4, partition="iid", seed=1)
    for i in range(4):
        assert all(test[r] for r in _client_records(dataset.test, i))
        assert not any(test[r] for r in _client_records(dataset.train, i))
    assert int(dataset.test.counts.sum()) == 20


def test_without_a_split_each_client_is_split_by_test_fraction(tmp_path):
    x, y, site, _ = _records(90)
    np.savez(tmp_path / "d.npz", x=x, y=y, client=site)
    dataset = load_npz(tmp_path / "d.npz", test_fraction=0.2, seed=0)
    assert dataset.test.counts.tolist() == [6, 6, 6] and dataset.train.counts.tolist() == [24, 24, 24]
    assert dataset.info["split"] == {"test_fraction": 0.2, "per_client": True}


def test_a_split_with_a_test_fraction_is_refused(tmp_path):
    x, y, _, test = _records()
    np.savez(tmp_path / "d.npz", x=x, y=y, split=test)
    with pytest.raises(ConfigError, match=r"data.test_fraction = 0.3 .*no value: .*d.npz marks each record") as err:
        load_npz(tmp_path / "d.npz", num_clients=2, test_fraction=0.3)
    assert err.value.field == "data.test_fraction"


def _refusal(call) -> str:
    with pytest.raises(ConfigError) as caught:
        call()
    return str(caught.value)


def test_npz_refusals_name_the_file_what_was_expected_and_found(tmp_path):
    x, y, site, test = _records()
    path = tmp_path / "d.npz"
    message = _refusal(lambda: load_npz(tmp_path / "none.npz", num_clients=2))
    assert "none.npz" in message and "an existing .npz file (found no such file)" in message
    (tmp_path / "text.npz").write_text("not a zip")
    assert "a readable .npz file" in _refusal(lambda: load_npz(tmp_path / "text.npz", num_clients=2))
    np.savez(path, features=x, y=y)
    assert "arrays named 'x' and 'y'" in _refusal(lambda: load_npz(path)) and "['features', 'y']" in _refusal(
        lambda: load_npz(path))
    cases = {
        "x [60, 3], y [60], client [59]": dict(x=x, y=y, client=site[:59]),
        "x [60, 3], y [60], split [61]": dict(x=x, y=y, split=np.append(test, True)),
        "x [60], y [60]": dict(x=x[:, 0], y=y),
        "found dtype <U": dict(x=x.astype(str), y=y),
        "found [2, 3, 4, 5]": dict(x=x, y=y, split=np.arange(60) % 6),
        "found ['tset']": dict(x=x, y=y, split=np.where(test, "tset", "train")),
        "found 2 NaN or infinite values, the first at x[4], feature 1": dict(
            x=np.where((np.arange(60) % 50 == 4)[:, None] & (np.arange(3) == 1), np.nan, x), y=y),
        "labels of at least two classes (found every record labelled 1)": dict(x=x, y=np.ones(60, int)),
        "some records marked 'test'": dict(x=x, y=y, split=np.zeros(60, bool)),
        "found 1 client(s) whose records are all marked test, the first 'east' with 20 test records": dict(
            x=x, y=y, client=site, split=(site == "east") | test),
        "save string ids with .astype(str)": dict(x=x, y=y, client=site.astype(object)),
    }
    for expected, arrays in cases.items():
        np.savez(path, **arrays)
        message = _refusal(lambda: load_npz(path, num_clients=None if "client" in arrays else 2))
        assert expected in message and str(path) in message, (expected, message)


def test_csv_refusals_name_the_file_the_column_and_the_line(tmp_path):
    x, y, site, test = _records(12)
    path = _write_csv(tmp_path / "d.csv", x, y, site, test)
    assert "an existing .csv file" in _refusal(lambda: load_csv(tmp_path / "none.csv", "label"))
    message = _refusal(lambda: load_csv(path, "outcome", "site", "part"))
    assert message.startswith("data.label_column = 'outcome'") and "found the columns ['index', 'a', 'b'" in message
    assert _refusal(lambda: load_csv(path, "label", "clinic")).startswith("data.client_column = 'clinic'")
    text = path.read_text().splitlines()
    bad = {
        "a number in feature column 'a'": (3, lambda f: f.__setitem__(1, "n/a"), "found 'n/a' in line 4"),
        "finite feature values": (5, lambda f: f.__setitem__(2, "inf"), "the first at column 'b', line 6"),
        "'train' or 'test' in the split column 'part'": (2, lambda f: f.__setitem__(4, "validation"),
                                                          "found ['validation']"),
        "6 fields in every row": (7, lambda f: f.pop(), "found 5 in line 8"),
    }
    for expected, (line, edit, found) in bad.items():
        fields = text[line].split(",")
        edit(fields)
        broken = tmp_path / "broken.csv"
        broken.write_text("\n".join(text[:line] + [",".join(fields)] + text[line + 1:]) + "\n")
        message = _refusal(lambda: load_csv(broken, "label", "site", "part"))
        assert expected in message and found in message and "broken.csv" in message, (expected, message)
    (tmp_path / "empty.csv").write_text("")
    assert "(found an empty file)" in _refusal(lambda: load_csv(tmp_path / "empty.csv", "label"))
    one = _write_csv(tmp_path / "one.csv", x, np.zeros(12, int))
    assert "labels of at least two classes (found every record labelled 0)" in _refusal(
        lambda: load_csv(one, "label", num_clients=2))


def test_labels_may_be_strings_and_features_any_number_of_columns(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("w,x,y,z,outcome\n" + "".join(f"{i},{i % 5},{-i},{i * 0.5},{'ill' if i % 3 else 'well'}\n"
                                                   for i in range(40)))
    dataset = load_csv(path, "outcome", num_clients=2, seed=0)
    assert dataset.num_features == 4 and dataset.info["classes"] == ["ill", "well"]
    x, _ = dataset.train.flat()
    assert x.dtype == torch.float32 and x.shape[1] == 4


def test_shape_of_reads_headers_only(tmp_path):
    x, y, site, _ = _records(30)
    np.savez(tmp_path / "d.npz", x=x.astype(np.float32), y=y, client=site)
    shape = shape_of(tmp_path / "d.npz", "npz")
    assert (shape["records"], shape["features"], shape["value_bytes"]) == (30, 3, 4)
    assert shape["client_sizes"].tolist() == [10, 10, 10]
    shape = shape_of(_write_csv(tmp_path / "d.csv", x, y, site), "csv")
    assert (shape["records"], shape["features"], shape["fields"]) == (30, 5, 150)


# -- data.bounds: public per-feature bounds ---------------------------------------------------------------------------
def _clinical(tmp_path):
    """age (years), blood pressure (mmHg) and a 0/1 smoker flag: raw clinical columns far from unit scale."""
    path = tmp_path / "clinical.csv"
    path.write_text("age,bp,smoker,label\n20,90,0,0\n60,120,1,1\n95,250,0,1\n40,150,1,0\n")
    return path


def test_bounds_clip_then_map_each_named_column_onto_minus_one_one(tmp_path):
    ds = load_csv(_clinical(tmp_path), bounds={"age": [0, 80], "bp": [50, 250]}, num_clients=1, test_fraction=0.0)
    x = ds.train.x[0, :4].numpy()
    order = np.argsort(x[:, 0])  # the split shuffles records; sort by the (monotone) age feature
    # age 20 -> -0.5, 40 -> 0, 60 -> 0.5, 95 clipped to 80 -> 1; bp (x - 150) / 100; smoker untouched
    assert np.array_equal(x[order], np.float32([[-0.5, -0.6, 0.0], [0.0, 0.0, 1.0], [0.5, -0.3, 1.0], [1.0, 1.0, 0.0]]))
    step, standardize = ds.info["preprocessing"]
    assert step == {"step": "bounds", "range": [-1.0, 1.0], "private": True, "clipped": True,
                    "bounds": {"age": [0.0, 80.0], "bp": [50.0, 250.0]}}
    assert standardize["step"] == "standardize" and standardize["private"]


def test_bounds_are_data_independent_and_take_a_list_or_one_pair(tmp_path):
    """A record's bounded features depend on the record and the bounds alone: the same on a subset of the file."""
    from dpfl.data.preprocess import bound_features, feature_bounds

    x = np.array([[20.0, 90.0], [60.0, 120.0], [95.0, 250.0]])
    low, high = feature_bounds([[0, 80], [50, 250]], ["age", "bp"])
    assert np.array_equal(bound_features(x, low, high)[1:], bound_features(x[1:], low, high))
    assert np.array_equal(bound_features(x, *feature_bounds([0, 250], ["a", "b"])),
                          np.clip(x, 0, 250) / 125 - 1)
    npz = tmp_path / "images.npz"
    np.savez(npz, x=np.array([[[0, 255], [51, 102]]] * 4), y=np.array([0, 1, 0, 1]))
    ds = load_npz(npz, bounds=[0, 255], num_clients=1, test_fraction=0.0)
    assert np.array_equal(np.unique(ds.train.x[0, :4].numpy()), np.float32([-1.0, -0.6, -0.2, 1.0]))


@pytest.mark.parametrize("bounds, message", [
    ({"weight": [0, 1]}, "data.bounds = {'weight': [0, 1]} is not allowed: expected bounds for feature columns of the "
                         "data: ['age', 'bp', 'smoker']"),
    ({"age": [80, 0]}, "data.bounds.age = [80, 0] is not allowed: expected [low, high]: two finite numbers with low < "
                       "high"),
    ([[0, 1], [0, 1]], "expected one [low, high] per feature (3)"),
    ("wide", "data.bounds = 'wide' is not allowed: expected [low, high]"),
])
def test_bad_bounds_are_refused_naming_the_key(tmp_path, bounds, message):
    with pytest.raises(ConfigError) as err:
        load_csv(_clinical(tmp_path), bounds=bounds, num_clients=1)
    assert message in str(err.value)


def test_features_far_from_unit_scale_are_warned_about_by_name(tmp_path):
    from dpfl.errors import ConfigWarning

    with pytest.warns(ConfigWarning, match=r"clinical.csv: 2 feature\(s\) far from unit scale \(largest \|value\| "
                                         r"above 10: bp 250, age 95\); .*\(data.bounds = \{bp = \[low, high\], age = "):
        load_csv(_clinical(tmp_path), check_scale=True, num_clients=1)
