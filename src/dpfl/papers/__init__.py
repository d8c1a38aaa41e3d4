"""The five papers dpfl implements, reproduced: one package per paper holding its constants, its experiments and
its report items (the headline tables and figures, each recomputed by dpfl beside the paper's numbers). The papers
import the library; nothing in the library imports them, except ``dpfl reproduce`` which reads this registry.

``ITEMS`` (id -> ``dpfl.reproduction.Item``) is the registry, in report order; ``item(id)`` looks one up;
``dpfl.reproduction.runner.reproduce`` runs one (or reads it from the cache); ``dpfl.reproduction.report.render``
writes the report (docs/reproduction.md)."""

from __future__ import annotations

import dataclasses

from dpfl.errors import ConfigError
from dpfl.papers import asoodeh2021, heikkila2024, lowy2023, noble2022, zhou2021
from dpfl.papers.full_runs import FULL_RUNS, NO_FULL_RUN
from dpfl.reproduction.item import Item

#: Every item, grouped by paper in the order of the report, with its full run's measured time (or why it has none).
ITEMS: dict[str, Item] = {i.id: dataclasses.replace(i, full_run=FULL_RUNS.get(i.id, ""),
                                                    no_full_run=NO_FULL_RUN.get(i.id, ""))
                          for paper in (noble2022, zhou2021, heikkila2024, asoodeh2021, lowy2023) for i in paper.ITEMS}


def item(item_id: str) -> Item:
    """The item named ``item_id``; a ConfigError naming every known item otherwise."""
    if item_id not in ITEMS:
        raise ConfigError("ITEM", item_id, f"one of {', '.join(ITEMS)} (`dpfl reproduce --list` describes them)")
    return ITEMS[item_id]


__all__ = ["ITEMS", "Item", "item"]
