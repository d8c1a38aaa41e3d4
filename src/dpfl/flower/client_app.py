"""The ClientApp: one silo, on its own SuperNode, runs the algorithm's ``client_round`` on its own records.

Its node config names its data (``data-path``: a silo file, ``dpfl.flower.silo``; optional ``client-column``), its
dpfl client id (``client-id``; else the file's client column; else Flower's ``partition-id``, which the simulation
runtime sets) and optionally the folder of its own state (``state-dir``; default: the data path + ".dpfl-state":
``dpfl.flower.silo_state``). In the simulation runtime the run config's ``silo-path`` (e.g.
"silos/{partition-id}.npz") stands in for a per-node ``data-path``.

* query: replies with its client id, number of training records (the ServerApp maps clients to nodes and builds the
  run from the counts: public metadata, ``dpfl.flower.federation``) and its secure aggregation public key, if it has
  one (``dpfl.flower.secagg_policy``).
* train: admits the job only if its release config is the one the silo is enrolled in (node config
  ``release-sha256``), with the setting the silo recomputes from it and no public noise seed unless the silo opts in
  (``dpfl.flower.pin``); checks that the release describes its records (its count, feature shape and classes:
  ``dpfl.flower.federation.check_silo``); builds the algorithm from that config and setting (cached per job);
  checks and records in its journal (``SiloState``) that its data is unchanged since its first round and the round
  not answered before on another input, with the run's epsilon per observer through the round, computed by the silo
  (``dpfl.flower.silo_ledger``) and printed to its log; runs ``client_round`` for its client with its own random
  streams (``SiloContext``: the silo's key for the run, the noise's bound to the round's input, ``silo_state``; the
  key never leaves the node), and replies with the messages, its new state rows and the events of the noise it drew.
  With ``privacy.secure_aggregation`` it keeps its messages, encoded, on the node and replies with their layout
  instead (``dpfl.flower.secure_sum.keep_input``).
* query "secagg": one stage of the secure aggregation round (``dpfl.flower.secure_sum.respond``), under the silo's
  own policy (node config ``secagg-min-cohort``, ``secagg-min-threshold``, ``secagg-signing-key``, ``secagg-peers``,
  or without the last two ``secagg-honest-but-curious = true``: ``dpfl.flower.secagg_policy``) and its journal of
  secure aggregations (``SiloState``).
* query "evaluate" (federated evaluation, ``dpfl.flower.evaluation``): the model's loss on its training records and
  accuracy on its test records, in the clear (NOT covered by epsilon); refused with the node config
  ``federated-evaluation = false``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from dataclasses import dataclass

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dpfl.algorithms import registry
from dpfl.engine.grads import CohortGradients
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.engine.randomness import ClientStreams
from dpfl.errors import ConfigError
from dpfl.experiments.assembly import build_boundary
from dpfl.experiments.resolved import RunConfig
from dpfl.flower import records, secure_sum
from dpfl.flower.federation import check_silo
from dpfl.flower.secagg_policy import SecAggPolicy, node_identity
from dpfl.flower.silo import Silo, load_silo
from dpfl.flower.pin import Admitted, admitted
from dpfl.flower.silo_ledger import check_budget, silo_epsilon
from dpfl.flower.silo_state import (NOISE_PURPOSES, SiloState, SiloStateError, bound_key, data_fingerprint,
                                    input_digest)
from dpfl.models import build_model

@functools.lru_cache(maxsize=4)
def silo_of(path: str, client_column: str | None) -> Silo:
    return load_silo(path, client_column)


@functools.lru_cache(maxsize=4)
def fingerprint_of(path: str, client_column: str | None) -> str:
    silo = silo_of(path, client_column)
    return data_fingerprint(silo.x, silo.y)


def silo_path(context: Context, run_config: dict | None = None) -> str:
    """The path of this node's silo file (see the module docstring)."""
    node = context.node_config
    path = node.get("data-path")
    if path is None:
        template = {**(run_config or {}), **context.run_config}.get("silo-path")
        if template is None:
            raise ConfigError("data-path", None, "the node config's path to this silo's data (or the run config's "
                                                 "silo-path template in a simulation)")
        path = str(template).replace("{partition-id}", str(node.get("partition-id")))
    return str(path)


def node_silo(context: Context, run_config: dict | None = None) -> tuple[int, Silo]:
    """This node's client id and records (see the module docstring); ``run_config`` under Flower's."""
    node = context.node_config
    silo = silo_of(silo_path(context, run_config), node.get("client-column"))
    client = node.get("client-id", silo.client if silo.client is not None else node.get("partition-id"))
    if client is None:
        raise ConfigError("client-id", None, "the node config's dpfl client id (or a client column in its data)")
    return int(client), silo


@functools.lru_cache(maxsize=2)
def algorithm_of(config_json: str, setting_json: str, num_features: int):
    """The algorithm and the gradient oracle the job describes (the same builder ``dpfl run`` uses)."""
    config, setting = json.loads(config_json), json.loads(setting_json)
    setting["train_counts"] = tuple(setting["train_counts"])
    setting["levels"] = tuple(tuple(pair) for pair in setting.get("levels", ()))  # JSON has lists
    algo_cfg, model_cfg = config["algorithm"], config["model"]
    spec = registry.spec_of(algo_cfg["name"])
    section = spec.section(algo_cfg)
    algorithm = spec.build(algo_cfg["name"], section, registry.Setting(**setting))
    model = build_model(model_cfg["name"], num_features, setting["num_classes"],
                        **{k: v for k, v in model_cfg.items() if k != "name"})
    if config["run"]["threads"] is not None:
        torch.set_num_threads(config["run"]["threads"])  # the same float rounding as the run it mirrors
    return algorithm, CohortGradients(model)


def identify(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    """The reply to a query: this node's client id, number of training records and secure aggregation public key
    (an OpenSSH line; empty without a signing key)."""
    client, silo = node_silo(context, run_config)
    identity = node_identity(context.node_config, client)
    return Message(RecordDict({records.JOB: ConfigRecord({"client": client, "records": int(silo.y.numel()),
                                                          records.IDENTITY: identity.public if identity else ""})}),
                   reply_to=msg)


def train(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    """The reply to a train message: the client's work of the round (see the module docstring)."""
    client, silo = node_silo(context, run_config)
    job = msg.content[records.JOB]
    if int(job["client"]) != client:
        raise ConfigError("client-id", client, f"the client the ServerApp addressed ({job['client']})")
    secure = bool(job["secure"])
    job_admitted = admitted(context.node_config, str(job["config"]), str(job["setting"]), secure)
    config, setting, t, ids = job_admitted.config, job_admitted.setting, int(job["round"]), torch.tensor([client])
    check_silo(config, setting, client, silo)  # before anything is built or drawn
    algorithm, grads = algorithm_of(job_admitted.config_json, job_admitted.setting_json, silo.x[0].numel())
    server, rows = records.tensors_of(msg.content[records.SERVER]), records.tensors_of(msg.content[records.CLIENT])
    ctx = silo_context(context, run_config, job_admitted, str(job["run"]), t, server, rows, algorithm, grads, ids)
    data = ClientData(silo.x.unsqueeze(0), silo.y.unsqueeze(0), torch.tensor([silo.y.numel()]))
    out = algorithm.client_round(t, server, rows, data, ctx)
    if secure:  # privacy.secure_aggregation: the messages stay here, encoded, for the protocol
        counts = torch.tensor(setting["train_counts"])
        boundary = build_boundary(RunConfig.of(config).privacy, algorithm, counts).secure
        defaults = SecAggPolicy.of_release(boundary, setting)
        sent = {secure_sum.LAYOUT: secure_sum.keep_input(context, boundary, out.messages, client, ctx.bound_seed, t,
                                                         int(job["cohort"]), job_admitted.release, str(job["run"]),
                                                         defaults)}
    else:
        sent = {records.MESSAGES: records.tensors_record(out.messages)}
    return Message(RecordDict({**sent, records.CLIENT: records.tensors_record(out.state),
                               records.DRAWN: records.events_record(out.events)}), reply_to=msg)


@dataclass
class SiloContext(ClientContext):
    """A silo's ``ClientContext``: the streams of ``NOISE_PURPOSES`` keyed by ``bound_seed`` (the round's key, bound
    to its input: ``silo_state.bound_key``), the others by ``seed`` (the run's key)."""

    bound_seed: int = 0

    def streams(self, purpose: str) -> ClientStreams:
        if purpose in NOISE_PURPOSES:
            return ClientContext(self.grads, self.bound_seed, self.round, self.ids, self.stream_ids).streams(purpose)
        return super().streams(purpose)


def silo_context(context: Context, run_config: dict | None, job: Admitted, run_id: str, round_index: int,
                 server: dict, rows: dict, algorithm, grads, ids: torch.Tensor) -> SiloContext:
    """The round's ``SiloContext``, after the silo's checks and its journal's record (``SiloState``): its data
    unchanged since its first round, the round not answered before on another input, its own budget not passed
    (node config ``privacy-budget``: ``silo_ledger.check_budget``); the record holds the run's epsilon per observer
    through this round (``silo_ledger``), which the silo prints. Keys: its own secret's for
    the run, bound to the round's input for the noise; or, where its node config opts in, run.noise_seed for all."""
    path = silo_path(context, run_config)
    state = SiloState.beside(path, context.node_config.get("state-dir"))
    fingerprint = fingerprint_of(path, context.node_config.get("client-column"))
    state.check_data(fingerprint)
    seed, digest = job.config["run"].get("noise_seed"), input_digest(round_index, server, rows)
    key = state.run_key(job.release, run_id) if seed is None else int(seed)
    epsilon = silo_epsilon(job.config_json, job.setting_json, algorithm, round_index + 1)
    state.admit(job.release, run_id, round_index, digest, epsilon, before_new=lambda rounds: check_budget(
        context.node_config, rounds, f"{job.release}/{run_id}", epsilon))
    print(f"dpfl silo (client {int(ids[0])}): round {round_index + 1} of run {run_id[:12]}: epsilon through it "
          + ", ".join(f"{o} {'inf' if e is None else f'{e:.4g}'}" for o, e in epsilon.items())
          + f" at delta {job.setting['delta']:.3g}", file=sys.stderr)
    bound = key if seed is not None else bound_key(key, fingerprint, digest)
    return SiloContext(grads, key, round_index, ids, bound_seed=bound)


def evaluate(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    """The reply to an "evaluate" query: the model's mean loss on this silo's training records and accuracy on its
    test records, with their numbers, in the clear (``dpfl.flower.evaluation``: NOT covered by epsilon)."""
    if not context.node_config.get("federated-evaluation", True):
        raise SiloStateError("this silo sends no metrics of its records in the clear (node config "
                             "federated-evaluation = false): run without federated evaluation")
    _, silo = node_silo(context, run_config)
    job = msg.content[records.JOB]
    _, grads = algorithm_of(str(job["config"]), str(job["setting"]), silo.x[0].numel())
    x = records.tensors_of(msg.content[records.SERVER])["x"]
    loss, _ = grads.loss_and_accuracy(x, silo.x, silo.y)
    _, accuracy = grads.loss_and_accuracy(x, silo.test_x, silo.test_y)
    return Message(RecordDict({records.METRICS: ConfigRecord({
        "train_loss": float(loss), "train_records": int(silo.y.numel()), "test_accuracy": float(accuracy),
        "test_records": int(silo.test_y.numel())})}), reply_to=msg)


def secagg(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    """The reply to a "secagg" query: one stage of the secure aggregation round, under this silo's policy and journal
    (``dpfl.flower.secure_sum.respond``)."""
    state = SiloState.beside(silo_path(context, run_config), context.node_config.get("state-dir"))
    return secure_sum.respond(msg, context, node_silo(context, run_config)[0], state)


def client_app(run_config: dict | None = None, node_config: dict | None = None) -> ClientApp:
    """A ClientApp answering ``identify``, ``train``, ``secagg`` and ``evaluate``, with ``run_config`` under the one
    Flower passes (the simulation runtime passes none: give it the silo-path template here) and ``node_config`` under
    the node's (the simulation runtime's nodes have only partition-id and num-partitions: give the silos' own settings,
    e.g. secagg-honest-but-curious, here; the ServerApp has no say in either)."""
    application = ClientApp()

    def handle(handler):
        def answer(msg: Message, context: Context) -> Message:
            if node_config:
                context = dataclasses.replace(context, node_config={**node_config, **context.node_config})
            return handler(msg, context, run_config)  # context.state is the node's own object either way
        return answer

    application.query()(handle(identify))
    application.train()(handle(train))
    application.query(secure_sum.ACTION)(handle(secagg))
    application.query(records.EVALUATE)(handle(evaluate))
    return application


app = client_app()

__all__ = ["app", "client_app", "identify", "train", "evaluate", "node_silo", "algorithm_of"]
