"""Noble, Bellet, Dieuleveut (2022), DP-SCAFFOLD: the privacy of the paper's settings (``privacy``: eps, Table 1's T,
Fig. 1), the test accuracies of Tables 1 and 4 and the curves of Figs. 1 and 3 (``utility``), the sampling-rate
trade-offs of Figs. 9 and 10 (``sampling``) and the MNIST MLP (``mlp``)."""

from dpfl.papers.noble2022 import mlp, privacy, sampling, utility

#: The paper's report items, in report order.
ITEMS = [*privacy.ITEMS, *utility.ITEMS, *sampling.ITEMS, *mlp.ITEMS]
