"""Every config key means what it says: a table of EVERY key (the [data], [privacy] and [run] SCHEMA, the models'
MODEL_KEYS, the round loop's registry.COMMON_KEYS and each registered algorithm's own [algorithm] keys), each with a
value that is neither its default nor the base config's and a probe that finds the value in the built simulation (or
in the results of a run). A test fails when a key of ``config.key_schema(name, model)``, for any registered name and
model, has no row: a new key cannot land without a probe. Also: keys that do not apply are rejected, the retired key
names its replacement, and every file in examples/ loads and runs (shrunk) to a finite epsilon.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn as nn
from dp_accounting import dp_event

from dpfl.accounting.events import DiscreteGaussianDpEvent, WorstOwnerDpEvent
from dpfl.algorithms import registry
from dpfl.data.next_word import synthetic_users, write_jsonl
from dpfl.data.public import PUBLIC
from dpfl.errors import ConfigError
from dpfl.experiments import config as config_module
from dpfl.experiments import results_file
from dpfl.experiments.config import MODEL_KEYS, RETIRED, SCHEMA, key_schema, load_config
from dpfl.experiments.runner import build_simulation, run_experiment
from dpfl.engine.protocol import ServerContext

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: A tiny private run every probe starts from (each row adds its own key, and maybe a few others it needs).
BASE = ("algorithm.name='dp-fedavg'", "data.num_clients=6", "data.samples_per_client=30", "algorithm.local_steps=2",
        "algorithm.client_rate=0.5", "algorithm.rounds=4", "algorithm.noise_multiplier=1.0")
DIGITS = ("data.name='digits'",)
#: A tiny FedSGD-DPC run (it names its cohort and calibrates its noise with keys of its own).
DPC = ("algorithm.name='fedsgd-dpc'", "data.num_clients=6", "data.samples_per_client=30", "algorithm.rounds=4")
DPC_EPS = (*DPC, "privacy.epsilon=2.0")
MLP = ("model.name='mlp'", "model.hidden=[8]")
#: A tiny joint-noise run: every one of the 6 clients in every round (Heikkilä et al.'s setting).
JOINT = ("algorithm.name='dp-fedavg-joint'", "data.num_clients=6", "data.samples_per_client=30",
         "algorithm.local_steps=2", "algorithm.rounds=2")
#: A tiny projected noisy SGD run (one pass over 6 clients; trusted aggregator, only the final model released).
PNS = ("algorithm.name='projected-noisy-sgd'", "data.num_clients=6", "data.samples_per_client=30",
       "algorithm.rounds=3", "algorithm.noise_multiplier=1.0")
#: A tiny ISRL-DP Prox-SGD run (noise calibrated to privacy.epsilon; 4 rounds over each silo's 24 train records).
ISRL = ("algorithm.name='isrl-prox-sgd'", "data.num_clients=6", "data.samples_per_client=30", "algorithm.rounds=4",
        "algorithm.client_rate=1.0", "privacy.epsilon=2.0")
ISRL_LOCAL = (*ISRL, "algorithm.name='isrl-local-sgd'")
ISRL_SPIDER = (*ISRL, "algorithm.name='isrl-spider'", "algorithm.rounds=6")
ISRL_SVRG = (*ISRL, "algorithm.name='isrl-prox-pl-svrg'", "algorithm.rounds=6")
#: A tiny BandMF run: one client of 6 a round in round robin, so a client's rounds are 6 apart (default b = 6).
BANDMF = ("algorithm.name='bandmf'", "data.num_clients=6", "data.samples_per_client=30", "algorithm.rounds=4",
          "algorithm.client_rate=0.2", "algorithm.noise_multiplier=1.0")
#: A tiny SDP Prox-SGD run (P_vec's noise bits calibrated to privacy.epsilon; 3 rounds over 24 train records).
SDP = ("algorithm.name='sdp-prox-sgd'", "data.num_clients=6", "data.samples_per_client=30", "algorithm.rounds=3",
       "algorithm.client_rate=0.5", "privacy.epsilon=4.0")
OWN = "$OWN"  # in a row's value or extra keys: the folder the probe writes the user's own files to (write_own_files)
CSV = ("data.name='csv'", f"data.path='{OWN}/own.csv'")
SITE_SIZES = (180, 120, 60)  # own.csv's records per site (its client column)


def write_own_files(folder: Path) -> None:
    """own.csv: 360 records; x0 (the record's index), x1, label (2 classes), outcome (3 classes), site (0, 1, 2 with
    SITE_SIZES records, in order), part ('test' for every 4th record). wide.csv: the same with three more features.
    own.npz: 360 records of 4 features, 2 classes, 6 clients, no split; six.npz: the same with 6 features. (BASE
    trims every client to 30 records.) text.jsonl: next-word's JSON lines of 6 users over 40 words."""
    n = sum(SITE_SIZES)
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal(n).round(3)
    site = np.repeat([0, 1, 2], SITE_SIZES)
    part = np.where(np.arange(n) % 4 == 0, "test", "train")
    for name, extra in (("own.csv", 0), ("wide.csv", 3)):
        header = ["x0", "x1", *[f"w{j}" for j in range(extra)], "label", "outcome", "site", "part"]
        rows = [[i, x1[i], *range(extra), i % 2, i % 3, site[i], part[i]] for i in range(n)]
        (folder / name).write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    for name, features in (("own.npz", 4), ("six.npz", 6)):
        np.savez(folder / name, x=rng.standard_normal((n, features)), y=np.arange(n) % 2, client=np.arange(n) % 6)
    write_jsonl(folder / "text.jsonl", synthetic_users(6, words=40, sentences=(2, 3), mean_length=4, seed=0))


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every test runs with one torch thread, and the count is restored after (build_simulation sets it when
    run.threads is given): on a small machine shared with other test runs, two OpenMP threads wait for each other's
    time slices at every op, which made these tests 10-30x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def noise_key(config) -> int:
    """The probes' noise key: run.noise_seed, or 0 (two builds of a config draw the same noise, so a probe can tell
    what its key changed)."""
    return config["run"]["noise_seed"] or 0


class Probe:
    """What a row's probe may look at: the loaded config, the built simulation (built on first use), the base run
    (BASE plus the row's extra keys, without its own key) and a temporary directory."""

    def __init__(self, key: str, value: str, extra: tuple, tmp_path: Path, base: tuple = BASE):
        self.key, self.extra, self.tmp_path = key, extra, tmp_path
        if any(OWN in o for o in (*extra, value)):
            write_own_files(tmp_path)
        extra = tuple(o.replace(OWN, str(tmp_path)) for o in extra)
        self.overrides = [*base, *extra, f"{key}={value}".replace(OWN, str(tmp_path))]
        self.config = load_config(None, self.overrides)
        self.base_config = load_config(None, [*base, *extra])
        section, name = key.split(".")
        self.value = self.config[section][name]

    @functools.cached_property
    def sim(self):
        return build_simulation(self.config, noise_key=noise_key(self.config))

    @functools.cached_property
    def base(self):
        return build_simulation(self.base_config, noise_key=noise_key(self.base_config))

    def release(self, sim=None):
        sim = sim or self.sim
        return sim.algorithm.release(sim.next_round, sim.state, sim.train.counts)


def _linear_widths(sim) -> list[int]:
    return [m.out_features for m in sim.grads.model.modules() if isinstance(m, nn.Linear)]


def _labels_per_client(sim) -> list[int]:
    train, test = sim.train, sim.test
    return [len(set(train.y[i, : train.counts[i]].tolist()) | set(test.y[i, : test.counts[i]].tolist()))
            for i in range(train.num_clients)]


def _inner(event):
    while isinstance(event, (dp_event.SampledWithoutReplacementDpEvent, dp_event.PoissonSampledDpEvent)):
        event = event.event
    return event


# -- the probes ---------------------------------------------------------------------------------------------------
def _data_name(p):
    assert p.sim.train.feature_shape == (64,) and p.base.train.feature_shape != (64,)  # digits: 8x8 pixels
    assert int(p.sim.train.y.max()) == 9


def _path_csv(p):  # wide.csv has three more feature columns than own.csv
    assert p.sim.train.feature_shape == (7,) and p.base.train.feature_shape == (4,)
    assert p.sim.data["source"]["path"] == str(p.tmp_path / "wide.csv")


def _path_npz(p):
    assert p.sim.train.feature_shape == (6,) and p.base.train.feature_shape == (4,)
    assert p.sim.data["source"] == {**p.sim.data["source"], "format": "npz", "path": str(p.tmp_path / "six.npz")}


def _label_column(p):  # outcome has 3 classes, label 2 (and label is now a feature)
    assert p.sim.grads.model(torch.zeros(1, 4)).shape == (1, 3) and int(p.sim.train.y.max()) == 2
    assert p.base.grads.model(torch.zeros(1, 4)).shape == (1, 2) and int(p.base.train.y.max()) == 1


def _sites_of(arrays) -> list[set[int]]:
    """The sites (by own.csv's record index x0) of each client's records."""
    bounds = np.cumsum(SITE_SIZES)
    return [set(np.searchsorted(bounds, arrays.x[i, : arrays.counts[i], 0].round().numpy(), side="right").tolist())
            for i in range(arrays.num_clients)]


def _client_column(p):  # each site is a client (sorted ids), the site is no longer a feature
    assert _sites_of(p.sim.train) == [{0}, {1}, {2}] and _sites_of(p.sim.test) == [{0}, {1}, {2}]
    assert p.sim.data["partition"] == {"scheme": "natural", "param": None, "client_ids": [0, 1, 2]}
    assert p.sim.train.feature_shape == (3,) and p.base.train.feature_shape == (4,)
    assert any(len(sites) > 1 for sites in _sites_of(p.base.train))  # iid clients mix the sites


def _split_column(p):  # the records marked 'test' (x0, the record's index, a multiple of 4) are tested, no other
    tested, trained = (p.sim.test.flat()[0][:, 0].round().long(), p.sim.train.flat()[0][:, 0].round().long())
    assert (tested % 4 == 0).all() and (trained % 4 != 0).all() and p.sim.data["split"]["given"]
    assert ((p.sim.train.counts + p.sim.test.counts) == 30).all() and (p.sim.test.counts > 0).all()  # BASE trims
    assert p.config["data"]["test_fraction"] is None and p.base_config["data"]["test_fraction"] == 0.2


def _alpha(p):  # model heterogeneity: the labels change
    assert not torch.equal(p.sim.train.y, p.base.train.y)


def _beta(p):  # feature heterogeneity: the features change
    assert not torch.equal(p.sim.train.x, p.base.train.x)


def _num_clients(p):
    assert p.sim.train.num_clients == p.sim.test.num_clients == p.sim.clients.num_clients == p.value == 7


def _samples_per_client(p):
    assert ((p.sim.train.counts + p.sim.test.counts) == 40).all()
    assert ((p.base.train.counts + p.base.test.counts) == 30).all()


def _partition(p):  # one_class: every client holds one label
    assert _labels_per_client(p.sim) == [1] * 6 and max(_labels_per_client(p.base)) > 1


def _parity_pairs(p):  # Lowy et al. 2023's silos: client 5e + o holds digits 2e and 2o + 1, and only those
    assert _labels_per_client(p.sim) == [2] * 25 and max(_labels_per_client(p.base)) > 2
    train = p.sim.train
    for i in range(25):
        assert set(train.y[i, : train.counts[i]].tolist()) == {2 * (i // 5), 2 * (i % 5) + 1}


def _labels_parity(p):  # even digits are 1, odd 0; the same records as without the map (it draws nothing)
    assert p.sim.data["classes"] == ["odd", "even"] and _linear_widths(p.sim)[-1] == 2  # two outputs
    for split in ("train", "test"):
        mapped, raw = getattr(p.sim, split), getattr(p.base, split)
        assert torch.equal(mapped.x, raw.x) and torch.equal(mapped.counts, raw.counts)
        for i in range(len(raw.counts)):
            n = int(raw.counts[i])
            assert torch.equal(mapped.y[i, :n], (raw.y[i, :n] % 2 == 0).to(mapped.y.dtype))


def _partition_param(p):  # k_labels with k = 3
    assert _labels_per_client(p.sim) == [3] * 6 and _labels_per_client(p.base) == [2] * 6


def _standardize(p):  # client: each client's training features are centred with its own mean
    for sim, centred in ((p.sim, True), (p.base, False)):
        x, counts = sim.train.x, sim.train.counts
        worst = max(float(x[i, : counts[i]].mean(0).abs().max()) for i in range(len(counts)))
        assert (worst < 1e-4) == centred, worst


def _scale(p):  # digits' pixels 0..16 times 1/16: every feature, train and test, exactly; a public constant
    for split in ("train", "test"):
        scaled, raw = getattr(p.sim, split).x, getattr(p.base, split).x
        assert torch.equal(scaled, raw * 0.0625) and float(raw.max()) == 16.0
    assert p.sim.data["preprocessing"][-1] == {"step": "scale", "factor": 0.0625, "private": True}


def _bounds(p):  # own.csv's x0 (the record's index, 0..359) clipped to [0, 359] and mapped onto [-1, 1]; x1 as it is
    for split in ("train", "test"):
        bounded, raw = getattr(p.sim, split), getattr(p.base, split)
        for i, n in enumerate(bounded.counts.tolist()):
            x, r = bounded.x[i, :n], raw.x[i, :n]
            assert torch.equal(x[:, 0], (-1.0 + 2.0 * r[:, 0].double() / 359).float()) and torch.equal(x[:, 1], r[:, 1])
    assert p.sim.data["preprocessing"][0] == {"step": "bounds", "range": [-1.0, 1.0], "private": True,
                                              "clipped": True, "bounds": {"x0": [0.0, 359.0]}}


def _test_fraction(p):
    assert (p.sim.test.counts == 15).all() and (p.sim.train.counts == 15).all()
    assert (p.base.test.counts == 6).all()


def _data_seed(p):
    assert not torch.equal(p.sim.train.x, p.base.train.x)


def _bias(p):  # logistic regression without an intercept: one Linear layer without bias
    (layer,) = [m for m in p.sim.grads.model.modules() if isinstance(m, nn.Linear)]
    features = p.sim.train.feature_shape[0]
    assert layer.bias is None and p.sim.grads.num_params == features * 10
    assert p.base.grads.num_params == features * 10 + 10


def _model_name(p):
    assert len(_linear_widths(p.sim)) == 2 and len(_linear_widths(p.base)) == 1
    assert any(isinstance(m, nn.ReLU) for m in p.sim.grads.model.modules())


def _hidden(p):
    assert _linear_widths(p.sim) == [7, 5, 10] and _linear_widths(p.base) == [200, 10]


def _activation(p):
    modules = list(p.sim.grads.model.modules())
    assert any(isinstance(m, nn.Tanh) for m in modules) and not any(isinstance(m, nn.ReLU) for m in modules)


def _vocabulary(p):  # the 20 most frequent words, against all 24 the training sentences use (of 40)
    assert p.sim.data["preprocessing"][0]["size"] == 20 and p.base.data["preprocessing"][0]["size"] == 24


def _sequence_length(p):
    assert p.sim.train.feature_shape == (5,) and p.base.train.feature_shape == (20,)


def _embedding(p):
    assert p.sim.grads.model.embedding.embedding_dim == 3 and p.base.grads.model.embedding.embedding_dim == 8


def _units(p):
    assert [layer.units for layer in p.sim.grads.model.layers] == [6, 6]
    assert [layer.units for layer in p.base.grads.model.layers] == [8, 8]


def _layers(p):
    assert len(p.sim.grads.model.layers) == 1 and len(p.base.grads.model.layers) == 2


def _d_model(p):
    assert p.sim.grads.model.embedding.embedding_dim == 8 and p.base.grads.model.embedding.embedding_dim == 16


def _heads(p):
    assert p.sim.grads.model.blocks[0].attention.heads == 8 and p.base.grads.model.blocks[0].attention.heads == 2


def _algorithm_name(p):  # dp-scaffold: control variates, no warm-up, private
    alg = p.sim.algorithm
    assert alg.control_variates and alg.move_locally and alg.warm_rounds == 0 and alg.mechanism.is_private
    assert "c" in p.sim.state.clients and not p.base.algorithm.control_variates


def _rounds(p):
    results = run_experiment(p.config)
    assert [r["round"] for r in results["rounds"]] == [1, 2, 3] and results["final"]["round"] == 3


def _client_rate(p):
    assert p.sim.clients.rate == 1.0 and p.sim.clients.sample(0, p.sim.seed).tolist() == list(range(6))
    assert p.base.clients.sample(0, p.base.seed).numel() == 3


def _client_sampling(p):
    assert p.sim.clients.scheme == "poisson" and p.base.clients.scheme == "fixed"
    sizes = {p.sim.clients.sample(t, p.sim.seed).numel() for t in range(20)}
    assert len(sizes) > 1  # Poisson cohorts vary in size


def _local_steps(p):
    assert p.sim.algorithm.local_steps == 3 and len(p.release().step_events) == 3


def _sample_rate(p):
    sampler = p.sim.algorithm.sampler
    assert sampler.rate == 0.4 and sampler.batch_sizes(p.sim.train.counts).tolist() == [9] * 6  # floor(0.4 * 24)


def _record_sampling(p):
    assert p.sim.algorithm.sampler.scheme == "poisson"
    assert p.sim.algorithm.neighboring == p.sim.ledger.neighboring == "zero_out"
    assert isinstance(p.release().step_events[0], dp_event.PoissonSampledDpEvent)


def _lr(p):
    assert p.sim.algorithm.lr == 0.3 and p.sim.algorithm.local_lr == pytest.approx(0.3 / (0.2 * 2))


def _global_lr(p):
    assert p.sim.algorithm.global_lr == 0.7


def _weight_decay(p):
    assert p.sim.algorithm.weight_decay == 0.01
    assert p.sim.algorithm.regulariser(torch.ones(4)) == pytest.approx(0.5 * 0.01 * 4)


def _clip(p):
    assert p.sim.algorithm.clip == 2.5


def _noise_multiplier(p):
    assert p.sim.algorithm.mechanism.noise_multiplier == 3.0
    assert {_inner(e) for e in p.release().step_events} == {dp_event.GaussianDpEvent(3.0)}


def _clip_heuristic(p):
    _non_private(p, "clip_heuristic", "median-nonprivate")


def _noise_sharing(p):
    _non_private(p, "noise_sharing", "cohort-nonprivate")


def _non_private(p, key, value):
    """The key is set, with its warning, and every observer's epsilon is infinite."""
    with pytest.warns(UserWarning, match="NOT differentially private"):
        sim = p.sim
    assert getattr(sim.algorithm, key) == value
    assert sim.algorithm.step_noise_event == dp_event.NonPrivateDpEvent()
    events = sim.round_privacy()
    assert all("NonPrivateDpEvent" in repr(e) for e in events.values())
    sim.ledger.record(0, events)  # what the round charges
    assert all(math.isinf(e) for e in sim.ledger.epsilon().values())


def _delta(p):  # the default for N = 6 x 24 = 144 training records: the largest power of ten at most 1/(10 N)
    assert p.sim.ledger.delta == 1e-3 and p.base.ledger.delta == 1e-4


def _budget_number(p):  # a number is the third party's budget; the run stops before the round that exceeds it
    assert p.sim.ledger.budget == {"third_party": 1.9}
    p.sim.run(4)  # epsilon towards a third party is 1.526, 1.798, 1.998, 2.166 after rounds 1-4 (delta 1e-4)
    assert "privacy.budget.third_party" in p.sim.stopped_reason and p.sim.next_round == 2
    assert 0 < p.sim.ledger.epsilon()["third_party"] <= 1.9


def _budget_table(p):
    assert p.sim.ledger.budget == {"server": 7.0}


def _mechanism(p):  # Gaussian: the tightest accountant over sampled Gaussians; Laplace: basic composition
    assert p.sim.ledger.accountant_names["server"] == "tightest" and p.base.ledger.accountant_names["server"] == "pure"
    assert "Gaussian" in str(p.sim.round_privacy(0)["server"]) and "Laplace" in str(p.base.round_privacy(0)["server"])


def _clients_per_round(p):
    assert p.sim.clients.cohort_size == 2 and p.sim.clients.sample(0, 0).numel() == 2
    assert p.base.clients.cohort_size == 6


def _selection(p):  # round robin: clients 0-1, 2-3, 4-5, 0-1, ...
    assert p.sim.clients.scheme == "round_robin" and p.base.clients.scheme == "fixed"
    assert [p.sim.clients.sample(t, 0).tolist() for t in range(4)] == [[0, 1], [2, 3], [4, 5], [0, 1]]


def _lr_schedule(p):  # eta_t = 2 / (mu (t + 2 lambda / mu)) with mu = 1, lambda = 2
    assert [p.sim.algorithm.step_size(t) for t in (0, 1)] == [0.5, 0.4]
    assert p.base.algorithm.step_size(1) == p.base.algorithm.lr


def _mu(p):  # mu = 2, lambda = 1: 2 / (2 (1 + 1)) = 0.5 at t = 1 (base mu = 1: 2 / 3)
    assert p.sim.algorithm.step_size(1) == 0.5 and p.base.algorithm.step_size(1) == pytest.approx(2 / 3)


def _smoothness(p):  # eta_0 = 1 / lambda
    assert p.sim.algorithm.step_size(0) == pytest.approx(1 / 3) and p.base.algorithm.step_size(0) == 1.0


def _drop_remainder(p):  # 4 does not divide 6: refused without the key, 2 clients left over with it
    assert p.sim.clients.cohort_size == 4 and p.sim.clients.sample(0, 0).numel() == 4
    with pytest.raises(ConfigError, match="drop_remainder") as caught:
        p.base
    assert caught.value.field == "algorithm.clients_per_round"


def _radius(p):  # every iterate stays in the ball of radius 0.05
    assert p.sim.algorithm.radius == 0.05 and p.base.algorithm.radius == 5.0
    p.sim.run(2)
    assert float(p.sim.model.norm()) <= 0.05 * (1 + 1e-6) < float(p.base.algorithm.radius)
    assert p.release().hidden.radius == 0.05


def _regularizer(p):  # a strong L1 prox (threshold eta lambda = 0.5) zeroes coordinates exactly; none does not
    assert p.sim.algorithm.regularizer.name == "l1" and p.base.algorithm.regularizer.name == "none"
    p.sim.run(2), p.base.run(2)
    assert int((p.sim.model == 0).sum()) > p.sim.model.numel() // 2 and int((p.base.model == 0).sum()) == 0


def _reg_strength(p):  # l2: the server's prox divides by 1 + eta lambda = 1.2
    one = torch.ones(3)
    assert p.sim.algorithm.regularizer.prox(one, 0.1).tolist() == pytest.approx([1 / 1.2] * 3)
    assert p.base.algorithm.regularizer.prox(one, 0.1).tolist() == [1.0] * 3


def _l1_ratio(p):  # elastic net lambda (alpha |w|_1 + (1 - alpha) |w|^2 / 2) with lambda = 2, alpha = 0.25
    assert (p.sim.algorithm.regularizer.l1, p.sim.algorithm.regularizer.l2) == (0.5, 1.5)
    assert (p.base.algorithm.regularizer.l1, p.base.algorithm.regularizer.l2) == (1.0, 1.0)


def _isrl_radius(p):  # the server's projection keeps every iterate in the l2 ball of radius 0.05 (default 1)
    assert p.sim.algorithm.regularizer.radius == 0.05 and p.base.algorithm.regularizer.radius == 1.0
    p.sim.run(2)
    assert float(p.sim.model.norm()) <= 0.05 * (1 + 1e-6)


def _isrl_local_steps(p):  # K local steps: K draws per round (the last additive), each calibrated into R K compositions
    assert len(p.release().step_events) == 3 and len(p.release(p.base).step_events) == 5
    assert p.release().additive == (False, False, True)
    assert p.sim.algorithm.steps.mechanism.noise_multiplier < p.base.algorithm.steps.mechanism.noise_multiplier


def _period(p):  # q = 3: checkpoints in rounds 1 and 4 (z1), differences between (z2); default q = 5
    sim, base = p.sim.algorithm, p.base.algorithm
    assert [sim.is_checkpoint(t) for t in range(6)] == [True, False, False] * 2
    assert [base.is_checkpoint(t) for t in range(6)] == [True, False, False, False, False, True]
    events = [p.release(p.sim).step_events[0]]
    p.sim.run(2)
    events.append(p.release(p.sim).step_events[0])
    assert "GaussianDpEvent(noise_multiplier=%r)" % sim.checkpoint.noise_multiplier in str(events[0])
    assert "GaussianDpEvent(noise_multiplier=%r)" % sim.difference.noise_multiplier in str(events[1])
    assert sim.checkpoint.noise_multiplier != sim.difference.noise_multiplier


def _bands(p):  # b = 3 bands of the banded square root (default: the separation, 6); the server keeps b - 1 w's
    assert p.sim.algorithm.coefficients == (1.0, 0.5, 0.375) and p.base.algorithm.bands == 6
    p.sim.run(2)
    assert tuple(p.sim.state.server["recent"].shape) == (2, p.sim.state.server["x"].shape[0])


def _svrg_period(p):  # one run of Alg. 1, a snapshot every Q = 2 rounds (default Q = 5)
    assert [p.sim.algorithm.is_checkpoint(t) for t in range(6)] == [True, False] * 3
    assert [p.base.algorithm.is_checkpoint(t) for t in range(6)] == [True, False, False, False, False, True]


def _restarts(p):  # S = 2 runs of Alg. 1 over 6 rounds (default min(4, R) = 4); the model ends each at its output
    assert p.sim.algorithm.starts == (0, 3) and p.base.algorithm.starts == (0, 1, 3, 4)
    history = p.sim.run(3)
    output = p.sim.algorithm.outputs[0]
    assert p.sim.state.server["x"].tolist() == p.sim.state.server["output"].tolist() and output in (0, 1, 2)
    assert len(history) == 3


def _spider_feature_clip(p):  # logreg on features of norm <= 0.5, clip 2 >= sqrt(2 (R^2 + 1)): beta = (0.25 + 1)/2
    assert p.sim.algorithm.smoothness == pytest.approx(0.625) and p.base.algorithm.smoothness is None
    assert p.sim.algorithm.feature_clip == 0.5
    p.sim.run(2)  # the difference stream's noise is scaled to min(2C, beta ||w_1 - w_0||)


def _convex(p):  # verified (logreg, features of norm <= 1, a clip that never binds): the diameter 2 rho
    assert p.sim.algorithm.smoothness == pytest.approx((1 + 1) / 2 + 0.01)
    assert not p.release().hidden.nonconvex and p.release(p.base).hidden.nonconvex
    assert p.sim.algorithm.assumptions["diameter"] == "2 rho"


def _feature_clip(p):  # features scaled to norm <= 0.5; with a stated convex loss, beta = (0.5^2 + 1)/2 + lambda
    from dpfl.algorithms.projected_noisy_sgd import scale_to_norm

    with pytest.warns(UserWarning, match="feature_clip is not set"):  # the base states convexity it cannot verify
        base = p.base
    assert p.sim.algorithm.feature_clip == 0.5 and base.algorithm.feature_clip is None
    assert float(scale_to_norm(p.sim.train.x, 0.5).flatten(2).norm(dim=-1).max()) <= 0.5 * (1 + 1e-6)
    assert p.sim.algorithm.smoothness == pytest.approx(1.25 / 2 + 0.01) and base.algorithm.smoothness is None


def _aggregation(p):  # paper: (N / b) sum_i (d_i / d) dx_i, whatever the cohort's weights sum to
    from dpfl.engine.boundary import Delivery

    delivered = Delivery({"dx": torch.tensor([12.0]), "weight": torch.tensor([24.0])}, 2, 6)
    server = {"x": torch.zeros(1)}
    paper = p.sim.algorithm.server_update(0, server, delivered, ServerContext(0, 0))["x"]
    normalized = p.base.algorithm.server_update(0, server, delivered, ServerContext(0, 0))["x"]
    assert float(normalized) == 0.5 and float(paper) == pytest.approx(3 * 12.0 / p.sim.algorithm.total_records)


def _client_epsilons(p):  # Laplace: client i's scale multiplier is m / eps_i
    noise = p.sim.algorithm.noise
    assert noise.tolist() == pytest.approx([p.sim.algorithm.schedule.most / e for e in (1, 2, 3, 4, 5, 6)], rel=1e-4)
    history = p.sim.run(4)  # all 6 clients reply in every round: the ledger charges the least private client
    assert history[-1].epsilon["server"] == pytest.approx(6.0, rel=1e-4)


def _epsilon(p):  # LocalSGD solves its noise for privacy.epsilon: the base config's noise multiplier is then refused
    with pytest.raises(ConfigError, match=r"algorithm\.noise_multiplier = 1\.0 .*None when privacy\.epsilon is given"):
        p.sim  # noqa: B018
    assert p.base.algorithm.mechanism.noise_multiplier == 1.0


def _analysis(p):
    ledger = p.sim.ledger
    assert (ledger.analysis, ledger.conversion, ledger.subsampling_bound) == ("paper", "classic", "paper")
    assert p.base.ledger.analysis == "sound"


def _conversion(p):
    assert p.sim.ledger.conversion == "classic" and p.sim.ledger.analysis == "sound"
    assert p.base.ledger.conversion == "modern"


def _boundary_trusted(p):
    assert p.sim.boundary.name == "trusted"
    assert p.sim.ledger.observers == tuple(p.sim.round_privacy()) == ("third_party", "other_silo")


def _boundary_secagg(p):
    events = p.sim.round_privacy()
    assert p.sim.boundary.name == "secagg" and events["server"] == events["third_party"]
    base = p.base.round_privacy()
    assert base["server"] != base["third_party"]


def _release(p):
    config = load_config(None, [*p.overrides, "algorithm.rounds=1"])
    run_experiment(config, p.tmp_path / "run")
    results = json.loads((p.tmp_path / "run" / "results.json").read_text())
    assert results["privacy"]["release"] == "final" and results["config"]["privacy"]["release"] == "final"


def _run_seed(p):  # public randomness only: the model's initialisation, never the noise key
    assert p.sim.seed == p.base.seed
    assert not torch.equal(p.sim.model, p.base.model)


def _noise_seed(p):  # the research mode: the noise key is the seed, so cohorts (and noise) follow it
    assert p.sim.seed == 5 and not p.sim.secret and p.base.secret
    assert torch.equal(p.sim.model, p.base.model)  # the same initial model
    cohorts = [p.sim.clients.sample(t, p.sim.seed).tolist() for t in range(4)]
    assert cohorts != [p.base.clients.sample(t, p.base.seed).tolist() for t in range(4)]
    assert "research mode, run.noise_seed = 5" in results_file.noise_of(p.config["run"]["noise_seed"])


def _eval_every(p):
    assert p.sim.eval_every == 2
    assert [m.round for m in p.sim.run(4)] == [2, 4]


def _eval_clients(p):  # 3 of the 6 clients measured, the same ones each time; the model trained as the base's
    assert p.sim.eval_clients.tolist() == sorted(p.sim.eval_clients.tolist()) and len(p.sim.eval_clients) == 3
    last, base_last = p.sim.run(2)[-1], p.base.run(2)[-1]
    assert torch.equal(p.sim.model, p.base.model) and last.train_loss != base_last.train_loss


def _epsilon_every(p):  # every 3rd evaluation and the last report epsilon, the others null; "auto" (the base's):
    # powers of two, the checkpoints (every 10th) and the last. The numbers: those of the journal's curve exactly
    assert p.sim.epsilon_every == 3 and p.base.epsilon_every == "auto"
    history = p.sim.run(7)
    assert [m.round for m in history] == list(range(1, 8))
    assert [m.round for m in history if m.epsilon is not None] == [3, 6, 7]
    curve = p.sim.ledger.epsilon_curve()
    assert all(m.epsilon == curve[m.round] for m in history if m.epsilon is not None)
    assert [m.round for m in p.base.run(7) if m.epsilon is not None] == [1, 2, 4, 7]


def _checkpoint_every(p):
    sim = build_simulation(p.config, p.tmp_path / "run")
    assert sim.checkpoint_every == 3
    saved, save = [], sim.save_checkpoint
    sim.save_checkpoint = lambda final=True, state=None: (saved.append(sim.next_round), save(final, state))
    sim.run(4)
    assert saved == [3, 4]  # every 3 rounds, and the last


def _memory_mb(p):
    assert p.sim.memory_budget_bytes == 2 * 2**20 and p.base.memory_budget_bytes == 512 * 2**20


def _threads(p):
    p.sim  # noqa: B018 (building sets the thread count)
    assert torch.get_num_threads() == p.value


def _device(p):  # 'cpu' named: the run's tensors on the CPU, the numbers of 'auto' on a machine whose runs are on it
    assert p.sim.device == torch.device("cpu") == p.base.device
    assert p.sim.train.x.device.type == p.sim.model.device.type == "cpu"
    assert torch.equal(p.sim.run(2) and p.sim.model, p.base.run(2) and p.base.model)


def _secure_noise(p):  # the rounded discrete Gaussian on the model's coordinates, at grid exponent 9
    dimension = p.sim.model.numel()
    assert {_inner(e) for e in p.release().step_events} == {DiscreteGaussianDpEvent(1.0, 9, dimension)}
    assert {_inner(e) for e in p.release(p.base).step_events} == {dp_event.GaussianDpEvent(1.0)}


def _secure_noise_bits(p):
    assert {_inner(e).grid_bits for e in p.release().step_events} == {12}


def _tensorboard(p):  # each evaluated round's scalars as events there (in detail: test_tensorboard_log.py)
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_experiment(p.config)
    events = EventAccumulator(p.value)
    events.Reload()
    assert p.value == str(p.tmp_path / "board") and [e.step for e in events.Scalars("test_accuracy")] == [1, 2, 3, 4]


def _other_threads() -> str:
    return "1" if torch.get_num_threads() != 1 else "2"


def _credited(event) -> float:
    """The noise multiplier of the last (additive) draw of a joint-noise round's event (the single bound of a round
    that also declares each owner's release)."""
    event = event.bound if isinstance(event, WorstOwnerDpEvent) else event
    last = event.events[-1].event if isinstance(event, dp_event.ComposedDpEvent) else event.event
    return _inner(last).noise_multiplier


def _trust(p):  # a coalition of 2: shares sigma / sqrt(6 - 2); the coalition is credited the 3 other shares
    assert p.sim.algorithm.mechanism.noise_multiplier == pytest.approx(1 / math.sqrt(4))
    assert p.base.algorithm.mechanism.noise_multiplier == pytest.approx(1 / math.sqrt(5))  # clients: sqrt(6 - 1)
    assert p.release().colluders == 2 and p.release(p.base).colluders == 1
    assert _credited(p.sim.round_privacy()["other_silo"]) == pytest.approx(math.sqrt(4) / math.sqrt(4))


def _colluders(p):  # 3 colluders: sigma / sqrt(3); the base's 2: sigma / sqrt(4)
    assert p.sim.algorithm.mechanism.noise_multiplier == pytest.approx(1 / math.sqrt(3))
    assert p.base.algorithm.mechanism.noise_multiplier == pytest.approx(1 / math.sqrt(4))
    assert p.release().colluders == 3


def _local_lr_schedule(p):  # gamma_s = lr l_s; the release (and the ledger) unchanged (Heikkilä et al. Eq. 20)
    alg = p.sim.algorithm
    assert alg.step_lr == (1.0, 0.25) and alg.gamma(1) == pytest.approx(0.25 * alg.lr)
    assert p.base.algorithm.step_lr == ()
    assert p.release() == p.release(p.base)


def _client_lr(p):  # g = (1, 0.5, 1, 1, 1, 1), equal n_i: the third party is credited Eq. 24's sqrt(5 + 1/4) shares
    share = p.sim.algorithm.mechanism.noise_multiplier
    assert p.sim.algorithm.relaxations.lr == (1.0, 0.5, 1.0, 1.0, 1.0, 1.0)
    assert len(set(p.sim.train.counts.tolist())) == 1
    assert _credited(p.sim.round_privacy()["third_party"]) == pytest.approx(share * math.sqrt(5.25))
    assert _credited(p.base.round_privacy()["third_party"]) == pytest.approx(share * math.sqrt(6))


def _client_clip(p):  # C = (2, 1, ..., 1): sensitivity max C_i = 2, noise sqrt(4 + 5) shares: credited 1.5 shares
    share = p.sim.algorithm.mechanism.noise_multiplier
    assert p.sim.algorithm.relaxations.clip == (2.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    assert _credited(p.sim.round_privacy()["third_party"]) == pytest.approx(share * 1.5)


def _client_noise(p):  # f = (0.5, 1, ...): own draws at z = sigma' / 2, the sum sqrt(0.25 + 5) sigma'
    share = p.base.algorithm.mechanism.noise_multiplier
    assert p.sim.algorithm.mechanism.noise_multiplier == pytest.approx(share / 2)
    assert _credited(p.sim.round_privacy()["third_party"]) == pytest.approx(share * math.sqrt(5.25))


def _client_local_steps(p):  # client 0 fuses 2 local steps: in some batch of the 2 w.p. 1 - 0.9^2 (paper only)
    from dpfl.algorithms.joint_relaxations import FUSED_UNPROVEN

    assert p.sim.algorithm.relaxations.fused == (2, 1, 1, 1, 1, 1)
    assert p.release().step_events[0].sampling_probability == pytest.approx(0.19)
    assert p.release().unproven[-1] == FUSED_UNPROVEN[0] and FUSED_UNPROVEN[0] not in p.release(p.base).unproven


def _min_clients(p):  # at least 4 of 6 reach the sum: shares sigma / sqrt(4 - 1), 3 others credited
    share = p.sim.algorithm.mechanism.noise_multiplier
    assert share == pytest.approx(1 / math.sqrt(3)) and p.release().contributors == 4
    assert _credited(p.sim.round_privacy()["third_party"]) == pytest.approx(share * math.sqrt(4))
    assert p.release(p.base).contributors == 6


def _noise(p):  # integer Skellam shares: int64 messages, the steps declared as Skellam events, charged a little more
    assert p.sim.algorithm.step_noise_event.scale == pytest.approx(2.0**16 * 1.0 / (0.1 * 24))  # s D_min, 24 records
    assert p.base.algorithm.step_noise_event == dp_event.GaussianDpEvent(p.base.algorithm.mechanism.noise_multiplier)
    out = next(p.sim.in_process(0, p.sim.clients.sample(0, p.sim.seed)))[1]
    assert out.messages["dy"].dtype == torch.int64
    p.sim.run(1)
    p.base.run(1)
    assert p.base.ledger.epsilon()["third_party"] < p.sim.ledger.epsilon()["third_party"]


def _skellam_scale(p):  # a coarse scale (64 integer units per unit of gradient) is charged much more than 2^16
    assert p.sim.algorithm.rounding.scale == 64.0 and p.base.algorithm.rounding.scale == 2.0**16
    p.sim.run(1)
    p.base.run(1)
    assert p.sim.ledger.epsilon()["third_party"] > 1.5 * p.base.ledger.epsilon()["third_party"]


#: A tiny user-level DP-FedAvg run (10 clients, fixed cohorts of 4).
USER = ("algorithm.name='dp-fedavg-user'", "data.num_clients=10", "data.samples_per_client=30",
        "algorithm.client_rate=0.4", "algorithm.rounds=3", "algorithm.noise_multiplier=1.0")
ADAPTIVE = ("algorithm.target_quantile=0.5", "algorithm.count_noise=5.0")
#: A tiny user-level run on next-word's JSON lines (write_own_files' text.jsonl), with small sequence models.
SEQUENCE = ("algorithm.name='dp-fedavg-user'", "algorithm.client_rate=0.5", "algorithm.rounds=2",
            "algorithm.noise_multiplier=1.0")
NEXT_WORD = ("data.name='next-word'", f"data.path='{OWN}/text.jsonl'")
LSTM = (*NEXT_WORD, "model.name='lstm'", "model.units=8")
TRANSFORMER = (*NEXT_WORD, "model.name='transformer'", "model.d_model=16", "model.heads=2")


def _server_step(sim, total: float) -> float:
    """How far dp-fedavg-user's server step moves x for a delivered sum ``total`` (its noise in the shares)."""
    from dpfl.engine.boundary import Delivery

    x = sim.state.server["x"]
    new = sim.algorithm.server_update(0, sim.state.server, Delivery({"u": torch.full_like(x, total)}, 4, 10),
                                      ServerContext(0, 0))
    return float((new["x"] - x)[0])


def _server_lr(p):  # x + eta_g sum / n
    assert _server_step(p.sim, 2.0) == pytest.approx(0.5 * 2.0 / 4) and _server_step(p.base, 2.0) == pytest.approx(0.5)


def _noise_at(p):  # the server draws (central DP): the clients' messages are not private, the server is charged so
    assert p.release().server_events == (dp_event.GaussianDpEvent(1.0),) and not p.release(p.base).server_events
    assert math.isinf(p.sim.ledger.epsilon_after([p.sim.round_privacy()])["server"])
    amplified = dp_event.SampledWithoutReplacementDpEvent(10, 4, dp_event.GaussianDpEvent(1.0))  # a secret cohort
    assert p.sim.round_privacy()["third_party"] == amplified != p.base.round_privacy()["third_party"]


def _cohort(p):  # published: the server's noise is no longer amplified towards the third party
    from dpfl.accounting.events import ParticipationDpEvent

    known = ParticipationDpEvent(0.4, dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(1.0), 1))
    assert p.sim.round_privacy()["third_party"] == known != p.base.round_privacy()["third_party"]
    assert p.sim.boundary.knows_cohort == {"server", "third_party", "other_silo"}


def _weights(sim) -> list[float]:
    return sim.algorithm.weights(sim.train.counts).tolist()


def _weighting(p):  # w_i = min(24 / 48, 1) = 1/2 for the 24 train records of each client
    assert set(_weights(p.sim)) == {0.5} and set(_weights(p.base)) == {1.0}


def _weight_records(p):  # n_hat = 48: 1/2; the base's 12: min(2, w_max = 1) = 1
    assert set(_weights(p.sim)) == {0.5} and set(_weights(p.base)) == {1.0}


def _max_weight(p):  # w_max = 2: min(24 / 12, 2) = 2, and the sensitivity 2 w_max C doubles
    assert set(_weights(p.sim)) == {2.0} and set(_weights(p.base)) == {1.0}
    assert float(p.sim.algorithm.sensitivity(torch.tensor(1.0))) == 2 * float(p.base.algorithm.sensitivity(
        torch.tensor(1.0)))


def _target_quantile(p):  # two draws per client (shares of a cohort of 4: each z / 2), composing to z = 1
    z_delta, z_b = (e.noise_multiplier for e in p.release().step_events)
    assert 1 / z_delta**2 + 1 / z_b**2 == pytest.approx(4.0) and len(p.release(p.base).step_events) == 1
    assert p.sim.algorithm.adaptive.target_quantile == 0.5 and p.base.algorithm.adaptive is None
    p.sim.run(1)
    assert float(p.sim.state.server["clip"]) != 1.0


def _clip_lr(p):  # log(C_1 / C_0) = -eta_C (b~ - gamma): with the same noise key, 0.5 / 0.2 of the base's
    p.sim.run(1)
    p.base.run(1)
    ratio = math.log(float(p.sim.state.server["clip"])) / math.log(float(p.base.state.server["clip"]))
    assert ratio == pytest.approx(0.5 / 0.2, rel=1e-4)


def _count_noise(p):  # sigma_b = 8 (fixed cohorts: z_b = sigma_b; each of 4 shares z_b / 2) against the base's 5
    assert p.release().step_events[1] == dp_event.GaussianDpEvent(4.0)
    assert p.release(p.base).step_events[1] == dp_event.GaussianDpEvent(2.5)


def _secure_aggregation(p):  # the real protocol computes the sum: the same model as the simulated sum, rounding apart
    assert p.sim.boundary.name == "secagg" and p.sim.boundary.secure is not None and p.base.boundary.secure is None
    p.sim.run(1)
    p.base.run(1)
    torch.testing.assert_close(p.sim.model, p.base.model, rtol=0, atol=1e-6)


def _shuffler(p):  # sdp-* default to the real shuffler of labelled bits (the server sees the sum); the simulated
    # one permutes whole messages (the server sees each silo's row): the same model, a larger charge to the server
    assert p.sim.boundary.shuffle == "simulated" and p.base.boundary.shuffle == "real"
    events, base = p.sim.round_privacy(0), p.base.round_privacy(0)
    assert base["server"] == base["third_party"] and events["server"] != events["third_party"]
    p.sim.run(1)
    p.base.run(1)
    assert torch.equal(p.sim.model, p.base.model)


def _grid(p):  # P_vec's grid: g = 2 instead of ceil(sqrt(d))
    dimension = p.sim.model.numel()
    assert p.sim.algorithm.summation(dimension).grid == 2 and p.base.algorithm.summation(dimension).grid == \
        math.ceil(math.sqrt(dimension)) > 2
    declared = p.sim.algorithm.release(0, p.sim.state, p.sim.train.counts).step_events[0]
    assert (declared.grid, declared.l2_shift, declared.dimension) == (2, 2.0, dimension)


def _secagg_bits(p):  # the ring sets the scale: at 8 bits 6 values of 0.3 (bound B ~ 10) round to steps of ~0.5
    assert p.sim.boundary.secure.bits == 8 and p.base.boundary.secure.bits == 32
    rows, ids = {"dy": torch.full((6, 400), 0.3)}, torch.arange(6)
    coarse = p.sim.boundary.secure.sum(rows, ids, 0, 0)[0]["dy"]
    fine = p.base.boundary.secure.sum(rows, ids, 0, 0)[0]["dy"]
    assert float((coarse - 1.8).abs().max()) > 0.1 and len(set(coarse.tolist())) > 1
    assert float(coarse.mean()) == pytest.approx(1.8, abs=0.1)  # unbiased rounding
    assert float((fine - 1.8).abs().max()) < 1e-6


@dataclass(frozen=True)
class Row:
    value: str | Callable[[], str]  # a TOML value, or a function giving one
    probe: Callable[[Probe], None]
    extra: tuple = field(default=())
    base: tuple = field(default=BASE)


TABLE: dict[str, list[Row]] = {
    "data.name": [Row("'digits'", _data_name)],
    "data.path": [Row(f"'{OWN}/wide.csv'", _path_csv, (*CSV, "data.split_column='part'")),
                  Row(f"'{OWN}/six.npz'", _path_npz, ("data.name='npz'", f"data.path='{OWN}/own.npz'"))],
    "data.label_column": [Row("'outcome'", _label_column, (*CSV, "data.split_column='part'", "data.num_clients=3"))],
    "data.client_column": [Row("'site'", _client_column, (*CSV, "data.split_column='part'", "data.num_clients=3"))],
    "data.split_column": [Row("'part'", _split_column, (*CSV, "data.client_column='site'", "data.num_clients=3"))],
    "data.alpha": [Row("1.0", _alpha)],
    "data.beta": [Row("1.0", _beta)],
    "data.num_clients": [Row("7", _num_clients)],
    "data.samples_per_client": [Row("40", _samples_per_client)],
    "data.partition": [Row("'one_class'", _partition, DIGITS),
                       Row("'parity_pairs'", _parity_pairs, (*DIGITS, "data.num_clients=25"))],
    "data.labels": [Row("'parity'", _labels_parity, (*DIGITS, "data.partition='parity_pairs'", "data.num_clients=25"))],
    "data.partition_param": [Row("3", _partition_param, (*DIGITS, "data.partition='k_labels'",
                                                         "data.partition_param=2"))],
    "data.standardize": [Row("'client'", _standardize, DIGITS)],
    "data.scale": [Row("0.0625", _scale, DIGITS)],
    "data.bounds": [Row("{x0 = [0, 359]}", _bounds, (*CSV, "data.split_column='part'"))],
    "data.test_fraction": [Row("0.5", _test_fraction)],
    "data.seed": [Row("1", _data_seed)],
    "model.name": [Row("'mlp'", _model_name)],
    "model.hidden": [Row("[7, 5]", _hidden, MLP[:1])],
    "model.bias": [Row("false", _bias)],
    "model.activation": [Row("'tanh'", _activation, MLP)],
    "data.vocabulary": [Row("20", _vocabulary, NEXT_WORD, base=SEQUENCE)],
    "data.sequence_length": [Row("5", _sequence_length, NEXT_WORD, base=SEQUENCE)],
    "model.embedding": [Row("3", _embedding, LSTM, base=SEQUENCE)],
    "model.units": [Row("6", _units, LSTM, base=SEQUENCE)],
    "model.layers": [Row("1", _layers, LSTM, base=SEQUENCE)],
    "model.d_model": [Row("8", _d_model, TRANSFORMER, base=SEQUENCE)],
    "model.heads": [Row("8", _heads, TRANSFORMER, base=SEQUENCE)],
    "algorithm.name": [Row("'dp-scaffold'", _algorithm_name)],
    "algorithm.rounds": [Row("3", _rounds)],
    "algorithm.client_rate": [Row("1.0", _client_rate)],
    "algorithm.client_sampling": [Row("'poisson'", _client_sampling)],
    "algorithm.local_steps": [Row("3", _local_steps), Row("3", _isrl_local_steps, base=ISRL_LOCAL)],
    "algorithm.sample_rate": [Row("0.4", _sample_rate)],
    "algorithm.record_sampling": [Row("'poisson'", _record_sampling)],
    "algorithm.lr": [Row("0.3", _lr)],
    "algorithm.global_lr": [Row("0.7", _global_lr)],
    "algorithm.weight_decay": [Row("0.01", _weight_decay)],
    "algorithm.clip": [Row("2.5", _clip)],
    "algorithm.noise_multiplier": [Row("3.0", _noise_multiplier)],
    "algorithm.clip_heuristic": [Row("'median-nonprivate'", _clip_heuristic)],
    "algorithm.noise_sharing": [Row("'cohort-nonprivate'", _noise_sharing)],
    "privacy.delta": [Row("1e-3", _delta)],
    "privacy.budget": [Row("1.9", _budget_number), Row("{server = 7.0}", _budget_table)],
    "privacy.epsilon": [Row("2.0", _epsilon)],
    "algorithm.mechanism": [Row("'gaussian'", _mechanism, base=DPC_EPS)],
    "algorithm.clients_per_round": [Row("2", _clients_per_round, base=DPC_EPS)],
    "algorithm.selection": [Row("'round-robin'", _selection, ("algorithm.clients_per_round=2",), base=DPC_EPS)],
    "algorithm.lr_schedule": [Row("'inverse'", _lr_schedule, ("algorithm.mu=1.0", "algorithm.smoothness=2.0"),
                                  base=DPC_EPS)],
    "algorithm.mu": [Row("2.0", _mu, ("algorithm.lr_schedule='inverse'", "algorithm.mu=1.0",
                                      "algorithm.smoothness=1.0"), base=DPC_EPS)],
    "algorithm.smoothness": [Row("3.0", _smoothness, ("algorithm.lr_schedule='inverse'", "algorithm.mu=1.0",
                                                      "algorithm.smoothness=1.0"), base=DPC_EPS)],
    "algorithm.aggregation": [Row("'paper'", _aggregation, ("algorithm.clients_per_round=2",), base=DPC_EPS)],
    "algorithm.client_epsilons": [Row("[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]", _client_epsilons, base=DPC)],
    "algorithm.drop_remainder": [Row("true", _drop_remainder, ("algorithm.clients_per_round=4", "algorithm.rounds=1"),
                                     base=PNS)],
    "algorithm.radius": [Row("0.05", _radius, ("algorithm.lr=1.0",), base=PNS),
                         Row("0.05", _isrl_radius, ("algorithm.regularizer='l2_ball'",), base=ISRL)],
    "algorithm.regularizer": [Row("'l1'", _regularizer, ("algorithm.reg_strength=5.0", "algorithm.lr=0.1"),
                                  base=ISRL)],
    "algorithm.reg_strength": [Row("2.0", _reg_strength, ("algorithm.regularizer='l2'",), base=ISRL)],
    "algorithm.l1_ratio": [Row("0.25", _l1_ratio, ("algorithm.regularizer='elastic_net'", "algorithm.reg_strength=2.0"),
                               base=ISRL)],
    "algorithm.convex": [Row("true", _convex, ("algorithm.feature_clip=1.0", "algorithm.clip=2.0"), base=PNS)],
    "algorithm.feature_clip": [Row("0.5", _feature_clip, ("algorithm.convex=true", "algorithm.clip=2.0"), base=PNS),
                               Row("0.5", _spider_feature_clip, ("algorithm.clip=2.0",),
                                   base=ISRL_SPIDER)],
    "algorithm.period": [Row("3", _period, base=ISRL_SPIDER), Row("2", _svrg_period, ("algorithm.restarts=1",),
                                                                      base=ISRL_SVRG)],
    "algorithm.restarts": [Row("2", _restarts, base=ISRL_SVRG)],
    "algorithm.bands": [Row("3", _bands, base=BANDMF)],
    "privacy.analysis": [Row("'paper'", _analysis)],
    "privacy.conversion": [Row("'classic'", _conversion)],
    "privacy.boundary": [Row("'trusted'", _boundary_trusted), Row("'secagg'", _boundary_secagg)],
    "privacy.release": [Row("'final'", _release)],
    "privacy.cohort": [Row("'published'", _cohort, ("algorithm.noise_at='server'",), base=USER)],
    "privacy.secure_aggregation": [Row("true", _secure_aggregation, ("privacy.boundary='secagg'",), base=JOINT)],
    "privacy.shuffler": [Row("'simulated'", _shuffler, base=SDP)],
    "algorithm.grid": [Row("2", _grid, base=SDP)],
    "privacy.secagg_bits": [Row("8", _secagg_bits, ("privacy.secure_aggregation=true",), base=JOINT)],
    "algorithm.trust": [Row("'coalition'", _trust, ("algorithm.colluders=2",), base=JOINT)],
    "algorithm.colluders": [Row("3", _colluders, ("algorithm.trust='coalition'", "algorithm.colluders=2"), base=JOINT)],
    "algorithm.min_clients": [Row("4", _min_clients, base=JOINT)],
    "algorithm.local_lr_schedule": [Row("[1.0, 0.25]", _local_lr_schedule, base=JOINT)],
    "algorithm.client_lr": [Row("[1.0, 0.5, 1.0, 1.0, 1.0, 1.0]", _client_lr, base=JOINT)],
    "algorithm.client_clip": [Row("[2.0, 1.0, 1.0, 1.0, 1.0, 1.0]", _client_clip, base=JOINT)],
    "algorithm.client_noise": [Row("[0.5, 1.0, 1.0, 1.0, 1.0, 1.0]", _client_noise, base=JOINT)],
    "algorithm.client_local_steps": [Row("[2, 1, 1, 1, 1, 1]", _client_local_steps, ("privacy.analysis='paper'",),
                                         base=JOINT)],
    "algorithm.noise": [Row("'skellam'", _noise, base=JOINT)],
    "algorithm.skellam_scale": [Row("64.0", _skellam_scale, ("algorithm.noise='skellam'",), base=JOINT)],
    "algorithm.server_lr": [Row("0.5", _server_lr, base=USER)],
    "algorithm.noise_at": [Row("'server'", _noise_at, base=USER)],
    "algorithm.weighting": [Row("'records'", _weighting, ("algorithm.weight_records=48.0",), base=USER)],
    "algorithm.weight_records": [Row("48.0", _weight_records, ("algorithm.weighting='records'",
                                                               "algorithm.weight_records=12.0"), base=USER)],
    "algorithm.max_weight": [Row("2.0", _max_weight, ("algorithm.weighting='records'", "algorithm.weight_records=12.0"),
                                 base=USER)],
    "algorithm.target_quantile": [Row("0.5", _target_quantile, ADAPTIVE[1:], base=USER)],
    "algorithm.clip_lr": [Row("0.5", _clip_lr, ADAPTIVE, base=USER)],
    "algorithm.count_noise": [Row("8.0", _count_noise, ADAPTIVE, base=USER)],
    "run.seed": [Row("5", _run_seed)],
    "run.noise_seed": [Row("5", _noise_seed)],
    "run.eval_every": [Row("2", _eval_every)],
    "run.eval_clients": [Row("3", _eval_clients)],
    "run.checkpoint_every": [Row("3", _checkpoint_every)],
    "run.epsilon_every": [Row("3", _epsilon_every)],
    "run.memory_mb": [Row("2", _memory_mb)],
    "run.threads": [Row(_other_threads, _threads)],
    "run.device": [Row("'cpu'", _device)],
    "run.secure_noise": [Row("true", _secure_noise)],
    "run.secure_noise_bits": [Row("12", _secure_noise_bits, ("run.secure_noise=true",))],
    "run.tensorboard": [Row(f"'{OWN}/board'", _tensorboard)],
}
CASES = [pytest.param(key, i, id=f"{key}#{i}" if len(rows) > 1 else key)
         for key, rows in TABLE.items() for i in range(len(rows))]
MODELS = tuple(MODEL_KEYS)


def _all_keys() -> set[str]:
    return {f"{section}.{key}" for name in registry.names() for model in MODELS
            for section, keys in key_schema(name, model).items() for key in keys}


def test_the_table_covers_every_key_of_every_algorithm_and_model():
    keys = _all_keys()
    missing = sorted(keys - set(TABLE))
    assert not missing, f"config keys without a probe in TABLE: {missing}"
    assert not sorted(set(TABLE) - keys), "TABLE rows for keys that no longer exist"
    # the sources the schema is made of are all in it
    assert {f"data.{k}" for k in SCHEMA["data"]} | {f"privacy.{k}" for k in SCHEMA["privacy"]} | \
        {f"run.{k}" for k in SCHEMA["run"]} <= keys
    assert {f"model.{k}" for keys_ in MODEL_KEYS.values() for k in keys_} <= keys
    assert {f"algorithm.{k}" for k in registry.COMMON_KEYS} <= keys


@pytest.mark.parametrize("key, index", CASES)
def test_every_key_reaches_the_run(key, index, tmp_path):
    row = TABLE[key][index]
    value = row.value() if callable(row.value) else row.value
    probe = Probe(key, value, row.extra, tmp_path, row.base)
    section, name = key.split(".")
    schema = key_schema(probe.config["algorithm"]["name"], probe.config["model"]["name"])
    default = config_module.MODEL_DEFAULT if key == "model.name" else schema[section][name][1]
    assert probe.value != default, f"{key}: the probe's value is the default"
    assert probe.value != probe.base_config[section][name], f"{key}: the probe's value is the base config's"
    row.probe(probe)


def test_the_median_heuristic_runs_and_reports_infinite_epsilon():
    with pytest.warns(UserWarning, match="NOT differentially private"):
        sim = build_simulation(load_config(None, [*BASE, "algorithm.clip_heuristic='median-nonprivate'"]))
    history = sim.run(1)
    assert all(eps is None for eps in history[-1].epsilon.values())


# -- keys that do not apply, retired keys ---------------------------------------------------------------------------
def test_a_model_key_of_another_model_is_rejected():
    with pytest.raises(ConfigError, match=r"applies to model.name in \['mlp'\], not 'logreg'") as caught:
        load_config(None, ["model.name='logreg'", "model.hidden=[8]"])
    assert caught.value.field == "model.hidden"


def test_a_private_key_is_rejected_for_a_non_private_name():
    with pytest.raises(ConfigError, match="applies only to the private names") as caught:
        load_config(None, ["algorithm.name='fedavg'", "algorithm.noise_multiplier=1.0"])
    assert caught.value.field == "algorithm.noise_multiplier"


def test_the_retired_subsampling_bound_is_rejected_naming_privacy_analysis():
    assert "privacy.subsampling_bound" in RETIRED
    with pytest.raises(ConfigError, match="retired") as caught:
        load_config(None, ["privacy.subsampling_bound='tight'"])
    assert caught.value.field == "privacy.subsampling_bound" and "privacy.analysis" in str(caught.value)


def test_unknown_sections_and_keys_are_rejected():
    with pytest.raises(ConfigError, match="one of the sections"):
        load_config(None, ["nosuch.key=1"])
    with pytest.raises(ConfigError, match="one of the keys") as caught:
        load_config(None, ["run.no_such_key=1"])
    assert all(repr(k) in str(caught.value) for k in SCHEMA["run"])
    assert config_module.SECTIONS == ("data", "model", "algorithm", "privacy", "run")


# -- examples/ --------------------------------------------------------------------------------------------------
def _warm_rounds(config: dict) -> int:
    algo = config["algorithm"]
    spec = registry.spec_of(algo["name"])
    if spec.cohort is not None or spec.noise_key is None:  # built from the data (own cohort, calibrated noise)
        return 0  # ... and no family of that kind has warm-up rounds
    section = spec.config(**{k: algo[k] for k in spec.keys(algo["name"])})
    return getattr(spec.build(algo["name"], section, registry.Setting(algo["client_rate"], algo["client_sampling"])),
                   "warm_rounds", 0)


def _shrunk(path: Path) -> dict:
    """The example with few clients, records and local steps, run for one round past any warm-up (a warm-up is
    shortened by taking every client: round(4 / 1) rounds)."""
    config = load_config(path)
    overrides = []
    if "local_steps" in config["algorithm"]:
        overrides.append("algorithm.local_steps=2")
    if config["data"]["name"] == "synthetic":
        overrides += ["data.num_clients=10", "data.samples_per_client=50"]
    if _warm_rounds(config):
        overrides.append("algorithm.client_rate=1.0")
    warm = _warm_rounds(load_config(path, overrides))
    rounds = warm + 1
    return load_config(path, [*overrides, f"algorithm.rounds={rounds}", f"run.eval_every={rounds}"])


EXAMPLE_FILES = sorted(EXAMPLES.glob("*.toml"))


def test_there_are_examples():
    assert len(EXAMPLE_FILES) >= 2


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_every_example_loads_and_runs_to_a_finite_epsilon(path, tmp_path):
    config = _shrunk(path)
    run_experiment(config, tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["stopped_reason"] is None
    assert results["final"]["round"] == config["algorithm"]["rounds"]
    observers = results["privacy"]["observers"]
    assert observers and set(results["final"]["epsilon"]) == set(observers)
    for observer in observers:
        eps = results["final"]["epsilon"][observer]
        assert eps is not None and math.isfinite(eps) and eps > 0, (observer, eps)


# -- the user's own data: keys that apply to some data.name only, data.path ----------------------------------------
@pytest.mark.parametrize("overrides, field, users", [
    (["data.path='x.csv'"], "data.path", str(["npz", "csv", "clients", "next-word", *PUBLIC])),
    (["data.name='npz'", "data.path='x.npz'", "data.label_column='y'"], "data.label_column", "['csv']"),
    (["data.name='digits'", "data.split_column='part'"], "data.split_column", "['csv']"),
    (["data.name='csv'", "data.path='x.csv'", "data.alpha=1.0"], "data.alpha", "['synthetic']"),
    (["data.partition='iid'"], "data.partition", str(["digits", "breast_cancer", "npz", "csv", *PUBLIC, "arrays"])),
    (["data.labels='parity'"], "data.labels", str(["digits", "breast_cancer", "npz", "csv", *PUBLIC, "arrays"])),
])
def test_a_data_key_of_another_source_is_rejected(overrides, field, users):
    with pytest.raises(ConfigError, match=rf"no value: {field} applies to data.name in {re.escape(users)}") as caught:
        load_config(None, overrides)
    assert caught.value.field == field


def test_a_file_source_needs_its_path_and_a_split_column_takes_no_test_fraction():
    with pytest.raises(ConfigError, match=r"data.path = None .*the path of the csv file") as caught:
        load_config(None, ["data.name='csv'"])
    assert caught.value.field == "data.path"
    with pytest.raises(ConfigError, match=r"data.test_fraction = 0.3 .*data.split_column = 'part' marks each record"):
        load_config(None, ["data.name='csv'", "data.path='x.csv'", "data.split_column='part'", "data.test_fraction=0.3"])
    csv = load_config(None, ["data.name='csv'", "data.path='x.csv'"])["data"]
    assert (csv["test_fraction"], csv["num_clients"]) == (0.2, 100)  # no split, no client column: the defaults
    npz = load_config(None, ["data.name='npz'", "data.path='x.npz'"])["data"]
    assert (npz["test_fraction"], npz["num_clients"]) == (None, None)  # the file may bring its clients and split
    assert load_config(None, [])["data"]["test_fraction"] == 0.2  # unchanged for the generated and packaged data


def test_a_relative_path_is_the_config_files_folder_and_the_current_directory_for_set(tmp_path, monkeypatch):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "run.toml").write_text("[data]\nname = 'csv'\npath = 'data/own.csv'\n")
    monkeypatch.chdir(tmp_path)
    assert load_config(folder / "run.toml")["data"]["path"] == str(folder / "data" / "own.csv")
    given = load_config(folder / "run.toml", ["data.path='elsewhere/own.csv'"])["data"]["path"]
    assert given == str(tmp_path / "elsewhere" / "own.csv")
    assert load_config(None, ["data.name='npz'", f"data.path='{folder}/x.npz'"])["data"]["path"] == str(folder / "x.npz")
