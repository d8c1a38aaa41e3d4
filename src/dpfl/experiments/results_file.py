"""results.json: what a run reports, and its writer.

results.json is written (atomically) after every evaluated round and when the run ends, so a crash or Ctrl-C leaves the
latest results. It holds "config", "data" (where the data came from and how it was made, ``FederatedDataset.info``: its
source (for a file: path, format, sha256, columns or arrays), classes, partition, split, preprocessing), "rounds" (one
entry per evaluated round: round, test_accuracy, train_loss, epsilon per observer as of that round, nonfinite_examples
(the examples whose gradient norm was not finite, so that the clip gave them weight 0, in the rounds since the previous
entry; absent where the client work ran elsewhere), and gradient_mapping for an algorithm with a prox step, clip (the
round's l2 clip) for one whose clip is server state (dp-fedavg-user's C_t): ``RoundMetrics``; a round replayed after a
resume reports its own epsilon; a row off run.epsilon_every's schedule has "epsilon": null,
``dpfl.engine.epsilon_schedule``, as, while the run runs, has a scheduled row whose epsilon is still being read on
the ledger's background thread, until a later write), "final" (the same keys plus delta, for the model after the last round done, with the
epsilon of every round the ledger records: after a resume stopped mid-replay, also the rounds recorded before the crash;
always computed when the run ends or stops, null while it runs where its last row's is), "privacy" (accountant,
conversion, observers, what each sees, the budget per observer, how the boundary is "enforced" (real protocol,
simulated, declared), where the "noise" comes from (a secret key, or the research mode's run.noise_seed);
"events_per_round": each observer's event of round "events_round", the last round done as the ledger charged it, or the
first round as it will be charged when none is done: one round's events, not the run's, which an algorithm that charges
a record once (isrl-prox-sgd) spends in round 1; for an algorithm that reports them, "noise_multipliers", the
multipliers its noise is drawn at, solved for privacy.epsilon or given; "calibration": for a run whose noise was solved
for privacy.epsilon, the target, the observers it bounds (whose epsilon is at most the target), the boundary they
stand behind and the level solved, else null), "status" ("running": the run has not ended, or
its process died (resume it); "finished": it ran all its rounds; "stopped": see "stopped_by"), "wall_seconds" (the time
in the round loop over the whole run, across resumes), "session_seconds" (this process's part of it), "stopped_reason"
and "stopped_by" (what stopped the run early: "budget", "diverged", "interrupted"; null when it did not) and, when the
directory holds runs archived by ``restart``, "archived" (their spend, and the total with this run:
``dpfl.experiments.archive``), and for a run evaluated elsewhere than on its own data (``Simulation.evaluator``),
"evaluation" (where its metrics come from, whether epsilon covers them; a metric not measured is null), and for a run
with run.eval_clients, "evaluated_clients" (the ids of the clients its train loss and test accuracy are measured on).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dpfl.accounting.observers import COHORT_UNKNOWN
from dpfl.durable import write_text_atomically
from dpfl.engine.simulator import Simulation
from dpfl.experiments.archive import with_archived
from dpfl.experiments.resolved import RunConfig

#: results.json's privacy.not_covered for a run evaluated on its own data (``Simulation.evaluate``).
NOT_COVERED = ("the reported metrics (train loss on all training records, test accuracy) are computed without noise "
               "for research evaluation; epsilon covers the models and messages only")


class ResultsFile:
    """results.json, rewritten atomically (``dpfl.durable``) after every evaluated round and when the run ends.

    Each evaluated round is one line, encoded once: during a run the rounds only grow, so a rewrite encodes the new
    rounds and the other keys, not the whole history again (at 400 rounds, a fraction of a millisecond instead of
    about 10 ms for an indented dump). A round written while its epsilon was still being read (``"epsilon": null``:
    ``Simulation.evaluate(wait=False)``) is encoded again once it has one."""

    def __init__(self, path: Path):
        self.path = path
        self._rounds: list[str] = []  # the encoded rounds so far
        self._unread: set[int] = set()  # positions of the rounds encoded with "epsilon": null

    def write(self, results: dict) -> None:
        rounds = results["rounds"]
        if len(rounds) < len(self._rounds):  # not the same run's history: encode it afresh
            self._rounds, self._unread = [], set()
        for position in [p for p in self._unread if rounds[p]["epsilon"] is not None]:
            self._rounds[position] = json.dumps(rounds[position])
            self._unread.discard(position)
        self._unread.update(p for p in range(len(self._rounds), len(rounds)) if rounds[p]["epsilon"] is None)
        self._rounds += [json.dumps(r) for r in rounds[len(self._rounds):]]
        listed = "[\n" + ",\n".join(" " + line for line in self._rounds) + "\n]" if self._rounds else "[]"
        entries = [(k, listed if k == "rounds" else json.dumps(v, indent=1)) for k, v in results.items()]
        write_text_atomically(self.path, "{\n" + ",\n".join(f" {json.dumps(k)}: " + text.replace("\n", "\n ")
                                                            for k, text in entries) + "\n}", "the results")


def reported_events(sim: Simulation) -> tuple[int, dict]:
    """(round, each observer's event) for results.json: the last round done as the ledger charged it, or round 1 as
    it will be charged when no round is done (rounds numbered from 1, as the ledger's journal)."""
    done = sim.ledger.charged(sim.next_round) if sim.next_round else None
    if done is None:
        return sim.next_round + 1, sim.round_privacy()
    return sim.next_round, done


def results_of(sim: Simulation, config: RunConfig, archived: list[dict] = (), exact: bool = True) -> dict:
    """The run's results so far (the module docstring lists the keys); ``archived``: the spend of the runs archived
    in its directory (``archive.archived_spend``). ``exact``: final's epsilon is computed (the end of a run, a stop);
    False (the write after each evaluated round): computed only where the last row reports epsilon (free then: the
    ledger remembers it) or runs are archived (their total with this run), else null like the row's
    (``dpfl.engine.epsilon_schedule``)."""
    done = sim.history[-1] if sim.history and sim.history[-1].round == sim.next_round else None
    final = (done or sim.evaluate()).to_dict()  # the model after the last round done
    accounted = exact or bool(archived) or final["epsilon"] is not None
    if accounted:  # all spent so far
        final["epsilon"] = {o: None if math.isinf(e) else e for o, e in sim.ledger.epsilon().items()}
    final["delta"] = sim.ledger.delta
    events_round, events = reported_events(sim)
    if accounted and sim.ledger.hides_iterates():  # beside the last-iterate epsilon: what releasing every iterate costs
        final["epsilon_composition"] = {o: None if math.isinf(e) else e
                                        for o, e in sim.ledger.epsilon_composition().items()}
    archive = {"archived": {"runs": list(archived), "with_this_run": with_archived(final["epsilon"], final["delta"],
                                                                              list(archived))}} if archived else {}
    return {
        "config": config.raw,
        "data": sim.data,
        "rounds": [m.to_dict() for m in sim.history],
        "final": final,
        "privacy": {
            "analysis": sim.ledger.analysis,
            "accountant": sim.ledger.accountants(),
            "conversion": sim.ledger.conversion,
            "subsampling_bound": sim.ledger.subsampling_bound,
            "neighboring": sim.ledger.neighboring,
            "boundary": sim.boundary.name,
            "enforced": sim.boundary.enforcement,
            "release": config.privacy.release,
            "cohort": cohort_knowledge(sim.boundary, sim.ledger.observers),
            "unproven": list(sim.algorithm.release(sim.next_round, sim.state, sim.train.counts).unproven)
            if sim.ledger.analysis == "paper" else [],
            "delta": sim.ledger.delta,
            "budget": sim.ledger.budget,
            "observers": list(sim.ledger.observers),
            "unit": sim.algorithm.privacy_unit,
            "noise": noise_of(config.run.noise_seed),
            "not_covered": NOT_COVERED if sim.evaluator is None else sim.evaluator.description["not_covered"],
            "events_round": events_round,
            "events_per_round": {o: str(e) for o, e in events.items()},
            "calibration": sim.calibration,
            **({"assumptions": sim.algorithm.assumptions} if sim.algorithm.assumptions is not None else {}),
            **({"noise_multipliers": sim.algorithm.noise_multipliers}
               if sim.algorithm.noise_multipliers is not None else {}),
        },
        "status": "stopped" if sim.stopped_by else
                  "finished" if sim.next_round >= config.algorithm.rounds else "running",
        "wall_seconds": sim.wall_seconds,
        "session_seconds": sim.session_seconds,
        "stopped_reason": sim.stopped_reason,
        "stopped_by": sim.stopped_by,
        **({"evaluation": sim.evaluator.description} if sim.evaluator is not None else {}),
        **({"evaluated_clients": sim.eval_clients.tolist()} if sim.eval_clients is not None else {}),
        **archive,
    }


def cohort_knowledge(boundary, observers) -> dict:
    """results.json's privacy.cohort: privacy.cohort, the observers that know who takes part in each round and those
    it is secret from, with what the amplification towards the latter assumes (``observers.cohort_known_to``)."""
    secret_from = [o for o in observers if o not in boundary.knows_cohort]
    return {"setting": boundary.cohort, "known_to": [o for o in observers if o in boundary.knows_cohort],
            "secret_from": secret_from,
            "assumes": COHORT_UNKNOWN.format(observers=" and ".join(secret_from)) if secret_from else None}


def noise_of(noise_seed: int | None) -> str:
    """What results.json and the CLI say of where the noise came from (``dpfl.engine.keys``), for ``run.noise_seed``."""
    if noise_seed is None:
        return "secret: a key from the OS's entropy, kept in the run directory's noise.key (never share that file)"
    return (f"research mode, run.noise_seed = {noise_seed}: the noise is reproducible, and every epsilon holds only "
            "against observers who do not know that seed")


__all__ = ["NOT_COVERED", "ResultsFile", "reported_events", "results_of", "cohort_knowledge", "noise_of"]
