"""``Results``: what ``dpfl.run`` returns, the content of the run's results.json as a small typed object."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Results:
    """A run's results: ``to_dict()`` is what results.json holds (``dpfl.experiments.results_file`` lists its keys).

    ``final``: the model after the last round done (test_accuracy, train_loss, epsilon per observer, delta, ...);
    ``rounds``: one dict per evaluated round; ``privacy``: the accountant, observers, boundary, unit, noise source and
    each observer's event of a round; ``status``: "finished", "stopped" (see ``stopped_by``) or "running"."""

    results: dict

    @property
    def final(self) -> dict:
        return self.results["final"]

    @property
    def rounds(self) -> list[dict]:
        return self.results["rounds"]

    @property
    def privacy(self) -> dict:
        return self.results["privacy"]

    @property
    def config(self) -> dict:
        return self.results["config"]

    @property
    def data(self) -> dict:
        """Where the data came from and how it was made (``FederatedDataset.info``)."""
        return self.results["data"]

    @property
    def status(self) -> str:
        return self.results["status"]

    @property
    def stopped_by(self) -> str | None:
        return self.results["stopped_by"]

    @property
    def epsilon(self) -> dict[str, float]:
        """Epsilon per observer after the last round done (inf where no finite epsilon holds: results.json's null)."""
        return {o: math.inf if e is None else e for o, e in self.final["epsilon"].items()}

    @property
    def delta(self) -> float:
        return self.final["delta"]

    def to_dict(self) -> dict:
        """A copy of the results, as results.json holds them."""
        return copy.deepcopy(self.results)

    def __repr__(self) -> str:
        eps = ", ".join(f"{o}={e:.4g}" for o, e in self.epsilon.items())
        return (f"Results(status={self.status!r}, rounds done={self.final['round']}, "
                f"test_accuracy={self.final['test_accuracy']:.4f}, epsilon=({eps}), delta={self.delta:g})")


__all__ = ["Results"]
