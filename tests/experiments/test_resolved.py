"""The resolved config (``dpfl.experiments.resolved``): a run's config is looked up once and every part of the run is
built from it."""

from __future__ import annotations

import dataclasses

import pytest

from dpfl.accounting.observers import THIRD_PARTY
from dpfl.algorithms import registry
from dpfl.errors import ConfigError
from dpfl.experiments.config import SCHEMA, load_config
from dpfl.experiments.resolved import PrivacyConfig, RunConfig, RunOptions, resolve
from dpfl.experiments.runner import build_simulation
from dpfl.models import LogisticRegression

SMALL = ["data.num_clients=10", "data.samples_per_client=20", "algorithm.rounds=2"]


@pytest.fixture
def counted(monkeypatch):
    """Counts registry look-ups, model builds (with the device of each) and algorithm builds."""
    calls = {"spec_of": 0, "models": [], "algorithms": 0}
    spec_of = registry.spec_of

    def counted_spec_of(name):
        calls["spec_of"] += 1
        return spec_of(name)

    init = LogisticRegression.__init__

    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        calls["models"].append(next(self.parameters()).device.type)

    spec = spec_of("dp-fedavg")

    def counted_build(*args):
        calls["algorithms"] += 1
        return spec.build(*args)

    monkeypatch.setattr(LogisticRegression, "__init__", counted_init)
    for name in spec.names:
        monkeypatch.setitem(registry._REGISTRY, name, dataclasses.replace(spec, build=counted_build))
    monkeypatch.setattr(registry, "spec_of", counted_spec_of)
    return calls


def test_a_build_looks_up_the_algorithm_once_and_builds_the_model_once_for_real(counted):
    """Before, a build looked the algorithm's registry entry up 7 times (validate, the cohort twice, the clients, the
    algorithm, the release hash) and built the model 3 times (twice on the meta device: the algorithm's setting and
    the memory estimate). The algorithm is built twice: once by ``validate``, before any data is built, to check its
    keys, and once for the run."""
    config = load_config(None, ["algorithm.name='dp-fedavg'", *SMALL])
    counted["spec_of"] = 0
    build_simulation(config)
    assert counted == {"spec_of": 1, "models": ["meta", "cpu"], "algorithms": 2}


def test_the_resolved_config_is_the_loaded_one_typed():
    config = load_config(None, ["algorithm.name='dp-fedavg'", "privacy.budget=3.0", "privacy.secure_aggregation=true",
                                "model.name='mlp'", "model.hidden=[8]", *SMALL])
    resolved = resolve(config)
    assert resolved.raw is config  # run.json, results.json and the release hash keep it verbatim
    assert resolved.algorithm.spec is registry.spec_of("dp-fedavg") and resolved.algorithm.rounds == 2
    assert resolved.algorithm.section == registry.spec_of("dp-fedavg").section(config["algorithm"])
    assert resolved.algorithm.cohort_sampling(10) == (0.2, "fixed")
    assert resolved.privacy.budgets == {THIRD_PARTY: 3.0} and resolved.privacy.accounted_boundary == "secagg"
    assert resolved.model.name == "mlp" and dict(resolved.model.options) == {"hidden": [8], "activation": "relu"}
    assert resolved.run.memory_budget_bytes == 512 * 2**20
    with pytest.raises(TypeError):
        resolved.data["num_clients"] = 3  # read-only: the raw config is the one record of it


def test_resolve_checks_the_ranges_and_of_does_not():
    config = load_config(None, ["run.eval_every=0", *SMALL])
    assert RunConfig.of(config).run.eval_every == 0
    with pytest.raises(ConfigError, match="run.eval_every = 0"):
        resolve(config)


@pytest.mark.parametrize("section, typed", [("privacy", PrivacyConfig), ("run", RunOptions)])
def test_a_typed_section_has_exactly_the_schemas_keys(section, typed):
    """A key added to config.SCHEMA is added to its typed section too (else every run fails to resolve)."""
    assert [f.name for f in dataclasses.fields(typed)] == list(SCHEMA[section])
