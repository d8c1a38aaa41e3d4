"""Tiny runs as one rank of a group (``dpfl.engine.ranks``), for the 1-rank vs N-rank contract
(tests/algorithms/test_contract.py): `python rank_runs.py PLAN OUT` under the ranks' variables (``dpfl.engine.launch``)
runs each of PLAN's configs (a JSON file: {"key": noise key, "rounds": r, "runs": {label: [--set overrides]}}) for r
rounds in one process group, and rank 0 writes each run's ``summary`` to OUT (torch.save), {label: {"ranked": ...,
"alone": ...}}, with the run in rank 0 alone (no group: the one-process run) beside it, made first, so that the
accounting curves it computes are cached for rank 0's ranked run (``dpfl.accounting.rdp``'s cache)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from dpfl.engine.client_table import ClientTable
from dpfl.engine.protocol import State
from dpfl.engine.ranks import Ranks
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
from states import dense


def summary(sim, whole: State) -> dict:
    """What the contract compares: the rounds run, the ledger's journal without its fingerprints (a world size
    above 1 enters them: ``Simulation._fingerprint``), the fingerprints apart, epsilon per observer (as the last
    evaluation reported it), the model, every client's state (``whole``: split across ranks, gathered from them as a
    checkpoint is) and the clients whose rows this process's client tables hold."""
    journal = sim.ledger.to_dict(summary=False)["journal"]
    held = sorted({int(i) for value in sim.state.clients.values() if isinstance(value, ClientTable)
                   for i in value.state_dict()["clients"]})
    return {"rounds": sim.next_round, "journal": [{k: v for k, v in e.items() if k != "fingerprint"} for e in journal],
            "fingerprints": [e["fingerprint"] for e in journal], "epsilon": sim.history[-1].epsilon,
            "model": sim.model.detach().cpu().clone(),
            "clients": {name: dense(value).detach().cpu().clone() for name, value in whole.clients.items()},
            "held": held}


def run(overrides: list[str], key: int, rounds: int, ranks: Ranks | None = None) -> dict | None:
    """``summary`` of ``rounds`` rounds of the config ``overrides`` with noise key ``key`` (on ``ranks``; None on a
    rank other than 0)."""
    sim = build_simulation(load_config(None, overrides), noise_key=key, ranks=ranks)
    sim.run(rounds)
    whole = sim.state if ranks is None else ranks.whole_state(sim.state)
    models = [sim.model.cpu()] if ranks is None else ranks.everyones(sim.model.detach().cpu())
    return None if whole is None else {**summary(sim, whole), "ranks_agree": all(torch.equal(m, models[0])
                                                                                 for m in models)}


def main(plan_path: str, out_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    ranks = Ranks.from_environment()
    results = {}
    try:
        for label, overrides in plan["runs"].items():
            alone = run(overrides, plan["key"], plan["rounds"]) if ranks.is_first else None
            results[label] = {"alone": alone, "ranked": run(overrides, plan["key"], plan["rounds"], ranks)}
    finally:
        ranks.leave()
    if ranks.is_first:
        torch.save(results, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
