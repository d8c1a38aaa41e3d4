"""The public data sets of the papers, read from their published files in a local folder, and federated.

===================  =================================  ===========================  ===============
data.name            format (reader)                    records, classes             natural clients
===================  =================================  ===========================  ===============
``mnist``            IDX (``idx.py``)                   [1, 28, 28] pixels, 10       none
``fashion_mnist``    IDX (``idx.py``)                   [1, 28, 28] pixels, 10       none
``emnist_balanced``  IDX (``idx.py``)                   [1, 28, 28] pixels, 47       none
``femnist``          LEAF JSON (``leaf.py``)            [1, 28, 28] in [0, 1], 62    writers
``cifar10``          python batches (``cifar.py``)      [3, 32, 32] pixels, 10       none
``shakespeare``      LEAF JSON (``leaf.py``)            [80] character ids, 81       speaking roles
===================  =================================  ===========================  ===============

The files are read from one folder (``library.folder_of``): data.path, else $DPFL_DATA/<data.name>, else
~/.dpfl/data/<data.name>.

Federating (``pooled.federate``): the clients are the natural ones where the data set has them and data.partition is
unset or "natural"; otherwise data.partition (default "iid", e.g. "k_labels", "dirichlet") divides the pooled records
of both splits over data.num_clients. The data set's own split is kept (each client's test records are those of the
official test files that it holds) unless data.test_fraction is set, which splits each client's records at random
instead. The classes are the data set's (10 digits even when a small file holds 3 of them). 8-bit pixels are scaled
to [0, 1] by the public constant 1/255 (recorded in the data's preprocessing; no statistic of the data is used).
"""

from __future__ import annotations

from types import ModuleType

from dpfl.data import cifar, idx, leaf
from dpfl.data.federated import FederatedDataset
from dpfl.data.library import PublicSet, Shape, folder_of
from dpfl.data.partition import PARTITIONS
from dpfl.data.pooled import federate
from dpfl.errors import ConfigError

_DIGITS = tuple(str(d) for d in range(10))
_UPPER = tuple(chr(c) for c in range(ord("A"), ord("Z") + 1))
_LOWER = tuple(chr(c) for c in range(ord("a"), ord("z") + 1))
_LEAF = ("the LEAF benchmark (github.com/TalwalkarLab/leaf): its data/{0}/preprocess.sh with -t sample writes them "
         "to data/{0}/data")

#: data.name -> (the data set, the module reading its format)
CATALOGUE: dict[str, tuple[PublicSet, ModuleType]] = {
    "mnist": (PublicSet(
        "mnist", "MNIST", "Y. LeCun, C. Cortes and C. Burges's MNIST database of handwritten digits "
                          "(yann.lecun.com/exdb/mnist)", _DIGITS), idx),
    "fashion_mnist": (PublicSet(
        "fashion_mnist", "Fashion-MNIST", "Zalando Research's Fashion-MNIST repository "
                                          "(github.com/zalandoresearch/fashion-mnist, data/fashion)",
        ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")),
        idx),
    "emnist_balanced": (PublicSet(
        "emnist_balanced", "EMNIST-balanced", "NIST's EMNIST page (www.nist.gov/itl/products-and-services/"
                                              "emnist-dataset): the binary format, gzip.zip, unpacked",
        (*_DIGITS, *_UPPER, *"abdefghnqrt")), idx),
    "femnist": (PublicSet(
        "femnist", "FEMNIST", _LEAF.format("femnist"),
        (*_DIGITS, *_UPPER, *_LOWER), natural=True), leaf),
    "cifar10": (PublicSet(
        "cifar10", "CIFAR-10", "A. Krizhevsky's CIFAR page at the University of Toronto (www.cs.toronto.edu/~kriz/"
                               "cifar.html): the CIFAR-10 python version, cifar-10-python.tar.gz, unpacked",
        ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")), cifar),
    "shakespeare": (PublicSet(
        "shakespeare", "Shakespeare", _LEAF.format("shakespeare"), (*leaf.ALPHABET, "other"), natural=True), leaf),
}
PUBLIC = tuple(CATALOGUE)
NATURAL = tuple(name for name, (spec, _) in CATALOGUE.items() if spec.natural)


def _spec(name: str) -> tuple[PublicSet, ModuleType]:
    if name not in CATALOGUE:
        raise ConfigError("data.name", name, f"one of {PUBLIC}")
    return CATALOGUE[name]


def build_public(name: str, path: str | None = None, *, partition: str | None = None, test_fraction=None,
                 **options) -> FederatedDataset:
    """The federated data set ``name`` (module docstring), read from ``path`` (data.path) or the data root.
    ``options`` are those of ``pooled.federate`` (num_clients, partition_param, samples_per_client, seed,
    standardize_scope, label_map)."""
    spec, reader = _spec(name)
    if partition == "natural" and not spec.natural:
        raise ConfigError("data.partition", partition,
                          f"one of {PARTITIONS} (or none: 'iid'): {spec.title} has no natural clients (those with "
                          f"writers: {list(NATURAL)})")
    if partition not in (None, "natural") and partition not in PARTITIONS:
        raise ConfigError("data.partition", partition, f"one of {PARTITIONS}"
                                                       + (" or 'natural' (its writers)" if spec.natural else ""))
    folder, why = folder_of(spec, path)
    records = reader.load(spec, folder, why)
    natural = records.writers is not None and partition in (None, "natural")
    test = records.test if test_fraction is None else None
    source = {"name": name, "title": spec.title, "path": str(folder), "files": records.files,
              "split": "the data set's own" if test is not None else "random per client (data.test_fraction)",
              **records.details}
    return federate(records.x, records.y, name=name, partition=None if natural else partition,
                    client_ids=records.writers if natural else None, test_mask=test, test_fraction=test_fraction,
                    classes=spec.classes, source=source, scale=records.pixel_scale, **options)


def shape_of(name: str, path: str | None = None) -> Shape:
    """What a memory estimate needs of the data set ``name`` (``library.Shape``), from its files' headers."""
    spec, reader = _spec(name)
    folder, why = folder_of(spec, path)
    return reader.shape_of(spec, folder, why)


__all__ = ["CATALOGUE", "PUBLIC", "NATURAL", "build_public", "shape_of"]
