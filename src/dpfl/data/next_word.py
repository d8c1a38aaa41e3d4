"""Next-word prediction on per-user text (``data.name = "next-word"``): the task of TFF's StackOverflow benchmark
(Reddi et al. 2021, "Adaptive federated optimization", Sec. 5 and App. C: the 10,000 most frequent words, sequences
of 20 tokens, accuracy without the special tokens), read from JSON lines, one user a line.

**Format.** ``data.path`` is a ``.jsonl`` file, or a folder whose ``*.jsonl`` files are read in name order (as
``write_jsonl`` writes them), each line one user::

    {"user": "u17", "sentences": ["how do i sort a list", ["or", "a", "tuple"]]}

a sentence being a string of whitespace-separated tokens (StackOverflow as TFF publishes it is lower-cased and
tokenised already, tokens separated by single spaces; nothing else is done to them) or a list of tokens. A user is
on one line only; a user without sentences is skipped. A folder may also hold ``vocabulary.txt``: a public
vocabulary, one token a line, most frequent first (TFF publishes StackOverflow's word counts beside the data).

**Split.** Each user's sentences are split at random (``data.seed``) by ``data.test_fraction`` (default 0.2, at
least one sentence kept for training), so that a user's test records come from sentences it did not train on.

**Vocabulary.** ``vocabulary.txt``'s first ``data.vocabulary`` tokens; without it, the ``data.vocabulary``
(default 10,000, TFF's) most frequent tokens of the training sentences, ties in code-point order. That choice reads
the data without noise: NOT differentially private (recorded in the data's preprocessing as ``"private": false``; the
run's epsilon covers the training, not this choice, as in TFF's benchmark, whose vocabulary is counted over the whole
corpus). Ids: ``PAD`` 0, ``OOV`` 1 (any token outside the vocabulary), ``BOS`` 2, ``EOS`` 3, then the vocabulary's
tokens in its order; the classes are all of them (vocabulary + 4).

**Records.** A sentence w_1..w_n is read as [BOS, w_1, ..., w_n, EOS]; each of its n + 1 next tokens (w_1..w_n and
EOS) is the label of one record whose features are the at most L tokens before it, left-padded with PAD to L =
``data.sequence_length`` (default 20). The engine takes one label per record (``dpfl.engine.grads``: logits [N, C],
labels [N]), so a record is the model's prediction at its last position, not TFF's loss over every position of a
sequence; a sentence of n words gives n + 1 records instead of one sequence.

**Accuracy.** PAD and BOS are never labels. Test records whose label is OOV or EOS are left out of the test split, so
the engine's test accuracy (and test loss) is over in-vocabulary words, as TFF's accuracy excludes pad, oov, bos and
eos; training records keep them (the model learns to end a sentence and to predict an unknown word, as TFF's
training loss counts them).

``write_synthetic`` writes text in this format: a Zipf vocabulary and per-user topic mixtures (seeded), for tests
and benchmarks.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dpfl.data.federated import TEST_FRACTION, ClientArrays, FederatedDataset, num_test_records
from dpfl.data.library import corrupt
from dpfl.errors import ConfigError, check_range, json_problem

PAD, OOV, BOS, EOS = 0, 1, 2, 3
SPECIAL = ("<pad>", "<oov>", "<bos>", "<eos>")
VOCABULARY = 10_000  # TFF's StackOverflow benchmark
SEQUENCE_LENGTH = 20  # TFF's StackOverflow benchmark
VOCABULARY_FILE = "vocabulary.txt"
EXPECTED = 'JSON lines, one user a line: {"user": id, "sentences": ["words ...", ...]}'


def files_of(path: str | None) -> tuple[list[Path], Path | None]:
    """The .jsonl files of data.path (a file, or a folder's in name order) and its vocabulary.txt (None: none)."""
    if not path:
        raise ConfigError("data.path", path, f"a .jsonl file or a folder of them ({EXPECTED}) for data.name = "
                                             "'next-word'")
    where = Path(path).expanduser()
    if where.is_file():
        return [where], None
    found = sorted(where.glob("*.jsonl")) if where.is_dir() else []
    if not found:
        raise ConfigError("data.path", str(where), f"a .jsonl file or a folder holding *.jsonl files ({EXPECTED}); "
                                                   f"found {'no .jsonl file' if where.is_dir() else 'no such path'}")
    vocabulary = where / VOCABULARY_FILE
    return found, vocabulary if vocabulary.is_file() else None


def _sentence(path: Path, line: int, value) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list) and all(isinstance(token, str) for token in value):
        return list(value)
    raise corrupt(path, "sentences as strings of words or lists of string tokens",
                  f"a {type(value).__name__} on line {line}")


def read_users(paths: list[Path]) -> Iterator[tuple[str, list[list[str]]]]:
    """(user, its sentences as token lists) of every line of ``paths``, checked (module docstring)."""
    seen: dict[str, tuple[Path, int]] = {}
    for path in paths:
        try:
            handle = open(path, encoding="utf-8")
        except OSError as err:
            raise corrupt(path, "a readable file", err.strerror or str(err)) from None
        with handle:
            for number, text in enumerate(handle, 1):
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as err:
                    raise corrupt(path, EXPECTED, f"line {number}: {json_problem(text, err)}") from None
                if not isinstance(row, dict) or not isinstance(row.get("sentences"), list) or "user" not in row:
                    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
                    raise corrupt(path, EXPECTED, f"{keys} on line {number}")
                user = str(row["user"])
                if user in seen:
                    raise corrupt(path, "each user on one line", f"{user!r} on line {number} and on line "
                                                                 f"{seen[user][1]} of {seen[user][0].name}")
                seen[user] = (path, number)
                yield user, [_sentence(path, number, s) for s in row["sentences"]]


def split_sentences(sentences: list[list[str]], test_fraction: float,
                    rng: np.random.Generator) -> tuple[list[list[str]], list[list[str]]]:
    """A user's (train, test) sentences, each in the user's order: round(test_fraction n) of n at random for
    testing, at least one kept for training (``federated.num_test_records``)."""
    order = rng.permutation(len(sentences))
    tests = num_test_records(len(sentences), test_fraction)
    return [sentences[i] for i in sorted(order[tests:])], [sentences[i] for i in sorted(order[:tests])]


def vocabulary_of(counts: Counter, size: int, public: Path | None) -> tuple[list[str], dict]:
    """The vocabulary's tokens in id order (after the 4 special ids) and its preprocessing record."""
    if public is not None:
        try:
            listed = public.read_text(encoding="utf-8").split()
        except (OSError, UnicodeDecodeError) as err:
            raise corrupt(public, "a readable UTF-8 file of tokens, one a line", str(err)) from None
        words = list(dict.fromkeys(listed))[:size]
        source = {"from": str(public), "sha256": hashlib.sha256("\n".join(words).encode()).hexdigest(), "private": True}
    else:
        words = [w for w, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:size]]
        source = {"from": "the training sentences' most frequent tokens, counted without noise", "private": False}
    return words, {"step": "vocabulary", "size": len(words), "special": list(SPECIAL), **source}


def windows(sentence: list[int], length: int) -> tuple[np.ndarray, np.ndarray]:
    """The records of one sentence of word ids (module docstring): [n + 1, length] contexts and their next ids."""
    tokens = np.array([PAD] * length + [BOS, *sentence, EOS], dtype=np.float32)
    ends = np.arange(length + 1, len(tokens))  # the position of each label
    contexts = tokens[ends[:, None] - length + np.arange(length)]
    return contexts, tokens[ends].astype(np.int64)


def user_records(sentences: list[list[str]], ids: dict[str, int], length: int, test: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """All records of a user's sentences; for the test split without the OOV and EOS labels."""
    pieces = [windows([ids.get(w, OOV) for w in s], length) for s in sentences]
    x = np.concatenate([p[0] for p in pieces]) if pieces else np.zeros((0, length), np.float32)
    y = np.concatenate([p[1] for p in pieces]) if pieces else np.zeros(0, np.int64)
    if test:
        keep = y > EOS
        x, y = x[keep], y[keep]
    return x, y


def build_next_word(path: str | None, *, vocabulary: int = VOCABULARY, sequence_length: int = SEQUENCE_LENGTH,
                    num_clients: int | None = None, test_fraction: float | None = None, seed: int = 0
                    ) -> FederatedDataset:
    """The next-word data set of the JSON lines at ``path`` (module docstring), one client per user."""
    check_range("data.vocabulary", vocabulary, 1, integer=True)
    check_range("data.sequence_length", sequence_length, 1, integer=True)
    test_fraction = TEST_FRACTION if test_fraction is None else test_fraction
    check_range("data.test_fraction", test_fraction, 0.0, 1.0, high_open=True)
    paths, public = files_of(path)
    rng = np.random.default_rng(seed)
    users, splits, counts = [], [], Counter()
    for user, sentences in read_users(paths):
        if not sentences:
            continue
        train, test = split_sentences(sentences, test_fraction, rng)
        for sentence in train:
            counts.update(sentence)
        users.append(user)
        splits.append((train, test))
    if not users:
        raise corrupt(paths[0], EXPECTED, "no user with a sentence")
    if num_clients is not None and num_clients != len(users):
        raise ConfigError("data.num_clients", num_clients, f"unset or {len(users)}, the users of {path} (each user "
                                                           "is a client)")
    words, step = vocabulary_of(counts, vocabulary, public)
    ids = {w: len(SPECIAL) + i for i, w in enumerate(words)}
    arrays = [[user_records(part, ids, sequence_length, k == 1) for k, part in enumerate(split)] for split in splits]
    train = ClientArrays.from_lists([a[0][0] for a in arrays], [a[0][1] for a in arrays])
    test = ClientArrays.from_lists([a[1][0] for a in arrays], [a[1][1] for a in arrays])
    source = {"name": "next-word", "path": str(Path(path).expanduser()),
              "files": [{"file": p.name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in paths],
              "sequence_length": sequence_length, "users": len(users), "tokens": int(sum(counts.values()))}
    info = {"source": source, "classes": {"special": list(SPECIAL), "most_frequent": words[:10]},
            "num_clients": len(users), "partition": {"scheme": "natural", "clients": "users"},
            "split": {"test_fraction": test_fraction, "per_client": True, "unit": "sentences",
                      "test_labels": "in-vocabulary words only (no oov, eos)"},
            "preprocessing": [step], "seed": seed}
    return FederatedDataset(train, test, len(SPECIAL) + len(words), "next-word", info)


def zipf(size: int, exponent: float) -> np.ndarray:
    """Zipf's law over ``size`` ranks: p_k proportional to k^-exponent, k = 1..size."""
    weights = np.arange(1, size + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()


def synthetic_users(users: int, *, words: int = 2000, topics: int = 10, sentences: tuple[int, int] = (2, 6),
                    mean_length: float = 12.0, exponent: float = 1.1, concentration: float = 0.3,
                    seed: int = 0) -> Iterator[tuple[str, list[str]]]:
    """Users' text for ``write_jsonl``: each token, with probability 1/2, from one Zipf law over ``words`` tokens
    ("w0" the most frequent: the language's common words), else from the sentence's topic, a Zipf law over its own
    random permutation of the tokens; each user's topic mixture is Dirichlet(``concentration``), each of its
    sentences (between ``sentences[0]`` and ``sentences[1]``, uniformly) has one topic drawn from it and 1 + a
    Poisson(``mean_length`` - 1) tokens. Seeded by ``seed``; the same seed writes the same text."""
    rng = np.random.default_rng(seed)
    cumulative = np.cumsum(zipf(words, exponent))

    def ranks(n: int) -> np.ndarray:  # n draws of Zipf's law (inverse transform: the law's cdf is computed once)
        return np.minimum(np.searchsorted(cumulative, rng.random(n), side="right"), words - 1)

    orders = np.stack([rng.permutation(words) for _ in range(topics)])
    names = np.array([f"w{k}" for k in range(words)])
    for u in range(users):
        mixture = np.cumsum(rng.dirichlet(np.full(topics, concentration)))
        text = []
        for _ in range(int(rng.integers(sentences[0], sentences[1] + 1))):
            n = 1 + int(rng.poisson(mean_length - 1))
            topic = min(int(np.searchsorted(mixture, rng.random(), side="right")), topics - 1)
            chosen = np.where(rng.random(n) < 0.5, ranks(n), orders[topic][ranks(n)])
            text.append(" ".join(names[chosen]))
        yield f"u{u}", text


def write_jsonl(path: str | Path, users) -> Path:
    """Writes (user, sentences) pairs as the JSON lines ``build_next_word`` reads (module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for user, sentences in users:
            handle.write(json.dumps({"user": user, "sentences": sentences}) + "\n")
    return path


__all__ = ["PAD", "OOV", "BOS", "EOS", "SPECIAL", "VOCABULARY", "SEQUENCE_LENGTH", "build_next_word", "windows",
           "read_users", "files_of", "zipf", "synthetic_users", "write_jsonl"]
