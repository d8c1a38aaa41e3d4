"""Named datasets and user files, turned into federated datasets; ``build_dataset`` maps the config's ``data.*``.

* ``synthetic``: Li et al. 2020 (FedProx) (alpha, beta) data, one generated user per client (``synthetic.py``).
* ``digits``: scikit-learn's 8x8 handwritten digits (1,797 records, 64 features, 10 classes).
* ``breast_cancer``: scikit-learn's Wisconsin diagnostic breast cancer (569 records, 30 features, 2 classes).
* ``npz`` / ``csv``: the user's own records (``files.py``), partitioned by a scheme of ``partition.py`` or naturally
  by a client-id array / column, split at random or as the file marks it.
* ``mnist``, ``fashion_mnist``, ``femnist``, ``cifar10``, ``shakespeare``: the papers' public data sets, read from
  their published files in a local folder, never downloaded (``public.py``).
* ``next-word``: per-user text in JSON lines (data.path), one client per user, next-word records over a vocabulary
  of the most frequent words (``next_word.py``).
* ``clients``: a folder of stacked client arrays that ``dpfl.data.stacked.save`` wrote (data.path), memory-mapped
  (``stacked.py``): its clients, split and preprocessing are those it was written with.
* ``arrays``: records a Python caller hands ``dpfl.run(config, data=...)`` (``files.federate_arrays``, like an npz's
  arrays); a config alone cannot name them, so ``build_dataset`` refuses it.

Pooled records go through ``pooled.federate``: partition over clients -> optional per-client subsample to exactly
``samples_per_client`` records (label proportions kept) -> per-client train/test split -> optional standardisation
with training statistics (see ``preprocess.py``).
"""

from __future__ import annotations

from sklearn import datasets as sklearn_datasets

from dpfl.data.federated import TEST_FRACTION, FederatedDataset
from dpfl.data.files import load_csv, load_npz
from dpfl.data.next_word import SEQUENCE_LENGTH, VOCABULARY, build_next_word
from dpfl.data.pooled import check_common, federate, require_natural
from dpfl.data.preprocess import rescale
from dpfl.data.public import NATURAL, PUBLIC, build_public
from dpfl.data.stacked import load as load_stacked
from dpfl.data.synthetic import synthetic_dataset
from dpfl.errors import ConfigError, check_range

DATASETS = ("synthetic", "digits", "breast_cancer", "npz", "csv", *PUBLIC, "next-word", "clients", "arrays")
#: Sources whose records may come with their clients (then data.num_clients may be left unset).
OWN_CLIENTS = ("npz", "csv", "clients", "arrays", "next-word", *NATURAL)
SYNTHETIC_SAMPLES_PER_CLIENT = 5000  # R of DP-SCAFFOLD's synthetic experiments (Noble et al. 2022)
_SKLEARN_LOADERS = {"digits": sklearn_datasets.load_digits, "breast_cancer": sklearn_datasets.load_breast_cancer}
#: data.scale left unset, for the sources whose raw features are far from unit scale: a public constant fixed from
#: the data set's documentation, never from its records. Wisconsin diagnostic breast cancer (Street, Wolberg and
#: Mangasarian 1993; scikit-learn's description lists each feature's range): its largest feature, "worst area", runs
#: up to 4,254, so 1e-3 brings every feature within [0, 4.3]; the unscaled features diverge at the local-SGD families'
#: default step (dp-fedavg, logistic regression, 100 clients: train loss 16.5 untrained, then 7.4 / 26 / 33.5).
PUBLIC_SCALE = {"breast_cancer": 1e-3}


def default_scale(name: str, standardize: str = "none") -> float:
    """data.scale when the config leaves it unset: ``PUBLIC_SCALE`` for a source whose raw features it names, 1 for
    every other source and for standardised features (already of unit scale). It depends on the config alone, not on
    the records, so the scaled features are as private as the raw ones (``preprocess.rescale``)."""
    return PUBLIC_SCALE.get(name, 1.0) if standardize == "none" else 1.0


def build_dataset(
    name: str,
    *,
    num_clients: int | None,
    samples_per_client: int | None = None,
    alpha: float = 0.0,
    beta: float = 0.0,
    partition: str | None = None,
    partition_param: float | None = None,
    seed: int = 0,
    test_fraction: float | None = None,
    standardize: str = "none",
    path: str | None = None,
    label_column: str = "label",
    client_column: str | None = None,
    split_column: str | None = None,
    scale: float | None = None,
    labels: str = "original",
    bounds=None,
    vocabulary: int = VOCABULARY,
    sequence_length: int = SEQUENCE_LENGTH,
) -> FederatedDataset:
    """The federated dataset a config's ``data.*`` keys describe.

    ``synthetic`` uses alpha, beta and samples_per_client (default 5000, DP-SCAFFOLD's R); its partition is natural
    (one generated user per client), so ``partition`` must be None or "natural". ``digits`` and ``breast_cancer``
    are partitioned by ``partition`` (default "iid") over ``num_clients`` clients; ``samples_per_client`` (default:
    every record of the client's share) trims each client to exactly that many records. ``standardize`` is the
    scope of feature standardisation: "none" (default: no statistic shared between records, so nothing escapes the
    privacy analysis), "client" or "pooled" (both NON-PRIVATE: statistics of the data are used without noise) (see
    ``preprocess.py``). ``labels`` maps the classes after the partition ("original" or "parity": even class
    number = 1, odd = 0; ``pooled.map_labels``). ``npz`` and ``csv`` read the file at ``path`` (``files.py``; csv: ``label_column``,
    ``client_column``, ``split_column``): partitioned like the packaged sets unless the file names each record's
    client, split by ``test_fraction`` (default 0.2) unless it marks each record train or test; ``bounds``
    (``data.bounds``: public [low, high] per feature) clips and maps their features onto [-1, 1] before anything else,
    and without bounds, scale or standardisation a warning names the features far from unit scale
    (``files.bounded``). Last, every feature is multiplied by ``scale``, a public constant (``preprocess.rescale``;
    None: ``default_scale``, 1e-3 for breast_cancer's raw features, else 1).
    The public data sets (``public.py``) are read from the folder ``path`` (default: ``$DPFL_DATA/<name>``, else
    ``~/.dpfl/data/<name>``), partitioned like the packaged sets or by their writers, their own split kept unless
    ``test_fraction`` is given. ``next-word`` reads the JSON lines at ``path``, one client per user, its sentences
    split by ``test_fraction`` (``next_word.py``: ``vocabulary`` words kept, records of ``sequence_length`` tokens).
    """
    if name not in DATASETS:
        raise ConfigError("data.name", name, f"one of {DATASETS}")
    if name == "arrays":
        raise ConfigError("data.name", name, "a source a config can name: 'arrays' stands for records handed to "
                                             "dpfl.run(config, data=(x, y)) in Python; a file is data.name = 'npz' or "
                                             "'csv' with data.path")
    scale = default_scale(name, standardize) if scale is None else scale
    check_range("data.scale", scale, 0.0, float("inf"), low_open=True, high_open=True)
    if num_clients is not None or name not in OWN_CLIENTS:
        check_range("data.num_clients", num_clients, 1, integer=True)
    if name == "synthetic":
        check_range("data.alpha", alpha, 0, float("inf"), high_open=True)
        check_range("data.beta", beta, 0, float("inf"), high_open=True)
        require_natural(partition, partition_param, "for data.name = 'synthetic': each generated user is a client")
        if labels != "original":
            raise ConfigError("data.labels", labels, "'original' for data.name = 'synthetic'")
        samples_per_client, seed = check_common(samples_per_client, seed, test_fraction, standardize)
        return rescale(synthetic_dataset(
            int(num_clients),
            samples_per_client or SYNTHETIC_SAMPLES_PER_CLIENT,
            alpha,
            beta,
            seed=seed,
            test_fraction=TEST_FRACTION if test_fraction is None else test_fraction,
            standardize_scope=standardize,
        ), scale)
    if name == "next-word":
        fixed = {"data.samples_per_client": (samples_per_client, None), "data.standardize": (standardize, "none"),
                 "data.scale": (scale, 1.0)}
        for field, (value, default) in fixed.items():
            if value != default:
                raise ConfigError(field, value, f"{default!r} for data.name = 'next-word' (its records are token ids "
                                                "of each user's sentences, one client per user)")
        return build_next_word(path, vocabulary=vocabulary, sequence_length=sequence_length, num_clients=num_clients,
                               test_fraction=test_fraction, seed=seed)
    if name == "clients":
        return _stored(path, num_clients, samples_per_client, test_fraction, standardize, scale)
    if bounds is not None and name not in ("npz", "csv"):
        raise ConfigError("data.bounds", bounds, f"None for data.name = {name!r} (bounds apply to npz / csv features)")
    for field, value in (("data.alpha", alpha), ("data.beta", beta)):
        if value != 0:
            raise ConfigError(field, value, f"0 for data.name = {name!r} (alpha and beta only shape 'synthetic')")
    options = dict(num_clients=num_clients, partition=partition, partition_param=partition_param,
                   samples_per_client=samples_per_client, seed=seed, test_fraction=test_fraction,
                   standardize_scope=standardize, label_map=labels)
    if name in PUBLIC:
        return rescale(build_public(name, path, **options), scale)
    if name in ("npz", "csv"):
        if not path:
            raise ConfigError("data.path", path, f"the path of the {name} file (data.name = {name!r})")
        own = dict(bounds=bounds, check_scale=scale == 1 and standardize == "none")
        if name == "npz":
            return rescale(load_npz(path, **own, **options), scale)
        return rescale(load_csv(path, label_column, client_column, split_column, **own, **options), scale)
    bunch = _SKLEARN_LOADERS[name]()
    source = {"name": name, "provider": f"sklearn.datasets.load_{name}", "num_records": len(bunch.target)}
    return rescale(federate(bunch.data, bunch.target, name=name, source=source, **options), scale)


def _stored(path, num_clients, samples_per_client, test_fraction, standardize, scale) -> FederatedDataset:
    """data.name = "clients": the folder at data.path as it was written (the config refuses the keys that do not
    apply to it); the keys that would rebuild the data must keep their defaults."""
    if not path:
        raise ConfigError("data.path", path, "the folder of stacked client arrays (data.name = 'clients')")
    fixed = {"data.samples_per_client": (samples_per_client, None), "data.test_fraction": (test_fraction, None),
             "data.standardize": (standardize, "none"), "data.scale": (scale, 1.0)}
    for field, (value, default) in fixed.items():
        if value != default:
            raise ConfigError(field, value, f"{default!r} for data.name = 'clients' (the folder fixes the clients, "
                                            "their records, split and preprocessing: write another folder to change "
                                            "it)")
    dataset = load_stacked(path)
    if num_clients is not None and num_clients != dataset.num_clients:
        raise ConfigError("data.num_clients", num_clients, f"unset or {dataset.num_clients}, the clients of the folder "
                                                           f"{path}")
    return dataset


__all__ = ["DATASETS", "OWN_CLIENTS", "SYNTHETIC_SAMPLES_PER_CLIENT", "PUBLIC_SCALE", "default_scale", "build_dataset",
           "load_npz", "load_csv"]
