"""Real secure aggregation behind Boundary.collect (privacy.secure_aggregation): the same model as the simulated sum
up to discretisation, dropouts down to the threshold, and faults (too many dropouts, malformed, replayed and
out-of-round messages) that end the round with an error, no model update, and the round's privacy still charged."""

from __future__ import annotations

import logging

import pytest
import torch

from dpfl.engine.boundary import Boundary
from dpfl.engine.secure_sum import SecureAggregation
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
from dpfl.protocols.secagg import SecAggClient, SecAggError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
logging.getLogger("absl").setLevel(logging.ERROR)

BASE = ["algorithm.name='dp-fedavg-joint'", "data.num_clients=8", "data.samples_per_client=40",
        "algorithm.local_steps=2", "privacy.boundary='secagg'", "algorithm.min_clients=6",
        "run.noise_seed=0"]  # the same draws in every simulation (research mode)


def simulation(secure: bool, *extra):
    return build_simulation(load_config(None, [*BASE, f"privacy.secure_aggregation={str(secure).lower()}", *extra]))


def test_real_and_simulated_secure_sums_give_the_same_model_up_to_discretisation():
    real, simulated = simulation(True), simulation(False)
    assert real.round_privacy() == simulated.round_privacy()  # the same accounting
    real.run(4)
    simulated.run(4)
    bound = real.boundary.secure.bounds["dy"]
    step = 8 * 8 * bound / 2**31  # n^2 B / 2^(bits-1): the rounding of 8 clients' values, summed
    assert float((real.model - simulated.model).abs().max()) <= 4 * step + 1e-6  # 4 rounds, float32 apart


def test_a_client_that_drops_out_is_left_out_of_the_sum_and_the_mean():
    rows = {"dy": torch.arange(8, dtype=torch.float32).reshape(8, 1) * torch.ones(8, 3)}
    ids = torch.arange(8)
    secure = SecureAggregation({"dy": 10.0}, min_clients=6, dropouts={3: "masked_input", 5: "unmasking"})
    delivered = Boundary("secagg", secure).collect([rows], 8, seed=0, round_index=0, clients=ids)
    # client 3 left before its masked input (not in the sum); client 5 after it (in the sum, unmasked by the others)
    assert delivered.count == 7
    torch.testing.assert_close(delivered.sum("dy"), torch.full((3,), 28.0 - 3.0), rtol=0, atol=1e-5)


def test_too_many_dropouts_end_the_round_with_no_update_and_the_privacy_charged():
    sim = simulation(True)
    sim.boundary.secure = SecureAggregation(sim.boundary.secure.bounds, min_clients=6,
                                            dropouts={0: "share_keys", 1: "masked_input", 2: "masked_input"})
    x0 = sim.model.clone()
    with pytest.raises(SecAggError, match="round 0"):
        sim.step()
    assert torch.equal(sim.model, x0) and sim.next_round == 0
    assert sim.ledger.compositions == 1 and sim.ledger.epsilon()["third_party"] > 0


def _tampered(monkeypatch, change):
    """Client 1's masked input replaced by change(its message, the messages sent so far)."""
    sent = {}
    original = SecAggClient.masked_input

    def masked_input(self, routed, row):
        message = original(self, routed, row)
        sent[self.id] = message
        return change(message, sent) if self.id == 1 else message

    monkeypatch.setattr(SecAggClient, "masked_input", masked_input)


FAULTS = {
    "malformed": lambda message, sent: message[:-3],
    "replayed": lambda message, sent: sent[0],  # client 0's message again
    "out of round": lambda message, sent: message[:6] + (7).to_bytes(8, "big") + message[14:],
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_bad_message_ends_the_round_with_a_clear_error_and_no_update(fault, monkeypatch):
    sim = simulation(True)
    sim.run(1)
    x1 = sim.model.clone()
    _tampered(monkeypatch, FAULTS[fault])
    with pytest.raises(SecAggError) as caught:
        sim.step()
    assert "round 1" in str(caught.value) and caught.value.party == "server"
    assert torch.equal(sim.model, x1) and sim.next_round == 1 and sim.ledger.compositions == 2


def test_a_round_of_50_clients_and_10000_parameters_sums_every_row():
    """The size benchmarks/secagg_round.py times (target < 5 s a round; timings belong there, not in a test)."""
    torch.manual_seed(0)
    rows = {"dy": torch.randn(50, 10_000)}
    secure = SecureAggregation({"dy": 8.0}, min_clients=26)
    sums, contributors = secure.sum(rows, torch.arange(50), seed=0, round_index=0)
    assert len(contributors) == 50
    torch.testing.assert_close(sums["dy"], rows["dy"].sum(0), rtol=0, atol=50 * 50 * 8.0 / 2**31 + 1e-5)
