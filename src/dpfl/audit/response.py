"""How each observed tensor responds to the canary: the weights of the white-box score, measured through the real
``client_round`` and ``server_update`` of any registered algorithm (nothing family-specific).

A *paired probe*: the canary's client runs round t in both worlds (the canary; its neighbour) from the same state
with the SAME random streams, so its minibatch and noise draws are the same in both and the difference of a
message between the worlds is the canary's own effect (the noise cancels exactly when it is additive). Projected on
the canary's gradient g and averaged over a few probe rows,

    r_u(t) = mean <u_1 - u_0, g>,

it is the canary's shift of the tensor u along g. Every message tensor with the parameter axis is probed, and the
model's move x_{t+1} - x_t through ``server_update`` on the probe's messages (one client delivering). The white-box
score weights each observed tensor by 1 / r_u(t), and leaves out a tensor the canary does not move (r_u = 0, e.g. a
count, or SCAFFOLD-warm's dy in a warm-up round): every tensor then shifts by the same amount under the canary, a step
against the gradient gets a negative weight, and tensors that carry the same noise scaled with their response add up
coherently. Examples: LocalSGD's dy = y - x (r = -eta_l K Delta) and SCAFFOLD's dc (r = +Delta) get weights in the
ratio -1 : eta_l K; FedSGD-DPC's dx = -eta_t d_i (g_i + w_i) gets -1 / (eta_t d_i Delta), Delta the sensitivity of
the client's mean gradient.

The state round t starts from is the probe's own run of rounds 0..t-1 in the neighbour's world (the initial state for
t = 0): a round whose message depends on where the model has been, such as SPIDER's gradient difference
g(w_t) - g(w_{t-1}) (``dpfl.algorithms.isrl_spider``), is probed where w_t != w_{t-1}, not at the initial model
where every difference is 0. The probe's streams come from a seed of their own (disjoint from every audited trial's),
so the weights are fixed before any audited run: the score is a fixed function of the observer's view, and the
bound stays honest whatever the weights.
"""

from __future__ import annotations

import numpy as np
import torch

from dpfl.audit.trials import TrialFailure
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import ClientContext, ClientData, ServerContext
from dpfl.errors import ConfigError

#: Spawn-key tag of the probe's seed (its streams are disjoint from the run's and the trials').
_PROBE_KEY = 0x9B0BE
#: A tensor whose response is below this fraction of the largest response is left out of the score.
NEGLIGIBLE = 1e-6
#: The name of the model's move among the probed tensors.
MOVE = "x"


def no_canary_path(algorithm, missing: str) -> ConfigError:
    """The error for an algorithm that cannot carry the canary, naming what is missing."""
    return ConfigError("algorithm.name", type(algorithm).__name__,
                       "an algorithm that can carry the audit's canary: it must take its per-example gradients from "
                       "ctx.grads.clipped_sum (the canary's oracle wraps it) and send messages with the parameter "
                       f"axis; {missing}")


def probe(sim, target, round_index: int, client: int = 0, probes: int = 4):
    """The paired probe of round ``round_index`` (module docstring) for the canary ``target``
    (``dpfl.audit.runs.Canary``) in client ``client``'s data, on ``probes`` rows with streams of their own: (what
    each world's rows send, with the model's move ``MOVE``, [probes, ...] per name; the canary's gradient g
    [probes, P] at the round's model)."""
    algorithm, train = sim.algorithm, sim.train
    population = train.num_clients
    x0 = target.worlds[0].grads.initial_params()
    initial = algorithm.init_state(x0, population)
    rows = torch.full((probes,), client, dtype=torch.long)
    server = {name: value.unsqueeze(0).repeat(probes, *([1] * value.dim())) for name, value in initial.server.items()}
    seed = int(np.random.SeedSequence(sim.seed, spawn_key=(_PROBE_KEY,)).generate_state(1, np.uint64)[0] >> 1)
    streams = torch.arange(probes) * population + client
    clients = initial.rows(rows)

    def step(t: int, world, server: dict, clients: dict):
        try:
            out = algorithm.client_round(t, server, clients, ClientData(world.x[rows], world.y[rows],
                                                                        train.counts[rows]),
                                         ClientContext(world.grads, seed, t, rows, streams))
        except NotImplementedError as err:  # the canary's oracle cannot give what the algorithm asked for
            raise no_canary_path(algorithm, str(err)) from None
        except ConfigError:
            raise
        except Exception as error:  # the algorithm broke under the canary: a failed audit (``TrialFailure``)
            raise TrialFailure(f"round {t} of the canary's probe: {type(error).__name__}: {error}") from error
        delivered = 1 if out.messages else 0  # a round that contacts nobody (randomly stopped) delivers nothing
        return out, algorithm.server_update(t, server, Delivery(dict(out.messages), delivered, population),
                                            ServerContext(seed, t, torch.arange(probes)))  # paired, as the clients

    for t in range(round_index):  # the state round t starts from: earlier rounds of the neighbour's world
        out, server = step(t, target.worlds[0], server, clients)
        clients = {**clients, **out.state}
    seen = []
    for world in target.worlds:
        out, after = step(round_index, world, server, clients)
        seen.append({**out.messages, MOVE: after[MOVE] - server[MOVE]})
    return (seen[0], seen[1]), target.gradient(server[MOVE]).double()


def responses(sim, target, round_index: int, client: int = 0, probes: int = 4) -> dict[str, float]:
    """{tensor: r_u(t)} of round ``round_index`` (module docstring) for the canary ``target``
    (``dpfl.audit.runs.Canary``) in client ``client``'s data: every message with the parameter axis, and the model's
    move ``MOVE``."""
    (without, with_canary), g = probe(sim, target, round_index, client, probes)
    return {name: float(((with_canary[name] - without[name]).double() * g).sum(1).mean())
            for name in without if without[name].dim() == 2 and without[name].shape[1] == g.shape[1]}


#: Probe rows from which ``row_law`` measures the law of a message's score.
LAW_PROBES = 32
#: The least spread ``row_law`` returns (in units of the canary's shift): a noise-free message.
LEAST_SPREAD = 1e-3


def row_law(sim, target, round_index: int, weights: dict[str, float], client: int = 0,
            probes: int = LAW_PROBES) -> tuple[float, float]:
    """(mean, standard deviation) over ``probes`` probe rows in the neighbour's world of the owner's message score
    sum_u w_u <u, g> (``weights`` w_u: ``score_weights`` of the round, so the canary moves it by 1), the standard
    deviation at least ``LEAST_SPREAD``: the m + mu_0 and sigma of ``dpfl.audit.distinguisher.multiset_score``.
    Measured on the probe's own streams, before any audited run."""
    (without, _), g = probe(sim, target, round_index, client, probes)
    score = torch.zeros(probes, dtype=torch.float64)
    for name, w in weights.items():
        if w and name != MOVE:
            score += w * (without[name].double() * g).sum(1)
    return float(score.mean()), max(float(score.std()), LEAST_SPREAD)


def score_weights(response: dict[str, float]) -> dict[str, float]:
    """1 / r_u for every tensor the canary moves, 0 for the others (module docstring)."""
    largest = max((abs(r) for r in response.values()), default=0.0)
    return {name: (1.0 / r if largest > 0 and abs(r) > NEGLIGIBLE * largest else 0.0) for name, r in response.items()}


def round_weights(sim, target, rounds: int, client: int = 0) -> list[dict[str, float]]:
    """``score_weights`` of rounds 0..``rounds`` - 1; an error naming what is missing when the canary moves no
    message in any of them."""
    weights = [score_weights(responses(sim, target, t, client)) for t in range(rounds)]
    if not any(w for round_weights in weights for name, w in round_weights.items() if name != MOVE):
        probed = sorted({name for round_weights in weights for name in round_weights if name != MOVE})
        raise no_canary_path(sim.algorithm, "no message moved with the canary (messages with the parameter axis: "
                                            f"{probed or 'none'})")
    return weights


__all__ = ["MOVE", "NEGLIGIBLE", "LAW_PROBES", "LEAST_SPREAD", "no_canary_path", "probe", "responses",
           "row_law", "score_weights", "round_weights"]
