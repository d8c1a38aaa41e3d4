"""`dpfl audit` for every registered algorithm (parametrized over ``registry.names()``, so a new family is audited as
soon as it registers): the canary reaches its messages through ctx.grads, every observer is scored, and no bound
exceeds its claim. Tiny runs (3 clients, 40 trials per world, 5 rounds configured so that SCAFFOLD-warm's 4 warm-up
rounds fit), audited up to the first round whose messages the canary moves (round 0, except for an algorithm that
uses each record in one round only, e.g. ISRL-DP Prox-SGD's disjoint batches): this checks the plumbing, not the
strength."""

import pytest

from dpfl.algorithms import registry
from dpfl.audit import response, runs
from dpfl.experiments.config import key_schema, load_config
from dpfl.experiments.runner import build_simulation

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: The tiny run's [algorithm] keys, each set only where the algorithm has it.
TINY = {"local_steps": 2, "sample_rate": 1.0, "client_rate": 1.0, "rounds": 5, "noise_multiplier": 1.0,
        "weight_decay": 0.0}


def simulation(name: str):
    spec = registry.spec_of(name)
    keys = key_schema(name, "logreg")["algorithm"]
    private = spec.private(name)
    calibrated = private and "noise_multiplier" not in keys  # its noise comes from privacy.epsilon
    values = {k: v for k, v in TINY.items() if k in keys and (private or k != "noise_multiplier")}
    if spec.max_rounds is not None:  # a one-pass family: each of the 3 clients in exactly one round
        section = spec.config(**{k: v for k, v in values.items() if k in spec.keys(name)})
        values["rounds"] = min(values["rounds"], spec.max_rounds(section, 3))
    return build_simulation(load_config(None, [
        f"algorithm.name='{name}'", "data.num_clients=3", "data.samples_per_client=10", "privacy.delta=0.01",
        "run.noise_seed=0",
        *(f"algorithm.{k}={v!r}" for k, v in values.items()), *(["privacy.epsilon=1.0"] if calibrated else [])]))


#: SPIDER's shuffled streams take about 40 s here (their bits calibrated per run): audited under -m slow.
SLOW = ("sdp-spider",)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in registry.names()])
def test_every_registered_algorithm_is_audited_towards_every_observer(name):
    sim = simulation(name)
    target = runs.make_canary(sim, "dirac")
    rounds = next(t + 1 for t in range(5)  # the first round in which some message carries the canary
                  if any(w for tensor, w in response.score_weights(response.responses(sim, target, t, 0)).items()
                         if tensor != response.MOVE))
    observers = sim.ledger.observers  # every observer the run has: the auditor models each one's view
    for result in runs.audit_all(sim, observers, 40, rounds=rounds).values():
        assert 0 <= result.bound.epsilon <= result.claimed_epsilon
        assert not result.violated  # a local randomiser's input (sdp-*) stays in the clip's ball
