"""The two single-point privacy bugs that once survived every test, both in the shuffle layers, planted with pytest's
``monkeypatch`` (undone when the test ends), for the tests that check they catch them (tests/engine/test_boundary.py,
tests/engine/test_grads.py, tests/algorithms/test_sdp.py).

* ``unclipped_examples``: ``CohortGradients.clipped_examples`` (the shuffle-DP families' local randomiser input)
  returns the raw per-example gradients: P_vec's l-inf clamp still accepts them, the accounting's l2 ball fails.
* ``unpermuted_shuffler``: the simulated shuffler's permutation is the identity: rows stay in cohort order, so the
  server knows who sent what (the ledger charges it as plain either way: no claim fails, only the boundary's
  promise).
"""

import torch

from dpfl.engine.grads import CohortGradients


def unclipped_examples(monkeypatch) -> None:
    def raw(self, theta, x, y, mask, clip):
        return mask.unsqueeze(-1) * self._per_example_grads(theta, x, y)

    monkeypatch.setattr(CohortGradients, "clipped_examples", raw)


def unpermuted_shuffler(monkeypatch) -> None:
    arange = torch.arange
    monkeypatch.setattr(torch, "randperm", lambda n, *args, generator=None, **kwargs: arange(n))
