"""What a silo has spent, computed by the silo itself from the release config it is enrolled in (``dpfl.flower.pin``),
not read from the server's ledger.

A round's privacy depends on the config only through what the round declares before drawing noise: the algorithm's
release, the boundary's view of it for each observer and the client sampler's participation
(``engine.simulator.declare_round``), composed by a ledger of the run's delta, analysis, conversion and neighbouring
relation (``experiments.assembly.build_ledger``). The silo builds those from the pinned config and the recomputed
setting, exactly as the ServerApp does, and declares rounds 1..r from the algorithm's initial state (as calibration
does: no round is trained), so the epsilon it records after answering round r is the one the honest server's ledger
reports through round r, per observer, whatever the server claims. A run with more rounds than the config says (the
rounds are a run-only key) is charged for every round the silo answers.

A silo's own budget (node config ``privacy-budget``, ``check_budget``) limits the epsilon towards the server, the
observer that receives its messages, over every run it answered: each run's epsilon after its last round, added up
(basic composition across runs, whose noise is independent: each run draws from its own key); a round that would take
the total past the budget is refused before anything is drawn.
"""

from __future__ import annotations

import functools
import json

import torch

from dpfl.engine.simulator import declare_round
from dpfl.errors import check_range
from dpfl.experiments.assembly import build_boundary, build_clients, build_ledger
from dpfl.experiments.resolved import resolve
from dpfl.flower.federation import Federation
from dpfl.flower.silo_state import SiloStateError


@functools.lru_cache(maxsize=2)
def _accounting(config_json: str, setting_json: str, algorithm) -> tuple:
    """(boundary, client sampler, initial state, counts, ledger, analysis, the rounds declared so far) of the run."""
    config, setting = json.loads(config_json), json.loads(setting_json)
    typed = resolve(config)
    counts = [int(c) for c in config["data"]["train_counts"]]
    dataset = Federation.of_config(config).dataset(counts, {})
    boundary = build_boundary(typed.privacy, algorithm, dataset.train.counts)
    state = algorithm.init_state(torch.zeros(setting["dimension"] or 1), dataset.num_clients)
    ledger = build_ledger(typed, boundary, setting["delta"], algorithm, budget=False)
    return boundary, build_clients(typed, dataset), state, dataset.train.counts, ledger, typed.privacy.analysis, []


def silo_epsilon(config_json: str, setting_json: str, algorithm, rounds: int) -> dict[str, float | None]:
    """Epsilon towards each observer of rounds 1..``rounds`` of the run of ``config_json`` (the pinned release config)
    with ``algorithm`` built from ``setting_json`` (the setting the silo recomputed); None for infinity."""
    boundary, clients, state, counts, ledger, analysis, declared = _accounting(config_json, setting_json, algorithm)
    while len(declared) < rounds:
        declared.append(declare_round(algorithm, boundary, clients, analysis, len(declared), state, counts)[1])
    return {o: (None if e == float("inf") else e) for o, e in ledger.epsilon_after(declared[:rounds]).items()}


#: The node config key of a silo's budget: the most epsilon towards the server over all its runs.
BUDGET = "privacy-budget"
#: The observer a silo's budget limits.
BUDGET_OBSERVER = "server"


def check_budget(node_config, rounds: list[dict], run: str, epsilon: dict[str, float | None]) -> None:
    """SiloStateError if answering a round of ``run`` (release/run id) whose run's epsilon through it is ``epsilon``
    would take the silo's epsilon towards the server, added up over its runs (``rounds``: the journal's), past its
    node config's ``privacy-budget`` (none: no limit)."""
    if BUDGET not in node_config:
        return
    budget = check_range(BUDGET, float(node_config[BUDGET]), 0.0)
    last: dict[str, dict] = {}
    for entry in rounds:  # each run's epsilon after its last recorded round
        if entry["run"] != run and entry.get("epsilon") is not None:
            last[entry["run"]] = entry["epsilon"]
    values = [e.get(BUDGET_OBSERVER) for e in [*last.values(), epsilon]]
    total = float("inf") if any(v is None for v in values) else sum(values)
    if total > budget:
        raise SiloStateError(
            f"answering this round would take this silo's epsilon towards the server to {total:.4g} over its "
            f"{len(last) + 1} runs (this run {values[-1] if values[-1] is not None else 'inf'}), past its budget "
            f"{BUDGET} = {budget:g}: refused before any noise is drawn")


__all__ = ["BUDGET", "silo_epsilon", "check_budget"]
