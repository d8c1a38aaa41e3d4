"""What each observer sees of one audited round, and its score: the seen update's inner product with the canary's
direction e (the Dirac canary's coordinate, ``dpfl.audit.canary``).

The views follow the run's boundary (``dpfl.accounting.observers``, ``dpfl.engine.boundary``):

* ``third_party``: the released global model; score = the model's move along e, from the algorithm's own
  ``server_update`` on what the boundary delivers.
* ``server``: plain boundary: the canary client's own message (dy along e), 0 when it is not in the cohort (the
  server knows the cohort, so that is a fixed, uninformative value); secure aggregation: only the cohort's sum (dy
  along e). A trusted aggregator's server is no observer; a shuffler's server sees an unlabelled multiset, which
  this auditor does not model (both are errors).
* ``other_silo``: a silo that is not the canary's owner: the released model plus its own update. With a fixed-size
  cohort it knows the cohort's size, so it recovers the sum of the messages and subtracts its own message (score =
  the sum minus its own dy, along e); with a Poisson cohort it does not know the size and scores the model's move.
  ``silo_weight`` w makes the fixed-cohort score sum - w x own: w = 1 is the likelihood-ratio test when the clients'
  noise draws are independent; w = the cohort size exposes a noise draw that every client reuses (the silo knows its
  own draw, hence everyone's, and subtracts all of them). Any w is post-processing of the silo's view: honest.

For a Gaussian mechanism on a Dirac canary the inner product with e is the likelihood-ratio statistic of each view
(the coordinate along e is a sufficient statistic: no other record moves it), so thresholding it is the optimal test
(Neyman-Pearson), up to the data-independent randomness of client sampling. Scores read dy only: SCAFFOLD's dc
messages carry the canary too, so for SCAFFOLD this distinguisher is weaker than the best (its bound stays honest).
"""

from __future__ import annotations

import torch

from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY
from dpfl.engine.boundary import Delivery
from dpfl.errors import ConfigError

OBSERVERS = (THIRD_PARTY, SERVER, OTHER_SILO)


def check_view(observer: str, boundary: str, num_clients: int) -> None:
    """ConfigError unless the run has a view for ``observer`` that this auditor models."""
    if observer not in OBSERVERS:
        raise ConfigError("--observer", observer, f"one of {list(OBSERVERS)}")
    if observer == SERVER and boundary == "trusted":
        raise ConfigError("--observer", observer, "an observer of this run: behind privacy.boundary = 'trusted' the "
                          "server is no observer (choose third_party or other_silo)")
    if observer == SERVER and boundary == "shuffler":
        raise ConfigError("--observer", observer, "an observer the auditor models: a shuffler's server sees an "
                          "unlabelled multiset, which the Dirac-canary distinguisher does not cover")
    if observer == OTHER_SILO and num_clients < 2:
        raise ConfigError("--observer", observer, "an observer of this run: another silo needs data.num_clients >= 2")


def scores(observer: str, boundary: str, algorithm, server: dict, trial_of_row: torch.Tensor,
           client_of_row: torch.Tensor, messages: dict, trials: int, population: int, canary_client: int,
           silo: int, fixed_cohort: bool, coordinate: int, silo_weight: float = 1.0) -> torch.Tensor:
    """Each trial's score [trials] for ``observer`` from the rows' messages (rows = (trial, client) pairs)."""
    sums = {name: torch.zeros(trials, value.shape[1], dtype=value.dtype).index_add_(0, trial_of_row, value)
            for name, value in messages.items()}
    counts = torch.bincount(trial_of_row, minlength=trials)
    dy = messages["dy"][:, coordinate].double()

    def own(client: int) -> torch.Tensor:
        rows = client_of_row == client
        return torch.zeros(trials, dtype=torch.float64).index_add_(0, trial_of_row[rows], dy[rows])

    if observer == SERVER:
        return sums["dy"][:, coordinate].double() if boundary == "secagg" else own(canary_client)
    if observer == OTHER_SILO and fixed_cohort:
        return sums["dy"][:, coordinate].double() - silo_weight * own(silo)
    # the released model's move along e, from the algorithm's server step on the trial's delivery
    start = server["x"][coordinate].double()
    moves = torch.empty(trials, dtype=torch.float64)
    for t in range(trials):
        delivery = Delivery({name: value[t] for name, value in sums.items()}, int(counts[t]), population)
        moves[t] = algorithm.server_update(0, server, delivery)["x"][coordinate].double() - start
    return moves


__all__ = ["OBSERVERS", "check_view", "scores"]
