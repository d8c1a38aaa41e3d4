"""Federated data: per-client arrays stacked on a leading client axis, generators, partitions and loaders.

``build_dataset`` is what a config's ``data.*`` keys map to; ``load_npz`` / ``load_csv`` federate the user's own files
(``files.py``), ``build_public`` the papers' public data sets from their published files in a local folder
(``public.py``: IDX, CIFAR-10's python batches, LEAF's JSON), ``federate`` any pooled records (``pooled.py``);
``stacked`` writes a federated data set as a folder of client arrays and maps it back (populations past memory).
"""

from dpfl.data.federated import ClientArrays, FederatedDataset, split_clients
from dpfl.data.files import load_csv, load_npz
from dpfl.data.partition import PARTITIONS, partition, stratified_subsample
from dpfl.data.pooled import federate
from dpfl.data.public import PUBLIC, build_public
from dpfl.data.sources import DATASETS, build_dataset
from dpfl.data.synthetic import generate_synthetic, synthetic_dataset

__all__ = [
    "ClientArrays",
    "FederatedDataset",
    "split_clients",
    "PARTITIONS",
    "partition",
    "stratified_subsample",
    "DATASETS",
    "build_dataset",
    "federate",
    "PUBLIC",
    "build_public",
    "load_csv",
    "load_npz",
    "generate_synthetic",
    "synthetic_dataset",
]
