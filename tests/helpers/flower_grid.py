"""Shared helpers of the Flower tests (on the tests' path: pyproject's ``pythonpath``); import after
``pytest.importorskip("flwr")``."""

import json
from dataclasses import asdict
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from dpfl.protocols.secagg import SecAggClient, SecAggConfig, SecAggServer, SecureSum, Stage

#: The node config of a silo without signing keys that opts in to the honest-but-curious protocol (what the tests of
#: that protocol run; without it, or keys, a silo refuses secure aggregation: ``dpfl.flower.secagg_policy``).
HONEST_BUT_CURIOUS = {"secagg-honest-but-curious": True}


class InProcessGrid:
    """Flower's Grid (``get_node_ids``, ``send_and_receive``) over ClientApps in this process: node 101 + i holds
    partition i, with the node config ``node_config(i)`` besides. ``before(messages)`` runs before each batch is
    delivered; ``lost(message)`` says whether a message's reply is lost (its node dropped out); ``received`` is every
    reply the server got, with the message it answers."""

    def __init__(self, app, nodes: int, node_config=lambda partition: {}):
        self.app, self.lost, self.before, self.received = app, (lambda message: False), (lambda messages: None), []
        self.contexts = {101 + i: Context(run_id=1, node_id=101 + i, node_config={"partition-id": i, **node_config(i)},
                                          state=RecordDict(), run_config={}) for i in range(nodes)}

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        self.before(messages)
        replies = []
        for message in messages:
            try:
                reply = self.app(message, self.contexts[message.metadata.dst_node_id])
            except Exception as err:  # the runtime turns a ClientApp's exception into an error reply
                reply = Message(Error(0, str(err)), reply_to=message)
            if not self.lost(message):
                self.received.append((message, reply))
                replies.append(reply)
        return replies


def write_federation_keys(folder: Path, nodes: int) -> dict[int, dict]:
    """Signing keys for ``nodes`` silos, as their operators would make them (silo 0: ECDSA P-384 in OpenSSH format, the
    key ``ssh-keygen -t ecdsa -b 384`` makes for a SuperNode's authentication; the others Ed25519), and the folder of
    their public keys; {partition: its node config keys}."""
    peers = folder / "peers"
    peers.mkdir(parents=True)
    configs = {}
    for i in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1()) if i == 0 else Ed25519PrivateKey.generate()
        path = folder / f"silo-{i}"
        path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
        (peers / f"{i}.pub").write_bytes(key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH))
        configs[i] = {"secagg-signing-key": str(path), "secagg-peers": str(peers)}
    return configs


def answer(party: SecAggClient, stage: Stage, message: bytes, x) -> bytes:
    """A client's message of ``stage`` in reply to the server's ``message`` (its input ``x``)."""
    if stage == Stage.ADVERTISE_KEYS:
        return party.advertise_keys()
    if stage == Stage.MASKED_INPUT:
        return party.masked_input(message, x)
    return getattr(party, {"SHARE_KEYS": "share_keys", "CONSISTENCY_CHECK": "consistency_check",
                           "UNMASKING": "unmask"}[stage.name])(message)


class MaliciousServer:
    """A ServerApp that runs secure aggregation rounds of its own choosing over a grid: with real nodes, and with
    sybils it plays itself (``SecAggClient`` objects of its own making, input zero)."""

    def __init__(self, grid: InProcessGrid):
        self.grid = grid

    def run(self, config: SecAggConfig, nodes: dict[int, int], sybils: dict[int, SecAggClient] | None = None,
            peers=None) -> SecureSum | dict[int, str]:
        """The round ``config`` with the real nodes {client: node id} and the sybils {client: party}; clients in
        neither are never asked. Its sum, or {client: why} of the real nodes that refused to go on."""
        sybils = sybils or {}
        server, setup = SecAggServer(config, peers), json.dumps(asdict(config))
        outgoing, refused = dict.fromkeys(config.clients, b""), {}
        for stage in config.stages:
            for client, payload in outgoing.items():
                if client in sybils:
                    server.receive(answer(sybils[client], stage, payload, [0] * config.dimension))
                elif client in nodes:
                    request = Message(RecordDict({"secagg": ConfigRecord({"stage": stage.name, "config": setup,
                                                                          "message": payload})}),
                                      dst_node_id=nodes[client], message_type="query.secagg")
                    [reply] = self.grid.send_and_receive([request])
                    if reply.has_error():
                        refused[client] = reply.error.reason
                    else:
                        server.receive(bytes(reply.content["secagg"]["message"]))
            if refused:
                return refused
            if stage != Stage.UNMASKING:
                outgoing = server.next_messages()
        return server.aggregate()

    def resend(self, message: Message, **job) -> Message:
        """A copy of the train ``message`` sent again to its node, with the fields ``job`` changed in its job record;
        the reply."""
        content = dict(message.content)
        content["job"] = ConfigRecord({**dict(content["job"]), **job})
        copy = Message(RecordDict(content), dst_node_id=message.metadata.dst_node_id,
                       message_type=message.metadata.message_type)
        return self.grid.send_and_receive([copy])[0]


__all__ = ["HONEST_BUT_CURIOUS", "InProcessGrid", "write_federation_keys", "answer", "MaliciousServer"]
