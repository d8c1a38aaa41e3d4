"""Feature preprocessing of per-client arrays: standardisation and unit L2 norm (Noble et al. 2022, Experiments),
public per-feature bounds (``data.bounds``) and a public scale (``data.scale``).

The default everywhere is ``scope="none"``: no statistic is shared between records, so the privacy analysis of a run
covers everything (per-record operations such as the unit L2 norm are private by construction). Standardisation is
NOT differentially private: its statistics are computed exactly from the data, so it is an explicit option. With
``scope="client"`` each client standardises with the mean and standard deviation of its OWN training split, which
any silo may do with its own records and which releases nothing to other silos or the server (the test split is
transformed with the training statistics, never used to compute them). ``scope="pooled"`` uses the statistics of
all clients' training splits together, as a centralised pipeline would: convenient for comparisons, but it assumes
a trusted party saw every silo's data, so runs using it are not federated end to end.
``scope="noble2022-minmax"`` is what Noble et al. (2022)'s public code does where the paper says "standardised"
(``noble2022_minmax``): a per-client min-max rescaling whose bounds come from the client's own training records,
like ``"client"``, and releases nothing either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dpfl.data.federated import FederatedDataset
from dpfl.errors import ConfigError, check_range

STANDARDIZE_SCOPES = ("client", "pooled", "none", "noble2022-minmax")


def _moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Feature-wise mean and standard deviation over records; constant features get scale 1 (left centred)."""
    if len(x) == 0:
        return np.zeros(x.shape[1:]), np.ones(x.shape[1:])
    mean, std = x.mean(axis=0), x.std(axis=0)
    return mean, np.where(std > 0, std, 1.0)


def standardize(
    train_xs: Sequence[np.ndarray], test_xs: Sequence[np.ndarray], scope: str = "client"
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Centres and scales every feature with training statistics (per client, pooled, or not at all)."""
    if scope not in STANDARDIZE_SCOPES:
        raise ConfigError("data.standardize", scope, f"one of {STANDARDIZE_SCOPES}")
    if scope == "none":
        return list(train_xs), list(test_xs)
    if scope == "noble2022-minmax":
        pairs = [noble2022_minmax(train, test) for train, test in zip(train_xs, test_xs)]
        return [train for train, _ in pairs], [test for _, test in pairs]
    if scope == "pooled":
        moments = [_moments(np.concatenate(train_xs))] * len(train_xs)
    else:
        moments = [_moments(x) for x in train_xs]
    return (
        [(x - mean) / std for x, (mean, std) in zip(train_xs, moments)],
        [(x - mean) / std for x, (mean, std) in zip(test_xs, moments)],
    )


def noble2022_minmax(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One client's features as Noble et al. (2022)'s public code rescales them before the unit L2 norm (its synthetic
    generator, option ``standardize``): feature j becomes (x_j - lo_j) / (hi_j - lo_j) in both splits, for j = 1..d in
    turn, where lo_j and hi_j are the smallest and largest entry of the j-th TRAINING RECORD (not of feature j: the
    code indexes a record where a column was meant), read after features 1..j-1 were rescaled (the code rescales the
    records in place). The result is an affine map per feature with bounds from d records of the client: all
    features near [0, 1], none centred. Needs at least d training records; a record of equal entries keeps its
    feature unscaled (its range would be 0)."""
    train, test = np.array(train, dtype=np.float64), np.array(test, dtype=np.float64)
    if train.ndim != 2 or len(train) < train.shape[1]:
        raise ConfigError("data.standardize", "noble2022-minmax",
                          f"'client' or 'none' here: it needs at least as many training records per client as "
                          f"features ({train.shape[1:]}), and this client has {len(train)}")
    for j in range(train.shape[1]):
        low, high = train[j].min(), train[j].max()
        span = high - low if high > low else 1.0
        train[:, j] = (train[:, j] - low) / span
        test[:, j] = (test[:, j] - low) / span
    return train, test


def unit_norm(x: np.ndarray) -> np.ndarray:
    """Scales each record (first axis) to unit L2 norm over all its features; all-zero records stay zero."""
    norms = np.sqrt(np.sum(np.square(x), axis=tuple(range(1, x.ndim)), keepdims=True))
    return x / np.where(norms > 0, norms, 1.0)


def rescale(dataset: FederatedDataset, scale: float) -> FederatedDataset:
    """Every feature of both splits times ``scale`` (``data.scale``), a public constant such as 1/16 for digits'
    pixels 0..16 (Zhou et al. 2021's MNIST pixels in [0, 1]). It is chosen without looking at any record, so, unlike
    standardisation, it is private by construction. ``scale = 1`` returns ``dataset`` as it is."""
    scale = check_range("data.scale", scale, 0.0, float("inf"), low_open=True, high_open=True)
    if scale == 1:
        return dataset
    train, test = (dataclasses.replace(split, x=split.x * scale) for split in (dataset.train, dataset.test))
    info = {**dataset.info, "preprocessing": [*dataset.info.get("preprocessing", []), describe_scale(scale)]}
    return dataclasses.replace(dataset, train=train, test=test, info=info)


def describe_scale(factor: float) -> dict:
    """The provenance entry of a multiplication by a public constant (for FederatedDataset.info)."""
    return {"step": "scale", "factor": factor, "private": True}
#: ``data.bounds`` maps each bounded feature onto this interval.
BOUNDED_RANGE = (-1.0, 1.0)
#: A feature whose largest absolute value exceeds this is "far from unit scale" (``far_from_unit_scale``).
FAR_FROM_UNIT = 10.0


def feature_bounds(bounds, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``data.bounds`` as (low, high) arrays over the features ``names`` (NaN: a feature left as it is). ``bounds``
    is a table {column: [low, high]} naming some of the columns (a csv's header names; an npz's features are "0",
    "1", ...), a list of one [low, high] per feature, or one [low, high] for every feature; every bound is a finite
    number and low < high. ConfigError naming data.bounds otherwise."""
    low, high = np.full(len(names), np.nan), np.full(len(names), np.nan)

    def pair(where: str, value) -> tuple[float, float]:
        if not (isinstance(value, (list, tuple)) and len(value) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in value)
                and value[0] < value[1]):
            raise ConfigError(f"data.bounds{where}", value, "[low, high]: two finite numbers with low < high")
        return float(value[0]), float(value[1])

    if isinstance(bounds, dict):
        unknown = [k for k in bounds if k not in names]
        if unknown:
            raise ConfigError("data.bounds", {unknown[0]: bounds[unknown[0]]},
                              f"bounds for feature columns of the data: {names[:20]}"
                              + (f" and {len(names) - 20} more" if len(names) > 20 else ""))
        for name, value in bounds.items():
            j = names.index(name)
            low[j], high[j] = pair(f".{name}", value)
    elif isinstance(bounds, (list, tuple)) and bounds and all(isinstance(b, (list, tuple)) for b in bounds):
        if len(bounds) != len(names):
            raise ConfigError("data.bounds", bounds, f"one [low, high] per feature ({len(names)}), or one [low, high] "
                                                     "for every feature, or a table {column = [low, high]}")
        for j, value in enumerate(bounds):
            low[j], high[j] = pair(f"[{j}]", value)
    else:
        low[:], high[:] = pair("", bounds)
    return low, high


def bound_features(x: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Each bounded feature (finite ``low``, ``high``) clipped to [low, high], then mapped affinely onto
    ``BOUNDED_RANGE`` = [-1, 1] (low -> -1, high -> 1); the others as they are. ``x`` is [N, features...] with
    features flattened in C order. The bounds are public constants, chosen without looking at any record, so the
    transformation is per record and private by construction (unlike standardisation)."""
    flat = x.reshape(len(x), -1).astype(np.float64, copy=True)
    bounded = np.isfinite(low)
    lo, hi = low[bounded], high[bounded]
    a, b = BOUNDED_RANGE
    flat[:, bounded] = a + (b - a) * (np.clip(flat[:, bounded], lo, hi) - lo) / (hi - lo)
    return flat.reshape(x.shape)


def describe_bounds(low: np.ndarray, high: np.ndarray, names: list[str]) -> dict:
    """The provenance entry of a ``data.bounds`` step (for FederatedDataset.info)."""
    return {"step": "bounds", "range": list(BOUNDED_RANGE), "private": True, "clipped": True,
            "bounds": {n: [float(lo), float(hi)] for n, lo, hi in zip(names, low, high) if np.isfinite(lo)}}


def far_from_unit_scale(x: np.ndarray, names: list[str]) -> dict[str, float]:
    """{feature name: largest |value|} of the features whose largest absolute value exceeds ``FAR_FROM_UNIT``, largest
    first (a local diagnostic of the user's own records: it is printed to them and released nowhere)."""
    flat = np.abs(x.reshape(len(x), -1))
    largest = flat.max(axis=0) if len(flat) else np.zeros(flat.shape[1])
    far = {names[j]: float(largest[j]) for j in np.flatnonzero(largest > FAR_FROM_UNIT)}
    return dict(sorted(far.items(), key=lambda item: -item[1]))


def describe_standardize(scope: str) -> dict:
    """The provenance entry of a standardisation step (for FederatedDataset.info)."""
    statistics = {
        "client": "mean and std of the client's own training split",
        "pooled": "mean and std of all clients' training splits together (crosses silos)",
        "none": "not standardised",
        "noble2022-minmax": "min-max per feature with bounds read from the client's own training records (Noble "
                            "et al. 2022's code)",
    }[scope]
    return {"step": "standardize", "scope": scope, "statistics": statistics, "private": scope == "none"}


__all__ = ["STANDARDIZE_SCOPES", "BOUNDED_RANGE", "FAR_FROM_UNIT", "standardize", "noble2022_minmax", "unit_norm",
           "rescale",
           "describe_scale", "describe_standardize", "feature_bounds", "bound_features", "describe_bounds",
           "far_from_unit_scale"]
