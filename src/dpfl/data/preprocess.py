"""Feature preprocessing of per-client arrays: standardisation and unit L2 norm (Noble et al. 2022, Experiments).

The default everywhere is ``scope="none"``: no statistic is shared between records, so the privacy analysis of a run
covers everything (per-record operations such as the unit L2 norm are private by construction). Standardisation is
NOT differentially private: its statistics are computed exactly from the data, so it is an explicit option. With
``scope="client"`` each client standardises with the mean and standard deviation of its OWN training split, which
any silo may do with its own records and which releases nothing to other silos or the server (the test split is
transformed with the training statistics, never used to compute them). ``scope="pooled"`` uses the statistics of
all clients' training splits together, as a centralised pipeline would: convenient for comparisons, but it assumes
a trusted party saw every silo's data, so runs using it are not federated end to end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dpfl.data.federated import FederatedDataset
from dpfl.errors import ConfigError, check_range

STANDARDIZE_SCOPES = ("client", "pooled", "none")


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
    if scope == "pooled":
        moments = [_moments(np.concatenate(train_xs))] * len(train_xs)
    else:
        moments = [_moments(x) for x in train_xs]
    return (
        [(x - mean) / std for x, (mean, std) in zip(train_xs, moments)],
        [(x - mean) / std for x, (mean, std) in zip(test_xs, moments)],
    )


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


def describe_standardize(scope: str) -> dict:
    """The provenance entry of a standardisation step (for FederatedDataset.info)."""
    statistics = {
        "client": "mean and std of the client's own training split",
        "pooled": "mean and std of all clients' training splits together (crosses silos)",
        "none": "not standardised",
    }[scope]
    return {"step": "standardize", "scope": scope, "statistics": statistics, "private": scope == "none"}


__all__ = ["STANDARDIZE_SCOPES", "standardize", "unit_norm", "rescale", "describe_scale", "describe_standardize"]
