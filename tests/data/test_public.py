"""The public data sets' loaders (dpfl.data.public and its format modules) on small files written here in the exact
published formats (conftest.py): records found again where they belong, the official split kept, writers as
clients, the partitions, and every refusal naming the file (or folder), what was expected and what was found."""

from __future__ import annotations

import gzip
import hashlib
import json
import pickle

import numpy as np
import pytest
import torch

from dpfl.data import footprint, idx, leaf
from dpfl.data.footprint import check_data_memory, data_footprint
from dpfl.data.memory_limit import MemoryLimit
from dpfl.data.pooled import federate
from dpfl.data.preprocess import rescale
from dpfl.data.public import CATALOGUE, build_public, shape_of
from dpfl.data.sources import build_dataset
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config

from .conftest import (IDX_NAMES, cifar_batch, femnist_writer, idx_bytes, mnist_records, py2_pickle, shakespeare_role,
                       write_cifar, write_leaf, write_mnist)


def _records_of(split, counts):
    """[(client, row)] of every real record of a ClientArrays."""
    return [(i, r) for i in range(split.num_clients) for r in range(int(counts[i]))]


def _first_pixels(split) -> list[int]:
    """The first pixel of every real record (the test files put the record's index there), as 0..255."""
    return sorted(round(float(split.x[i, r].flatten()[0]) * 255) for i, r in _records_of(split, split.counts))


# -- MNIST / Fashion-MNIST (IDX) -----------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_idx_images_keep_their_pixels_labels_and_official_split(tmp_path, name, gz):
    records = write_mnist(tmp_path / name, gz=gz)
    dataset = build_public(name, str(tmp_path / name), num_clients=5, seed=1)
    assert dataset.train.feature_shape == (1, 28, 28) and dataset.num_classes == 10
    assert dataset.info["classes"] == list(CATALOGUE[name][0].classes)
    # every record once, in its own split: train holds the 40 training images, test the 10 t10k ones
    assert _first_pixels(dataset.train) == list(range(40)) and _first_pixels(dataset.test) == list(range(10))
    images, labels = records["train"]
    for i, r in _records_of(dataset.train, dataset.train.counts):
        index = round(float(dataset.train.x[i, r, 0, 0, 0]) * 255)
        assert torch.allclose(dataset.train.x[i, r, 0], torch.from_numpy(images[index] / 255).float())
        assert int(dataset.train.y[i, r]) == labels[index]
    assert dataset.info["preprocessing"][-1] == {"step": "scale", "factor": 1 / 255, "private": True}
    assert dataset.info["split"]["given"] and dataset.info["source"]["split"] == "the data set's own"
    files = {f["file"]: f for f in dataset.info["source"]["files"]}
    suffix = ".gz" if gz else ""
    assert set(files) == {n + suffix for n in IDX_NAMES.values()}
    path = tmp_path / name / f"t10k-labels-idx1-ubyte{suffix}"
    assert files[path.name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_emnist_balanced_images_are_turned_to_mnists_orientation_and_keep_47_classes(tmp_path):
    records = mnist_records(40, 10)
    records = {split: (images, labels + 37 * (np.arange(len(labels)) % 2)) for split, (images, labels) in
               records.items()}  # classes 0..9 and 37..46 (lower-case b..t)
    for images, _ in records.values():
        images[:, 5, :] = 255  # row 5 white: a transposition would make it a column
    write_mnist(tmp_path / "emnist", records, gz=True, emnist=True)
    dataset = build_public("emnist_balanced", str(tmp_path / "emnist"), num_clients=4)
    assert dataset.num_classes == 47 and dataset.info["classes"][36:] == list("abdefghnqrt")
    images, labels = records["train"]
    for i, r in _records_of(dataset.train, dataset.train.counts):
        index = round(float(dataset.train.x[i, r, 0, 0, 0]) * 255)
        assert torch.allclose(dataset.train.x[i, r, 0], torch.from_numpy(images[index] / 255).float())
        assert bool((dataset.train.x[i, r, 0, 5] == 1).all()) and int(dataset.train.y[i, r]) == labels[index]
    with pytest.raises(ConfigError, match=r"emnist-balanced-train-images-idx3-ubyte\[.gz\].*www.nist.gov"):
        build_public("emnist_balanced", str(tmp_path / "mnist"), num_clients=4)


def test_the_uncompressed_file_is_read_when_both_are_there(tmp_path):
    write_mnist(tmp_path / "mnist", gz=True)
    write_mnist(tmp_path / "mnist", gz=False)
    files = [f["file"] for f in build_public("mnist", str(tmp_path / "mnist"), num_clients=2).info["source"]["files"]]
    assert files == ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                     "t10k-labels-idx1-ubyte"]


def test_a_test_fraction_replaces_the_official_split_by_a_random_one_per_client(tmp_path):
    write_mnist(tmp_path / "mnist")
    dataset = build_public("mnist", str(tmp_path / "mnist"), num_clients=5, test_fraction=0.5)
    assert dataset.train.counts.tolist() == dataset.test.counts.tolist() == [5] * 5
    assert dataset.info["split"] == {"test_fraction": 0.5, "per_client": True}


def test_the_data_root_is_data_path_then_dpfl_data_then_the_home_folder(tmp_path, monkeypatch):
    write_mnist(tmp_path / "root" / "mnist")
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "root"))
    assert build_dataset("mnist", num_clients=2).info["source"]["path"] == str(tmp_path / "root" / "mnist")
    monkeypatch.delenv("DPFL_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_mnist(tmp_path / "home" / ".dpfl" / "data" / "mnist")
    assert build_dataset("mnist", num_clients=2).info["source"]["path"] == str(tmp_path / "home/.dpfl/data/mnist")


def test_a_missing_folder_names_the_files_where_it_looked_and_where_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "root"))
    with pytest.raises(ConfigError) as caught:
        build_dataset("mnist", num_clients=2)
    message = str(caught.value)
    for text in ("train-images-idx3-ubyte[.gz]", "t10k-labels-idx1-ubyte[.gz]", "no such folder",
                 f"looked in {tmp_path / 'root' / 'mnist'}, from $DPFL_DATA/mnist", "never downloads",
                 "yann.lecun.com/exdb/mnist", "DPFL_DATA"):
        assert text in message, (text, message)
    monkeypatch.delenv("DPFL_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(ConfigError, match=r"from the default folder \(DPFL_DATA is not set\)/cifar10.*"
                                          r"www.cs.toronto.edu/~kriz/cifar.html"):
        build_dataset("cifar10", num_clients=2)


def test_a_missing_file_is_named(tmp_path):
    write_mnist(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigError, match=r"found missing t10k-labels-idx1-ubyte\[.gz\];"):
        build_public("mnist", str(tmp_path / "mnist"), num_clients=2)


def _corrupt_mnist(folder, name, data: bytes):
    write_mnist(folder)
    (folder / name).write_bytes(data)


@pytest.mark.parametrize("name, data, found", [
    ("train-images-idx3-ubyte", idx_bytes(np.zeros(10)), r"0x00000801, the magic number of labels: are the files' "
                                                         r"names swapped\?"),
    ("train-images-idx3-ubyte", b"PK\x03\x04" + bytes(20), r"0x504B0304, whose first two bytes are not 0"),
    ("train-images-idx3-ubyte", idx_bytes(np.zeros((40, 28, 28)))[:-5], r"truncated: 31,355 bytes of values"),
    ("train-images-idx3-ubyte", idx_bytes(np.zeros((40, 28, 28))) + b"\0", r"the 40 x 28 x 28 = 31,360 values its "
                                                                           r"header announces \(found 31,361"),
    ("train-images-idx3-ubyte", idx_bytes(np.zeros((40, 28, 28)))[:10], r"a header cut off after 10 bytes"),
    ("train-labels-idx1-ubyte", idx_bytes(np.full(40, 10)), r"labels 0..9 \(found 10 at record 0 \(40 out of range"),
    ("train-labels-idx1-ubyte", idx_bytes(np.zeros(39)), r"40 labels, one per image of train-images-idx3-ubyte "
                                                         r"\(found 39"),
    ("t10k-images-idx3-ubyte", idx_bytes(np.zeros((10, 14, 14))), r"28 x 28 images, as in the training images "
                                                                   r"\(found 14 x 14"),
])
def test_a_corrupt_idx_file_is_named_with_what_is_wrong(tmp_path, name, data, found):
    _corrupt_mnist(tmp_path / "mnist", name, data)
    with pytest.raises(ConfigError, match=found) as caught:
        build_public("mnist", str(tmp_path / "mnist"), num_clients=2)
    assert caught.value.field == "data.path" and caught.value.value == str(tmp_path / "mnist" / name)


def test_a_truncated_gzip_file_is_named(tmp_path):
    write_mnist(tmp_path / "mnist", gz=True)
    path = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ConfigError, match=r"train-images-idx3-ubyte.gz' is not allowed: expected a readable gzip file"):
        build_public("mnist", str(tmp_path / "mnist"), num_clients=2)


# -- CIFAR-10 (python batches) -------------------------------------------------------------------------------------
@pytest.mark.parametrize("inside", ["", "cifar-10-batches-py"])
def test_cifar_batches_are_images_with_their_channels_and_official_split(tmp_path, inside):
    batches = write_cifar(tmp_path / "cifar10" / inside if inside else tmp_path / "cifar10")
    dataset = build_public("cifar10", str(tmp_path / "cifar10"), num_clients=4, seed=2)
    assert dataset.train.feature_shape == (3, 32, 32) and dataset.num_classes == 10
    assert int(dataset.train.counts.sum()) == 30 and int(dataset.test.counts.sum()) == 10
    rows = {int(row[0]): row for batch in batches.values() for row in batch[b"data"]}
    labels = {int(row[0]): label for batch in batches.values() for row, label in zip(batch[b"data"], batch[b"labels"])}
    for split, expected in ((dataset.train, range(30)), (dataset.test, range(30, 40))):
        assert _first_pixels(split) == list(expected)
        for i, r in _records_of(split, split.counts):
            image = split.x[i, r]
            row = rows[round(float(image[0, 0, 0]) * 255)]
            # the row is 1,024 red values, then green, then blue, each 32 x 32 row by row
            assert torch.allclose(image, torch.from_numpy(row.reshape(3, 32, 32) / 255).float())
            assert float(image[1, 0, 5]) * 255 == pytest.approx(row[1024 + 5])
            assert int(split.y[i, r]) == labels[row[0]]
    assert dataset.info["classes"][0] == "airplane"


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_batches_pickled_by_python_3_are_read_too(tmp_path, protocol):
    write_cifar(tmp_path / "c")
    batch = cifar_batch(6, 0, 1)
    (tmp_path / "c" / "data_batch_1").write_bytes(
        pickle.dumps({"data": batch[b"data"], "labels": batch[b"labels"]}, protocol=protocol))
    assert int(build_public("cifar10", str(tmp_path / "c"), num_clients=2).train.counts.sum()) == 30


def test_a_pickle_naming_anything_but_arrays_is_refused_and_never_run(tmp_path):
    write_cifar(tmp_path / "c")
    marker = tmp_path / "ran"
    hostile = b"\x80\x02cposix\nsystem\nU" + bytes([len(f"touch {marker}")]) + f"touch {marker}".encode() + b"\x85R."
    (tmp_path / "c" / "data_batch_3").write_bytes(hostile)
    with pytest.raises(ConfigError, match=r"data_batch_3' is not allowed: .*found a pickle that names posix.system, "
                                          r"which a data batch never holds; dpfl does not unpickle it"):
        build_public("cifar10", str(tmp_path / "c"), num_clients=2)
    assert not marker.exists()


@pytest.mark.parametrize("content, found", [
    (b"not a pickle", r"found an unreadable pickle: UnpicklingError"),
    (py2_pickle(cifar_batch(6, 0, 1))[:-300], r"found an unreadable pickle"),
    (py2_pickle({b"data": cifar_batch(6, 0, 1)[b"data"]}), r"found the keys \[\"b'data'\"\]"),
    (py2_pickle({b"data": np.zeros((6, 1024), np.uint8), b"labels": [0] * 6}), r"uint8 array \[N, 3072\].*found uint8 "
                                                                               r"\[6, 1024\]"),
    (py2_pickle({b"data": np.zeros((6, 3072), np.uint8), b"labels": [0] * 5}), r"6 class numbers .*found int64 \[5\]"),
    (py2_pickle({b"data": np.zeros((6, 3072), np.uint8), b"labels": [0, 1, 12, 3, 4, 5]}), r"labels 0..9 \(found 12 "
                                                                                           r"at record 2"),
])
def test_a_corrupt_cifar_batch_is_named_with_what_is_wrong(tmp_path, content, found):
    write_cifar(tmp_path / "c")
    (tmp_path / "c" / "test_batch").write_bytes(content)
    with pytest.raises(ConfigError, match=found) as caught:
        build_public("cifar10", str(tmp_path / "c"), num_clients=2)
    assert caught.value.value == str(tmp_path / "c" / "test_batch")


def test_missing_cifar_batches_are_named(tmp_path):
    write_cifar(tmp_path / "c")
    (tmp_path / "c" / "data_batch_4").unlink()
    with pytest.raises(ConfigError, match=r"data_batch_1, .*test_batch \(in the folder or its cifar-10-batches-py "
                                          r"folder\) \(found missing data_batch_4;.*cifar-10-python.tar.gz"):
        build_public("cifar10", str(tmp_path / "c"), num_clients=2)


# -- LEAF: FEMNIST -------------------------------------------------------------------------------------------------
def _femnist(folder, writers=4, records=6, test=2, split=True):
    """LEAF's femnist/data: writers f0000_00.. of 6 + i records, the last ``test`` of each in test/ (or all in
    all_data/), spread over two files per folder as LEAF spreads writers."""
    users = {f"f{i:04d}_{i:02d}": femnist_writer(i, records + i) for i in range(writers)}
    if not split:
        write_leaf(folder / "all_data", "all_data_0.json", users)
        return users
    names = list(users)
    for part, chosen in enumerate((names[: writers // 2], names[writers // 2:])):
        write_leaf(folder / "train", f"all_data_{part}_niid_0_keep_0_train_9.json",
                   {u: (users[u][0][:-test], users[u][1][:-test]) for u in chosen})
        write_leaf(folder / "test", f"all_data_{part}_niid_0_keep_0_test_9.json",
                   {u: (users[u][0][-test:], users[u][1][-test:]) for u in chosen})
    return users


def test_femnist_writers_are_the_clients_and_their_own_split_is_kept(tmp_path):
    users = _femnist(tmp_path / "femnist")
    dataset = build_public("femnist", str(tmp_path / "femnist"), seed=3)
    assert dataset.info["partition"] == {"scheme": "natural", "param": None, "client_ids": sorted(users)}
    assert dataset.num_classes == 62 and dataset.info["classes"][10] == "A" and dataset.info["classes"][36] == "a"
    assert dataset.train.feature_shape == (1, 28, 28)
    assert dataset.info["preprocessing"] == [{"step": "standardize", "scope": "none", "statistics": "not standardised",
                                              "private": True}]  # already in [0, 1]: no scaling
    for i, user in enumerate(sorted(users)):
        x, y = users[user]
        for split, rows in ((dataset.train, range(len(y) - 2)), (dataset.test, range(len(y) - 2, len(y)))):
            assert int(split.counts[i]) == len(rows)
            got = sorted((round(float(split.x[i, r, 0, 0, 0]) * 255), int(split.y[i, r]))
                         for r in range(int(split.counts[i])))
            assert got == sorted((round(x[j][0] * 255), y[j]) for j in rows)
            first = next(r for r in range(int(split.counts[i])) if round(float(split.x[i, r, 0, 0, 0]) * 255) ==
                         round(x[rows[0]][0] * 255))
            assert torch.equal(split.x[i, first].flatten(), torch.tensor(x[rows[0]], dtype=torch.float32))


def test_femnist_without_a_split_is_split_per_writer_by_test_fraction(tmp_path):
    _femnist(tmp_path / "femnist", split=False)
    dataset = build_public("femnist", str(tmp_path / "femnist"), test_fraction=0.5)
    # writers of 6..9 records keep round(n / 2) (half to even) for testing: 3, 4, 4, 4
    assert dataset.train.counts.tolist() == [3, 3, 4, 5] and dataset.test.counts.tolist() == [3, 4, 4, 4]
    assert dataset.info["source"]["layout"] == "all_data"


@pytest.mark.parametrize("scheme, param", [("dirichlet", 0.5), ("k_labels", 2), ("iid", None)])
def test_femnist_may_be_pooled_and_partitioned_by_a_scheme(tmp_path, scheme, param):
    _femnist(tmp_path / "femnist", writers=6, records=20)
    dataset = build_public("femnist", str(tmp_path / "femnist"), partition=scheme, partition_param=param,
                           num_clients=3)
    assert dataset.num_clients == 3 and dataset.info["partition"]["scheme"] == scheme
    if scheme == "k_labels":  # 3 clients of 2 labels hold 6 of the 62 classes; the others' records are left out
        for i in range(3):
            labels = torch.cat([s.y[i, : s.counts[i]] for s in (dataset.train, dataset.test)])
            assert len(labels.unique()) == 2
    else:
        assert int(dataset.train.counts.sum() + dataset.test.counts.sum()) == sum(20 + i for i in range(6))


def test_a_writer_only_in_test_is_refused_as_a_split_by_writer(tmp_path):
    _femnist(tmp_path / "femnist")
    write_leaf(tmp_path / "femnist" / "test", "extra_test.json", {"f9999_99": femnist_writer(99, 2)})
    with pytest.raises(ConfigError, match=r"extra_test.json' is not allowed: expected writers that also have records "
                                          r"in train/ .*\(found 1 writer\(s\) only in test/, e.g. 'f9999_99': a split "
                                          r"by writer \(-t user\)"):
        build_public("femnist", str(tmp_path / "femnist"))


def test_femnist_folders_missing_are_named(tmp_path):
    _femnist(tmp_path / "femnist")
    for path in (tmp_path / "femnist" / "test").iterdir():
        path.unlink()
    with pytest.raises(ConfigError, match=r"expected a folder holding the FEMNIST files: train/\*.json and "
                                          r"test/\*.json .*found missing test/\*.json.*github.com/TalwalkarLab/leaf"):
        build_public("femnist", str(tmp_path / "femnist"))


def _leaf_document(users):
    return {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


@pytest.mark.parametrize("change, found", [
    (lambda d: d["user_data"]["f0000_00"]["x"][1].pop(), r"784 pixel values \(28 x 28\) per image in x \(found 783 "
                                                         r"values in writer 'f0000_00''s record 1"),
    (lambda d: d["user_data"]["f0000_00"]["x"][2].__setitem__(5, 3.0), r"pixel values in \[0, 1\] .*found 3.0 in "
                                                                       r"writer 'f0000_00''s record 2"),
    (lambda d: d["user_data"]["f0000_00"]["x"][0].__setitem__(5, "a"), r"numbers in x"),
    (lambda d: d["user_data"]["f0000_00"]["y"].__setitem__(0, 62), r"class numbers 0..61 in y \(found 62 in writer "
                                                                    r"'f0000_00''s record 0"),
    (lambda d: d["user_data"]["f0000_00"]["y"].pop(), r"lists 'x' and 'y' of one entry per record "
                                                      r".*\{'x': 4, 'y': 3\}"),
    (lambda d: d["num_samples"].__setitem__(0, 7), r"num_samples\[0\] = the records of 'f0000_00' \(found 7 for 4 "
                                                   r"records"),
    (lambda d: d["users"].append("ghost"), r"'users' naming each key of 'user_data' once"),
    (lambda d: d.pop("user_data"), r"a LEAF JSON object with 'users', 'num_samples' and 'user_data' \(found the keys "
                                   r"\['num_samples', 'users'\]"),
])
def test_a_corrupt_leaf_file_is_named_with_what_is_wrong(tmp_path, change, found):
    _femnist(tmp_path / "femnist")
    path = tmp_path / "femnist" / "train" / "all_data_0_niid_0_keep_0_train_9.json"
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=found) as caught:
        build_public("femnist", str(tmp_path / "femnist"))
    assert caught.value.value == str(path)


def test_truncated_json_and_a_writer_in_two_files_are_refused(tmp_path):
    _femnist(tmp_path / "femnist")
    path = tmp_path / "femnist" / "train" / "all_data_1_niid_0_keep_0_train_9.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ConfigError, match=r"all_data_1_niid_0_keep_0_train_9.json' is not allowed: expected a LEAF "
                                          r"JSON file \(found truncated JSON at line 1"):
        build_public("femnist", str(tmp_path / "femnist"))
    path.write_text(text)
    write_leaf(tmp_path / "femnist" / "train", "zz_again.json", {"f0000_00": femnist_writer(0, 3)})
    with pytest.raises(ConfigError, match=r"zz_again.json' is not allowed: expected each user in one file of train/ "
                                          r"\(found 'f0000_00' also in all_data_0_niid_0_keep_0_train_9.json"):
        build_public("femnist", str(tmp_path / "femnist"))


# -- LEAF: Shakespeare ---------------------------------------------------------------------------------------------
LINES = {"THE_TRAGEDY_OF_KING_LEAR_LEAR": "Blow, winds, and crack your cheeks! rage! blow!",
         "THE_TRAGEDY_OF_HAMLET_HAMLET": "To be, or not to be: that is the question. Ça va?"}


def test_shakespeare_roles_are_clients_and_characters_are_ids_of_leafs_alphabet(tmp_path):
    roles = {role: shakespeare_role(text) for role, text in LINES.items()}
    write_leaf(tmp_path / "s" / "all_data", "all_data.json", roles, hierarchies=["KING_LEAR", "HAMLET"])
    dataset = build_public("shakespeare", str(tmp_path / "s"), test_fraction=0.25)
    assert dataset.num_classes == 81 and dataset.info["classes"][:3] == ["\n", " ", "!"]
    assert dataset.info["classes"][-1] == "other" and dataset.train.feature_shape == (80,)
    source = dataset.info["source"]
    assert source["sequence_length"] == 80 and source["other_characters"] == 6  # the Ç of "Ça": one y, 5 x
    assert dataset.info["partition"]["client_ids"] == sorted(LINES)
    alphabet = leaf.ALPHABET + "\x00"  # id 80: a character outside it
    for i, role in enumerate(sorted(LINES)):
        xs, ys = roles[role]
        got = sorted("".join(alphabet[int(c)] for c in s.x[i, r]) + alphabet[int(s.y[i, r])]
                     for s in (dataset.train, dataset.test) for r in range(int(s.counts[i])))
        assert got == sorted(x.replace("Ç", "\x00") + y.replace("Ç", "\x00") for x, y in zip(xs, ys))


@pytest.mark.parametrize("change, found", [
    (lambda d: d["user_data"]["R"]["x"].__setitem__(1, 5), r"strings \(LEAF: of 80 characters\) in x \(found 5 in "
                                                           r"user 'R''s record 1"),
    (lambda d: d["user_data"]["R"]["y"].__setitem__(0, "ab"), r"single characters in y \(found 'ab' in user 'R''s "
                                                              r"record 0"),
    (lambda d: d["user_data"]["R"]["x"].__setitem__(0, "short"), r"strings of one length in x \(LEAF: 80 characters\) "
                                                                 r"\(found lengths \[5, 80\]"),
])
def test_a_corrupt_shakespeare_file_is_named_with_what_is_wrong(tmp_path, change, found):
    document = _leaf_document({"R": shakespeare_role("Now is the winter of our discontent")})
    change(document)
    (tmp_path / "s" / "all_data").mkdir(parents=True)
    (tmp_path / "s" / "all_data" / "all_data.json").write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=found):
        build_public("shakespeare", str(tmp_path / "s"))


# -- partitions and keys -------------------------------------------------------------------------------------------
def test_k_labels_and_dirichlet_partition_mnist_and_natural_is_refused_naming_the_sets_with_writers(tmp_path):
    write_mnist(tmp_path / "mnist", mnist_records(200, 50))
    dataset = build_public("mnist", str(tmp_path / "mnist"), partition="k_labels", partition_param=2, num_clients=5)
    for i in range(5):
        labels = torch.cat([s.y[i, : s.counts[i]] for s in (dataset.train, dataset.test)])
        assert len(labels.unique()) == 2
    skewed = build_public("mnist", str(tmp_path / "mnist"), partition="dirichlet", partition_param=0.1,
                          num_clients=5)
    assert int(skewed.train.counts.sum() + skewed.test.counts.sum()) == 250
    with pytest.raises(ConfigError, match=r"data.partition = 'natural' is not allowed: .*MNIST has no natural clients "
                                          r"\(those with writers: \['femnist', 'shakespeare'\]\)"):
        build_public("mnist", str(tmp_path / "mnist"), partition="natural", num_clients=5)


def test_parity_labels_and_samples_per_client_apply(tmp_path):
    write_mnist(tmp_path / "mnist", mnist_records(200, 50))
    dataset = build_dataset("mnist", path=str(tmp_path / "mnist"), num_clients=25, partition="parity_pairs",
                            labels="parity", samples_per_client=8)
    assert dataset.num_classes == 2 and dataset.info["classes"] == ["odd", "even"]
    assert (dataset.train.counts + dataset.test.counts).tolist() == [8] * 25


# -- shapes, for a memory estimate ---------------------------------------------------------------------------------
def test_shapes_come_from_the_headers(tmp_path):
    write_mnist(tmp_path / "mnist", gz=True)
    path = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:16 + 784]))  # the header, one image of 40
    shape = shape_of("mnist", str(tmp_path / "mnist"))
    assert (shape.records, shape.test_records, shape.record_shape, shape.value_bytes) == (50, 10, (1, 28, 28), 1)
    with pytest.raises(ConfigError, match="truncated"):  # reading it finds what the header alone cannot
        build_public("mnist", str(tmp_path / "mnist"), num_clients=2)
    users = _femnist(tmp_path / "femnist")
    shape = shape_of("femnist", str(tmp_path / "femnist"))
    assert shape.records == sum(len(y) for _, y in users.values()) and shape.value_bytes == 4
    assert shape.client_sizes == [(len(y) - 2, 2) for _, y in users.values()] and shape.test_records == 8
    assert shape.id_bytes == 8 + 1 + 4 * len("f0000_00")
    write_cifar(tmp_path / "c")
    shape = shape_of("cifar10", str(tmp_path / "c"))
    assert (shape.records, shape.test_records) == (40, 10)  # size // 3072: exact for batches this small


def test_a_file_whose_head_does_not_list_its_records_is_bounded_by_its_size(tmp_path):
    users = {"R": shakespeare_role("Now is the winter of our discontent made glorious summer")}
    document = _leaf_document(users)
    (tmp_path / "s" / "all_data").mkdir(parents=True)
    path = tmp_path / "s" / "all_data" / "all_data.json"
    path.write_text(json.dumps({"user_data": document["user_data"], "users": ["R"], "num_samples": [56]}))
    shape = shape_of("shakespeare", str(tmp_path / "s"))
    assert shape.client_sizes is None and 56 <= shape.records == path.stat().st_size // 85


def _kept(dataset) -> int:
    """Bytes of the data set's tensors and of the simulator's flat copies, all resident once a run is built."""
    return sum(t.numel() * t.element_size() for split in (dataset.train, dataset.test)
               for t in (split.x, split.y, *split.flat()))


@pytest.mark.parametrize("name", ["mnist", "cifar10", "femnist", "shakespeare"])
def test_the_estimate_covers_what_a_build_keeps(tmp_path, monkeypatch, name):
    monkeypatch.setenv("DPFL_DATA", str(tmp_path))
    if name == "mnist":
        write_mnist(tmp_path / name, mnist_records(600, 100), gz=True)
    elif name == "cifar10":
        write_cifar(tmp_path / name, per_batch=60, test=60)
    elif name == "femnist":
        _femnist(tmp_path / name, writers=8, records=30)
    else:
        write_leaf(tmp_path / name / "all_data", "all_data.json",
                   {role: shakespeare_role(text * 8) for role, text in LINES.items()})
    config = load_config(None, [f"data.name='{name}'", *(["data.num_clients=7"] if name in ("mnist", "cifar10")
                                                          else [])])
    estimate = data_footprint(config["data"]).peak_bytes
    kept = _kept(build_dataset(**config["data"]))
    assert kept <= estimate, (kept, estimate)


def test_a_public_data_set_too_large_is_refused_naming_it_and_the_knobs(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFL_DATA", str(tmp_path))
    write_mnist(tmp_path / "mnist", mnist_records(600, 100))
    monkeypatch.setattr(footprint, "available_memory", lambda: MemoryLimit(2**20, "MemAvailable in /proc/meminfo"))
    with pytest.raises(ConfigError, match=r"data.name = 'mnist' is not allowed: expected a data set that fits in "
                                          r"memory \(building the data needs 10 clients x 70 records x 784 features: "
                                          r".*1.0 MB available.*lower data.samples_per_client .*or use a subset of "
                                          r"the data set's files"):
        check_data_memory(load_config(None, ["data.name='mnist'", "data.num_clients=10"])["data"])


def test_pixels_are_scaled_in_place_as_rescale_would_scale_them(tmp_path):
    write_mnist(tmp_path / "mnist")
    scaled = build_public("mnist", str(tmp_path / "mnist"), num_clients=3, seed=4)
    spec = CATALOGUE["mnist"][0]
    records = idx.load(spec, tmp_path / "mnist", "data.path")
    raw = federate(records.x, records.y, name="mnist", num_clients=3, seed=4, test_mask=records.test,
                   classes=spec.classes)
    assert torch.equal(scaled.train.x, rescale(raw, 1 / 255).train.x)
    assert raw.train.x.max() == 255 and scaled.train.x.max() <= 1
