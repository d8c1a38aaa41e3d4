"""run.eval_clients: the train loss and test accuracy measured on a fixed public sample of clients (for a federation
too large to evaluate in full), without changing the training or the privacy."""

from __future__ import annotations

import pytest
import torch

import dpfl
from dpfl.errors import ConfigError

BASE = ["data.name='digits'", "model.name='logreg'", "algorithm.name='dp-fedavg'", "algorithm.rounds=2",
        "run.noise_seed=3"]


def test_the_sample_changes_what_is_measured_not_what_is_trained():
    full, sampled = (dpfl.build(dpfl.load_config(None, BASE + extra)) for extra in ([], ["run.eval_clients=10"]))
    full.run(2), sampled.run(2)
    assert torch.equal(full.model, sampled.model)
    assert full.ledger.epsilon() == sampled.ledger.epsilon()
    ids = sampled.eval_clients
    assert ids.tolist() == sorted(set(ids.tolist())) and len(ids) == 10
    train_x = torch.cat([sampled.train.x[i, : sampled.train.counts[i]] for i in ids])
    train_y = torch.cat([sampled.train.y[i, : sampled.train.counts[i]] for i in ids])
    test_x = torch.cat([sampled.test.x[i, : sampled.test.counts[i]] for i in ids])
    test_y = torch.cat([sampled.test.y[i, : sampled.test.counts[i]] for i in ids])
    loss, _ = sampled.grads.mean_loss_and_accuracy(sampled.model, [(train_x, train_y)])
    _, accuracy = sampled.grads.mean_loss_and_accuracy(sampled.model, [(test_x, test_y)])
    metrics = sampled.history[-1]
    regulariser = sampled.algorithm.regulariser(sampled.model)  # the train objective's term (weight decay)
    assert (metrics.train_loss, metrics.test_accuracy) == pytest.approx((loss + regulariser, accuracy), rel=1e-9)
    assert metrics.train_loss != pytest.approx(full.history[-1].train_loss, rel=1e-3)


def test_the_sample_is_public_drawn_from_run_seed_and_reported():
    def ids(*extra):
        return dpfl.build(dpfl.load_config(None, BASE + ["run.eval_clients=10", *extra])).eval_clients.tolist()

    assert ids() == ids("run.noise_seed=4") != ids("run.seed=1")
    results = dpfl.run(dpfl.load_config(None, BASE + ["run.eval_clients=10", "algorithm.rounds=1"]))
    assert results.to_dict()["evaluated_clients"] == ids()
    assert dpfl.build(dpfl.load_config(None, BASE + ["run.eval_clients=100"])).eval_clients is None  # all of them


@pytest.mark.parametrize("value", [0, -3, 2.5])
def test_a_sample_of_no_clients_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="run.eval_clients"):
        dpfl.build(dpfl.load_config(None, BASE + [f"run.eval_clients={value}"]))
