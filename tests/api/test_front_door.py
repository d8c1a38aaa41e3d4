"""The front door, used as a notebook would: only ``import dpfl`` (plus torch, numpy and the standard library).

A user's own module (a residual MLP, unlike dpfl's Sequential models) on the user's numpy arrays runs through the
same engine and the same accounting as a config run: its epsilon equals that of the built-in MLP of the same
parameter count on the same arrays, and of a config run on the same arrays written to an npz file (whose results are
identical to the arrays run's). The run directory records the module and the data, and a resume with another module,
other initial parameters or other data is refused. Layers and losses the per-example engine cannot use are refused
before round 1, naming the layer or the loss. ``dpfl.account`` / ``dpfl.calibrate`` reproduce a published vector
(the TensorFlow Privacy DP-SGD MNIST tutorial: z = 1.1, q = 256/60000, 14063 steps, delta = 1e-5: PLD 2.38178, RDP
with the classic conversion 3.00839, docs/accounting.md).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn as nn
from dp_accounting import dp_event

import dpfl

CONFIG = {"algorithm": {"name": "dp-fedavg", "rounds": 2, "client_rate": 0.5, "local_steps": 2},
          "data": {"num_clients": 8}, "run": {"noise_seed": 3}}
FEATURES, CLASSES = 10, 3


def arrays(records: int = 240, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(records, FEATURES)).astype(np.float32)
    return x, (x @ rng.normal(size=(FEATURES, CLASSES))).argmax(1)


class ResidualMLP(nn.Module):
    """10 -> 6 -> (6 -> 6 residual) -> 3, tanh: 66 + 42 + 21 = 129 parameters, as dpfl's MLP with hidden = [9]."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.inner, self.residual, self.out = nn.Linear(FEATURES, 6), nn.Linear(6, 6), nn.Linear(6, CLASSES)

    def forward(self, x):
        h = torch.tanh(self.inner(x))
        return self.out(h + torch.tanh(self.residual(h)))


BUILTIN_SAME_SIZE = {"name": "mlp", "hidden": [9], "activation": "tanh"}  # 10*9 + 9 + 9*3 + 3 = 129


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "run"
    return out, dpfl.run(CONFIG, model=ResidualMLP(), data=arrays(), out=out)


def test_import_dpfl_does_not_import_torch():
    done = subprocess.run([sys.executable, "-c", "import dpfl, sys; print('torch' in sys.modules)"],
                          capture_output=True, text=True, env={"PYTHONPATH": ":".join(sys.path)})
    assert done.stdout.strip() == "False", done.stderr


def test_every_exported_name_is_there():
    assert set(dpfl.__all__) == {"__version__", "run", "build", "Results", "account", "calibrate", "make_accountant",
                                 "register_algorithm", "load_config", "Simulation", "PrivacyLedger", "FederatedDataset",
                                 "ConfigError", "DpflError"}
    assert all(getattr(dpfl, name) is not None for name in dpfl.__all__)
    with pytest.raises(AttributeError, match="no attribute 'runner'"):
        dpfl.runner  # noqa: B018


def test_user_module_on_user_arrays(user_run):
    out, results = user_run
    assert isinstance(results, dpfl.Results) and results.status == "finished"
    assert set(results.final) == {"round", "test_accuracy", "train_loss", "epsilon", "delta", "nonfinite_examples"}
    assert results.final["nonfinite_examples"] == 0
    assert results.final["round"] == 2 and [r["round"] for r in results.rounds] == [1, 2]
    assert set(results.final["epsilon"]) == {"third_party", "server", "other_silo"} == set(results.privacy["observers"])
    assert 0 < results.epsilon["third_party"] < float("inf")
    curve = results.epsilon_curve()  # from the run's ledger: every round, the rows' numbers where they carry one
    assert sorted(curve) == [1, 2] and curve[2] == results.epsilon and curve[1] == results.rounds[0]["epsilon"]
    assert dpfl.Results.load(out).epsilon_curve([1]) == {1: curve[1]}
    assert results.to_dict() == json.loads((out / "results.json").read_text())
    assert results.config["model"] == {"name": "custom"} and results.config["data"]["name"] == "arrays"
    supplied = json.loads((out / "run.json").read_text())["config"]["supplied"]
    assert supplied["model"].endswith("ResidualMLP") and supplied["model_parameters"] == 129
    assert supplied["data_arrays"] == "x [240, 10] float32, y [240] int64"
    assert results.data["source"]["sha256"] == supplied["data_sha256"]
    assert results.data["num_clients"] == 8 and results.data["partition"]["scheme"] == "iid"


def test_accounting_is_the_config_runs(user_run, tmp_path):
    """The same epsilon with dpfl's MLP of the same size on the same arrays, and with a config run on the arrays
    written to an npz file; that config run and the arrays run give identical results."""
    _, results = user_run
    builtin = dpfl.run({**CONFIG, "model": BUILTIN_SAME_SIZE}, data=arrays())
    x, y = arrays()
    np.savez(tmp_path / "records.npz", x=x, y=y)
    from_file = dpfl.run({**CONFIG, "model": BUILTIN_SAME_SIZE,
                          "data": {**CONFIG["data"], "name": "npz", "path": str(tmp_path / "records.npz")}})
    assert results.final["epsilon"] == builtin.final["epsilon"] == from_file.final["epsilon"]
    assert results.privacy["events_per_round"] == from_file.privacy["events_per_round"]
    assert builtin.final == from_file.final and builtin.rounds == from_file.rounds
    assert {k: v for k, v in builtin.data.items() if k != "source"} == \
        {k: v for k, v in from_file.data.items() if k != "source"}


def test_resume_refuses_another_module_or_data(user_run):
    out, _ = user_run
    rounds3 = {**CONFIG, "algorithm": {**CONFIG["algorithm"], "rounds": 3}}
    for model, data, key in ((nn.Sequential(nn.Linear(FEATURES, CLASSES)), arrays(), "supplied.model"),
                             (ResidualMLP(seed=1), arrays(), "supplied.model_init_sha256"),
                             (ResidualMLP(), arrays(seed=1), "supplied.data_sha256")):
        with pytest.raises(dpfl.DpflError, match=f"cannot resume: .*{key} = "):
            dpfl.run(rounds3, model=model, data=data, out=out, resume=True)
    resumed = dpfl.run(rounds3, model=ResidualMLP(), data=arrays(), out=out, resume=True)  # the same: continues
    assert resumed.status == "finished" and [r["round"] for r in resumed.rounds] == [1, 2, 3]


class Counting(nn.Module):
    """Updates a buffer in place in its forward pass: torch.func cannot take its per-example gradients."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(FEATURES, CLASSES)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


@pytest.mark.parametrize("model, message", [
    (nn.Sequential(nn.Linear(FEATURES, 6), nn.BatchNorm1d(6), nn.Linear(6, CLASSES)),
     r"model = '1 \(BatchNorm1d\)' is not allowed: expected a module without batch normalisation: .* per-example "
     r"gradients .* are undefined; use GroupNorm or LayerNorm"),
    (nn.Sequential(nn.Linear(FEATURES, 6), nn.Dropout(0.5), nn.Linear(6, CLASSES)),
     r"model = '1 \(Dropout\)' is not allowed: expected a module without active dropout"),
    (Counting(), r"model = 'Counting' is not allowed: expected a module torch.func can take per-example gradients of "
                 r"\(.*\) \(it raised RuntimeError: "),
    (nn.Sequential(nn.Linear(FEATURES, 4)), r"model = 'Sequential' is not allowed: expected a module returning logits "
                                            r"\[N, 3\] .* it returned \[2, 4\] for N = 2"),
    ("not a module", "model = 'str' is not allowed: expected a torch.nn.Module"),
])
def test_a_module_the_engine_cannot_use_is_refused_before_round_one(model, message, tmp_path):
    with pytest.raises(dpfl.ConfigError, match=message) as refused:
        dpfl.run(CONFIG, model=model, data=arrays(), out=tmp_path / "run")
    error = refused.value  # no torch traceback behind it
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert not (tmp_path / "run" / "ledger.json").exists()  # no round started


def batch_centred(outputs, labels):
    """Not per-example: each loss minus the batch's mean."""
    losses = nn.functional.cross_entropy(outputs, labels, reduction="none")
    return losses - losses.mean()


@pytest.mark.parametrize("loss, message", [
    (nn.CrossEntropyLoss(), r"loss = 'CrossEntropyLoss' is not allowed: expected a per-example loss.*; it returned "
                            r"\[\] for N = 2 examples: a mean or a sum mixes the examples"),
    (batch_centred, r"loss = 'batch_centred' is not allowed: expected a per-example loss.* each example's loss does "
                    r"not depend on the other examples"),
])
def test_a_loss_that_is_not_per_example_is_refused(loss, message):
    with pytest.raises(dpfl.ConfigError, match=message):
        dpfl.run(CONFIG, model=ResidualMLP(), loss=loss, data=arrays())


def test_a_per_example_loss_is_used(user_run):
    """Cross-entropy given as a loss is the default's run; label smoothing changes the training, not epsilon."""
    _, results = user_run
    same = dpfl.run(CONFIG, model=ResidualMLP(), loss=nn.CrossEntropyLoss(reduction="none"), data=arrays())
    assert same.final["train_loss"] == pytest.approx(results.final["train_loss"], rel=1e-6)
    smoothed = dpfl.run(CONFIG, model=ResidualMLP(), loss=nn.CrossEntropyLoss(reduction="none", label_smoothing=0.3),
                        data=arrays())
    assert smoothed.final["train_loss"] != pytest.approx(results.final["train_loss"], rel=1e-3)
    assert smoothed.final["epsilon"] == results.final["epsilon"]
    assert smoothed.config["supplied"]["loss"] == "torch.nn.modules.loss.CrossEntropyLoss"


def test_a_callers_loss_or_module_is_never_credited_with_verified_convexity():
    """Projected noisy SGD's tighter (convex) accounting is credited only for logistic regression's cross-entropy,
    which dpfl verifies; with a caller's loss (even cross-entropy itself: dpfl cannot see inside it) or module, the
    accounting falls back to the non-convex diameter, saying why."""
    x, y = arrays()
    binary = (x, (y == 0).astype(int))
    config = {"algorithm": {"name": "projected-noisy-sgd", "convex": True, "feature_clip": 4.0,
                            "noise_multiplier": 2.0}, "data": {"num_clients": 8}}
    assert dpfl.build(config, data=binary).algorithm.smoothness == pytest.approx((4.0**2 + 1) / 2 + 0.01)
    with pytest.warns(UserWarning, match="not verified .*the loss 'torch.nn.modules.loss.CrossEntropyLoss' is a "
                                         "caller's"):
        assert dpfl.build(config, loss=nn.CrossEntropyLoss(reduction="none"), data=binary).algorithm.smoothness is None
    with pytest.warns(UserWarning, match="not verified .*model.name = 'custom' is not a convex model"):
        assert dpfl.build(config, model=nn.Sequential(nn.Linear(FEATURES, 2)), data=binary).algorithm.smoothness \
            is None


def test_client_ids_and_config_forms(tmp_path):
    """Client ids as given; the config as a TOML path, a dict or a loaded config; the names the config must give."""
    x, y = arrays()
    clients = np.repeat(np.arange(6), 40)
    (tmp_path / "run.toml").write_text('[algorithm]\nname = "dp-fedavg"\nrounds = 1\nclient_rate = 0.5\n'
                                       '[run]\nnoise_seed = 3\n')
    from_path = dpfl.run(tmp_path / "run.toml", data=(x, y, clients))
    assert from_path.data["num_clients"] == 6 and from_path.data["partition"]["scheme"] == "natural"
    loaded = dpfl.load_config(tmp_path / "run.toml", ['data.name="arrays"'])
    assert dpfl.run(loaded, data=(x, y, clients)).final == from_path.final
    with pytest.raises(dpfl.ConfigError, match="data.name = 'synthetic' is not allowed: expected 'arrays' when "
                                               "dpfl.run is given data=: load the config with dpfl.load_config"):
        dpfl.run(dpfl.load_config(tmp_path / "run.toml"), data=(x, y))
    with pytest.raises(dpfl.ConfigError, match=r"model.name = 'mlp' is not allowed: expected 'custom' \(or unset\)"):
        dpfl.run({"model": {"name": "mlp"}}, model=ResidualMLP(), data=(x, y))
    with pytest.raises(dpfl.ConfigError, match="model.name = 'custom' is not allowed: expected another name: "
                                               "'custom' stands for a module"):
        dpfl.run({"model": {"name": "custom"}})
    with pytest.raises(dpfl.ConfigError, match="data = 'a dict of x, z' is not allowed"):
        dpfl.run(CONFIG, data={"x": x, "z": y})


def test_a_federated_dataset_is_used_as_it_is(user_run):
    _, results = user_run
    simulation = dpfl.build(CONFIG, data=arrays())
    dataset = dpfl.FederatedDataset(simulation.train, simulation.test, CLASSES, "mine", {"source": "test"})
    given = dpfl.run({k: v for k, v in CONFIG.items() if k != "data"}, model=ResidualMLP(), data=dataset)
    assert given.final == results.final and given.data == {"source": "test"}
    with pytest.raises(dpfl.ConfigError, match="data.num_clients = 8 is not allowed: expected None .* data= is a "
                                               "FederatedDataset"):
        dpfl.run(CONFIG, data=dataset)


# -- accounting ------------------------------------------------------------------------------------------------------
MNIST = dict(noise_multiplier=1.1, sampling_rate=256 / 60000, steps=14063, delta=1e-5)


MNIST_EVENT = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(256 / 60000, dp_event.GaussianDpEvent(1.1)),
                                          14063)


def test_account_a_published_vector():
    assert 2.38177 < dpfl.account(**MNIST).epsilon <= 2.38178  # the published figures, rounded up (the safe side)
    rdp = dpfl.account(**MNIST, accountant="rdp", conversion="classic")
    assert 3.00838 < rdp.epsilon <= 3.00839 and rdp.accountant == "rdp"
    accountant = dpfl.make_accountant("rdp", conversion="classic")
    assert accountant.compose(MNIST_EVENT).get_epsilon(1e-5) == rdp.epsilon
    event = MNIST_EVENT
    assert dpfl.account(event, delta=1e-5).epsilon == dpfl.account(**MNIST).epsilon
    with pytest.raises(dpfl.ConfigError, match="noise_multiplier = 1.1 is not allowed: expected None when an event"):
        dpfl.account(event, **MNIST)
    with pytest.raises(dpfl.ConfigError, match="neighboring = 'swap' is not allowed"):
        dpfl.make_accountant("pld", neighboring="swap")


def test_calibrate_a_published_vector():
    gaussian = {k: v for k, v in MNIST.items() if k != "noise_multiplier"}
    assert dpfl.calibrate(2.38178, **gaussian) == pytest.approx(1.1, rel=2e-4)
    assert dpfl.calibrate(3.00839, **gaussian, accountant="rdp") == pytest.approx(1.1, rel=2e-4)
    assert dpfl.calibrate(3.00839, delta=1e-5, event=lambda z: dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(256 / 60000, dp_event.GaussianDpEvent(z)), 14063), accountant="rdp") == \
        dpfl.calibrate(3.00839, **gaussian, accountant="rdp")
    with pytest.raises(dpfl.ConfigError, match="sampling_rate = None is not allowed"):
        dpfl.calibrate(1.0, delta=1e-5, steps=10)


# -- registering an algorithm ----------------------------------------------------------------------------------------
@pytest.fixture
def restored_registry():
    """The test's own cleanup (not a user's path): the registry as it was, so other tests never see the name."""
    registry = importlib.import_module("dpfl.algorithms.registry")
    before = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)


@dataclass(frozen=True)
class HalvingConfig:
    lr: float = 0.5
    noise_multiplier: float = 1.0


def test_register_algorithm(restored_registry):
    spec = dpfl.register_algorithm(("halving", "dp-halving"), HalvingConfig, build=lambda name, section, setting: None,
                                   help="a test family")
    config = dpfl.load_config({"algorithm": {"name": "dp-halving", "lr": 0.25}})
    assert config["algorithm"]["lr"] == 0.25 and config["algorithm"]["noise_multiplier"] == 1.0
    assert spec.private("dp-halving") and not spec.private("halving")
    with pytest.raises(ValueError, match="registered twice"):
        dpfl.register_algorithm("dp-fedavg", HalvingConfig, build=lambda name, section, setting: None)
