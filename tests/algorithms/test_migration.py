"""The algorithm protocol changed no result: the LocalSGD names against golden files made from the code before it.

* Deterministic runs (golden_deterministic.json, ``golden.fingerprint``: full participation, full batches, no noise,
  6 rounds): the new code's final x_head and every round's train loss agree with the old code's to 1e-5 (observed:
  <= 5e-7), and test accuracy to one test record (observed: equal). Not bit for bit, and it cannot be: with
  sample_rate = 1 a "minibatch" is every record, but both the old and the new code order it by random keys (the
  smallest floor(s n_i) keys), and the keys now come from per-client streams (``dpfl.engine.randomness``) instead of
  one generator, so each client sums the same per-example gradients in another order; float32 addition is not
  associative, which moves the last bits (~1e-8 on a parameter, ~1e-7 on a loss after 6 rounds).
* Private runs (golden_private.json, ``golden.private_losses``: 10 seeds per private name): the noise and minibatch
  draws come from different streams, so single runs differ; the distribution of the final train loss must not. The
  means agree within 4 standard errors of their difference (Welch: se = sqrt(s_old^2 / 10 + s_new^2 / 10)).
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-5
WELCH_Z = 4.0


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _load_golden():
    """tests/algorithms/golden.py, by path (tests cannot import each other under --import-mode=importlib)."""
    spec = importlib.util.spec_from_file_location("dpfl_tests_golden", HERE / "golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


golden = _load_golden()
DETERMINISTIC = json.loads((HERE / "golden_deterministic.json").read_text())
PRIVATE = json.loads((HERE / "golden_private.json").read_text())


def test_the_golden_files_cover_every_local_sgd_name_and_model():
    assert set(DETERMINISTIC) == {f"{n}/{m}" for n in golden.NAMES for m in golden.MODELS}
    assert set(PRIVATE) == set(golden.PRIVATE)
    assert all(len(losses) == len(golden.SEEDS) for losses in PRIVATE.values())


@pytest.mark.parametrize("key", sorted(DETERMINISTIC))
def test_deterministic_runs_agree_with_the_code_before_the_protocol(key):
    name, model = key.split("/")
    old, new = DETERMINISTIC[key], golden.fingerprint(name, model)
    assert len(new["x_head"]) == len(old["x_head"]) and len(new["train_loss"]) == len(old["train_loss"])
    for got, want in zip(new["x_head"], old["x_head"]):
        assert abs(got - want) <= TOLERANCE, (new["x_head"], old["x_head"])
    for got, want in zip(new["train_loss"], old["train_loss"]):
        assert abs(got - want) <= TOLERANCE, (new["train_loss"], old["train_loss"])
    test_records = 6 * round(0.2 * 30)  # golden.settings: 6 clients of 30 records, test_fraction 0.2
    for got, want in zip(new["test_accuracy"], old["test_accuracy"]):
        assert abs(got - want) <= 1 / test_records + 1e-12, (new["test_accuracy"], old["test_accuracy"])


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_private_final_losses_agree_in_distribution_with_the_code_before_the_protocol(name):
    old, new = PRIVATE[name], golden.private_losses(name)
    assert len(new) == len(old) and all(math.isfinite(v) for v in new)
    se = math.sqrt(statistics.variance(old) / len(old) + statistics.variance(new) / len(new))
    difference = statistics.fmean(new) - statistics.fmean(old)
    assert abs(difference) <= WELCH_Z * se, (name, statistics.fmean(old), statistics.fmean(new), se)
