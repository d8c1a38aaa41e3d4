"""The ServerApp: ``dpfl run``'s round loop, with the cohort's client work done by the silos' ClientApps.

The run config's ``dpfl-config`` is the resolved dpfl config as JSON (written by ``dpfl flower-app`` from the TOML,
the single source of truth; its [data] section is the federation's public metadata, ``dpfl.flower.federation``),
``out`` the run directory, ``round-timeout`` the seconds a round waits for its replies, ``evaluation`` where the
model is evaluated (``dpfl.flower.evaluation``), and ``resume`` / ``restart`` continue the run in ``out`` / archive
it and start over (``dpfl run --resume`` / ``--restart``). The ServerApp reads no records: before round 1 it asks
every node for its client id and number of training records and adds the counts to the config (the release config
commits to them), then ``run_experiment`` builds the run as ``dpfl run`` does (model, algorithm, ClientSampler,
boundary, ledger) from that metadata and runs it with ``FlowerCohort`` as ``Simulation.workers``: each round the
cohort is sampled and the round recorded in the ledger (saved; a budget stops the run here) BEFORE any client is asked to train; then each sampled client's node gets a train message, the drawn
noise is checked against the declaration, the boundary sums the messages (with ``privacy.secure_aggregation``: the
nodes keep their messages and the sum comes from the secure aggregation protocol run with them,
``dpfl.flower.secure_sum``), the algorithm's ``server_update`` runs, the model is evaluated (``Simulation.evaluator``)
and checkpointed, and results.json and ledger.json are written as by ``dpfl run``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Iterator

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from dpfl.data import FederatedDataset
from dpfl.engine.protocol import ClientOutput
from dpfl.errors import ConfigError, DpflError
from dpfl.experiments.assembly import build_setting
from dpfl.experiments.resolved import RunConfig
from dpfl.experiments.run_directory import release_hash
from dpfl.experiments.runner import run_experiment
from dpfl.flower import evaluation, records, secure_sum
from dpfl.flower.app_dir import check_cohort, check_enforced
from dpfl.flower.federation import Federation
from dpfl.flower.pin import release_of
from dpfl.protocols.identity import VerifyingKey, parse_verifying_key


class FlowerCohort:
    """``Simulation.workers`` over a Flower grid: client i's work runs on the node that holds silo i. ``connect``
    first (it finds the nodes and their record counts), then ``bind`` to the run (the runner's ``workers`` factory)."""

    def __init__(self, grid: Grid, num_clients: int, timeout: float | None = None):
        self.grid, self.num_clients, self.timeout = grid, num_clients, timeout
        self.job: dict | None = None
        self.release = ""
        self.node_of: dict[int, int] | None = None
        self.identities: dict[int, VerifyingKey] = {}  # client -> its node's secure aggregation key (if it has one)

    def bind(self, config: RunConfig, dataset: FederatedDataset, delta: float) -> "FlowerCohort":
        """This cohort for the run ``config`` builds (``run_experiment``'s ``workers``): the job every train message
        carries (the config and the algorithm's ``registry.Setting``)."""
        setting = build_setting(config, dataset, delta)  # without the server's noise key (secret: None)
        self.job = {"config": json.dumps(config.raw, sort_keys=True),
                    "setting": json.dumps(dataclasses.asdict(setting))}
        self.release = release_hash(config.raw, config.algorithm.spec)
        return self

    def connect(self) -> list[int]:
        """Each client's number of training records, by client id, from each node's reply to a query (public
        metadata: ``dpfl.flower.federation``); DpflError unless every client 0..M-1 is held by exactly one node.
        Keeps {client id: node id} in ``node_of`` and the public keys the nodes report in ``identities``."""
        deadline = time.monotonic() + (self.timeout or 60.0)
        nodes = list(self.grid.get_node_ids())
        while len(nodes) < self.num_clients and time.monotonic() < deadline:
            time.sleep(0.5)
            nodes = list(self.grid.get_node_ids())
        replies = self._exchange([(node, "query", RecordDict({records.JOB: ConfigRecord({})})) for node in nodes])
        node_of, counts = {}, {}
        for node, reply in replies.items():
            client, count = int(reply[records.JOB]["client"]), int(reply[records.JOB]["records"])
            if not 0 <= client < self.num_clients or client in node_of:
                raise DpflError(f"node {node} holds client {client}: expected each of the clients 0..."
                                f"{self.num_clients - 1} on exactly one node")
            if count < 1:
                raise DpflError(f"node {node} reports {count} training records of client {client}: expected at "
                                "least one")
            node_of[client], counts[client] = node, count
            identity = str(reply[records.JOB].get(records.IDENTITY, ""))
            if identity:
                self.identities[client] = parse_verifying_key(identity.encode(), f"node {node}'s reply",
                                                              records.IDENTITY)
        missing = sorted(set(range(self.num_clients)) - set(node_of))
        if missing:
            raise DpflError(f"no node holds the clients {missing[:10]} ({len(node_of)} of {self.num_clients} found)")
        self.node_of = node_of
        return [counts[client] for client in range(self.num_clients)]

    def evaluate(self, x: torch.Tensor) -> list[dict]:
        """Each node's metrics of the model ``x`` on its own records (``dpfl.flower.evaluation``, "federated")."""
        replies = self._exchange([(node, f"query.{records.EVALUATE}",
                                   RecordDict({records.JOB: ConfigRecord(self.job),
                                               records.SERVER: records.tensors_record({"x": x})}))
                                  for node in self.node_of.values()])
        return [dict(reply[records.METRICS]) for reply in replies.values()]

    def __call__(self, sim, t: int, cohort: torch.Tensor) -> Iterator[tuple[torch.Tensor, ClientOutput]]:
        if sim.boundary.secure is not None and not isinstance(sim.boundary.secure, secure_sum.FlowerSecureSum):
            # privacy.secure_aggregation: the protocol runs with the nodes
            sim.boundary.secure = secure_sum.FlowerSecureSum(
                sim.boundary.secure, self, secure_sum.session_of(self.release, sim.run_id), self._peers())
        secure = isinstance(sim.boundary.secure, secure_sum.FlowerSecureSum)
        clients = cohort.tolist()
        jobs = []
        for client in clients:
            ids = torch.tensor([client])
            job = {**self.job, "round": t, "client": client, "secure": secure, "cohort": len(clients),
                   "run": sim.run_id}
            content = RecordDict({records.JOB: ConfigRecord(job),
                                  records.SERVER: records.tensors_record(sim.state.server),
                                  records.CLIENT: records.tensors_record(sim.state.rows(ids))})
            jobs.append((self.node_of[client], "train", content))
        replies = self._exchange(jobs, round_number=t + 1)
        for client in clients:  # in cohort order, as the simulation sums them
            reply = replies[self.node_of[client]]
            messages = secure_sum.placeholders(reply) if secure else records.tensors_of(reply[records.MESSAGES])
            yield torch.tensor([client]), ClientOutput(messages,
                                                       records.tensors_of(reply[records.CLIENT]),
                                                       records.events_of(reply[records.DRAWN]))

    def _peers(self) -> dict[int, VerifyingKey] | None:
        """The nodes' public keys for the actively secure variant of secure aggregation, if every node has one (None
        if none has); DpflError for a federation in which some have and some have not."""
        if not self.identities:
            return None
        without = sorted(set(self.node_of) - set(self.identities))
        if without:
            raise DpflError(f"the nodes of clients {without[:10]} have no secure aggregation signing key, the others "
                            "have one: a silo with a key takes part only in the actively secure variant, which needs "
                            "every silo's signature. Give every SuperNode the node config keys secagg-signing-key and "
                            "secagg-peers, or none")
        return dict(self.identities)

    def _exchange(self, jobs: list, round_number: int | None = None) -> dict[int, RecordDict]:
        """Sends each (node, message type, content) and returns {node: reply content}; DpflError for a node that
        replied with an error or not at all (the round stays recorded in the ledger: its noise may have been drawn)."""
        messages = [Message(content, dst_node_id=node, message_type=kind) for node, kind, content in jobs]
        replies, errors = {}, set()
        for reply in self.grid.send_and_receive(messages, timeout=self.timeout):
            if reply.has_error():  # e.g. Flower's "node unavailable", which comes from the SuperLink, not the node
                errors.add(reply.error.reason)
            else:
                replies[reply.metadata.src_node_id] = reply.content
        failed = sorted({node for node, _, _ in jobs} - set(replies))
        if failed:
            what = f"replied with an error ({'; '.join(sorted(errors))})" if errors else \
                f"did not reply within {self.timeout} seconds"
            raise DpflError(self._failed(round_number, failed, what))
        return replies

    def _failed(self, round_number: int | None, nodes: list[int], what: str) -> str:
        """The error of a round (or of the connection, round None) that ``nodes`` did not complete: which nodes and
        clients, and what to do (a round is aborted, never retried: see docs/flower.md, "A silo that dies")."""
        client_of = {node: client for client, node in (self.node_of or {}).items()}
        named = ", ".join(f"node {n}" + (f" (client {client_of[n]})" if n in client_of else "") for n in nodes[:10])
        if round_number is None:
            return f"{named} {what}; check that SuperNode and start the run again"
        return (f"round {round_number}: {named} {what}. The round is aborted: nothing of it is applied to the model, "
                "and its privacy charge stays in ledger.json (its noise may have been drawn). Restart that SuperNode "
                "(the same silo file) and resume the run: flwr run APP SUPERLINK --run-config 'resume=true'")


def serve(grid: Grid, run_config: dict) -> dict:
    """Runs the dpfl config in ``run_config`` (see the module docstring) over ``grid``; its results (``dpfl run``'s).
    Reads no records: the federation's metadata comes from the config and the nodes, the evaluation set (if any) is
    the file the run config's ``evaluation`` names."""
    if "dpfl-config" not in run_config or "out" not in run_config:
        raise ConfigError("tool.flwr.app.config", sorted(run_config), "the keys dpfl-config (the resolved dpfl config "
                                                                      "as JSON) and out (the run directory)")
    config = json.loads(str(run_config["dpfl-config"]))
    check_enforced(config)  # the ledger charges the server what it really receives
    federation = Federation.of_config(config)
    check_cohort(config)  # and the silos what they learn of the cohort
    timeout = float(run_config["round-timeout"]) if "round-timeout" in run_config else None
    cohort = FlowerCohort(grid, federation.num_clients, timeout)
    evaluator = evaluation.evaluator_of(run_config, federation, cohort)  # a bad evaluation set: before any node
    counts = cohort.connect()
    config = release_of(config, counts)  # the release the silos pinned: it commits to the counts
    dataset = federation.dataset(counts, {"source": "the silos' own files on their Flower nodes (the server holds no "
                                                    "records)", "train_counts": counts,
                                          "evaluation": evaluator.description["what"]})
    results = run_experiment(config, str(run_config["out"]), resume=bool(run_config.get("resume", False)),
                             restart=bool(run_config.get("restart", False)), workers=cohort.bind, dataset=dataset,
                             evaluator=evaluator)
    print(summary(results), file=sys.stderr)  # the ServerApp's log (`flwr log`)
    return results


def summary(results: dict) -> str:
    """The ServerApp's last log line: the final metrics, labelled with where they come from (``evaluation``), and
    the epsilon per observer."""
    final, described = results["final"], results["evaluation"]
    metrics = ", ".join(f"{name.replace('_', ' ')} {final[name]:.4f}" for name in ("test_accuracy", "train_loss")
                        if final[name] is not None) or "no metrics"
    label = "" if described["covered_by_epsilon"] else " [NOT COVERED BY EPSILON: computed by the silos in the clear]"
    epsilon = ", ".join(f"{o} {'inf' if e is None else f'{e:.3g}'}" for o, e in final["epsilon"].items())
    return (f"dpfl: {results['status']} after round {final['round']}: {metrics} (evaluation: {described['mode']})"
            f"{label}; epsilon ({epsilon}) at delta {final['delta']:.3g}")


def server_app(run_config: dict | None = None) -> ServerApp:
    """A ServerApp serving the run config Flower passes (``flwr run``), over ``run_config`` (the simulation runtime's
    ``run_simulation`` passes none)."""
    application = ServerApp()

    @application.main()
    def main(grid: Grid, context: Context) -> None:
        serve(grid, {**(run_config or {}), **context.run_config})

    return application


app = server_app()

__all__ = ["app", "server_app", "serve", "summary", "FlowerCohort"]
