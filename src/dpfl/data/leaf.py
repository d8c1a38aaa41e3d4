"""FEMNIST and Shakespeare in LEAF's JSON layout, their writers (speaking roles) the natural clients.

Format (Caldas et al. 2018, "LEAF: A benchmark for federated settings"; the files LEAF's preprocess.sh writes, from
the LEAF repository, github.com/TalwalkarLab/leaf, data/femnist and data/shakespeare): each .json file is an object
with "users" (user ids), "num_samples" (each user's number of records), "user_data" (user id -> {"x": [...],
"y": [...]}, one entry of x and y per record) and, in Shakespeare's, "hierarchies" (each user's play; not read).

* FEMNIST (Caldas et al. 2018: the handwritten characters of NIST Special Database 19, grouped by writer): x holds 784
  numbers in [0, 1] per record, a 28 x 28 grey image row by row as LEAF writes it (pixel / 255, white = 1); y a class
  number 0..61 (digits 0-9, then A-Z as 10-35, then a-z as 36-61). Records: images [N, 1, 28, 28] float32, already in
  [0, 1] (pixel scale 1).
* Shakespeare (McMahan et al. 2017; LEAF's next-character task, one user per speaking role of a play): x holds a
  string of 80 characters, y the character that follows. Records: [N, 80] character ids, a character's position in
  LEAF's 80-character alphabet (``ALPHABET``, LEAF's ALL_LETTERS) or 80 for any other character (``OTHER``); the class
  is y's id (81 classes). How many characters fell outside the alphabet is recorded.

Folders, in the data set's folder (LEAF's data/<name>/data): train/ and test/ holding LEAF's per-writer split
(``preprocess.sh -t sample``: each writer's records divided between train and test; kept as it is), or all_data/
alone (no split: each writer's records are split by data.test_fraction). A writer of test/ must have records in
train/: LEAF's ``-t user`` split holds out whole writers, which has no place in per-client test splits, and is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpfl.data.library import PublicSet, Records, Shape, corrupt, missing, read_file
from dpfl.errors import json_problem

SPLITS = ("train", "test")
UNSPLIT = "all_data"
EXPECTED = "train/*.json and test/*.json (LEAF's per-writer split, preprocess.sh -t sample), or all_data/*.json"
IMAGE_SIDE = 28
FEMNIST_CLASSES = 62
ALPHABET = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
OTHER = len(ALPHABET)
SEQUENCE_LENGTH = 80  # LEAF's: what a memory estimate assumes before the files are read
HEAD_LIMIT = 1 << 24  # the most bytes read looking for a file's "num_samples" before its "user_data"
UNKNOWN_ID_LENGTH = 64  # the characters of a writer id a memory estimate assumes when no file's head names them


class _Ids(dict):
    """str.translate's table: a character of ALPHABET -> its position in ALPHABET, any other -> OTHER (translate
    writes the character of that code, whose latin-1 byte is the id)."""

    def __missing__(self, code: int) -> int:
        return OTHER


_TRANSLATE = _Ids({ord(c): i for i, c in enumerate(ALPHABET)})


def _femnist_records(path: Path, user: str, xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
    """One writer's images [n, 1, 28, 28] float32 in [0, 1] and classes 0..61."""
    pixels = IMAGE_SIDE * IMAGE_SIDE
    where = f"writer {user!r}"
    for j, record in enumerate(xs):
        if not isinstance(record, list) or len(record) != pixels:
            found = f"{len(record)} values" if isinstance(record, list) else f"a {type(record).__name__}"
            raise corrupt(path, f"{pixels} pixel values (28 x 28) per image in x", f"{found} in {where}'s record {j}")
    try:
        x = np.asarray(xs, dtype=np.float32).reshape(len(xs), 1, IMAGE_SIDE, IMAGE_SIDE)
    except (TypeError, ValueError):
        raise corrupt(path, "numbers in x", f"other values in {where}'s records") from None
    outside = ~((x >= 0) & (x <= 1))  # NaN too
    if outside.any():
        j = int(np.argwhere(outside)[0][0])
        raise corrupt(path, "pixel values in [0, 1] (LEAF writes pixel / 255)",
                      f"{x[j][outside[j]][0]} in {where}'s record {j}")
    return x, _classes(path, where, ys, FEMNIST_CLASSES)


def _classes(path: Path, where: str, ys: list, count: int) -> np.ndarray:
    y = np.asarray(ys)
    if y.dtype.kind not in "iu" or y.ndim != 1:
        raise corrupt(path, f"class numbers 0..{count - 1} in y", f"{y.dtype} values in {where}'s y")
    bad = np.flatnonzero((y < 0) | (y >= count))
    if len(bad):
        raise corrupt(path, f"class numbers 0..{count - 1} in y", f"{y[bad[0]]} in {where}'s record {bad[0]}")
    return y.astype(np.int64)


def _shakespeare_records(path: Path, user: str, xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
    """One speaking role's character ids [n, L] uint8 and next-character ids (``ALPHABET``, OTHER)."""
    where = f"user {user!r}"
    for name, values, wanted in (("x", xs, "strings (LEAF: of 80 characters)"), ("y", ys, "single characters")):
        for j, value in enumerate(values):
            if not isinstance(value, str) or (name == "y" and len(value) != 1):
                raise corrupt(path, f"{wanted} in {name}", f"{value!r} in {where}'s record {j}")
    lengths = sorted({len(s) for s in xs})
    if len(lengths) > 1 or (lengths and lengths[0] == 0):
        raise corrupt(path, "strings of one length in x (LEAF: 80 characters)", f"lengths {lengths[:5]} in {where}'s x")
    x = np.frombuffer("".join(xs).translate(_TRANSLATE).encode("latin-1"), dtype=np.uint8)
    y = np.frombuffer("".join(ys).translate(_TRANSLATE).encode("latin-1"), dtype=np.uint8)
    return x.reshape(len(xs), lengths[0] if lengths else 0), y.astype(np.int64)


@dataclass(frozen=True)
class _Task:
    """What differs between LEAF's data sets: reading one user's records, and what a memory estimate needs."""

    records: Callable[[Path, str, list, list], tuple[np.ndarray, np.ndarray]]
    record_shape: tuple[int, ...]
    value_bytes: int
    parsed_bytes: int  # the JSON parser's objects per record (measured: 41 bytes a float, in its list)
    fewest_text_bytes: int  # the least JSON text one record takes (bounds the records of a file by its size)


TASKS = {
    "femnist": _Task(_femnist_records, (1, IMAGE_SIDE, IMAGE_SIDE), 4, 784 * 41 + 2 * 64, 784 * 2),
    "shakespeare": _Task(_shakespeare_records, (SEQUENCE_LENGTH,), 1, 144 + 2 * 8 + 2 * 8, 85),  # 80-character str
}


def locate(spec: PublicSet, folder: Path, why: str) -> dict[str, list[Path]]:
    """"train" and "test" (or "all_data") -> the .json files of that folder, sorted; refused naming what is missing."""
    def files(sub: str) -> list[Path]:
        return sorted(p for p in (folder / sub).glob("*.json") if p.is_file()) if (folder / sub).is_dir() else []

    split = {name: files(name) for name in SPLITS}
    if all(split.values()):
        return split
    if not any(split.values()) and files(UNSPLIT):
        return {UNSPLIT: files(UNSPLIT)}
    absent = [f"{name}/*.json" for name, found in split.items() if not found] if any(split.values()) else None
    raise missing(spec, folder, why, EXPECTED, absent)


def _read(path: Path) -> tuple[dict, str]:
    """A LEAF JSON file's users (checked: each user's x and y, one entry per record) and its sha256."""
    raw, digest = read_file(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise corrupt(path, "a UTF-8 JSON file", f"{err}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise corrupt(path, "a LEAF JSON file", json_problem(text, err)) from None
    expected = "a LEAF JSON object with 'users', 'num_samples' and 'user_data'"
    if not isinstance(document, dict):
        raise corrupt(path, expected, f"a JSON {type(document).__name__}")
    users, data = document.get("users"), document.get("user_data")
    if not isinstance(users, list) or not isinstance(data, dict):
        raise corrupt(path, expected, f"the keys {sorted(document)}")
    if sorted(map(str, users)) != sorted(data) or len(set(map(str, users))) != len(users):
        extra = sorted(set(data) - set(map(str, users)))[:3] or sorted(set(map(str, users)) - set(data))[:3]
        raise corrupt(path, "'users' naming each key of 'user_data' once", f"a mismatch, e.g. {extra or users[:3]}")
    counts = document.get("num_samples")
    for i, user in enumerate(users):
        records = data[str(user)]
        if not isinstance(records, dict) or not isinstance(records.get("x"), list) or \
                not isinstance(records.get("y"), list) or len(records["x"]) != len(records["y"]):
            found = ({k: len(v) if isinstance(v, list) else type(v).__name__ for k, v in records.items()}
                     if isinstance(records, dict) else type(records).__name__)
            raise corrupt(path, "lists 'x' and 'y' of one entry per record for each user", f"{found} for {user!r}")
        if isinstance(counts, list) and i < len(counts) and counts[i] != len(records["y"]):
            raise corrupt(path, f"num_samples[{i}] = the records of {user!r}", f"{counts[i]} for "
                                                                            f"{len(records['y'])} records")
    return {str(user): data[str(user)] for user in users}, digest


def load(spec: PublicSet, folder: Path, why: str) -> Records:
    """The records of every user of every file (module docstring), the test/ ones marked test."""
    task = TASKS[spec.name]
    xs, ys, writers, marks, files = [], [], [], [], []
    seen: dict[str, dict[str, Path]] = {}
    for split, paths in locate(spec, folder, why).items():
        owner = seen.setdefault(split, {})
        for path in paths:
            users, digest = _read(path)
            for user, records in users.items():
                if not records["y"]:
                    continue
                if user in owner:
                    raise corrupt(path, f"each user in one file of {split}/", f"{user!r} also in {owner[user].name}")
                owner[user] = path
                x, y = task.records(path, user, records["x"], records["y"])
                if xs and x.shape[1:] != xs[0].shape[1:]:
                    raise corrupt(path, f"records of shape {list(xs[0].shape[1:])}, as in the files before",
                                  f"{list(x.shape[1:])} for {user!r}")
                xs.append(x)
                ys.append(y)
                writers.append(np.full(len(y), user))
                marks.append(np.full(len(y), split == "test"))
            files.append({"file": str(path.relative_to(folder)), "sha256": digest,
                          "records": sum(len(r["y"]) for r in users.values())})
    if "test" in seen:
        strays = sorted(set(seen["test"]) - set(seen["train"]))
        if strays:
            raise corrupt(seen["test"][strays[0]], "writers that also have records in train/ (LEAF's per-writer "
                                                   "split, preprocess.sh -t sample)",
                          f"{len(strays)} writer(s) only in test/, e.g. {strays[0]!r}: a split by writer (-t user)")
    if not xs:
        raise corrupt(folder, f"records in the {spec.title} files", "no user with a record")
    x, y = np.concatenate(xs), np.concatenate(ys)
    details = {"layout": UNSPLIT if UNSPLIT in seen else "train/test"}
    if spec.name == "shakespeare":
        details.update(sequence_length=int(x.shape[1]), alphabet=ALPHABET,
                       other_characters=int((x == OTHER).sum() + (y == OTHER).sum()))
    return Records(x=x, y=y, test=np.concatenate(marks) if "test" in seen else None,
                   writers=np.concatenate(writers), pixel_scale=1.0, files=files, details=details)


def _head_counts(path: Path) -> dict[str, int] | None:
    """user -> records, from the "users" and "num_samples" written before "user_data" (as LEAF writes its files),
    without reading the records; None when the file does not start that way."""
    head = b""
    try:
        with open(path, "rb") as handle:
            while b'"user_data"' not in head and len(head) < HEAD_LIMIT:
                chunk = handle.read(1 << 16)
                if not chunk:
                    break
                head += chunk
    except OSError as err:
        raise corrupt(path, "a readable file", err.strerror or str(err)) from None
    end = head.find(b'"user_data"')
    try:
        meta = json.loads(head[:end].rstrip().rstrip(b",") + b"}") if end > 0 else None
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("users"), list) or \
            not isinstance(meta.get("num_samples"), list) or len(meta["users"]) != len(meta["num_samples"]):
        return None
    if not all(isinstance(n, int) and n >= 0 for n in meta["num_samples"]):
        return None
    return dict(zip(map(str, meta["users"]), meta["num_samples"]))


def shape_of(spec: PublicSet, folder: Path, why: str) -> Shape:
    """Records and each writer's (train, test) records from the files' heads ("users", "num_samples"); a file whose
    head does not say is bounded by its size (``_Task.fewest_text_bytes`` per record), and then writers are not
    counted. Reading a file holds its bytes, its text and the parser's objects for its records, and as much again
    of the objects of the file before (freed, but kept by Python's allocator)."""
    task = TASKS[spec.name]
    writers: dict[str, list[int]] | None = {}
    records, test, parse = 0, 0, 0
    for split, paths in locate(spec, folder, why).items():
        for path in paths:
            size = path.stat().st_size
            counts = _head_counts(path)
            in_file = sum(counts.values()) if counts is not None else size // task.fewest_text_bytes
            if counts is None:
                writers = None
            elif writers is not None:
                for user, n in counts.items():
                    writers.setdefault(user, [0, 0])[split == "test"] += n
            records += in_file
            test += in_file if split == "test" else 0
            parse = max(parse, 2 * size + 2 * in_file * task.parsed_bytes)
    longest = max(map(len, writers), default=0) if writers is not None else UNKNOWN_ID_LENGTH
    sizes = None if writers is None else [(train, test) for train, test in writers.values() if train + test]
    return Shape(records=records, test_records=test, record_shape=task.record_shape, value_bytes=task.value_bytes,
                 client_sizes=sizes, parse_bytes=parse, id_bytes=8 + 1 + 4 * longest)


__all__ = ["ALPHABET", "OTHER", "TASKS", "load", "shape_of"]
