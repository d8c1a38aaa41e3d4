"""Zhou, Liu, Fu, Wu, Li, Yu (2021), the optimal numbers of queries and replies: the experiment on digits and
breast cancer (``experiment``: the paper's constants, the (b, T) grid against the planned (b*, T*)), one experiment per
suspected cause of the plan's loss (``causes``) and the report items (``items``)."""

from dpfl.papers.zhou2021 import items

#: The paper's report items, in report order.
ITEMS = items.ITEMS
