"""`dpfl reproduce`'s machinery, shared by every paper in ``dpfl.papers``: an ``Item`` (a table or figure of a paper,
its settings in quick and full mode, the function that recomputes it, rows beside the paper's numbers), the runner
that caches each item's results by the sha256 of its settings and code, and the report (docs/reproduction.md)."""

from dpfl.reproduction.item import Item, Row

__all__ = ["Item", "Row"]
