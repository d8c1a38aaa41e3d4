"""``Results``: what ``dpfl.run`` returns, the content of the run's results.json as a small typed object."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from dpfl.errors import ConfigError

if TYPE_CHECKING:
    from dpfl.accounting.ledger import PrivacyLedger


@dataclass(frozen=True)
class Results:
    """A run's results: ``to_dict()`` is what results.json holds (``dpfl.experiments.results_file`` lists its keys).

    ``final``: the model after the last round done (test_accuracy, train_loss, epsilon per observer, delta, ...);
    ``rounds``: one dict per evaluated round (epsilon where run.epsilon_every reports it, else null);
    ``privacy``: the accountant, observers, boundary, unit, noise source and each observer's event of a round;
    ``status``: "finished", "stopped" (see ``stopped_by``) or "running". ``ledger``: the run's privacy ledger (from
    ``dpfl.run`` or ``load``), whose journal gives epsilon after any round (``epsilon_curve``)."""

    results: dict
    ledger: PrivacyLedger | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, directory: str | Path) -> "Results":
        """The results of the run in ``directory`` (its results.json) with its ledger (ledger.json)."""
        from dpfl.accounting.ledger import PrivacyLedger

        directory = Path(directory)
        return cls(json.loads((directory / "results.json").read_text()), PrivacyLedger.load(directory / "ledger.json"))

    def epsilon_curve(self, rounds: Iterable[int] | None = None) -> dict[int, dict[str, float]]:
        """{round: {observer: epsilon}} after each of ``rounds`` (default every round the ledger recorded; numbered
        from 1, as results.json's rows), inf where no finite epsilon holds: the whole curve, also at the rounds whose
        rows carry none (run.epsilon_every), computed now from the ledger's journal (one accounting per round and
        observer: ``PrivacyLedger.epsilon_curve``), the numbers a row reporting it would carry."""
        if self.ledger is None:
            raise ConfigError("Results.ledger", None, "the run's privacy ledger: Results from dpfl.run, or "
                                                      "dpfl.Results.load(run directory)")
        return self.ledger.epsilon_curve(rounds)

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
