"""How much memory building a config's data takes, estimated from the config alone, and a refusal before building
when it exceeds what this process can still take (``memory_limit.available_memory``: the machine's free memory,
the process's cgroup limit or its RLIMIT_AS, whichever is least; ``HEADROOM``: a tenth of it is left for the
interpreter and the estimate's own error). The model, the algorithm's state and a round's work are guarded once the
data is built, against what is left then (``dpfl.experiments.memory``).

A ``FederatedDataset`` stores each split as float32 features and int64 labels stacked on a leading client axis and
padded to the largest client (``federated.py``); the simulator then keeps a flat copy of every real record
(``ClientArrays.flat``, for evaluation). Building goes through temporaries on the way, and the estimate is the
largest of its phases (bytes; M clients, R records each, F features, C classes, N records in all):

* synthetic (``synthetic.py``): generation holds x (4MRF), two logits arrays (8MRC) and five label-sized integer
  arrays (~33MR); preprocessing holds x, the unit-normed training records and their stacked copy (4MRF + 8MR_trF +
  8MR); afterwards the dataset and its flat copy (2 (4F + 8) MR). At M = 10^6, R = 60 that is 23.7 GB (2^30 bytes);
  measured peak resident memory: 205 MB at M = 8,000, R = 60 (estimate 204 MB), 753 MB at M = 30,000 (728 MB),
  207 MB at M = 100, R = 5000 (202 MB).
* pooled records (packaged sets, npz, csv; ``pooled.py``): the file as read (npz: its arrays; csv: one Python
  string per field, ~72 bytes each), x in float64 and its float64 copies on the way (per client, split, and
  standardised if data.standardize is not "none"; an upper bound without standardisation, where the features keep
  the file's type), then the padded arrays M x (largest client) x (4F + 8), and afterwards those and the flat copy
  (4F + 8) N. The largest client is known for an npz with a 'client' array; otherwise clients are taken to be equal
  (a skewed partition pads more than estimated). Measured (peak resident memory of the build): a 400,000 x 50
  float32 npz over 200 clients, 626 MB estimated, 325 MB measured (630 MB when its features were copied as float64);
  with standardisation 778 MB, 782 MB (an earlier measurement: 710 MB); a 100,000 x 20 csv, 220 MB estimated,
  217 MB measured.
* public data sets (``public.py``, from the files' headers: IDX dimensions, the CIFAR batches' sizes, LEAF's
  "num_samples"): reading one file at a time holds its bytes (decompressed, decoded) and, for LEAF's JSON, the
  parser's objects (41 bytes a number, measured), counted twice since Python's allocator keeps those of the file
  before; then the records as read (uint8 pixels, float32 values or uint8 character ids, with int64 labels and writer
  ids) and their concatenation. Federating holds the per-client and per-split copies in the records' own type
  (float64 when standardised) and the padded float32 arrays (pixels scaled in place); afterwards those and the flat
  copy, the copies' memory counted as kept by the allocator. Each split is padded to its own largest client: natural
  clients' largest train and test shares come from the headers; a partition of the pooled records gives each client
  an equal share, whose part of the data set's own test split is taken 3 standard deviations above its mean either
  way. Measured (peak resident memory of the build and the flat copies, files written in the real formats): 70,000
  MNIST-sized images (gzipped IDX) over 100 clients, 541.5 MB estimated, 512.1 MB measured, over 1,000 clients
  581.4 MB and 558.1 MB; 60,000 CIFAR-10-sized images over 100 clients, 1.8 GB and 1.7 GB; FEMNIST of 150 writers
  (15,000 images, 3 + 3 files), 502.2 MB and 436.8 MB; Shakespeare of 200 roles (200,000 records), 208.9 MB and
  198.7 MB. A skewed partition (data.partition = 'dirichlet') pads more than estimated, as for files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpfl.data import stacked, synthetic
from dpfl.data.federated import TEST_FRACTION
from dpfl.data.files import shape_of
from dpfl.data.next_word import files_of as next_word_files
from dpfl.data.memory_limit import MemoryLimit, available_memory, size
from dpfl.data.public import NATURAL, PUBLIC
from dpfl.data.public import shape_of as public_shape_of
from dpfl.data.sources import SYNTHETIC_SAMPLES_PER_CLIENT
from dpfl.errors import ConfigError

#: Records, features and classes of the packaged data sets (scikit-learn's digits and breast cancer).
PACKAGED = {"digits": (1797, 64, 10), "breast_cancer": (569, 30, 2)}
HEADROOM = 0.9  # the share of the available memory the data may take
TOKEN_BYTES = 60  # a short Python str (49 bytes + its characters) and its pointer in a sentence's list
CSV_FIELD_BYTES = 72  # a short Python str (49 bytes + its characters), its pointer and its share of the row list


@dataclass(frozen=True)
class Footprint:
    """Peak bytes of building a config's data, and what it is made of (for the message)."""

    peak_bytes: int
    clients: int
    records_per_client: int
    features: int
    per_client_bytes: float  # the share of the peak that scales with the number of clients (synthetic)

    def describe(self) -> str:
        return (f"{self.clients:,} client{'s' if self.clients != 1 else ''} x {self.records_per_client:,} records x "
                f"{self.features} features: about {size(self.peak_bytes)} at its peak")


def data_footprint(data: dict) -> Footprint:
    """The estimate for a resolved config's [data] section (reads only file headers: ``files.shape_of``)."""
    name, spc = data["name"], data["samples_per_client"]
    test_fraction = data["test_fraction"] if data["test_fraction"] is not None else TEST_FRACTION
    if name == "synthetic":
        m, r = data["num_clients"], spc or SYNTHETIC_SAMPLES_PER_CLIENT
        f, c = synthetic.NUM_FEATURES, synthetic.NUM_CLASSES
        r_train = r * (1 - test_fraction)
        per_client = max(4 * r * f + 8 * r * c + 33 * r,  # generation
                         4 * r * f + 8 * r_train * f + 8 * r,  # unit norm and stacking
                         2 * (4 * f + 8) * r)  # the dataset and its flat copy
        return Footprint(int(m * per_client), m, r, f, per_client)
    if name in PUBLIC:
        return _public_footprint(data)
    if name == "next-word":
        return _next_word_footprint(data)
    if name == "clients":  # memory-mapped: the counts (and the labels, as they are checked) are read
        shape = stacked.shape_of(data["path"])
        m = shape["clients"]
        return Footprint(shape["held_bytes"] + 8 * m * shape["max_records"], m, shape["max_records"],
                         shape["features"], shape["held_bytes"] / max(m, 1) + 8 * shape["max_records"])
    if name in PACKAGED:
        n, f, _ = PACKAGED[name]
        file_bytes, sizes = 0, None
    else:
        shape = shape_of(data["path"], name)
        n, f, sizes = shape["records"], shape["features"], shape["client_sizes"]
        file_bytes = shape["records"] * f * shape["value_bytes"] + shape["fields"] * CSV_FIELD_BYTES
    m = len(sizes) if sizes is not None else (data["num_clients"] or 1)
    largest = int(max(sizes)) if sizes is not None and len(sizes) else math.ceil(n / max(m, 1))
    if spc is not None:
        largest, n = min(largest, spc), min(n, m * spc)
    copies = 4 if data["standardize"] != "none" else 3  # float64: x, per client, split (, standardised)
    padded = m * (largest + 1) * (4 * f + 8)  # train and test padded separately: at most one extra row
    flat = n * (4 * f + 8)
    labels = 8 * n * 4  # labels, their renumbering, per client and split (int64)
    peak = max(file_bytes + 8 * n * f * copies + labels + padded, padded + flat)
    return Footprint(int(peak), m, largest, f, peak / max(m, 1))


def _public_footprint(data: dict) -> Footprint:
    """A public data set's estimate (module docstring), from its files' headers (``public.shape_of``)."""
    shape = public_shape_of(data["name"], data["path"])
    n_all, f, spc = shape.records, shape.features, data["samples_per_client"]
    natural = data["name"] in NATURAL and data["partition"] in (None, "natural") and shape.client_sizes
    own_split = data["test_fraction"] is None and shape.test_records > 0
    if natural:
        m, cap = len(shape.client_sizes), spc or n_all
        largest = min(max(train + test for train, test in shape.client_sizes), cap)
        rows = (max(min(train, cap) for train, _ in shape.client_sizes) +
                max(min(test, cap) for _, test in shape.client_sizes)) if own_split else largest + 1
    else:
        m = data["num_clients"] or 1
        largest = min(math.ceil(n_all / m), spc or n_all)
        rows = largest + 1
        if own_split:  # each client's share of the test split varies: its largest train and test shares, 3 sd up
            p = shape.test_records / max(n_all, 1)
            rows += math.ceil(6 * math.sqrt(largest * p * (1 - p)))
    n = min(n_all, m * spc) if spc is not None else n_all
    records = n_all * (f * shape.value_bytes + shape.id_bytes)  # as read
    padded = m * rows * (4 * f + 8)  # train and test, each padded to its largest client
    flat = n * (4 * f + 8)
    standardised = data["standardize"] != "none"
    copies = (8 * 4 if standardised else 2 * shape.value_bytes) * n * f  # float64: x, per client, split, result
    ids = 2 * n_all * shape.id_bytes + 8 * n_all * 4  # sorted client ids; labels, renumbered, per client and split
    # the per-client copies are freed before the end, but Python's allocator may keep their memory
    peak = max(shape.parse_bytes + 2 * records,  # reading: the records so far, then their concatenation
               records + ids + copies + padded,  # federating
               copies + padded * (2 if data["scale"] != 1 else 1),  # data.scale: the tensors before and after
               copies + padded + flat)  # the dataset and the simulator's flat copy
    return Footprint(int(peak), m, largest, f, peak / max(m, 1))


def _next_word_footprint(data: dict) -> Footprint:
    """next-word's estimate from its files' sizes (``next_word.py``): a token takes at least 2 bytes of text (a
    character and a space), so at most B / 2 tokens and as many records; the sentences are kept as Python strings
    while the vocabulary is counted (``TOKEN_BYTES`` each), then each record is L float32 ids and an int64 label,
    stacked per client and copied flat for evaluation (clients taken equal: a skewed population pads more)."""
    paths, _ = next_word_files(data["path"])
    tokens = sum(p.stat().st_size for p in paths) // 2
    record = 4 * data["sequence_length"] + 8
    m = data["num_clients"] or 1
    peak = tokens * TOKEN_BYTES + 3 * tokens * record
    return Footprint(int(peak), m, math.ceil(tokens / m), data["sequence_length"], peak / m)


def check_data_memory(data: dict, limit: MemoryLimit | None = None) -> Footprint:
    """Refuses (ConfigError naming the knob to change, with the estimate and the memory limit that applied) a [data]
    config whose build would take more than HEADROOM of the memory ``limit`` leaves (default:
    ``memory_limit.available_memory()``, the least of the machine's free memory, the process's cgroup and RLIMIT_AS;
    the packaged sets are far below any machine; the knob of a synthetic set is the number of clients or their
    records, that of a file or a public data set the records kept per client); returns the estimate otherwise."""
    footprint = data_footprint(data)
    limit = available_memory() if limit is None else limit
    available = limit.available
    if footprint.peak_bytes <= HEADROOM * available:
        return footprint
    need = (f"building the data needs {footprint.describe()}, and this process has {limit_text(limit)}, "
            f"{HEADROOM:.0%} of it for the data")
    if data["name"] == "synthetic":
        fit = int(HEADROOM * available // footprint.per_client_bytes)
        raise ConfigError("data.num_clients", data["num_clients"],
                          f"at most {fit:,} clients of {footprint.records_per_client:,} records ({need}); lower "
                          "data.num_clients or data.samples_per_client")
    field, value = ("data.path", data["path"]) if data["path"] else ("data.name", data["name"])
    smaller = "a subset of the data set's files" if data["name"] in PUBLIC else "a smaller file"
    raise ConfigError(field, value, f"a data set that fits in memory ({need}); lower data.samples_per_client (records "
                                    f"kept per client), or use {smaller}")


def limit_text(limit: MemoryLimit) -> str:
    """The memory left and the limit that leaves it: "1.0 GB available (cgroup v2 memory.max = ...)"."""
    return f"{size(limit.available)} available ({limit.source})"


__all__ = ["HEADROOM", "Footprint", "data_footprint", "available_memory", "check_data_memory", "limit_text", "size"]
