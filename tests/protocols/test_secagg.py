"""Secure aggregation (dpfl.protocols.secagg, Bonawitz et al. 2017): exact sums, privacy of the server's view,
dropout recovery up to the threshold, and refusal of bad messages."""

import struct

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.errors import ConfigError
from dpfl.protocols import messages
from dpfl.protocols.messages import MessageType, SecAggError
from dpfl.protocols.primitives import SeededRandomBytes
from dpfl.protocols.secagg import SecAggClient, SecAggConfig, SecAggServer, Stage, simulate_round


def random_inputs(n, d, bits, seed=0):
    values = np.random.default_rng(seed).integers(0, 2**bits, (n, d), dtype=np.uint64)
    return torch.from_numpy(values.view(np.int64))


def modular_sum(rows, bits):
    """The reference: the rows' sum in uint64 arithmetic (mod 2^64), reduced mod 2^bits."""
    total = rows.numpy().view(np.uint64).sum(axis=0, dtype=np.uint64) & np.uint64(2**bits - 1)
    return torch.from_numpy(total.view(np.int64))


class Round:
    """All parties of one round, driven stage by stage so that a test can intercept any message."""

    def __init__(self, inputs, threshold, bits=16, seed=0, round_id=0, clients=None):
        ids = tuple(range(inputs.shape[0])) if clients is None else tuple(clients)
        self.config = SecAggConfig(round_id, ids, threshold, inputs.shape[1], bits)
        self.inputs = dict(zip(ids, inputs))
        self.clients = {c: SecAggClient(c, self.config, SeededRandomBytes(seed, round_id, c)) for c in ids}
        self.server = SecAggServer(self.config)

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
        self.request = self.server.unmask_request()
        return sent

    def unmask(self, among=None):
        sent = {c: self.clients[c].unmask(self.request) for c in (among or self.server.masked)}
        for message in sent.values():
            self.server.receive(message)
        return self.server.aggregate()


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
    _, payload = messages.decode(sent[0], 0, "test", MessageType.MASKED_INPUT)
    return messages.unpack_vector(messages.PayloadReader(payload, 0, "test", "y")).astype(np.int64)


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
    short = messages.encode(MessageType.UNMASK_REQUEST, 0, messages.SERVER, struct.pack(">III", 2, 0, 1))
    with pytest.raises(SecAggError, match="round 0, client 2: only 2 clients with masked inputs"):
        parties.clients[2].unmask(short)


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
    (lambda m: m[:4] + b"\x02" + m[5:], "malformed message from client 1: protocol version 2, this party speaks 1"),
    (lambda m: m[:5] + b"\x63" + m[6:], "unknown message type 99"),
    (lambda m: m + b"\x00", "header says 64 payload bytes, 65 arrived"),
    (lambda m: m[:-1], "header says 64 payload bytes, 63 arrived"),
    (lambda m: m[:18] + struct.pack(">I", 63) + m[22:-1], "malformed ADVERTISE_KEYS from client 1: truncated"),
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
    copied = messages.encode(MessageType.ADVERTISE_KEYS, 0, 1, sent[0][22:])
    with pytest.raises(SecAggError, match="client 1 advertised a public key already in use"):
        parties.server.receive(copied)


def test_forged_counts_are_refused():
    parties = Round(random_inputs(3, 4, 16), 2)
    parties.advertise()
    shares = parties.clients[0].share_keys(parties.key_list)
    payload = shares[22:]
    forged = messages.encode(MessageType.ENCRYPTED_SHARES, 0, 0, struct.pack(">I", 2**31) + payload[4:])
    with pytest.raises(SecAggError, match="ENCRYPTED_SHARES from client 0: count 2147483648"):
        parties.server.receive(forged)
    missing = messages.encode(MessageType.ENCRYPTED_SHARES, 0, 0, struct.pack(">I", 1) + payload[4:4 + 152])
    with pytest.raises(SecAggError, match=r"ciphertexts for clients \[1\], expected one for each of \[1, 2\]"):
        parties.server.receive(missing)


def test_masked_inputs_of_the_wrong_size_or_range_are_refused():
    parties = Round(random_inputs(3, 4, 16), 2)
    parties.advertise()
    parties.share()
    wrong_size = messages.encode(MessageType.MASKED_INPUT, 0, 0, messages.pack_vector(np.zeros(5, np.uint64)))
    with pytest.raises(SecAggError, match="MASKED_INPUT from client 0: 5 values, expected 4"):
        parties.server.receive(wrong_size)
    too_big = messages.encode(MessageType.MASKED_INPUT, 0, 0, messages.pack_vector(np.full(4, 2**16, np.uint64)))
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
    for_two_from_one = parties.routed[2][22 + 4 + 152:]
    for_zero_from_two = parties.routed[0][22 + 4 + 152:]
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
        message = bytearray(parties.clients[c].unmask(parties.request))
        if c == 0:
            message[-1] ^= 1  # the last entry is client 3's key share
        parties.server.receive(bytes(message))
    with pytest.raises(SecAggError, match=r"shares of client 3's .*\(a share was altered\)"):
        parties.server.aggregate()


def test_unmasking_shares_of_the_wrong_kind_are_refused():
    parties = Round(random_inputs(4, 6, 16), 3)
    parties.advertise()
    parties.share()
    parties.mask(among=[0, 1, 2])
    message = bytearray(parties.clients[0].unmask(parties.request))
    message[22 + 4 + 4] = 1  # client 0's own entry: a mask-key share although it survived
    with pytest.raises(SecAggError, match="a share of kind 1 for client 0, expected 0"):
        parties.server.receive(bytes(message))


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
