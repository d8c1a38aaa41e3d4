"""stream_seeds evaluates numpy's SeedSequence for a cohort at once: word for word the seeds of
np.random.SeedSequence(key, spawn_key=(round, client + 1, purpose)).generate_state(1, uint64) >> 1, for keys of any
size (the secret key is 128 bits), the server's client id -1, and ids or rounds past 32 bits (numpy's own path)."""

import random

import numpy as np
import pytest
import torch

from dpfl.engine.randomness import PURPOSES, generators, stream_seed, stream_seeds


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
