"""Where a Flower run's model is evaluated (``Simulation.evaluator``): its server holds no training records.

The run config's ``evaluation`` (`dpfl flower-app --evaluation`) chooses:

* "none" (the default): no metrics; every evaluated round's train_loss and test_accuracy are null in results.json.
* the path of an .npz or .csv file in a silo file's format (its "test" records, or all of them without a split
  column: ``silo.load_records``) that the server is allowed to hold: each model's test accuracy on it, computed on
  the server; train_loss is null (the server holds no training records). A function of the released model and of
  records outside the federation: as far as the silos' records are concerned, epsilon covers it (post-processing).
* "federated": each silo computes the model's loss on its own training records and its accuracy on its own test
  records (its silo file's "test" split), and sends them to the server in the clear, without noise; the server reports
  their record-weighted means. NOT COVERED BY EPSILON: they are functions of the silos' records released without any
  privacy guarantee, and results.json's "evaluation" and privacy.not_covered and the ServerApp's log say so. A silo
  refuses to answer with the node config ``federated-evaluation = false``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dpfl.errors import ConfigError
from dpfl.flower.federation import Federation
from dpfl.flower.silo import load_records

#: The run config key, and its values besides a path.
KEY, NONE, FEDERATED = "evaluation", "none", "federated"


@dataclass
class NoEvaluation:
    """evaluation = "none": no metrics."""

    description: dict = field(default_factory=lambda: {
        "mode": NONE, "covered_by_epsilon": True,
        "what": "none (evaluation = 'none'): the server holds no records to evaluate on",
        "not_covered": "nothing: the run reports no metrics (evaluation = 'none'); epsilon covers the models and "
                       "messages"})

    def __call__(self, sim, x: torch.Tensor) -> tuple[float | None, float | None]:
        return None, None


@dataclass
class ServerEvaluation:
    """evaluation = PATH: the test accuracy on records the server holds."""

    x: torch.Tensor
    y: torch.Tensor
    description: dict

    @classmethod
    def load(cls, path: str, federation: Federation) -> "ServerEvaluation":
        """The records of ``path``; ConfigError naming the run config key ``evaluation`` unless their features have
        the federation's shape and their labels are among its classes."""
        x, y = load_records(path, KEY)
        if x[0].numel() != math.prod(federation.feature_shape):
            raise ConfigError(KEY, path, f"records with the federation's feature shape {list(federation.feature_shape)}"
                                         f" (found {list(x.shape[1:])})")
        if int(y.min()) < 0 or int(y.max()) >= federation.num_classes:
            raise ConfigError(KEY, path, f"labels among the federation's classes 0..{federation.num_classes - 1} "
                                         f"(found {int(y.min())}..{int(y.max())})")
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        return cls(x.reshape(len(y), *federation.feature_shape), y, {
            "mode": "server", "path": str(Path(path).resolve()), "sha256": digest, "records": int(y.numel()),
            "covered_by_epsilon": True,
            "what": f"test_accuracy on the server's evaluation set ({y.numel()} records); train_loss not measured "
                    "(null: the server holds no training records)",
            "not_covered": "the server's evaluation records (its own, outside the federation) are not protected; the "
                           "metrics are functions of the released models and of those records, so as far as the "
                           "silos' records are concerned epsilon covers them"})

    def __call__(self, sim, x: torch.Tensor) -> tuple[float | None, float | None]:
        return None, sim.grads.loss_and_accuracy(x, self.x, self.y)[1]


@dataclass
class FederatedEvaluation:
    """evaluation = "federated": the silos' own metrics, sent in the clear (NOT covered by epsilon)."""

    cohort: object  # dpfl.flower.server_app.FlowerCohort: evaluate(x) -> each node's metrics
    description: dict = field(default_factory=lambda: {
        "mode": FEDERATED, "covered_by_epsilon": False,
        "what": "train_loss and test_accuracy computed by the silos on their own training and test records and sent "
                "to the server in the clear; the record-weighted means",
        "not_covered": "NOT COVERED BY EPSILON: the reported metrics (evaluation = 'federated') are computed by the "
                       "silos on their own records without noise and sent to the server in the clear: they release "
                       "information about the silos' records with no privacy guarantee; epsilon covers the models "
                       "and messages only"})

    def __call__(self, sim, x: torch.Tensor) -> tuple[float | None, float | None]:
        metrics = self.cohort.evaluate(x)
        train = sum(m["train_records"] for m in metrics)
        test = sum(m["test_records"] for m in metrics)
        loss = sum(m["train_loss"] * m["train_records"] for m in metrics) / train
        accuracy = sum(m["test_accuracy"] * m["test_records"] for m in metrics) / test if test else None
        return loss, accuracy


def evaluator_of(run_config: dict, federation: Federation, cohort):
    """The run config's evaluation (module docstring) for ``federation``, whose nodes ``cohort`` reaches."""
    mode = str(run_config.get(KEY, NONE))
    if mode == NONE:
        return NoEvaluation()
    if mode == FEDERATED:
        return FederatedEvaluation(cohort)
    if Path(mode).suffix not in (".npz", ".csv"):
        raise ConfigError(KEY, mode, f"{NONE!r}, {FEDERATED!r} (the silos' own metrics, NOT covered by epsilon) or "
                                     "the path of an .npz or .csv evaluation set the server may hold")
    return ServerEvaluation.load(mode, federation)


__all__ = ["KEY", "NONE", "FEDERATED", "NoEvaluation", "ServerEvaluation", "FederatedEvaluation", "evaluator_of"]
