"""What each observer sees of the audited rounds, and its score: white-box, the observed updates' inner product with
the canary's gradient; black-box, minus the canary's loss on the released model.

The views follow the run's boundary and release policy (``dpfl.accounting.observers``, ``dpfl.engine.boundary``):

* ``third_party``: the released global models. Under ``privacy.release = "every_round"`` every iterate, and the
  score sums the rounds' scores (each move x_{t+1} - x_t against the canary's gradient at x_t); under ``"final"``
  only the last model: the score is that of x_R - x_0 at the public initial model x_0.
* ``server``: plain boundary: the canary client's own messages (dy, and SCAFFOLD's dc), 0 in a round where it is not
  in the cohort (the server knows the cohort, so that is a fixed, uninformative value); secure aggregation: only the
  cohort's sums. A trusted aggregator's server is no observer; a shuffler's server sees an unlabelled multiset, which
  this auditor does not model (both are errors).
* ``other_silo``: a silo that is not the canary's owner: the broadcast models plus its own messages. With a
  fixed-size cohort it knows the cohort's size, so it recovers the sum of the messages and subtracts its own (the
  sum minus ``silo_weight`` x its own message); with a Poisson cohort it does not know the size and scores the
  model's moves. ``silo_weight`` w = 1 is the likelihood-ratio test when the clients' noise draws are independent;
  w = the cohort size exposes a noise draw that every client reuses (the silo knows its own draw, hence everyone's).
  Any w is post-processing of the silo's view: honest.

White-box score of a round: sum over the observed updates u of w_u <u, g_t>, g_t the canary's (clipped) gradient at
the round's model, w = -1 for model moves and dy (a step moves against the gradient) and w = + eta_l K for dc (a
mean gradient, put on dy's scale). Scores are oriented so that the canary raises them (``dpfl.audit.bounds``).
For a Gaussian mechanism on a Dirac canary the coordinate along e is the likelihood-ratio statistic of a round's view
(no other record moves it), so thresholding it is the optimal test (Neyman-Pearson). Any fixed score is
post-processing of the observer's view: the bound stays honest whichever score is used, only its strength varies.
"""

from __future__ import annotations

import torch

from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY
from dpfl.audit.trials import RoundView
from dpfl.errors import ConfigError

OBSERVERS = (THIRD_PARTY, SERVER, OTHER_SILO)
SCORES = ("white-box", "loss")


def check_view(observer: str, boundary: str, num_clients: int, score: str = "white-box") -> None:
    """ConfigError unless the run has a view for ``observer`` that this auditor models, with ``score``."""
    if observer not in OBSERVERS:
        raise ConfigError("--observer", observer, f"one of {list(OBSERVERS)}")
    if score not in SCORES:
        raise ConfigError("--score", score, f"one of {list(SCORES)}")
    if observer == SERVER and boundary == "trusted":
        raise ConfigError("--observer", observer, "an observer of this run: behind privacy.boundary = 'trusted' the "
                          "server is no observer (choose third_party or other_silo)")
    if observer == SERVER and boundary == "shuffler":
        raise ConfigError("--observer", observer, "an observer the auditor models: a shuffler's server sees an "
                          "unlabelled multiset, which the canary distinguishers do not cover")
    if observer == OTHER_SILO and num_clients < 2:
        raise ConfigError("--observer", observer, "an observer of this run: another silo needs data.num_clients >= 2")
    if score == "loss" and observer != THIRD_PARTY:
        raise ConfigError("--score", score, "'white-box' for this observer (the black-box loss score reads the "
                          "released model alone: --observer third_party)")


def observed_updates(observer: str, boundary: str, view: RoundView, canary_client: int, silo: int,
                     fixed_cohort: bool, silo_weight: float = 1.0) -> dict[str, torch.Tensor]:
    """{name: [trials, P]}: what ``observer`` sees of the round's updates (module docstring); "x" is the model's
    move."""
    if observer == SERVER and boundary == "secagg":
        return {name: view.sums(name) for name in view.messages}
    if observer == SERVER:
        return {name: view.own(name, canary_client) for name in view.messages}
    if observer == OTHER_SILO and fixed_cohort:
        return {name: view.sums(name) - silo_weight * view.own(name, silo) for name in view.messages}
    return {"x": view.after["x"] - view.before["x"]}


def white_box_score(updates: dict[str, torch.Tensor], gradient: torch.Tensor, dc_weight: float) -> torch.Tensor:
    """[trials]: sum over the updates of w_u <u, g> (module docstring), in float64."""
    weights = {"x": -1.0, "dy": -1.0, "dc": dc_weight}
    g = gradient.double()
    total = torch.zeros(g.shape[0], dtype=torch.float64)
    for name, update in updates.items():
        total += weights[name] * (update.double() * g).sum(1)
    return total


__all__ = ["OBSERVERS", "SCORES", "check_view", "observed_updates", "white_box_score"]
