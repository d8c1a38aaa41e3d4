"""Secure aggregation across Flower's nodes: the cohort's sum by the Bonawitz et al. 2017 protocol, with each client's
side in its own ClientApp and the server's side in the ServerApp, every protocol message carried by Flower.

``dpfl.engine.secure_sum.SecureAggregation`` runs the four steps (encode, mask, sum mod 2^bits, decode) with every
party in one process. Here the parties are apart (``privacy.secure_aggregation = true`` on Flower):

* **train** (``keep_input``, on the node): the client runs its round, encodes its messages into Z_(2^bits)^d
  exactly as ``SecureAggregation.encode`` does (clamped to the bounds, scaled for the cohort's size, rounded from its
  own "rounding" stream), keeps that vector in its node's ``context.state`` with what the round must look like (its
  index, run, cohort size, dimension, ring, and the default policy of the run's release config) and replies with the
  messages' layout (names, shapes, dtypes) only: no value of an update leaves the node in the clear.
* **the protocol** (``FlowerSecureSum``, on the server; ``respond``, on the node): one exchange of "query.secagg"
  messages per stage of Bonawitz et al. 2017 (Sec. 4): AdvertiseKeys, ShareKeys, MaskedInputCollection,
  ConsistencyCheck (the actively secure variant only) and Unmasking. Each carries the server's message of the stage
  as bytes in the format of ``dpfl.protocols.messages`` and the round's ``SecAggConfig`` (its session: the run's
  release sha256 and run id); the reply carries the client's. The server side is
  ``dpfl.protocols.server.SecAggServer``: it only ever holds public keys, signatures, ciphertexts, commitments, the
  masked vectors y_u = x_u + PRG(b_u) + sum +-PRG(s_uv) (uniform on Z_(2^bits)^d for an observer who lacks the
  masks) and the shares it needs to unmask the SUM, which ``SecureAggregation.decode`` turns back into the
  messages' shapes. The variant is the nodes' choice: the actively secure one when they have signing keys (each
  tells the ServerApp its public key when asked who it is), which they then insist on; a node without one takes
  part only if its node config opts in to the honest-but-curious protocol (``secagg_policy.check_variant``).
* **the node's checks** (``respond``): before it answers, the silo checks the setup against the round it trained and
  against its own policy (``dpfl.flower.secagg_policy``: the smallest cohort and threshold it accepts, its signing
  key), and records the stage in its journal of secure aggregations, on disk beside its data
  (``SiloState.secagg_stage``): each stage once and in order, and once its masked input is out, no other secure
  aggregation of that round, whatever message the server re-sends (a re-sent train message re-creates the same
  input in ``context.state``; the journal is not there).
* **the client's secrets** stay on the node: its ``context.state`` holds the kept input, a 128-bit seed drawn from
  the operating system when the round's keys are advertised (its key pairs, round signing key, self-mask seed and
  Shamir polynomials are derived from it: ``primitives.SeededRandomBytes``) and the server's messages received so
  far. Each stage rebuilds the ``SecAggClient`` by replaying the stages before it from these (the same keys again,
  as the derivation is deterministic) and answers the stage the journal allows. After Unmasking the round's state is
  erased.

A node that replies with an error or not at all within the round timeout has dropped out at that stage (the
protocol's dropout): the next stage goes on without it, its masks are removed by the survivors' shares, and a stage
with fewer than t = ``SecureAggregation.threshold`` clients left stops the round (``SecAggError``, naming the
dropouts): the server's step does not run, and the ledger keeps the round's charge (recorded before any client
trained). A message the server refuses (malformed, unsigned, replayed, out of round, from a node speaking for another
client) stops the round too, as in ``dpfl run``.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from dpfl.engine.secure_sum import SecureAggregation
from dpfl.flower import records
from dpfl.flower.secagg_policy import NodeIdentity, SecAggPolicy, check_setup, check_variant
from dpfl.flower.silo_state import SiloState
from dpfl.protocols.identity import Registry
from dpfl.protocols.messages import SecAggError, read_header
from dpfl.protocols.primitives import SeededRandomBytes
from dpfl.protocols.secagg import SecAggClient, SecAggConfig, SecAggServer, SecureSum, Stage

if TYPE_CHECKING:
    from dpfl.flower.server_app import FlowerCohort

#: The Flower message type of the protocol's stages (a ClientApp query action).
ACTION = "secagg"
#: Record names: the stage's message (both ways), a train reply's message layout, the node's kept round.
SECAGG, LAYOUT, KEPT, KEPT_INPUT = "secagg", "layout", "secagg-round", "secagg-input"
#: The seed's bytes (``SeededRandomBytes`` reads 16).
SEED_BYTES = 16


def session_of(release: str, run_id: str) -> str:
    """The session of a run's secure aggregations (``SecAggConfig.session``): its release sha256 and run id."""
    return f"{release}/{run_id}"


# -- the server's side ----------------------------------------------------------------------------------------------
class FlowerSecureSum:
    """``SecureAggregation.sum`` for a ``Boundary`` on the ServerApp: the rows it gets are the messages' layout
    (tensors on the "meta" device: shapes and dtypes, no values); the clients' encoded inputs stay on their nodes and
    the sum comes from the protocol run over ``cohort``'s grid (module docstring), in the session ``session``, in the
    actively secure variant when ``peers`` (the nodes' public keys) is given."""

    def __init__(self, secure: SecureAggregation, cohort: FlowerCohort, session: str, peers: Registry | None = None):
        self.secure, self.cohort, self.session, self.peers = secure, cohort, session, peers

    def sum(self, rows: dict[str, torch.Tensor], clients: torch.Tensor, seed: int, round_index: int,
            stream_ids: torch.Tensor | None = None):
        """(sums, contributors), as ``SecureAggregation.sum``; every node rounds from its own client's streams
        (``stream_ids`` other than the client ids are the audit's, which never runs on Flower)."""
        if stream_ids is not None:
            raise ValueError("on Flower each node rounds from its own client's streams: stream_ids must be None")
        n = int(clients.numel())
        config = SecAggConfig(round_index, tuple(clients.tolist()), self.secure.threshold(n),
                              sum(rows[k][0].numel() for k in rows), self.secure.bits, self.session,
                              self.peers is not None)
        result = self.run_round(config)
        return self.secure.decode(result.total, rows, n), result.contributors

    def run_round(self, config: SecAggConfig) -> SecureSum:
        """The round's stages with the clients' nodes; ``SecAggError`` (naming the dropouts) when the round stops."""
        server, dropped = SecAggServer(config, self.peers), {}
        try:
            outgoing = dict.fromkeys(config.clients, b"")
            for stage in config.stages:
                self._stage(server, stage, outgoing, dropped)
                if stage != Stage.UNMASKING:
                    outgoing = server.next_messages()
            return server.aggregate()
        except SecAggError as err:
            if not dropped:
                raise
            why = "; ".join(f"client {c} at {stage}: {reason}" for c, (stage, reason) in sorted(dropped.items()))
            raise SecAggError(err.round_id, err.party, f"{err.problem} (dropped out: {why})", err.culprits) from err

    def _stage(self, server: SecAggServer, stage: Stage, outgoing: dict[int, bytes], dropped: dict) -> None:
        """Sends each client its message of ``stage`` and hands the server each reply; a node that replies with an
        error, or not within the timeout, has dropped out (recorded in ``dropped``)."""
        node_of = self.cohort.node_of
        client_of = {node: client for client, node in node_of.items()}
        setup = json.dumps(asdict(server.config))
        messages = [Message(RecordDict({SECAGG: ConfigRecord({"stage": stage.name, "config": setup,
                                                              "message": payload})}),
                            dst_node_id=node_of[c], message_type=f"query.{ACTION}") for c, payload in outgoing.items()]
        answered = set()
        for reply in self.cohort.grid.send_and_receive(messages, timeout=self.cohort.timeout):
            client = client_of.get(reply.metadata.src_node_id)
            if client not in outgoing or client in answered:
                continue
            answered.add(client)
            if reply.has_error():
                dropped[client] = (stage.name, f"its node replied with an error: {reply.error.reason}")
                continue
            message = bytes(reply.content[SECAGG]["message"])
            sender = read_header(message, server.config.round_id, "server").sender
            if sender != client:
                raise SecAggError(server.config.round_id, "server", f"the node of client {client} sent a message "
                                                                    f"in the name of client {sender}", (client,))
            server.receive(message)
        for client in sorted(set(outgoing) - answered):
            dropped[client] = (stage.name, f"no reply within the round timeout ({self.cohort.timeout} s)")


def placeholders(reply: RecordDict) -> dict[str, torch.Tensor]:
    """A secure train reply's messages as the server holds them: their layout, as "meta" tensors [1, *shape]."""
    return {name: torch.empty((1, *shape), dtype=getattr(torch, dtype), device="meta")
            for name, shape, dtype in json.loads(str(reply[LAYOUT]["layout"]))}


# -- the client's side ----------------------------------------------------------------------------------------------
def keep_input(context: Context, secure: SecureAggregation, messages: dict[str, torch.Tensor], client: int,
               seed: int, round_index: int, cohort: int, release: str, run_id: str,
               defaults: SecAggPolicy) -> ConfigRecord:
    """Encodes the client's ``messages`` (leading axis 1) for a cohort of ``cohort`` clients, keeps the vector in the
    node's state for the round's protocol, with what the round must look like (round ``round_index`` of the run
    ``run_id`` of the release config ``release``, whose default policy is ``defaults``), and returns the layout
    record the train reply carries instead."""
    encoded = secure.encode(messages, torch.tensor([client]), seed, round_index, cohort)[0]
    context.state[KEPT_INPUT] = records.tensors_record({"x": encoded})
    context.state[KEPT] = ConfigRecord({"round": round_index, "run": run_id, "release": release,
                                        "session": session_of(release, run_id), "cohort": cohort,
                                        "dimension": int(encoded.numel()), "bits": secure.bits,
                                        "min-cohort": defaults.min_cohort, "min-threshold": defaults.min_threshold})
    layout = [[name, list(value.shape[1:]), str(value.dtype).removeprefix("torch.")] for name, value in messages.items()]
    return ConfigRecord({"layout": json.dumps(layout)})


def respond(msg: Message, context: Context, client: int, state: SiloState) -> Message:
    """The node's reply to the server's message of one stage (module docstring); ``SecAggError`` (an error reply:
    the server counts this client as dropped out) for a round it has no input of or set up otherwise than it
    trained, below its policy, without the signatures its identity requires, and ``SiloStateError`` for a stage its
    journal (``state``) does not allow."""
    request = msg.content[SECAGG]
    stage, setup = Stage[str(request["stage"])], str(request["config"])
    fields = json.loads(setup)
    config = SecAggConfig(**{**fields, "clients": tuple(fields["clients"])})
    if KEPT not in context.state:
        raise SecAggError(config.round_id, f"client {client}", f"{stage.name} for a round this client did not train")
    kept = context.state[KEPT]
    identity = _accepted(config, stage, setup, client, kept, context.node_config, state)
    position = config.stages.index(stage)
    state.secagg_stage(str(kept["run"]), config.round_id, setup, position, config.stages.index(Stage.MASKED_INPUT))
    if stage == Stage.ADVERTISE_KEYS:
        kept["seed"], kept["config"] = secrets.token_bytes(SEED_BYTES), setup
    kept[f"server-{stage.name}"] = bytes(request["message"])
    answer = _replay(client, config, kept, records.tensors_of(context.state[KEPT_INPUT])["x"], stage, identity)
    if stage == Stage.UNMASKING:  # the round is over: its secrets go
        del context.state[KEPT], context.state[KEPT_INPUT]
    return Message(RecordDict({SECAGG: ConfigRecord({"message": answer})}), reply_to=msg)


def _accepted(config: SecAggConfig, stage: Stage, setup: str, client: int, kept: ConfigRecord, node_config,
              state: SiloState) -> NodeIdentity | None:
    """The silo's identity, once the setup has passed its checks (module docstring): the round it trained, its policy
    (the node config's, by default the run's recorded release defaults), the stage in the round's variant, the
    variant its keys require (without keys, only with the explicit opt-in to the honest-but-curious protocol:
    ``check_variant``), and the state of a round under way; SecAggError naming the first that fails."""
    check_setup(config, client, kept)
    defaults = {"min_cohort": int(kept["min-cohort"]), "min_threshold": int(kept["min-threshold"])}
    recorded = state.secagg_defaults(str(kept["run"]), str(kept["release"]), defaults)
    SecAggPolicy(**recorded).under(node_config).check(config, client)
    if stage not in config.stages:
        raise SecAggError(config.round_id, f"client {client}", f"{stage.name} in a round without that stage")
    identity = check_variant(config, node_config, client)
    if stage != Stage.ADVERTISE_KEYS and (str(kept.get("config", "")) != setup or "seed" not in kept):
        raise SecAggError(config.round_id, f"client {client}", f"{stage.name} of a round whose keys this node did not "
                                                               "advertise under this setup (its state was reset)")
    return identity


def _replay(client: int, config: SecAggConfig, kept: ConfigRecord, x: torch.Tensor, upto: Stage,
            identity: NodeIdentity | None) -> bytes:
    """The client's message of stage ``upto``, from a ``SecAggClient`` taken through the stages before it with the
    server's messages it received (its randomness derived from the kept seed, so its keys repeat)."""
    party = SecAggClient(client, config, SeededRandomBytes(int.from_bytes(kept["seed"], "big", signed=True),
                                                           config.round_id, client),
                         identity.key if identity else None, identity.peers if identity else None)
    steps = {Stage.ADVERTISE_KEYS: lambda message: party.advertise_keys(), Stage.SHARE_KEYS: party.share_keys,
             Stage.MASKED_INPUT: lambda message: party.masked_input(message, x),
             Stage.CONSISTENCY_CHECK: party.consistency_check, Stage.UNMASKING: party.unmask}
    for stage in config.stages[: config.stages.index(upto) + 1]:
        answer = steps[stage](bytes(kept[f"server-{stage.name}"]))
    return answer


__all__ = ["ACTION", "FlowerSecureSum", "session_of", "placeholders", "keep_input", "respond"]
