"""`dpfl reproduce`: the headline tables and figures of the five papers dpfl implements, each recomputed by dpfl
beside the paper's numbers, cached by the sha256 of its settings, and gathered into one report
(docs/reproduction.md).

``ITEMS`` (id -> ``Item``) is the registry, in report order; ``item(id)`` looks one up; ``runner.reproduce`` runs
one (or reads it from the cache); ``report.render`` writes the report."""

from __future__ import annotations

from dpfl.errors import ConfigError
from dpfl.experiments.reproduce import (asoodeh2021, heikkila2024, heikkila2024_heterogeneous, lowy2023,
                                        lowy2023_grids, noble2022, noble2022_mlp, noble2022_sampling,
                                        noble2022_utility, zhou2021)
from dpfl.experiments.reproduce.item import Item

#: Every item, grouped by paper in the order of the report.
ITEMS: dict[str, Item] = {i.id: i for module in (noble2022, noble2022_utility, noble2022_sampling, noble2022_mlp,
                                                zhou2021, heikkila2024, heikkila2024_heterogeneous, asoodeh2021,
                                                lowy2023, lowy2023_grids)
                          for i in module.ITEMS}


def item(item_id: str) -> Item:
    """The item named ``item_id``; a ConfigError naming every known item otherwise."""
    if item_id not in ITEMS:
        raise ConfigError("ITEM", item_id, f"one of {', '.join(ITEMS)} (`dpfl reproduce --list` describes them)")
    return ITEMS[item_id]


__all__ = ["ITEMS", "Item", "item"]
