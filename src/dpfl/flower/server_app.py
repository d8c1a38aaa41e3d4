"""The ServerApp: ``dpfl run``'s round loop, with the cohort's client work done by the silos' ClientApps.

The run config's ``dpfl-config`` is the resolved dpfl config as JSON (written by ``dpfl flower-app`` from the TOML,
the single source of truth), ``out`` the run directory, ``round-timeout`` the seconds a round waits for its replies,
and ``resume`` / ``restart`` continue the run in ``out`` / archive it and start over (``dpfl run --resume`` /
``--restart``). ``run_experiment`` builds the run exactly as ``dpfl run`` does (data for evaluation and the clients'
record counts, model, algorithm, ClientSampler, boundary, ledger) and runs it with ``FlowerCohort`` as
``Simulation.workers``: each round the cohort is sampled and the round recorded in the ledger (saved; a budget stops
the run here) BEFORE any client is asked to train; then each sampled client's node gets a train message, the drawn
noise is checked against the declaration, the boundary sums the messages (with ``privacy.secure_aggregation``: the
nodes keep their messages and the sum comes from the secure aggregation protocol run with them,
``dpfl.flower.secure_sum``), the algorithm's ``server_update`` runs, the model is evaluated and checkpointed, and
results.json and ledger.json are written as by ``dpfl run``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Iterator

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from dpfl.data import FederatedDataset
from dpfl.engine.protocol import ClientOutput
from dpfl.errors import ConfigError, DpflError
from dpfl.experiments.runner import build_setting, release_hash, run_experiment
from dpfl.flower import records, secure_sum
from dpfl.flower.app_dir import check_enforced
from dpfl.protocols.identity import VerifyingKey, parse_verifying_key


class FlowerCohort:
    """``Simulation.workers`` over a Flower grid: client i's work runs on the node that holds silo i."""

    def __init__(self, grid: Grid, config: dict, dataset: FederatedDataset, delta: float,
                 timeout: float | None = None):
        self.grid, self.timeout = grid, timeout
        self.counts = [int(c) for c in dataset.train.counts]
        setting = build_setting(config, dataset, delta)  # without the server's noise key (secret: None)
        self.job = {"config": json.dumps(config, sort_keys=True), "setting": json.dumps(dataclasses.asdict(setting))}
        self.release = release_hash(config)
        self.node_of: dict[int, int] | None = None
        self.identities: dict[int, VerifyingKey] = {}  # client -> its node's secure aggregation key (if it has one)

    def connect(self) -> dict[int, int]:
        """{client id: node id}, from each node's reply to a query; DpflError unless every client of the config is
        held by exactly one node with the number of training records the ledger was computed from. Keeps the public
        keys the nodes report in ``identities``."""
        deadline = time.monotonic() + (self.timeout or 60.0)
        nodes = list(self.grid.get_node_ids())
        while len(nodes) < len(self.counts) and time.monotonic() < deadline:
            time.sleep(0.5)
            nodes = list(self.grid.get_node_ids())
        replies = self._exchange([(node, "query", RecordDict({records.JOB: ConfigRecord({})})) for node in nodes])
        node_of = {}
        for node, reply in replies.items():
            client, count = int(reply[records.JOB]["client"]), int(reply[records.JOB]["records"])
            if not 0 <= client < len(self.counts) or client in node_of:
                raise DpflError(f"node {node} holds client {client}: expected each of the clients 0..."
                                f"{len(self.counts) - 1} on exactly one node")
            if count != self.counts[client]:
                raise DpflError(f"node {node} holds {count} training records of client {client}; the config's data "
                                f"has {self.counts[client]} (the privacy ledger is computed from those)")
            node_of[client] = node
            identity = str(reply[records.JOB].get(records.IDENTITY, ""))
            if identity:
                self.identities[client] = parse_verifying_key(identity.encode(), f"node {node}'s reply",
                                                              records.IDENTITY)
        missing = sorted(set(range(len(self.counts))) - set(node_of))
        if missing:
            raise DpflError(f"no node holds the clients {missing[:10]} ({len(node_of)} of {len(self.counts)} found)")
        return node_of

    def __call__(self, sim, t: int, cohort: torch.Tensor) -> Iterator[tuple[torch.Tensor, ClientOutput]]:
        if self.node_of is None:
            self.node_of = self.connect()
            if sim.boundary.secure is not None:  # privacy.secure_aggregation: the protocol runs with the nodes
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
    """Runs the dpfl config in ``run_config`` (see the module docstring) over ``grid``; its results (``dpfl run``'s)."""
    if "dpfl-config" not in run_config or "out" not in run_config:
        raise ConfigError("tool.flwr.app.config", sorted(run_config), "the keys dpfl-config (the resolved dpfl config "
                                                                      "as JSON) and out (the run directory)")
    config = json.loads(str(run_config["dpfl-config"]))
    check_enforced(config)  # the ledger charges the server what it really receives
    timeout = float(run_config["round-timeout"]) if "round-timeout" in run_config else None
    return run_experiment(config, str(run_config["out"]), resume=bool(run_config.get("resume", False)),
                          restart=bool(run_config.get("restart", False)),
                          workers=lambda cfg, dataset, delta: FlowerCohort(grid, cfg, dataset, delta, timeout))


def server_app(run_config: dict | None = None) -> ServerApp:
    """A ServerApp serving the run config Flower passes (``flwr run``), over ``run_config`` (the simulation runtime's
    ``run_simulation`` passes none)."""
    application = ServerApp()

    @application.main()
    def main(grid: Grid, context: Context) -> None:
        serve(grid, {**(run_config or {}), **context.run_config})

    return application


app = server_app()

__all__ = ["app", "server_app", "serve", "FlowerCohort"]
