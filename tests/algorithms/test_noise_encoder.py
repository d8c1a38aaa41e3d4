"""``Algorithm.noise_encoder`` of the matrix-factorization families: applied to the moves' noise that the server's
``round_noise`` actually produces from independent draws nu, the encoder C gives back nu exactly (C e = nu), over
several epochs of DP-FTRL's restarted tree (a power of 2 and not) and BandMF's bands."""

import pytest
import torch

from dpfl.algorithms.bandmf import BandMf, banded_sqrt_coefficients
from dpfl.algorithms.dp_ftrl import DpFtrl
from dpfl.engine.protocol import Algorithm

SHARED = dict(local_steps=1, lr=0.1, sampler=None, clip=1.0, noise_multiplier=1.0, global_lr=1.0, population=8,
              cohort_size=2)


@pytest.mark.parametrize("algorithm", [DpFtrl(**SHARED, epoch=4), DpFtrl(**SHARED, epoch=5),
                                       BandMf(**SHARED, coefficients=banded_sqrt_coefficients(3), separation=4)],
                         ids=["tree E=4", "tree E=5", "bandmf b=3"])
def test_the_encoder_recovers_every_draw_from_the_moves(algorithm):
    rounds = 13
    draws = torch.randn(rounds, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    server, moves = algorithm.noise_state(torch.zeros(3, dtype=torch.float64)), []
    for t in range(rounds):
        noise, server = algorithm.round_noise(t, draws[t], server)
        moves.append(noise)
    encoder = algorithm.noise_encoder(rounds)
    assert torch.allclose(encoder @ torch.stack(moves), draws, rtol=0, atol=1e-12)
    assert torch.equal(encoder, encoder.tril()) and bool((encoder.diagonal() > 0).all())


def test_the_tree_encoder_holds_the_nodes_drawn():
    """E = 4: rounds 1..4 draw the nodes {1}, {1, 2}, {3}, {1..4}; the tree restarts at round 5."""
    encoder = DpFtrl(**SHARED, epoch=4).noise_encoder(6)
    assert encoder.tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                                [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1]]


def test_a_family_with_independent_rounds_has_none():
    assert Algorithm.noise_encoder(None, 4) is None
