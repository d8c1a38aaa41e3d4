"""The user's own records: an .npz or .csv file, checked, then federated (``pooled.federate``).

* npz: arrays ``x`` [N, features...] (numbers), ``y`` [N] (labels of any type), optionally ``client`` [N] (client
  ids: each distinct id is one client) and ``split`` [N] ("train" / "test", or booleans / 0-1 where true or 1 means
  test).
* csv: a header row, then one row per record; a label column (``label_column``), optionally a client-id column
  and a split column ("train" / "test"); every other column is a numeric feature.

Without client ids the records are partitioned by a scheme of ``partition.py`` over ``num_clients``; without a split
each client's records are split at random by ``test_fraction``; a given split is kept exactly. Everything that would
make a run meaningless or fail later is refused here, naming the file, what was expected and what was found:
missing file, array or column, ragged arrays, no records or no features, non-numeric or non-finite features, bad split
values, a single class, labels that are no classes (fractional or negative numbers), a client without training records.

``federate_arrays`` takes the npz's arrays from memory (``dpfl.run(config, data=(x, y))``), with the same checks; its
refusals name ``data`` (the argument) instead of ``data.path``.

``shape_of`` reads only what a memory estimate needs (array headers of an npz; the header and line count of a csv).
"""

from __future__ import annotations

import csv
import hashlib
import warnings
import zipfile
from pathlib import Path

import numpy as np

from dpfl.data.federated import FederatedDataset
from dpfl.data.pooled import federate
from dpfl.data.preprocess import FAR_FROM_UNIT, bound_features, describe_bounds, far_from_unit_scale, feature_bounds
from dpfl.errors import ConfigError, ConfigWarning

NPZ_ARRAYS = ("x", "y", "client", "split")
#: Fewer records per class than this on average warns: a label column with that many values is rarely a class.
MIN_RECORDS_PER_CLASS = 10
SPLIT_VALUES = ("train", "test")


def _refuse(path: Path | str, expected: str, found: str, field: str | None = None) -> ConfigError:
    """A refusal of a file (``path``: a Path, named by data.path) or of arrays in memory (a str, named by data)."""
    field = field or ("data.path" if isinstance(path, Path) else "data")
    return ConfigError(field, str(path), f"{expected} (found {found})")


def _existing(path, kind: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise _refuse(path, f"an existing {kind} file", "no such file" if not path.exists() else "not a file")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- npz -----------------------------------------------------------------------------------------------------------
def _read_npz(path: Path, keys: tuple[str, ...] = NPZ_ARRAYS) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of the file that it has (it must have x and y)."""
    if not zipfile.is_zipfile(path):
        raise _refuse(path, "a readable .npz file (numpy.savez)", "not a zip archive")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            names = list(arrays.files)
            missing = [key for key in ("x", "y") if key not in names]
            if missing:
                raise _refuse(path, "arrays named 'x' and 'y' (optionally 'client' and 'split')",
                              f"the arrays {sorted(names)}")
            return {key: arrays[key] for key in keys if key in names}
    except ConfigError:
        raise
    except ValueError as err:  # an object array: needs pickle
        raise _refuse(path, "arrays of numbers, strings or booleans (save string ids with .astype(str))",
                      str(err)) from None
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise _refuse(path, "a readable .npz file (numpy.savez)", getattr(err, "strerror", None) or str(err)) from None


def _npz_test_mask(path: Path, split: np.ndarray) -> np.ndarray:
    """'split' as a test mask: "train"/"test" strings, or booleans / 0-1 numbers (true or 1: test)."""
    if split.dtype.kind in "US":
        values = np.char.strip(split.astype(str))
        bad = sorted(set(np.unique(values).tolist()) - set(SPLIT_VALUES))
        if not bad:
            return values == "test"
    elif split.dtype.kind == "b":
        return split.astype(bool)
    elif split.dtype.kind in "iuf":
        bad = sorted(set(np.unique(split).tolist()) - {0, 1})
        if not bad:
            return split == 1
    else:
        bad = [str(split.dtype)]
    raise _refuse(path, "'split' values 'train' / 'test', or booleans / 0-1 (1: test)", f"{bad[:5]}")


def load_npz(path, bounds=None, check_scale: bool = False, **options) -> FederatedDataset:
    """Federated dataset from an .npz file (see the module docstring for its arrays); ``bounds`` (``data.bounds``) and
    ``check_scale`` as in ``bounded``; ``options`` are those of ``federate`` (``num_clients``, ``partition``,
    ``samples_per_client``, ``test_fraction``, ...)."""
    path = _existing(path, ".npz")
    arrays = _read_npz(path)
    source = {"name": path.stem, "format": "npz", "path": str(path), "sha256": _sha256(path),
              "arrays": sorted(arrays)}
    return federate_arrays(arrays, path, source, bounds, check_scale, **options)


def federate_arrays(arrays: dict[str, np.ndarray], origin: Path | str, source: dict, bounds=None,
                    check_scale: bool = False, **options) -> FederatedDataset:
    """Federated dataset from the arrays of an npz (``x``, ``y``, optionally ``client`` and ``split``: the module
    docstring), checked as a file's are; ``origin`` names them in refusals (the file's Path: data.path; a str: the
    ``data`` a Python caller passed), ``source`` is their provenance; ``bounds``, ``check_scale`` and ``options`` as
    in ``load_npz``."""
    x, y = arrays["x"], arrays["y"]
    lengths = {key: (len(a) if a.ndim else "a scalar") for key, a in arrays.items()}
    if x.ndim < 2 or any(a.ndim != 1 for key, a in arrays.items() if key != "x") or len(set(lengths.values())) > 1:
        shapes = ", ".join(f"{key} {list(a.shape)}" for key, a in arrays.items())
        raise _refuse(origin, "x [N, features...] and y, client, split [N]: one entry per record in each", shapes)
    if len(x) == 0 or int(np.prod(x.shape[1:])) == 0:
        raise _refuse(origin, "at least one record and one feature in 'x'", f"x of shape {list(x.shape)}")
    if x.dtype.kind not in "iuf":
        raise _refuse(origin, "numeric features in 'x'", f"dtype {x.dtype}")
    test_mask = _npz_test_mask(origin, arrays["split"]) if "split" in arrays else None
    _check_records(origin, x, y, test_mask, label=("data.path" if isinstance(origin, Path) else "data", str(origin)))
    x, steps = bounded(x, [str(j) for j in range(int(np.prod(x.shape[1:])))], bounds, check_scale, origin)
    return federate(x, y, name=source["name"], client_ids=arrays.get("client"), test_mask=test_mask, source=source,
                    steps=steps, **options)


# -- csv -----------------------------------------------------------------------------------------------------------
def _read_csv(path: Path) -> tuple[list[str], list[int], list[list[str]]]:
    """The header, and each non-blank row after it with its line number."""
    try:
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            rows = [(reader.line_num, row) for row in reader if row]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _refuse(path, "a readable UTF-8 csv file", getattr(err, "strerror", None) or str(err)) from None
    if not rows:
        raise _refuse(path, "a header row naming the columns, then one row per record", "an empty file")
    return [name.strip() for name in rows[0][1]], [n for n, _ in rows[1:]], [row for _, row in rows[1:]]


def _column(path: Path, header: list[str], field: str, name: str) -> int:
    if name not in header:
        raise ConfigError(field, name, f"a column of {path} (found the columns {header})")
    return header.index(name)


def load_csv(path, label_column: str = "label", client_column: str | None = None, split_column: str | None = None,
             bounds=None, check_scale: bool = False, **options) -> FederatedDataset:
    """Federated dataset from a CSV file with a header row (see the module docstring); blank lines are skipped.
    ``bounds`` (``data.bounds``, by column name) and ``check_scale`` as in ``bounded``; ``options`` are those of
    ``federate``."""
    path = _existing(path, ".csv")
    header, lines, records = _read_csv(path)
    special = {"data.label_column": label_column, "data.client_column": client_column,
               "data.split_column": split_column}
    index = {field: _column(path, header, field, name) for field, name in special.items() if name is not None}
    features = [j for j in range(len(header)) if j not in index.values()]
    if not features or not records:
        raise _refuse(path, "at least one feature column and one record",
                      f"{len(features)} feature columns and {len(records)} records")
    for line, record in zip(lines, records):
        if len(record) != len(header):
            raise _refuse(path, f"{len(header)} fields in every row, as in the header",
                          f"{len(record)} in line {line}: {record[:6]}")
    x = np.empty((len(records), len(features)))
    for j, column in enumerate(features):
        for i, record in enumerate(records):
            try:
                x[i, j] = float(record[column])
            except ValueError:
                raise _refuse(path, f"a number in feature column {header[column]!r} (every column other than the "
                                    "label, client and split columns is a feature)",
                              f"{record[column]!r} in line {lines[i]}") from None
    y = _as_numbers(np.array([record[index["data.label_column"]] for record in records]))
    client_ids = None
    if client_column is not None:
        client_ids = _as_numbers(np.array([record[index["data.client_column"]] for record in records]))
    test_mask = None
    if split_column is not None:
        marks = np.char.strip(np.array([record[index["data.split_column"]] for record in records]))
        bad = sorted(set(marks.tolist()) - set(SPLIT_VALUES))
        if bad:
            raise _refuse(path, f"'train' or 'test' in the split column {split_column!r}", f"{bad[:5]}",
                          field="data.split_column")
        test_mask = marks == "test"
    _check_records(path, x, y, test_mask, [f"column {header[j]!r}" for j in features], [f"line {n}" for n in lines],
                   label=("data.label_column", label_column))
    source = {"name": path.stem, "format": "csv", "path": str(path), "sha256": _sha256(path),
              "label_column": label_column, "client_column": client_column, "split_column": split_column,
              "feature_columns": [header[j] for j in features]}
    x, steps = bounded(x, source["feature_columns"], bounds, check_scale, path)
    return federate(x, y, name=path.stem, client_ids=client_ids, test_mask=test_mask, source=source, steps=steps,
                    **options)


def bounded(x: np.ndarray, names: list[str], bounds, check_scale: bool, path: Path) -> tuple[np.ndarray, list[dict]]:
    """The features ``x`` (named ``names``) within ``data.bounds`` (``preprocess.bound_features``: clipped, then mapped
    onto [-1, 1]) and the provenance step, or as they are with no bounds. With ``check_scale`` (no bounds, scale nor
    standardisation in the config) a ``ConfigWarning`` names the features far from unit scale: clipped gradients of such
    features lose most of their direction (a csv of ages and blood pressures trains to a loss of 7)."""
    if bounds is not None:
        low, high = feature_bounds(bounds, names)
        return bound_features(x, low, high), [describe_bounds(low, high, names)]
    far = far_from_unit_scale(x, names) if check_scale else {}
    if far:
        shown = ", ".join(f"{name} {value:.4g}" for name, value in list(far.items())[:6])
        more = f" and {len(far) - 6} more" if len(far) > 6 else ""
        example = ", ".join(f"{name} = [low, high]" for name in list(far)[:2])
        warnings.warn(ConfigWarning(
            f"{getattr(path, 'name', path)}: {len(far)} feature(s) far from unit scale (largest |value| above {FAR_FROM_UNIT:g}: "
            f"{shown}{more}); gradients clipped at algorithm.clip then train slowly. Set public bounds, known without "
            f"looking at the data (data.bounds = {{{example}}}: clipped, then mapped onto [-1, 1]), or data.scale "
            "(this check reads your records locally and releases nothing)"), stacklevel=2)
    return x, []


def _fractional(labels: np.ndarray) -> list:
    """The labels that are numbers but not integers (numeric strings from a csv count as numbers)."""
    try:
        numbers = labels.astype(np.float64)
    except ValueError:  # names
        return []
    return labels[numbers != np.round(numbers)].tolist()


def _as_numbers(values: np.ndarray) -> np.ndarray:
    """CSV labels or client ids as integers when they all are (so "10" sorts after "9"), else kept as strings."""
    try:
        return values.astype(np.int64)
    except ValueError:
        return values


# -- checks shared by both formats ---------------------------------------------------------------------------------
def _check_records(path: Path, x: np.ndarray, y: np.ndarray, test_mask: np.ndarray | None,
                   features: list[str] | None = None, records: list[str] | None = None,
                   label: tuple[str, str] = ("data.path", "")) -> None:
    """Finite features, at least two classes (labels that are numbers must be finite integers 0..C-1: a continuous
    quantity is no class, nor is -1 for 'unlabelled'; ``label`` is (the key that chose them, its value)), some test
    records under a given split; a warning (``ConfigWarning``) when the classes average fewer than
    ``MIN_RECORDS_PER_CLASS`` records. ``features`` and ``records`` name the columns and rows in messages (default:
    x's indices)."""
    finite = np.isfinite(x.reshape(len(x), -1))
    if not finite.all():
        record, feature = np.argwhere(~finite)[0]
        where = (f"{features[feature]}, {records[record]}" if features else f"x[{record}], feature {feature}")
        raise _refuse(path, "finite feature values", f"{int((~finite).sum())} NaN or infinite values, the first at "
                                                     f"{where}")
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise _refuse(path, "finite labels", f"{int((~np.isfinite(y)).sum())} NaN or infinite labels")
    classes = np.unique(y)
    if len(classes) < 2:
        raise _refuse(path, "labels of at least two classes", f"every record labelled {classes.tolist()[0]!r}")
    fractional = _fractional(classes)
    key, value = label
    if len(fractional):
        raise ConfigError(key, value, f"class labels (dpfl trains classifiers): integers or names (found in {path} "
                                      f"{len(fractional)} fractional numbers, e.g. {fractional[0]}, among "
                                      f"{len(classes)} distinct labels: a continuous quantity)")
    if classes.dtype.kind in "iuf" and classes[0] < 0:  # sorted: the first is the least
        negative = y < 0
        raise ConfigError(key, value, f"class labels: names, or integers 0..C-1 (found in {path} "
                                      f"{int(negative.sum())} records labelled {classes[0].item()!r}, the first "
                                      f"{_where(records, int(np.argmax(negative)))}, among {len(classes)} distinct "
                                      "labels; a negative label, often -1 for 'unlabelled', is no class)")
    if len(classes) * MIN_RECORDS_PER_CLASS > len(y):
        warnings.warn(f"{key} = {value!r}: {len(classes)} classes for {len(y)} records in {path} "
                      f"({len(y) / len(classes):.1f} records per class): are these labels classes?", ConfigWarning,
                      stacklevel=3)
    if test_mask is not None and not test_mask.any():
        raise _refuse(path, "some records marked 'test' in the split", "every record marked 'train'")


def _where(records: list[str] | None, index: int) -> str:
    """Record ``index`` as a message names it: by ``records`` (a csv's line) or as y's index."""
    return records[index] if records else f"y[{index}]"


# -- shapes, for a memory estimate ---------------------------------------------------------------------------------
def shape_of(path, kind: str) -> dict:
    """What a memory estimate needs, read cheaply: {"records": N, "features": F, "value_bytes": bytes of one stored
    feature value, "client_sizes": records per client id (an npz's client array; None otherwise), "fields": text
    fields to parse (csv: N x columns; 0 for npz)}. npz: the arrays' .npy headers and the (small) client array;
    csv: the header and a count of the non-blank lines (features: every column, an upper bound)."""
    path = _existing(path, f".{kind}")
    if kind == "npz":
        headers = _npz_headers(path)
        if "x" not in headers:
            raise _refuse(path, "arrays named 'x' and 'y' (optionally 'client' and 'split')",
                          f"the arrays {sorted(headers)}")
        shape, dtype = headers["x"]
        sizes = None
        if "client" in headers:
            sizes = np.unique(_read_npz(path, ("client",))["client"], return_counts=True)[1]
        return {"records": shape[0] if shape else 0, "features": int(np.prod(shape[1:])),
                "value_bytes": dtype.itemsize, "client_sizes": sizes, "fields": 0}
    try:
        with open(path, newline="") as handle:
            header = next(csv.reader(handle), [])
            lines = sum(1 for line in handle if line.strip())
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _refuse(path, "a readable UTF-8 csv file", getattr(err, "strerror", None) or str(err)) from None
    return {"records": lines, "features": len(header), "value_bytes": 8, "client_sizes": None,
            "fields": lines * len(header)}


def _npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (shape, dtype) of each array of an .npz, from the .npy headers only (no data is read)."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    try:
        with zipfile.ZipFile(path) as archive:
            headers = {}
            for member in (m for m in archive.namelist() if m.endswith(".npy")):
                with archive.open(member) as handle:
                    version = np.lib.format.read_magic(handle)
                    if version in readers:
                        shape, _, dtype = readers[version](handle)
                    else:  # a header format this reader does not know: read the array
                        array = np.lib.format.read_array(handle, allow_pickle=False)
                        shape, dtype = array.shape, array.dtype
                headers[member[:-4]] = (shape, dtype)
            return headers
    except (OSError, zipfile.BadZipFile, ValueError) as err:
        raise _refuse(path, "a readable .npz file (numpy.savez)", getattr(err, "strerror", None) or str(err)) from None


__all__ = ["load_npz", "federate_arrays", "load_csv", "shape_of", "NPZ_ARRAYS", "SPLIT_VALUES"]
