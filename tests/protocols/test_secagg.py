"""Secure aggregation (dpfl.protocols.secagg, Bonawitz et al. 2017): exact sums, privacy of the server's view,
dropout recovery up to the threshold, and refusal of bad messages."""

import dataclasses
import struct

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.errors import ConfigError
from dpfl.protocols import messages, shamir
from dpfl.protocols.identity import ed25519_key, sign
from dpfl.protocols.messages import MessageType, SecAggError, ShareKind
from dpfl.protocols.primitives import SeededRandomBytes
from dpfl.protocols.secagg import SecAggClient, SecAggConfig, SecAggServer, Stage, play_round, simulate_round
from dpfl.protocols.shamir import PRIME


def random_inputs(n, d, bits, seed=0):
    values = np.random.default_rng(seed).integers(0, 2**bits, (n, d), dtype=np.uint64)
    return torch.from_numpy(values.view(np.int64))


def modular_sum(rows, bits):
    """The reference: the rows' sum in uint64 arithmetic (mod 2^64), reduced mod 2^bits."""
    total = rows.numpy().view(np.uint64).sum(axis=0, dtype=np.uint64) & np.uint64(2**bits - 1)
    return torch.from_numpy(total.view(np.int64))


def body_of(message, kind):
    """The body of a client message (after its signature)."""
    header = messages.read_header(message, 0, "test")
    _, payload = messages.decode(message, header.round_id, "test", kind)
    return messages.signed_parts(payload, header.round_id, "test", kind.name)[1]


def signed(client, kind, body, sender=None):
    """A message of type ``kind`` with ``body`` in the name of ``sender`` (default: the client), signed with the
    client's key (what a malicious client can send)."""
    sender = client.id if sender is None else sender
    signature = sign(client._signing_key, messages.statement(client.config.digest, kind, sender, body))
    return messages.encode(kind, client.config.round_id, sender, messages.pack_signature(signature) + body)


class Round:
    """All parties of one round, driven stage by stage so that a test can intercept any message (``active``: the
    actively secure variant, each client with an Ed25519 identity in the registry ``peers``)."""

    def __init__(self, inputs, threshold, bits=16, seed=0, round_id=0, clients=None, active=False):
        ids = tuple(range(inputs.shape[0])) if clients is None else tuple(clients)
        self.config = SecAggConfig(round_id, ids, threshold, inputs.shape[1], bits, active=active)
        self.inputs = dict(zip(ids, inputs))
        self.identities = {c: identity(seed, c) for c in ids} if active else {}
        self.peers = {c: key.public_key() for c, key in self.identities.items()} if active else None
        self.clients = {c: SecAggClient(c, self.config, SeededRandomBytes(seed, round_id, c), self.identities.get(c),
                                        self.peers) for c in ids}
        self.server = SecAggServer(self.config, self.peers)

    def advertise(self, among=None):
        sent = {c: self.clients[c].advertise_keys() for c in (among or self.clients)}
        for message in sent.values():
            self.server.receive(message)
        self.key_list = self.server.key_list()
        return sent

    def share(self, among=None):
        sent = {c: self.clients[c].share_keys(self.key_list) for c in (among or self.server.advertised)}
        for message in sent.values():
            self.server.receive(message)
        self.routed = self.server.routed_shares()
        return sent

    def mask(self, among=None):
        sent = {c: self.clients[c].masked_input(self.routed[c], self.inputs[c]) for c in (among or self.routed)}
        for message in sent.values():
            self.server.receive(message)
        if self.config.active:
            self.survivors = self.server.consistency_request()
        else:
            self.request = self.server.unmask_request()
        return sent

    def check(self, among=None):
        sent = {c: self.clients[c].consistency_check(self.survivors) for c in (among or self.server.masked)}
        for message in sent.values():
            self.server.receive(message)
        self.request = self.server.unmask_request()
        return sent

    def unmask(self, among=None):
        sent = {c: self.clients[c].unmask(self.request) for c in (among or self.server.eligible)}
        for message in sent.values():
            self.server.receive(message)
        return self.server.aggregate()

    def run(self):
        self.advertise()
        self.share()
        self.mask()
        if self.config.active:
            self.check()
        return self.unmask()


def identity(seed, client):
    """A client's long-term Ed25519 signing key (reproducible)."""
    return ed25519_key(SeededRandomBytes(seed, 2**32, client)(32))


# --- the sum -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [1, 8, 32, 63])
def test_the_sum_is_exact_mod_2_to_the_bits(bits):
    inputs = random_inputs(5, 33, bits, seed=bits)
    result = simulate_round(inputs, threshold=3, bits=bits, seed=bits)
    assert result.contributors == (0, 1, 2, 3, 4)
    assert result.total.dtype == torch.int64
    assert torch.equal(result.total, modular_sum(inputs, bits))


def test_any_client_ids_and_fresh_operating_system_keys():
    ids = (3, 17, 40, 1000, 2**32 - 2)
    inputs = random_inputs(5, 10, 20)
    result = simulate_round(inputs, threshold=3, bits=20, clients=ids, round_id=2**64 - 1)  # seed None: os.urandom
    assert result.contributors == tuple(sorted(ids))
    assert torch.equal(result.total, modular_sum(inputs, 20))


def test_a_lone_client_sums_to_its_input():
    inputs = random_inputs(1, 4, 12)
    assert torch.equal(simulate_round(inputs, 1, bits=12, seed=3).total, inputs[0])


# --- what the server sees ------------------------------------------------------------------------------------------


def masked_view(x_of_client_0, seed, bits=8):
    """The server's view of client 0's masked vector (decoded from the bytes it received) in a 3-client round."""
    d = x_of_client_0.numel()
    inputs = torch.stack([x_of_client_0, random_inputs(1, d, bits, 1)[0], random_inputs(1, d, bits, 2)[0]])
    parties = Round(inputs, 2, bits=bits, seed=seed)
    parties.advertise()
    parties.share()
    sent = parties.mask()
    body = body_of(sent[0], MessageType.MASKED_INPUT)
    return messages.unpack_vector(messages.PayloadReader(body, 0, "test", "y")).astype(np.int64)


def independence_p(x, y, bins=16, bits=8):
    """p-value of a chi-square test of independence between the coordinates of x and of y (each cut into bins)."""
    width = 2**bits // bins
    table = np.zeros((bins, bins))
    np.add.at(table, (np.asarray(x) // width, np.asarray(y) // width), 1)
    return stats.chi2_contingency(table).pvalue


def test_the_masked_vector_is_uniform_and_independent_of_the_input():
    """y_u = x_u + masks mod 2^8 is uniform on Z_256 whatever x_u is, and carries no trace of x_u: for a zero input and
    for a skewed random input (values 0..15) the coordinates of y pass a chi-square test of uniformity, the two views'
    histograms pass a two-sample test, and the pairs (x_i, y_i) pass a test of independence. The same independence test
    rejects an unmasked view, so it has the power to fail."""
    d = 20_000
    skewed = torch.randint(0, 16, (d,), generator=torch.Generator().manual_seed(9)) * 16
    views = [masked_view(torch.zeros(d, dtype=torch.int64), seed=11), masked_view(skewed, seed=12)]
    histograms = [np.bincount(v, minlength=256) for v in views]
    for h in histograms:
        assert stats.chisquare(h).pvalue > 1e-3
    assert stats.chi2_contingency(np.stack(histograms)).pvalue > 1e-3
    assert independence_p(skewed.numpy(), views[1]) > 1e-3
    assert independence_p(skewed.numpy(), skewed.numpy()) < 1e-10
    assert stats.chisquare(np.bincount(skewed.numpy(), minlength=256)).pvalue < 1e-10


def test_the_keys_and_masks_are_fresh_in_every_round():
    """The same input in two rounds gives unrelated masked vectors (the difference is uniform, not zero)."""
    x = torch.zeros(5000, dtype=torch.int64)
    first, second = masked_view(x, seed=5), masked_view(x, seed=6)
    assert stats.chisquare(np.bincount((first - second) % 256, minlength=256)).pvalue > 1e-3


# --- dropouts ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["advertise_keys", "share_keys", "masked_input", "unmasking"])
def test_dropouts_up_to_n_minus_t_are_recovered(stage):
    """7 clients, t = 4: three may leave at any stage. Clients leaving before their masked input is sent are not in
    the sum (their pair masks with the survivors are removed with their reconstructed keys); clients leaving after it
    are (their self-masks are removed with their reconstructed seeds)."""
    inputs = random_inputs(7, 50, 24, seed=3)
    result = simulate_round(inputs, 4, {1: stage, 4: stage, 6: stage}, bits=24, seed=4)
    included = [0, 1, 2, 3, 4, 5, 6] if stage == "unmasking" else [0, 2, 3, 5]
    assert result.contributors == tuple(included)
    assert torch.equal(result.total, modular_sum(inputs[included], 24))


def test_dropouts_at_every_stage_together():
    inputs = random_inputs(9, 20, 32, seed=5)
    dropouts = {0: Stage.SHARE_KEYS, 3: Stage.MASKED_INPUT, 8: Stage.UNMASKING, 5: Stage.ADVERTISE_KEYS}
    result = simulate_round(inputs, 5, dropouts, bits=32, seed=6)
    assert result.contributors == (1, 2, 4, 6, 7, 8)
    assert torch.equal(result.total, modular_sum(inputs[[1, 2, 4, 6, 7, 8]], 32))


@pytest.mark.parametrize("stage", ["advertise_keys", "share_keys", "masked_input", "unmasking"])
def test_more_than_n_minus_t_dropouts_are_refused(stage):
    inputs = random_inputs(7, 5, 16)
    with pytest.raises(SecAggError, match=r"round 0, server: only 3 .* fewer than the threshold 4.*without a sum"):
        simulate_round(inputs, 4, {c: stage for c in (0, 2, 4, 6)}, bits=16, seed=1)


def test_a_refused_round_gives_no_partial_sum():
    parties = Round(random_inputs(5, 3, 16), 3)
    parties.advertise()
    parties.share()
    parties.mask(among=[0, 1, 2])
    parties.clients[0].unmask(parties.request)
    parties.server.receive(parties.clients[1].unmask(parties.request))
    with pytest.raises(SecAggError, match="only 1 clients sent unmasking shares"):
        parties.server.aggregate()
    assert parties.server.stage == Stage.ABORTED
    with pytest.raises(SecAggError, match="cannot end now"):
        parties.server.aggregate()


def test_a_client_refuses_a_request_below_the_threshold():
    parties = Round(random_inputs(5, 3, 16), 3)
    parties.advertise()
    parties.share()
    parties.mask()
    short = messages.encode(MessageType.UNMASK_REQUEST, 0, messages.SERVER, struct.pack(">IIII", 2, 0, 1, 0))
    with pytest.raises(SecAggError, match="round 0, client 1: only 2 clients with masked inputs"):
        parties.clients[1].unmask(short)


# --- bad messages --------------------------------------------------------------------------------------------------


@pytest.fixture
def advertised():
    parties = Round(random_inputs(4, 6, 16), 3)
    return parties, {c: parties.clients[c].advertise_keys() for c in parties.clients}


def test_a_replayed_message_is_refused(advertised):
    parties, sent = advertised
    parties.server.receive(sent[1])
    with pytest.raises(SecAggError, match="round 0, server: replayed ADVERTISE_KEYS from client 1"):
        parties.server.receive(sent[1])


def test_an_out_of_round_message_is_refused():
    inputs = random_inputs(3, 4, 16)
    old, new = Round(inputs, 2, round_id=6), Round(inputs, 2, round_id=7)
    with pytest.raises(SecAggError, match="round 7, server: out-of-round message from client 0: it belongs to round 6"):
        new.server.receive(old.clients[0].advertise_keys())


def test_an_out_of_order_message_is_refused(advertised):
    parties, sent = advertised
    for message in sent.values():
        parties.server.receive(message)
    parties.key_list = parties.server.key_list()
    with pytest.raises(SecAggError, match="out-of-order message from client 3: ADVERTISE_KEYS while waiting for "
                                          "ENCRYPTED_SHARES"):
        parties.server.receive(sent[3])
    parties.clients[0].share_keys(parties.key_list)
    with pytest.raises(SecAggError, match=r"client 0: share_keys\(\) called at stage MASKED_INPUT"):
        parties.clients[0].share_keys(parties.key_list)


def test_a_client_refuses_a_server_message_of_the_wrong_stage(advertised):
    parties, sent = advertised
    for message in sent.values():
        parties.server.receive(message)
    key_list = parties.server.key_list()
    parties.clients[2].share_keys(key_list)
    with pytest.raises(SecAggError, match="round 0, client 2: out-of-order message from server: KEY_LIST while "
                                          "waiting for ROUTED_SHARES"):
        parties.clients[2].masked_input(key_list, parties.inputs[2])


def test_a_client_cannot_pose_as_the_server(advertised):
    parties, _ = advertised
    forged = messages.encode(MessageType.KEY_LIST, 0, 2, struct.pack(">I", 0))
    with pytest.raises(SecAggError, match="KEY_LIST from client 2: only the server sends it"):
        parties.clients[0].share_keys(forged)


@pytest.mark.parametrize("corrupt, match", [
    (lambda m: m[:10], "10 bytes, shorter than the 22-byte header"),
    (lambda m: b"XXXX" + m[4:], "magic"),
    (lambda m: m[:4] + b"\x01" + m[5:], "malformed message from client 1: protocol version 1, this party speaks 3"),
    (lambda m: m[:5] + b"\x63" + m[6:], "unknown message type 99"),
    (lambda m: m + b"\x00", "header says 162 payload bytes, 163 arrived"),
    (lambda m: m[:-1], "header says 162 payload bytes, 161 arrived"),
    (lambda m: m[:18] + struct.pack(">I", 161) + m[22:-1], "malformed ADVERTISE_KEYS from client 1: 95 bytes of keys"),
    (lambda m: m[:-1] + bytes([m[-1] ^ 1]), "ADVERTISE_KEYS in the name of client 1 does not carry client 1's sig"),
    (lambda m: m[:14] + struct.pack(">I", 99) + m[18:], "ADVERTISE_KEYS from client 99, who is not invited"),
    (lambda m: "text", "received a str, expected bytes"),
])
def test_malformed_messages_are_refused_and_leave_the_server_unchanged(advertised, corrupt, match):
    parties, sent = advertised
    with pytest.raises(SecAggError, match=match):
        parties.server.receive(corrupt(sent[1]))
    parties.server.receive(sent[1])  # the genuine message is still accepted
    assert parties.server.advertised == (1,)


def test_a_reused_public_key_is_refused(advertised):
    parties, sent = advertised
    parties.server.receive(sent[0])
    own = body_of(sent[1], MessageType.ADVERTISE_KEYS)
    copied = signed(parties.clients[1], MessageType.ADVERTISE_KEYS, body_of(sent[0], MessageType.ADVERTISE_KEYS)[:64]
                    + own[64:])  # client 0's public keys, with client 1's key of the round
    with pytest.raises(SecAggError, match="client 1 advertised a public key already in use"):
        parties.server.receive(copied)


def test_forged_counts_are_refused():
    parties = Round(random_inputs(3, 4, 16), 2)
    parties.advertise()
    client = parties.clients[0]
    body = body_of(client.share_keys(parties.key_list), MessageType.ENCRYPTED_SHARES)
    commitment, entries = body[:32], body[36:]
    forged = signed(client, MessageType.ENCRYPTED_SHARES, commitment + struct.pack(">I", 2**31) + entries)
    with pytest.raises(SecAggError, match="ENCRYPTED_SHARES from client 0: count 2147483648"):
        parties.server.receive(forged)
    first = entries[:len(entries) // 2]  # two entries of equal size: (recipient, ciphertext)
    missing = signed(client, MessageType.ENCRYPTED_SHARES, commitment + struct.pack(">I", 1) + first)
    with pytest.raises(SecAggError, match=r"ciphertexts for clients \[1\], expected one for each of \[1, 2\]"):
        parties.server.receive(missing)


def test_masked_inputs_of_the_wrong_size_or_range_are_refused():
    parties = Round(random_inputs(3, 4, 16), 2)
    parties.advertise()
    parties.share()
    wrong_size = signed(parties.clients[0], MessageType.MASKED_INPUT, messages.pack_vector(np.zeros(5, np.uint64)))
    with pytest.raises(SecAggError, match="MASKED_INPUT from client 0: 5 values, expected 4"):
        parties.server.receive(wrong_size)
    too_big = signed(parties.clients[0], MessageType.MASKED_INPUT, messages.pack_vector(np.full(4, 2**16, np.uint64)))
    with pytest.raises(SecAggError, match=r"value 65536 outside Z_\(2\^16\)"):
        parties.server.receive(too_big)


def test_altered_or_misdirected_shares_fail_authentication():
    parties = Round(random_inputs(3, 4, 16), 2)
    parties.advertise()
    parties.share()
    routed = bytearray(parties.routed[2])
    routed[-1] ^= 1
    with pytest.raises(SecAggError, match="round 0, client 2: the shares from client 1 fail authentication"):
        parties.clients[2].masked_input(bytes(routed), parties.inputs[2])
    assert parties.clients[2].stage == Stage.ABORTED
    # client 1's ciphertext for client 2, delivered to client 0 as if it were addressed to it
    entry = (len(parties.routed[2]) - 22 - 4) // 2  # each message: header, count, two (sender, ciphertext) entries
    for_two_from_one = parties.routed[2][22 + 4 + entry:]
    for_zero_from_two = parties.routed[0][22 + 4 + entry:]
    misdirected = messages.encode(MessageType.ROUTED_SHARES, 0, messages.SERVER,
                                  struct.pack(">I", 2) + for_two_from_one + for_zero_from_two)
    with pytest.raises(SecAggError, match="round 0, client 0: the shares from client 1 fail authentication"):
        parties.clients[0].masked_input(misdirected, parties.inputs[0])


def test_a_ciphertext_replayed_from_another_round_fails_authentication():
    """Same keys (same seed) in rounds 0 and 1 would make a replay decrypt, but the round is in the associated data."""
    inputs = random_inputs(3, 4, 16)
    rounds = [Round(inputs, 2, seed=1, round_id=r) for r in (0, 1)]
    for r in rounds:
        r.advertise()
        r.share()
    replay = messages.encode(MessageType.ROUTED_SHARES, 1, messages.SERVER, rounds[0].routed[2][22:])
    with pytest.raises(SecAggError, match="round 1, client 2: the shares from client 0 fail authentication"):
        rounds[1].clients[2].masked_input(replay, inputs[2])


def test_a_key_list_without_the_clients_own_keys_is_refused(advertised):
    parties, sent = advertised
    for c in (0, 1, 2):
        parties.server.receive(sent[c])
    key_list = parties.server.key_list()
    with pytest.raises(SecAggError, match="client 3: the key list does not carry this client's own public keys"):
        parties.clients[3].share_keys(key_list)


def test_a_corrupted_share_of_a_dropped_clients_key_is_detected():
    parties = Round(random_inputs(4, 6, 16), 3)
    parties.advertise()
    parties.share()
    parties.mask(among=[0, 1, 2])  # client 3 drops: the server reconstructs its mask key
    for c in (0, 1, 2):
        message = parties.clients[c].unmask(parties.request)
        if c == 0:  # the last entry is client 3's key share (then its empty signature): client 0 alters it
            body = bytearray(body_of(message, MessageType.UNMASK_SHARES))
            body[-3] ^= 1
            message = signed(parties.clients[0], MessageType.UNMASK_SHARES, bytes(body))
        parties.server.receive(message)
    with pytest.raises(SecAggError, match=r"shares of client 3's mask key .* not its advertised public key .*"
                                          r"\(a share was altered: with 3 responders for a threshold of 3"):
        parties.server.aggregate()


def test_unmasking_shares_of_the_wrong_kind_are_refused():
    parties = Round(random_inputs(4, 6, 16), 3)
    parties.advertise()
    parties.share()
    parties.mask(among=[0, 1, 2])
    body = bytearray(body_of(parties.clients[0].unmask(parties.request), MessageType.UNMASK_SHARES))
    body[4 + 4] = 1  # client 0's own entry: a mask-key share although it survived
    with pytest.raises(SecAggError, match="a share of kind 1 for client 0, expected 0"):
        parties.server.receive(signed(parties.clients[0], MessageType.UNMASK_SHARES, bytes(body)))


# --- the actively secure variant (Bonawitz et al. 2017: signed keys, ConsistencyCheck) --------------------------


@pytest.mark.parametrize("stage", ["share_keys", "masked_input", "consistency_check", "unmasking"])
def test_the_active_variant_sums_exactly_with_dropouts_at_every_stage(stage):
    """7 clients, t = 4, three leave at ``stage``: a client that leaves at ConsistencyCheck sent its masked input, so
    it is in the sum (its self-mask removed with the signers' shares), as one that leaves at Unmasking."""
    inputs = random_inputs(7, 30, 24, seed=8)
    result = simulate_round(inputs, 4, {1: stage, 4: stage, 6: stage}, bits=24, seed=9, active=True)
    included = [0, 2, 3, 5] if stage in ("share_keys", "masked_input") else list(range(7))
    assert result.contributors == tuple(included)
    assert torch.equal(result.total, modular_sum(inputs[included], 24))


def sybil_round(config, victim, x_victim):
    """A malicious server's round with one real client, ``victim`` (client 0), in which it plays clients 1 and 2
    itself: their keys (and, in the active variant, identities, which its own registry holds) are its own, their
    inputs zero. Returns the sum, or the victim's refusal."""
    sybil_peers = {0: identity(0, 0).public_key(), 1: identity(99, 1).public_key(), 2: identity(99, 2).public_key()}
    sybils = {c: SecAggClient(c, config, SeededRandomBytes(99, 0, c), identity(99, c) if config.active else None,
                              sybil_peers if config.active else None) for c in (1, 2)}
    server = SecAggServer(config, sybil_peers if config.active else None)
    parties, inputs = {0: victim, **sybils}, {0: x_victim, 1: torch.zeros_like(x_victim), 2: torch.zeros_like(x_victim)}
    try:
        return play_round(server, parties, inputs)
    except SecAggError as err:
        return err


@pytest.mark.parametrize("active", [False, True])
def test_a_server_that_substitutes_the_other_clients_keys_reads_an_input_unless_keys_are_signed(active):
    """Key substitution: the server answers client 0 with a key list of its own sybils for clients 1 and 2. In the
    honest-but-curious protocol client 0 cannot tell, and the round's "sum" is its input, exactly (what that protocol
    does not protect against). In the active variant the sybils' keys carry no signature of clients 1 and 2's
    registered keys, and client 0 refuses the key list before it sends anything that depends on its input."""
    parties = Round(random_inputs(3, 40, 32, seed=4), 2, bits=32, active=active)
    result = sybil_round(parties.config, parties.clients[0], parties.inputs[0])
    if not active:
        assert torch.equal(result.total, parties.inputs[0])
        return
    assert isinstance(result, SecAggError) and result.party == "client 0"
    assert "keys of clients [1, 2] are not signed by their registered keys" in result.problem
    assert parties.clients[0].stage == Stage.ABORTED


def test_the_server_cannot_show_clients_different_survivor_sets():
    """ConsistencyCheck: client 0 is told that client 4's masked input did not arrive, the others that it did (the
    server's first step towards both shares of client 4's secrets). Client 0 signs the list it saw, the others theirs;
    at Unmasking each client checks t signatures of the list it signed, and both lies are refused."""
    parties = Round(random_inputs(5, 6, 16), 3, active=True)
    parties.advertise()
    parties.share()
    parties.mask()
    short = messages.encode(MessageType.CONSISTENCY_CHECK, 0, messages.SERVER, messages.pack_ids([0, 1, 2, 3]))
    signatures = {c: messages.signed_parts(messages.decode(parties.clients[c].consistency_check(
        short if c == 0 else parties.survivors), 0, "test", MessageType.CONSISTENCY_SIGNATURE)[1], 0, "test", "")[0]
        for c in range(5)}

    def request(survivors, signers):
        entries = b"".join(c.to_bytes(4, "big") + messages.pack_signature(signatures[c]) for c in signers)
        payload = messages.pack_ids(survivors) + messages.pack_count(len(signers)) + entries
        return messages.encode(MessageType.UNMASK_REQUEST, 0, messages.SERVER, payload)

    with pytest.raises(SecAggError, match=r"client 0: the consistency signatures of clients \[1, 2, 3\] are not"):
        parties.clients[0].unmask(request([0, 1, 2, 3], [0, 1, 2, 3]))
    with pytest.raises(SecAggError, match=r"client 1: the consistency signatures of clients \[0\] are not"):
        parties.clients[1].unmask(request(range(5), range(5)))
    with pytest.raises(SecAggError, match="client 2: the unmasking request's survivor list is not the one this"):
        parties.clients[2].unmask(request([0, 1, 2, 3], [0, 1, 2, 3]))


def test_fewer_than_t_consistency_signatures_stop_the_round():
    parties = Round(random_inputs(5, 6, 16), 3, active=True)
    parties.advertise()
    parties.share()
    parties.mask()
    with pytest.raises(SecAggError, match="only 2 clients signed the survivor list at CONSISTENCY_CHECK"):
        parties.check(among=[0, 1])
    assert parties.server.stage == Stage.ABORTED


def test_a_client_with_an_identity_refuses_a_round_without_signatures():
    """No downgrade: a client that has a signing key does not take part in the honest-but-curious protocol."""
    config = SecAggConfig(0, (0, 1, 2), 2, 4, 16)
    with pytest.raises(SecAggError, match="client 0: the round is set up without signatures .* cannot turn off"):
        SecAggClient(0, config, identity=identity(0, 0))
    active = SecAggConfig(0, (0, 1, 2), 2, 4, 16, active=True)
    with pytest.raises(ConfigError, match="identity"):
        SecAggClient(0, active)
    with pytest.raises(SecAggError, match="holds no public key of the invited clients \\[2\\]"):
        SecAggClient(0, active, identity=identity(0, 0), peers={c: identity(0, c).public_key() for c in (0, 1)})
    with pytest.raises(SecAggError, match="not the one the registry holds for it"):
        SecAggClient(0, active, identity=identity(0, 5), peers={c: identity(0, c).public_key() for c in (0, 1, 2)})
    with pytest.raises(ConfigError, match="peers"):
        SecAggServer(active, {0: identity(0, 0).public_key()})


def test_signatures_bind_the_round_setup():
    """A key list signed in a round set up with threshold 2 does not verify for a client told threshold 3."""
    parties = Round(random_inputs(3, 4, 16), 2, active=True)
    parties.advertise()
    other = dataclasses.replace(parties.config, threshold=3)
    victim = SecAggClient(0, other, SeededRandomBytes(0, 0, 0), parties.identities[0], parties.peers)
    victim.advertise_keys()  # the same keys again (the same seed)
    with pytest.raises(SecAggError, match=r"keys of clients \[1, 2\] are not signed .* set the round up differently"):
        victim.share_keys(parties.key_list)


# --- malicious clients: sender authentication and checked secrets -------------------------------------------------


@pytest.mark.parametrize("active", [False, True])
def test_a_client_cannot_send_in_another_clients_name(active):
    """Client 1 sends its masked input under client 0's id, before client 0: refused (it does not carry client 0's
    signature), and the round then sums everyone's own input."""
    parties = Round(random_inputs(3, 5, 16), 2, active=active)
    parties.advertise()
    parties.share()
    sent = {c: parties.clients[c].masked_input(parties.routed[c], parties.inputs[c]) for c in range(3)}
    forged = sent[1][:14] + (0).to_bytes(4, "big") + sent[1][18:]  # the header's sender
    with pytest.raises(SecAggError, match="MASKED_INPUT in the name of client 0 does not carry client 0's signature"):
        parties.server.receive(forged)
    for message in sent.values():
        parties.server.receive(message)
    parties.survivors = parties.request = parties.server.next_messages()[0]
    if active:
        parties.check()
    assert torch.equal(parties.unmask().total, modular_sum(torch.stack(list(parties.inputs.values())), 16))


@pytest.mark.parametrize("active", [False, True])
def test_a_party_advertising_in_another_clients_name(active):
    """An impostor advertises keys as client 0 before client 0 does. With registered keys its signature fails and
    client 0's own advertisement is accepted; without, the second, different advertisement in one name stops the
    round (which of the two is client 0 cannot be told)."""
    parties = Round(random_inputs(3, 5, 16), 2, active=active)
    impostor = SecAggClient(0, parties.config, SeededRandomBytes(7, 0, 0), identity(7, 0) if active else None,
                            {**parties.peers, 0: identity(7, 0).public_key()} if active else None)
    if active:
        with pytest.raises(SecAggError, match="ADVERTISE_KEYS in the name of client 0 does not carry"):
            parties.server.receive(impostor.advertise_keys())
        assert torch.equal(parties.run().total, modular_sum(torch.stack(list(parties.inputs.values())), 16))
        return
    parties.server.receive(impostor.advertise_keys())
    with pytest.raises(SecAggError, match="two different ADVERTISE_KEYS in the name of client 0"):
        parties.server.receive(parties.clients[0].advertise_keys())
    assert parties.server.stage == Stage.ABORTED


@pytest.mark.parametrize("active", [False, True])
def test_a_corrupted_share_of_a_survivors_seed_is_detected_and_its_holder_named_where_shares_are_signed(active):
    """Client 0 (malicious) alters its share of client 3's self-mask seed b_3 before it unmasks. The server's
    reconstruction from t = 3 responders no longer matches client 3's commitment: the round stops instead of giving a
    wrong sum, and the leave-one-out reconstructions from the 5 responders point at client 0's share. In the active
    variant that share no longer carries client 3's signature, and client 0 is named; without signatures client 3
    could have dealt it so (``test_a_share_dealt_off_the_polynomial_never_names_the_honest_recipient``), and no one
    is."""
    parties = Round(random_inputs(5, 8, 16), 3, active=active)
    parties.advertise()
    parties.share()
    parties.mask()
    if active:
        parties.check()
    seed_share, key_share = parties.clients[0]._held[3]
    parties.clients[0]._held[3] = (seed_share._replace(value=(seed_share.value + 1) % PRIME), key_share)
    with pytest.raises(SecAggError, match=r"shares of client 3's self-mask seed from clients \[0, 1, 2\] reconstruct "
                                          r"a value that is not its commitment; the shares of clients \[0\]") as err:
        parties.unmask()
    assert err.value.culprits == ((0,) if active else ())
    assert parties.server.stage == Stage.ABORTED


def test_with_only_t_responders_a_corrupted_share_is_detected_without_a_culprit():
    parties = Round(random_inputs(5, 8, 16), 3)
    parties.advertise()
    parties.share()
    parties.mask()
    seed_share, key_share = parties.clients[1]._held[4]
    parties.clients[1]._held[4] = (seed_share._replace(value=(seed_share.value + 5) % PRIME), key_share)
    with pytest.raises(SecAggError, match=r"client 4's self-mask seed .* \(a share was altered: with 3 responders "
                                          r"for a threshold of 3 its sender cannot be located\)") as err:
        parties.unmask(among=[0, 1, 2])
    assert err.value.culprits == ()


class DishonestDealer(SecAggClient):
    """A malicious client that deals client ``victim`` a share of its self-mask seed b_u off its polynomial,
    f(victim + 1) + 1: its Shamir sharing of b_u is altered at that one point as it is made, before anything is
    signed or encrypted, so that (in the active variant) the share carries the dealer's signature as every other."""

    victim = 0

    def share_keys(self, key_list):
        split = shamir.split

        def off_polynomial(secret, threshold, xs, random_bytes):
            shares = split(secret, threshold, xs, random_bytes)
            if secret == int.from_bytes(self._self_mask_seed, "big"):
                shares[self.victim + 1] = (shares[self.victim + 1] + 1) % PRIME
            return shares

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(shamir, "split", off_polynomial)
            return super().share_keys(key_list)


class UnsignedDealer(SecAggClient):
    """A malicious client that signs its true share of b_u for client ``victim`` but deals it another value."""

    victim = 0

    def _deal(self, recipient, kind, value):
        dealt = super()._deal(recipient, kind, value)
        if recipient != self.victim or kind != ShareKind.SELF_MASK_SEED:
            return dealt
        return dealt._replace(value=(value + 1) % PRIME)


def with_dealer(parties, dealer, kind=DishonestDealer):
    """``parties`` with client ``dealer`` replaced by a party of class ``kind`` with the same keys."""
    parties.clients[dealer] = kind(dealer, parties.config, SeededRandomBytes(0, parties.config.round_id, dealer),
                                   parties.identities.get(dealer), parties.peers)
    return parties


@pytest.mark.parametrize("active", [False, True], ids=["honest-but-curious", "active"])
def test_a_share_dealt_off_the_polynomial_never_names_the_honest_recipient(active):
    """Client 3 deals honest client 0 a share of b_3 off its polynomial; client 0 forwards it at Unmasking, and the
    reconstruction from clients 0, 1, 2 fails client 3's commitment. The shares of clients 1, 2, 3, 4 lie on one
    polynomial, so client 0's share is the odd one out; but in the active variant it carries client 3's signature for
    client 0, so client 3 dealt it: the culprit is client 3. Without signatures client 0's alteration and client 3's
    dealing cannot be told apart, and the error says so and names neither."""
    parties = with_dealer(Round(random_inputs(5, 8, 16), 3, active=active), 3)
    with pytest.raises(SecAggError, match=r"client 3's self-mask seed from clients \[0, 1, 2\] reconstruct") as err:
        parties.run()
    if active:
        assert err.value.culprits == (3,)
        assert "every share carries client 3's signature: client 3 dealt shares that do not lie on one polynomial " \
               "of its secret (those it dealt to clients [0] are off the polynomial of t others)" in err.value.problem
    else:
        assert err.value.culprits == ()
        assert "the shares of clients [0] do not lie on the polynomial of t other shares that reconstruct it: they " \
               "altered them, or client 3 dealt them so, which without signed shares (the honest-but-curious " \
               "protocol) cannot be told apart: neither is named" in err.value.problem
    assert parties.server.stage == Stage.ABORTED


def test_a_recipient_refuses_a_share_without_its_dealers_signature_and_names_the_dealer():
    """Active variant: client 3 signs the true share of b_3 for client 0 but sends another value. Client 0 checks
    client 3's signature when it decrypts its shares and refuses before it sends its masked input, naming client 3
    (only client 3 and client 0 hold the ciphertext's key); the others go on."""
    parties = with_dealer(Round(random_inputs(5, 8, 16), 3, active=True), 3, UnsignedDealer)
    parties.advertise()
    parties.share()
    with pytest.raises(SecAggError, match=r"round 0, client 0: the share of client 3's self-mask seed does not carry "
                                          r"client 3's signature of it for this client") as err:
        parties.clients[0].masked_input(parties.routed[0], parties.inputs[0])
    assert err.value.culprits == (3,) and parties.clients[0].stage == Stage.ABORTED
    assert parties.clients[1].masked_input(parties.routed[1], parties.inputs[1])  # dealt a true share: goes on


def test_with_only_t_responders_the_active_variant_names_a_holder_that_altered_its_share():
    """Client 1 alters its share of client 4's self-mask seed and only t = 3 clients respond: without signatures no
    subset of other shares can point at it (the test above); with them its share no longer carries client 4's
    signature, and client 1 is named."""
    parties = Round(random_inputs(5, 8, 16), 3, active=True)
    parties.advertise()
    parties.share()
    parties.mask()
    parties.check()
    share, key_share = parties.clients[1]._held[4]
    parties.clients[1]._held[4] = (share._replace(value=(share.value + 5) % PRIME), key_share)
    with pytest.raises(SecAggError, match=r"the shares of clients \[1\] do not carry client 4's signature of them: "
                                          r"they altered the shares client 4 dealt them") as err:
        parties.unmask(among=[0, 1, 2])
    assert err.value.culprits == (1,)


def test_a_client_that_committed_to_another_seed_is_named():
    """Client 3 sends a commitment that is not to the seed it shares: every responder's share agrees on the seed, which
    does not match the commitment, so the server names client 3 (and never sums with an unchecked seed)."""
    parties = Round(random_inputs(5, 8, 16), 3)
    parties.advertise()
    sent = {c: parties.clients[c].share_keys(parties.key_list) for c in parties.clients}
    body = body_of(sent[3], MessageType.ENCRYPTED_SHARES)
    sent[3] = signed(parties.clients[3], MessageType.ENCRYPTED_SHARES, bytes(32) + body[32:])
    for message in sent.values():
        parties.server.receive(message)
    parties.routed = parties.server.routed_shares()
    parties.mask()
    with pytest.raises(SecAggError, match=r"all 5 shares agree on that value: client 3 shared another secret") as err:
        parties.unmask()
    assert err.value.culprits == (3,)


# --- configuration -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, field", [
    ({"threshold": 2}, "threshold"),  # not a majority of 5
    ({"threshold": 6}, "threshold"),
    ({"bits": 64}, "bits"),
    ({"dimension": 0}, "dimension"),
    ({"clients": (1, 1, 2, 3, 4)}, "clients"),
    ({"clients": (0, 1, 2, 3, 2**32 - 1)}, "clients"),
    ({"clients": (0, 1, 2, 3, 4.0)}, "clients"),
    ({"round_id": -1}, "round_id"),
])
def test_bad_configurations_are_refused(kwargs, field):
    base = {"round_id": 0, "clients": (0, 1, 2, 3, 4), "threshold": 3, "dimension": 2, "bits": 8}
    with pytest.raises(ConfigError, match=f"^{field} = "):
        SecAggConfig(**{**base, **kwargs})


@pytest.mark.parametrize("x, match", [
    (torch.tensor([0, 256]), r"values in \[0, 256\]"),
    (torch.tensor([-1, 2]), r"values in \[-1, 2\]"),
    (torch.tensor([0.5, 1.0]), "float"),
    (torch.tensor([1, 2, 3]), r"shape \(3,\)"),
])
def test_bad_inputs_are_refused(x, match):
    parties = Round(random_inputs(3, 2, 8), 2, bits=8)
    parties.advertise()
    parties.share()
    with pytest.raises(ConfigError, match=match):
        parties.clients[0].masked_input(parties.routed[0], x)


def test_simulate_round_checks_its_arguments():
    with pytest.raises(ConfigError, match="dropouts"):
        simulate_round(random_inputs(3, 2, 8), 2, {7: "unmasking"}, bits=8)
    with pytest.raises(ConfigError, match=r"dropouts\[1\]"):
        simulate_round(random_inputs(3, 2, 8), 2, {1: "later"}, bits=8)
    with pytest.raises(ConfigError, match="inputs"):
        simulate_round(np.zeros((3, 2)), 2, bits=8)


# --- cost ----------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_round_of_50_clients_and_10000_parameters_with_dropouts_is_exact():
    """The size benchmarks/secagg_round.py times (target < 5 s a round)."""
    inputs = random_inputs(50, 10_000, 32)
    result = simulate_round(inputs, 26, {c: "masked_input" for c in range(0, 50, 7)}, bits=32)
    assert torch.equal(result.total, modular_sum(inputs[[c for c in range(50) if c % 7]], 32))
