"""Heikkilä et al. (2024), joint noise under secure aggregation with several local steps: Table 1's
calibration and the training runs (``experiment``), the report items (``items``) and the heterogeneous-data item
(``heterogeneous``)."""

from dpfl.papers.heikkila2024 import heterogeneous, items

#: The paper's report items, in report order.
ITEMS = [*items.ITEMS, *heterogeneous.ITEMS]
