"""Asoodeh, Chen, Calmon, Özgür (2021), the privacy of the last iterate: Fig. 2's curves and the utility run
(``experiment``) and the report items (``items``)."""

from dpfl.papers.asoodeh2021 import items

#: The paper's report items, in report order.
ITEMS = items.ITEMS
