"""stream_seeds evaluates numpy's SeedSequence for a cohort at once: word for word the seeds of
np.random.SeedSequence(key, spawn_key=(round, client + 1, purpose)).generate_state(1, uint64) >> 1, for keys of any
size (the secret key is 128 bits), the server's client id -1, and ids or rounds past 32 bits (numpy's own path); the
audit's batched streams (one generator for a call's rows) draw each row's shape from a stream no row owns."""

import random

import numpy as np
import pytest
import torch

from dpfl.engine.randomness import (PURPOSES, ClientStreams, ServerStreams, batch_generator, generators, stream_seed,
                                    stream_seeds)


def numpy_seed(key: int, round_index: int, client: int, purpose: str) -> int:
    sequence = np.random.SeedSequence(key, spawn_key=(round_index, client + 1, PURPOSES[purpose]))
    return int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1))


def test_every_seed_is_numpys():
    rng = random.Random(0)
    for _ in range(200):
        key = rng.choice([0, 1, rng.randrange(2**32), rng.randrange(2**64), rng.randrange(2**128),
                          rng.randrange(2**200)])
        round_index = rng.choice([0, rng.randrange(10**6), 2**32 - 1])
        purpose = rng.choice(list(PURPOSES))
        clients = [-1, 0, 5, rng.randrange(10**6), 2**32 - 2]
        assert stream_seeds(key, round_index, clients, purpose) == \
            [numpy_seed(key, round_index, c, purpose) for c in clients]


@pytest.mark.parametrize("round_index, client", [(2**32, 3), (5, 2**32 - 1), (5, 2**40)])
def test_ids_past_32_bits_take_numpys_path(round_index, client):
    assert stream_seed(123, round_index, client, "noise") == numpy_seed(123, round_index, client, "noise")


def test_generators_draw_the_streams_of_their_seeds():
    ours = generators(2**100 + 7, 4, [-1, 0, 9], "records")
    for g, client in zip(ours, [-1, 0, 9]):
        reference = torch.Generator().manual_seed(numpy_seed(2**100 + 7, 4, client, "records"))
        assert torch.equal(torch.rand(5, generator=g), torch.rand(5, generator=reference))


def test_an_unknown_purpose_is_refused():
    with pytest.raises(ValueError, match="purpose = 'nope' is not allowed"):
        stream_seeds(1, 0, [0], "nope")


def test_batched_streams_draw_every_rows_shape_from_one_stream_no_row_owns():
    """Batched client streams: one draw [rows, *widest] from ``batch_generator`` (key, round, the first id, purpose),
    padded past each row's shape as the per-row streams pad; ``generators`` still gives each row its own stream, and
    the batch's numbers are none of them. Batched server rows continue their one stream across draws."""
    key, ids, shapes = 2**70 + 3, [12, 13, 14], [(2, 3), (1, 4), (2, 1)]
    batched, rows = ClientStreams(key, 5, ids, "records", batched=True), ClientStreams(key, 5, ids, "records")
    drawn = batched.uniform(shapes)
    reference = torch.rand((3, 2, 4), generator=batch_generator(key, 5, ids, "records"))
    for i, (a, b) in enumerate(shapes):
        assert torch.equal(drawn[i, :a, :b], reference[i, :a, :b])
        assert bool(torch.isinf(drawn[i]).sum() == 8 - a * b)
    assert rows.uniform(shapes).isinf().tolist() == drawn.isinf().tolist()
    own = [torch.rand(8, generator=g) for g in batched.generators]
    assert all(torch.equal(o, torch.rand(8, generator=g)) for o, g in zip(own, generators(key, 5, ids, "records")))
    assert not any(torch.equal(o, reference.reshape(-1)[:8]) for o in own)
    fresh = ClientStreams(key, 5, ids, "records", batched=True)  # (successive draws continue one object's stream)
    assert torch.equal(fresh.normal((4,)), torch.randn((3, 4), generator=batch_generator(key, 5, ids, "records")))
    server = ServerStreams(key, 5, torch.tensor(ids), "server_noise", batched=True)
    stream = batch_generator(key, 5, ids, "server_noise")
    for _ in range(2):
        assert torch.equal(server.normal((2,)), torch.randn((3, 2), generator=stream))
    assert not torch.equal(ClientStreams(key, 5, [13, 14], "records", batched=True).normal((4,))[0],
                           ClientStreams(key, 5, ids, "records", batched=True).normal((4,))[1])  # another first id
