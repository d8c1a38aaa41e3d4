"""Lowy, Ghafelebashi, Razaviyayn (2023), ISRL-DP without a trusted server: the tuned runs on breast cancer and
digits (``experiment``), the report items (``items``) and the tuning-grid items (``grids``)."""

from dpfl.papers.lowy2023 import grids, items

#: The paper's report items, in report order.
ITEMS = [*items.ITEMS, *grids.ITEMS]
