"""next-word (``dpfl.data.next_word``): JSON lines of per-user sentences, written here, read into next-word records
(exact ids, windows and splits), the vocabulary from the training text or a public file, the refusals of bad files,
the seeded synthetic writer, and a run of the sequence models on it, also from a memory-mapped folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dpfl
from dpfl.data import stacked
from dpfl.data.footprint import TOKEN_BYTES, data_footprint
from dpfl.data.next_word import BOS, EOS, OOV, PAD, synthetic_users, windows, write_jsonl
from dpfl.data.sources import build_dataset
from dpfl.errors import ConfigError

USERS = [("ann", ["the cat sat", "the dog sat", "a cat ran"]), ("bob", [["the", "cat"], "dogs sat down"])]


def build(path, **keys):
    return build_dataset("next-word", num_clients=None, path=str(path), **keys)


def test_a_sentence_gives_one_record_per_next_token_left_padded():
    x, y = windows([7, 8], 3)
    assert x.tolist() == [[PAD, PAD, BOS], [PAD, BOS, 7], [BOS, 7, 8]] and y.tolist() == [7, 8, EOS]
    x, y = windows([5, 6, 7, 8], 2)
    assert x.tolist() == [[PAD, BOS], [BOS, 5], [5, 6], [6, 7], [7, 8]] and y.tolist() == [5, 6, 7, 8, EOS]


def test_users_are_clients_with_ids_of_the_training_vocabulary_and_test_labels_are_words(tmp_path):
    """Test fraction 0 keeps every sentence for training, in the user's order: 'cat', 'sat' and 'the' are said 3 times
    each, so a vocabulary of 3 holds them in code-point order, and every other word is oov."""
    write_jsonl(tmp_path / "text.jsonl", USERS)
    data = build(tmp_path / "text.jsonl", vocabulary=3, sequence_length=4, test_fraction=0.0)
    cat, sat, the = 4, 5, 6
    assert data.num_classes == 7 and data.num_clients == 2 and data.train.counts.tolist() == [12, 7]
    assert data.info["classes"]["most_frequent"] == ["cat", "sat", "the"]
    ann = data.train.y[0, :12].tolist()
    assert ann == [the, cat, sat, EOS, the, OOV, sat, EOS, OOV, cat, OOV, EOS]
    assert data.train.x[1, 2].tolist() == [PAD, BOS, the, cat] and data.train.y[1, 2].item() == EOS
    assert data.info["preprocessing"][0]["private"] is False and data.info["source"]["sequence_length"] == 4
    # Half the sentences for testing (seed 1): ann trains on "a cat ran", bob on "dogs sat down"; the vocabulary
    # is theirs (every word once: a, cat, dogs first); only 'cat' is a tested word ('the cat sat', 'the dog sat';
    # 'the cat'): one test record each, no oov or eos label.
    split = build(tmp_path / "text.jsonl", vocabulary=3, sequence_length=4, test_fraction=0.5, seed=1)
    a, cat, dogs = 4, 5, 6
    assert split.train.y.tolist() == [[a, cat, OOV, EOS], [dogs, OOV, OOV, EOS]]
    assert split.test.y.tolist() == [[cat], [cat]] and split.test.x[1, 0].tolist() == [PAD, PAD, BOS, OOV]


def test_a_public_vocabulary_file_fixes_the_ids_and_is_private(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", USERS[:1])
    write_jsonl(tmp_path / "b.jsonl", USERS[1:])
    (tmp_path / "vocabulary.txt").write_text("dog\ncat\nthe\nsat\n")
    data = build(tmp_path, vocabulary=2, sequence_length=2, test_fraction=0.0)
    assert data.num_classes == 6 and data.info["preprocessing"][0]["private"] is True
    assert data.train.y[0, :4].tolist() == [OOV, 5, OOV, EOS]  # the cat sat: only dog (4) and cat (5) are words
    assert [f["file"] for f in data.info["source"]["files"]] == ["a.jsonl", "b.jsonl"]


@pytest.mark.parametrize("line, found", [
    ('{"user": "x", "sentences": ["a b"]', r"line 2: .*"),
    ('{"user": "x"}', r"\['user'\] on line 2"),
    ('{"user": "ann", "sentences": ["a"]}', r"each user on one line \(found 'ann' on line 2 and on line 1"),
    ('{"user": "x", "sentences": [3]}', r"sentences as strings of words or lists of string tokens \(found a int on "
                                        r"line 2\)"),
])
def test_a_corrupt_file_is_named_with_the_line_and_what_is_wrong(tmp_path, line, found):
    path = tmp_path / "text.jsonl"
    path.write_text(json.dumps({"user": "ann", "sentences": ["a b"]}) + "\n" + line + "\n")
    with pytest.raises(ConfigError, match=f"data.path = '{path}' is not allowed: expected .*{found}"):
        build(path)


def test_missing_files_and_a_wrong_client_count_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"data.path = '.*nothing' is not allowed: expected a .jsonl file or a "
                                          r"folder holding \*.jsonl files .*found no such path"):
        build(tmp_path / "nothing")
    write_jsonl(tmp_path / "text.jsonl", USERS)
    with pytest.raises(ConfigError, match=r"data.num_clients = 3 is not allowed: expected unset or 2, the users"):
        build_dataset("next-word", num_clients=3, path=str(tmp_path))
    with pytest.raises(ConfigError, match=r"data.vocabulary = 0 is not allowed"):
        build(tmp_path, vocabulary=0)
    with pytest.raises(ConfigError, match=r"data.sequence_length = 3 is not allowed: expected no value: "
                                          r"data.sequence_length applies to data.name in \['next-word'\]"):
        dpfl.run({"data": {"name": "digits", "sequence_length": 3}})


def test_the_synthetic_writer_is_seeded_and_zipfian(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", synthetic_users(30, words=100, seed=4)).read_bytes()
    b = write_jsonl(tmp_path / "b.jsonl", synthetic_users(30, words=100, seed=4)).read_bytes()
    c = write_jsonl(tmp_path / "c.jsonl", synthetic_users(30, words=100, seed=5)).read_bytes()
    assert a == b != c
    data = build(tmp_path / "a.jsonl", vocabulary=5, test_fraction=0.0)
    assert data.num_clients == 30 and data.info["classes"]["most_frequent"][0] == "w0"
    counts = np.bincount(data.train.y[data.train.mask].numpy(), minlength=9)
    assert counts[4] > counts[5] > counts[8] > 0  # w0 the most frequent word, then w1, ...


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    folder = tmp_path_factory.mktemp("next-word")
    write_jsonl(folder / "users.jsonl", synthetic_users(12, words=60, sentences=(2, 3), mean_length=5, seed=0))
    return folder


def test_the_lstm_trains_on_next_word_and_a_memory_mapped_copy_runs_the_same(text, tmp_path):
    """dp-fedavg-user on the JSON lines, and on the same data set saved as stacked client arrays (data.name =
    'clients', memory-mapped): the same accuracy each round and the same epsilon."""
    data = {"name": "next-word", "path": str(text), "vocabulary": 30, "sequence_length": 6}
    config = {"algorithm": {"name": "dp-fedavg-user", "rounds": 2, "client_rate": 0.5, "noise_multiplier": 1.0},
              "data": data, "model": {"name": "lstm", "embedding": 4, "units": 8, "layers": 1},
              "run": {"noise_seed": 2}}
    direct = dpfl.run(config)
    stacked.save(build(text, vocabulary=30, sequence_length=6), tmp_path / "stored")
    mapped = dpfl.run({**config, "data": {"name": "clients", "path": str(tmp_path / "stored")}})
    assert direct.status == mapped.status == "finished"
    assert [r["test_accuracy"] for r in direct.rounds] == [r["test_accuracy"] for r in mapped.rounds]
    assert direct.epsilon == mapped.epsilon and direct.data["source"]["sequence_length"] == 6


def test_the_memory_estimate_bounds_the_tokens_by_the_text(tmp_path):
    """At most one token per 2 bytes of text: TOKEN_BYTES each while counted, then 3 copies of a record (20 float32
    ids and an int64 label) each."""
    path = write_jsonl(tmp_path / "text.jsonl", USERS)
    tokens = path.stat().st_size // 2
    estimate = data_footprint({"name": "next-word", "path": str(path), "sequence_length": 20, "num_clients": None,
                               "samples_per_client": None, "test_fraction": None})
    assert estimate.peak_bytes == tokens * TOKEN_BYTES + 3 * tokens * (4 * 20 + 8) and estimate.features == 20
