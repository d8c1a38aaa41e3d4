"""The federation's public metadata: what the ServerApp builds a run from instead of the data.

On Flower the records stay on the silos. What the server needs of them is metadata that the analysis treats as
public, as ``dpfl run`` does: the number of clients M, the number of classes C (the labels' shared numbering), the
feature shape, and each client's number of training records n_i (the ledger's sampling ratios, delta's default, the
algorithm's weights). `dpfl flower-app` writes M, C and the feature shape as the [data] section of the config the
app carries (``Federation.section``: data.name = "silos", no path); the ServerApp asks every node for its count
before round 1 and adds the counts to that section (``with_counts``), so the release config commits to them: its
sha256 names the run in run.json, a resume with other counts is refused, and each silo derives its noise key from it
(``silo_state``). Each silo refuses a train message whose release config names other counts, another feature shape
or fewer classes than its own records have (``check_silo``), before it draws any noise.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from dpfl.data import ClientArrays, FederatedDataset
from dpfl.errors import ConfigError
from dpfl.flower.silo import Silo
from dpfl.flower.silo_state import SiloStateError

#: data.name of the config a Flower App carries: the records are the silos'.
SOURCE = "silos"


@dataclass(frozen=True)
class Federation:
    """M clients, C classes, the features' shape: the public metadata the app's config holds."""

    num_clients: int
    num_classes: int
    feature_shape: tuple[int, ...]

    @classmethod
    def of_dataset(cls, dataset: FederatedDataset) -> "Federation":
        """The metadata of a federated data set (a rehearsal: `dpfl flower-app` on a machine holding the data)."""
        return cls(dataset.num_clients, dataset.num_classes, tuple(dataset.train.feature_shape))

    @classmethod
    def of_config(cls, config: dict) -> "Federation":
        """The metadata of the config a Flower App carries; ConfigError for any other [data] section (a config that
        names data the ServerApp would have to read)."""
        data = config["data"]
        if data.get("name") != SOURCE:
            raise ConfigError("data.name", data.get("name"), f"{SOURCE!r} in the config a Flower App carries (its "
                                                             "[data] is the federation's public metadata, written by "
                                                             "`dpfl flower-app`: the ServerApp reads no records); "
                                                             "regenerate the app with `dpfl flower-app`")
        return cls(int(data["num_clients"]), int(data["num_classes"]), tuple(int(n) for n in data["feature_shape"]))

    def section(self) -> dict:
        """The [data] section of the config a Flower App carries."""
        return {"name": SOURCE, "num_clients": self.num_clients, "num_classes": self.num_classes,
                "feature_shape": list(self.feature_shape)}

    def dataset(self, counts: list[int], info: dict) -> FederatedDataset:
        """The run's data as the server knows it: the clients' record counts and shapes, no records (the arrays are on
        torch's meta device: their shapes size the memory estimate, reading them fails); no test records."""
        def arrays(records: int) -> ClientArrays:
            return ClientArrays(torch.empty((self.num_clients, records, *self.feature_shape), device="meta"),
                                torch.empty((self.num_clients, records), dtype=torch.int64, device="meta"),
                                torch.tensor(counts, dtype=torch.int64) if records else
                                torch.zeros(self.num_clients, dtype=torch.int64))

        return FederatedDataset(arrays(max(counts)), arrays(0), self.num_classes, SOURCE, info)


def with_counts(config: dict, counts: list[int]) -> dict:
    """``config`` (a Flower App's) with the clients' training record counts in its [data] section: the release
    config, and so the run's identity, commits to them."""
    counted = copy.deepcopy(config)
    counted["data"]["train_counts"] = [int(n) for n in counts]
    return counted


def check_silo(config: dict, setting: dict, client: int, silo: Silo) -> None:
    """SiloStateError unless the run's release config (and the ``registry.Setting`` built from it) describes this
    silo's records: its count of training records, its feature shape, labels below the number of classes. A ledger
    computed from another count charges another sampling ratio than this silo's records have."""
    data, own = config["data"], int(silo.y.numel())
    counts = data.get("train_counts")
    if counts is None or not 0 <= client < len(counts) or int(counts[client]) != own:
        said = "none" if counts is None or not 0 <= client < len(counts) else counts[client]
        raise SiloStateError(f"the run's release config gives client {client} {said} training records; this silo holds "
                             f"{own}: refused (the privacy ledger would be computed from counts other than its own)")
    if list(setting.get("train_counts", ())) != list(counts):
        raise SiloStateError("the train message's setting names other record counts than its release config: refused")
    if math.prod(data["feature_shape"]) != silo.x[0].numel():
        raise SiloStateError(f"the run's release config gives the features the shape {data['feature_shape']}; this "
                             f"silo's records have {list(silo.x.shape[1:])}: refused")
    if int(silo.y.max()) >= int(data["num_classes"]) or int(silo.y.min()) < 0:
        raise SiloStateError(f"the run's release config has {data['num_classes']} classes; this silo's labels range "
                             f"over {int(silo.y.min())}..{int(silo.y.max())}: refused")


__all__ = ["SOURCE", "Federation", "with_counts", "check_silo"]
