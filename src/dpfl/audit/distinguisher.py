"""What each observer sees of the audited rounds, and its score: white-box, the observed updates' inner product with
the canary's gradient; black-box, minus the canary's loss on the released model.

The views follow the run's boundary and release policy (``dpfl.accounting.observers``, ``dpfl.engine.boundary``):

* ``third_party``: the released global models. Under ``privacy.release = "every_round"`` every iterate, and the
  score sums the rounds' scores (each move x_{t+1} - x_t against the canary's gradient at x_t, each round weighted
  by its likelihood-ratio factor, ``dpfl.audit.likelihood_ratio``); under ``"final"``
  only the last model: the score is that of x_R - x_0 at the public initial model x_0.
* ``server`` (``server_view``): plain boundary: the canary client's own messages (dy, and SCAFFOLD's dc), 0 in a
  round where it is not in the cohort (the server knows the cohort, so that is a fixed, uninformative value); secure
  aggregation: only the cohort's sums, scored only in the rounds whose cohort holds the owner (the server knows
  the cohort; a sum without the owner does not depend on the record, so its noise would only dilute the score:
  with half the clients a round, the planned audit of a sampled cohort behind secure aggregation ...). Behind the real shuffler (privacy.shuffler = "real", ``dpfl.protocols.shuffler``)
  the server reads the shuffled labelled bits, which say exactly the per-label counts: the cohort's sums of ``ones``
  and ``slots`` (the stage's output, read from the count path: ``count_labelled_bits(shuffle(labelled_bits(o, s)))``
  is (sum o, s), tests/algorithms/test_sdp.py). For the Dirac canary the white-box score of the counts is the count
  c_e of 1-bits labelled e over g: the canary's user sends g of them at +C and none at -C, every other user's
  x_e = 0 gives g/2 (randomly rounded) and the noise is Bin(m, p); that sum of independent Bernoulli and binomial
  counts is log-concave, so its shifts have a monotone likelihood ratio and thresholding c_e is the Neyman-Pearson
  test of the counts (the other labels do not depend on the canary). Behind the simulated shuffler the server sees
  the cohort's messages as an unlabelled multiset, scored by ``multiset_score`` (below). A trusted aggregator's
  server is no observer (an error).
* ``other_silo``: a silo that is not the canary's owner: the broadcast models plus its own messages. With a
  fixed-size cohort it knows the cohort's size, so it recovers the sum of the messages and subtracts its own (the
  sum minus ``silo_weight`` x its own message); with a Poisson cohort it does not know the size, and where the
  server adds noise of its own (``silo_recovers_sum``) the models carry the sum plus that noise: it scores the
  model's moves. ``silo_weight`` w = 1 is the likelihood-ratio test when the clients' noise draws are independent;
  w = the cohort size exposes a noise draw that every client reuses (the silo knows its own draw, hence everyone's).
  Any w is post-processing of the silo's view: honest.

White-box score of a round: sum over the observed tensors u (every message with the parameter axis, or the model's
move) of w_u <u, g_t>, g_t the canary's (clipped) gradient at the round's model and w_u = 1 / r_u(t), the inverse of
the canary's measured shift of u along g (``dpfl.audit.response``: a step against the gradient gets w < 0, a tensor
the canary does not move w = 0). Scores are oriented so that the canary raises them (``dpfl.audit.bounds``).
For a Gaussian mechanism on a Dirac canary the coordinate along e is the likelihood-ratio statistic of a round's view
(no other record moves it), so thresholding it is the optimal test (Neyman-Pearson). For a Laplace mechanism
(FedSGD-DPC) the log likelihood ratio of one release, (|v + a| - |v - a|) / b for means -a, +a and scale b, is the
coordinate clipped to [-a, a]: a monotone function of it, so thresholding the coordinate is as strong for one release
(the rank test's threshold is placed at the claim's scale; over several releases the clipped sum would be the
likelihood ratio, not implemented). Any fixed score is
post-processing of the observer's view: the bound stays honest whichever score is used, only its strength varies.

**The shuffled multiset** (``multiset_score``). Behind the simulated shuffler the server sees the cohort's n message
rows in a uniformly random order, so it does not know which row is the owner's. Score each row i as the owner's
message would be scored, s_i = sum_u w_u <u_i, g> (so the canary moves the owner's s by 1), and model the rows as
independent N(m + a_i, sigma^2), a_i = 0 for every row but the owner's, whose a is mu_b in world b: mu_1 - mu_0 = 1,
mu_0 = -1/2 for a replace-one neighbour (the Dirac canary's -C e against +C e: symmetric about the other rows) and 0
for a null record. Averaging over the owner's position (the permutation is uniform and the rows are otherwise
exchangeable), the view's density in world b is prod_j phi_sigma(s_j - m) (1/n) sum_i exp((mu_b (s_i - m) -
mu_b^2 / 2) / sigma^2), so the log likelihood ratio of a round is

    T = LSE_i(mu_1 (s_i - m) / sigma^2) - LSE_i(mu_0 (s_i - m) / sigma^2) - (mu_1^2 - mu_0^2) / (2 sigma^2),

LSE the log-sum-exp over the cohort's rows; rounds use independent permutations, so their T add. As sigma grows T
tends to (mu_1 - mu_0) sum_i (s_i - m) / (n sigma^2) (the sum: the secure-aggregation view); as sigma shrinks, to the
largest (and smallest) row. m + mu_0 and sigma are the mean and the spread of the owner's score in the neighbour's
world over the paired probe's rows (``dpfl.audit.response.row_law``), fixed before the audited runs (m is 0 for the
Dirac canary's coordinate under LocalSGD, which no other record touches; the shuffle-DP families' counts carry every
user's rounded x_e = 0 and noise bits). A round whose cohort does not hold
the owner scores 0 (the server knows the cohort; the view does not depend on the record). Exact (the Neyman-Pearson
test of the multiset) for Gaussian messages with the Dirac canary; for other messages the same statistic is an
approximation, and, like every fixed score, honest.
"""

from __future__ import annotations

import torch

from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY
from dpfl.audit.trials import RoundView
from dpfl.errors import ConfigError

OBSERVERS = (THIRD_PARTY, SERVER, OTHER_SILO)
SCORES = ("white-box", "loss")


#: What the server sees of the cohort's messages (``server_view``).
MESSAGES, SUM, MULTISET, NOTHING = "messages", "sum", "multiset", "nothing"


def server_view(boundary) -> str:
    """What the server receives behind ``boundary`` (a ``dpfl.engine.boundary.Boundary``): every client's messages
    (plain), their sums (secure aggregation; the real shuffler's labelled-bit counts), the unlabelled multiset of the
    messages (the simulated shuffler), or nothing it observes (a trusted aggregator)."""
    if boundary.name == "plain":
        return MESSAGES
    if boundary.name == "secagg" or (boundary.name == "shuffler" and boundary.shuffle == "real"):
        return SUM
    return MULTISET if boundary.name == "shuffler" else NOTHING


def check_view(observer: str, seen: str, num_clients: int, score: str = "white-box") -> None:
    """ConfigError unless the run has a view for ``observer`` that this auditor models, with ``score``; ``seen`` is
    ``server_view`` of the run's boundary."""
    if observer not in OBSERVERS:
        raise ConfigError("--observer", observer, f"one of {list(OBSERVERS)}")
    if score not in SCORES:
        raise ConfigError("--score", score, f"one of {list(SCORES)}")
    if observer == SERVER and seen == NOTHING:
        raise ConfigError("--observer", observer, "an observer of this run: behind privacy.boundary = 'trusted' the "
                          "server is no observer (choose third_party or other_silo)")
    if observer == OTHER_SILO and num_clients < 2:
        raise ConfigError("--observer", observer, "an observer of this run: another silo needs data.num_clients >= 2")
    if score == "loss" and observer != THIRD_PARTY:
        raise ConfigError("--score", score, "'white-box' for this observer (the black-box loss score reads the "
                          "released model alone: --observer third_party)")


def silo_recovers_sum(sim, rounds: int) -> bool:
    """Whether another silo recovers the cohort's sum of the messages in rounds 0..``rounds`` - 1: it knows the
    cohort's size (not a Poisson cohort) and the server adds no noise of its own (``Release.server_events`` empty).
    Where the server draws (central DP, DP-FTRL's tree), the model carries the sum plus the server's draw and the
    unnoised sum is released to nobody, so the silo scores the model's moves."""
    if sim.clients.scheme == "poisson":
        return False
    state = sim.algorithm.init_state(sim.grads.initial_params(), sim.train.num_clients)
    return not any(sim.algorithm.release(t, state, sim.train.counts).server_events for t in range(rounds))


def observed_updates(observer: str, seen: str, view: RoundView, canary_client: int, silo: int,
                     recovers_sum: bool, silo_weight: float = 1.0) -> dict[str, torch.Tensor]:
    """{name: [trials, P]}: what ``observer`` sees of the round's updates (module docstring; ``seen``: the server's
    ``server_view``, other than the multiset, which ``multiset_score`` reads; ``recovers_sum``: ``silo_recovers_sum``
    of the run); "x" is the model's move."""
    if observer == SERVER and seen == SUM:  # it knows the cohort: a round without the owner says nothing
        owner = view.holds(canary_client)
        return {name: torch.where(owner.view(-1, *[1] * (view.messages[name].dim() - 1)), view.sums(name), 0)
                for name in view.messages}
    if observer == SERVER:
        return {name: view.own(name, canary_client) for name in view.messages}
    if observer == OTHER_SILO and recovers_sum:
        return {name: view.sums(name) - silo_weight * view.own(name, silo) for name in view.messages}
    return {"x": view.after["x"] - view.before["x"]}


def white_box_score(updates: dict[str, torch.Tensor], gradient: torch.Tensor, weights: dict[str, float]) -> torch.Tensor:
    """[trials]: sum over the updates of w_u <u, g> (module docstring), in float64; ``weights`` w_u per tensor name
    (a tensor without a weight, such as a message without the parameter axis, is left out)."""
    g = gradient.double()
    total = torch.zeros(g.shape[0], dtype=torch.float64)
    for name, update in updates.items():
        if weights.get(name, 0.0):
            total += weights[name] * (update.double() * g).sum(1)
    return total


def multiset_score(view: RoundView, canary_client: int, gradient: torch.Tensor, weights: dict[str, float],
                   law: tuple[float, float], neighbour_offset: float) -> torch.Tensor:
    """[trials]: the log likelihood ratio T of the round's shuffled multiset (module docstring), each trial's rows
    scored as the owner's would be (``weights`` w_u per message name, ``gradient`` g [trials, P] at each trial's
    model); ``law`` = (m + mu_0, sigma), mu_0 = ``neighbour_offset``; 0 in a trial whose cohort does not hold the
    owner."""
    rows = torch.zeros(view.trial_of_row.numel(), dtype=torch.float64)
    g = gradient.double()[view.trial_of_row]
    for name, value in view.messages.items():
        if weights.get(name, 0.0) and value.dim() == 2 and value.shape[1] == g.shape[1]:
            rows += weights[name] * (value.double() * g).sum(1)
    mean, spread = law
    centred = rows - (mean - neighbour_offset)
    mu1, mu0, variance = neighbour_offset + 1.0, neighbour_offset, spread * spread
    score = (_segment_logsumexp(mu1 * centred / variance, view.trial_of_row, view.trials)
             - _segment_logsumexp(mu0 * centred / variance, view.trial_of_row, view.trials)
             - (mu1 * mu1 - mu0 * mu0) / (2 * variance))
    return torch.where(view.holds(canary_client), score, torch.zeros_like(score))


def _segment_logsumexp(values: torch.Tensor, segment: torch.Tensor, segments: int) -> torch.Tensor:
    """[segments]: log sum exp of ``values`` over each segment (rows with ``segment`` = s); -inf for an empty one."""
    top = torch.full((segments,), -torch.inf, dtype=values.dtype).scatter_reduce(0, segment, values, "amax")
    shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = torch.zeros(segments, dtype=values.dtype).index_add_(0, segment, (values - shift[segment]).exp())
    return total.log() + shift


__all__ = ["OBSERVERS", "SCORES", "MESSAGES", "SUM", "MULTISET", "NOTHING", "server_view", "check_view",
           "silo_recovers_sum", "observed_updates", "white_box_score", "multiset_score"]
