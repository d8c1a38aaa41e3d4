"""The contract every registered algorithm must pass (parametrized over ``registry.names()``, so a new algorithm is
tested here as soon as it registers): declared noise = drawn noise, epsilon finite exactly for the private names,
resume = the uninterrupted run, state survives serialisation, bad configs name their key, the engine imports no
algorithm, results do not depend on ``run.memory_mb``, Poisson record sampling runs and is accounted with PLD, and the
memory guard's estimate of the state has the shapes of the state built.

Every run is tiny (6 clients of 30 records, 2 local steps): each test takes under a second on an idle machine. A
one-pass family (``AlgorithmSpec.max_rounds``: each client used in one round) runs at most as many rounds as its
6 clients allow (``capped``).
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import math
import re
import sys
import tokenize
from pathlib import Path

import pytest
import torch
from dp_accounting import dp_event

from dpfl.algorithms import registry
from dpfl.engine import checkpoint
from dpfl.engine.client_table import ClientTable
from dpfl.engine.protocol import Algorithm, ClientOutput, State
from dpfl.engine.cohort_round import noise_of
from dpfl.engine.simulator import client_work_bytes
from dpfl.errors import ConfigError, DpflError, RunDirectoryError
from dpfl.experiments.config import key_schema, load_config
from dpfl.experiments.memory import initial_state_shapes
from dpfl.experiments.runner import build_simulation
from states import states_equal

NAMES = registry.names()
PRIVATE = [n for n in NAMES if registry.spec_of(n).private(n)]
NON_PRIVATE = [n for n in NAMES if not registry.spec_of(n).private(n)]
ENGINE = Path(__file__).resolve().parents[2] / "src" / "dpfl" / "engine"
SRC = ENGINE.parent.parent

#: The tiny run's [algorithm] keys; each is set only where the algorithm has it (a future algorithm may not).
#: client_rate 0.5 leaves a warm-up of round(4 / 0.5) = 8 rounds (SCAFFOLD-warm): rounds = 12 is above it.
TINY = {"local_steps": 2, "client_rate": 0.5, "rounds": 12, "noise_multiplier": 1.0, "lr": 0.5}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def is_private(name: str) -> bool:
    return registry.spec_of(name).private(name)


def round_limit(name: str, **algorithm) -> int | None:
    """The most rounds a tiny run of ``name`` may have: a one-pass family (``AlgorithmSpec.max_rounds``) uses each of
    the 6 clients once; None for the others (and for a section the family refuses: its builder says why)."""
    spec = registry.spec_of(name)
    if spec.max_rounds is None:
        return None
    fields = {f.name for f in dataclasses.fields(spec.config)}
    try:
        return spec.max_rounds(spec.config(**{k: v for k, v in {**TINY, **algorithm}.items() if k in fields}), 6)
    except ConfigError:
        return None


def capped(name: str, rounds: int, **algorithm) -> int:
    """``rounds``, or fewer for a one-pass family (``round_limit``)."""
    limit = round_limit(name, **algorithm)
    return rounds if limit is None else min(rounds, limit)


def settings(name: str, *extra: str, **algorithm) -> list[str]:
    """Overrides of a tiny run of ``name``: TINY's keys that ``name`` has, updated by ``algorithm`` (rounds capped
    for a one-pass family)."""
    keys = key_schema(name, "logreg")["algorithm"]
    values = {**TINY, **algorithm}
    values["rounds"] = capped(name, values["rounds"], **algorithm) if values["rounds"] > 0 else values["rounds"]
    calibrated = is_private(name) and "noise_multiplier" not in keys  # its noise comes from privacy.epsilon
    # the shuffle-DP families' real shuffler expands every count into labelled bits (tests/algorithms/test_sdp.py:
    # the same sums as the count path); the contract runs the count path, 10-100x faster
    counts = ["privacy.shuffler='simulated'"] if registry.spec_of(name).privacy_defaults.get("shuffler") == "real" else []
    return [f"algorithm.name='{name}'", "data.num_clients=6", "data.samples_per_client=30", "run.seed=1",
            *(f"algorithm.{k}={v!r}" for k, v in values.items() if k in keys),
            *(["privacy.epsilon=2.0"] if calibrated else []), *counts, *extra]


def simulation(name: str, *extra: str, out=None, noise_key=None, **algorithm):
    return build_simulation(load_config(None, settings(name, *extra, **algorithm)), out, noise_key=noise_key)


def horizon(sim) -> int:
    """Rounds that reach past any warm-up by 4 rounds (4 for an algorithm without one; the tiny run's 6 clients
    allow a one-pass family at least 4 rounds at its default cohort)."""
    return sim.algorithm.warm_rounds + 4


class Wrapped:
    """The algorithm ``inner`` with ``client_round`` replaced by ``client_round(inner, *args)`` (and ``server_update``
    by ``server_update(inner, *args)`` when given); everything else is the inner algorithm's."""

    def __init__(self, inner, client_round=None, server_update=None):
        self._inner, self._client_round, self._server_update = inner, client_round, server_update

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def client_round(self, *args):
        if self._client_round is None:
            return self._inner.client_round(*args)
        return self._client_round(self._inner, *args)

    def server_update(self, *args):
        if self._server_update is None:
            return self._inner.server_update(*args)
        return self._server_update(self._inner, *args)


def server_noised(sim) -> bool:
    """Whether the family's privacy comes from the server's own noise (central DP: ``Release.server_events``), its
    clients sending their updates unnoised."""
    return bool(sim.algorithm.release(0, sim.state, sim.train.counts).server_events)


def declared_noise(sim, t: int) -> list:
    """The noise of each declared draw of round t (the record sampling around it stripped)."""
    events = []
    for event in sim.algorithm.release(t, sim.state, sim.train.counts).step_events:
        while isinstance(event, (dp_event.SampledWithoutReplacementDpEvent, dp_event.PoissonSampledDpEvent)):
            event = event.event
        events.append(event)
    return events


# -- a. declared events = drawn events ---------------------------------------------------------------------------
def test_every_registered_name_builds_an_algorithm_of_the_protocol():
    assert NAMES and PRIVATE and NON_PRIVATE
    for name in NAMES:
        assert isinstance(simulation(name).algorithm, Algorithm), name


@pytest.mark.parametrize("name", NAMES)
def test_the_noise_drawn_is_the_noise_declared(name):
    sim = simulation(name)
    drawn, declared = [], []

    def record(inner, t, *args):
        declared.append(declared_noise(sim, t))  # what round t declared, from the round-start state
        out = inner.client_round(t, *args)
        drawn.append(list(out.events))
        return out

    server_drawn, server_declared = [], []

    def record_server(inner, t, server, delivered, ctx):
        server_declared.append([noise_of(e) for e in inner.release(t, sim.state, sim.train.counts).server_events])
        updated = inner.server_update(t, server, delivered, ctx)
        server_drawn.append(list(ctx.events))
        return updated

    sim.algorithm = Wrapped(sim.algorithm, record, record_server)
    sim.run(2)
    assert sim.next_round == 2 and sim.stopped_reason is None
    assert len(drawn) == 2, "one chunk per round (the tiny cohort fits in memory)"
    assert drawn == declared and server_drawn == server_declared
    if is_private(name):  # the privacy comes from the clients' noise, or from the server's (central DP)
        private = server_drawn if any(server_drawn) else drawn
        assert all(not isinstance(e, dp_event.NonPrivateDpEvent) for chunk in private for e in chunk) and \
            any(private)


def _more_noise(event):
    """A different noise: twice the multiplier of a Gaussian or a Laplace event, else a Gaussian."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(2 * event.noise_multiplier)
    if isinstance(event, dp_event.LaplaceDpEvent):
        return dp_event.LaplaceDpEvent(2 * event.noise_multiplier)
    return dp_event.GaussianDpEvent(1.0)


TAMPERS = {
    "one draw fewer": lambda events: events[:-1],
    "one draw more": lambda events: events + events[-1:],
    "other noise": lambda events: [_more_noise(e) for e in events],
}


@pytest.mark.parametrize("name, tamper", [(name, tamper) for name in PRIVATE for tamper in TAMPERS])
def test_noise_drawn_other_than_declared_stops_the_round(name, tamper):
    """The draws the privacy comes from tampered: the clients', or the server's (central DP)."""
    sim = simulation(name)
    x0 = sim.model.clone()

    def tampered(inner, *args):
        out = inner.client_round(*args)
        return ClientOutput(out.messages, out.state, TAMPERS[tamper](list(out.events)))

    def tampered_server(inner, t, server, delivered, ctx):
        updated = inner.server_update(t, server, delivered, ctx)
        ctx.events[:] = TAMPERS[tamper](list(ctx.events))
        return updated

    sim.algorithm = Wrapped(sim.algorithm, None, tampered_server) if server_noised(sim) else \
        Wrapped(sim.algorithm, tampered)
    with pytest.raises(DpflError, match="declared"):
        sim.step()
    assert torch.equal(sim.model, x0) and sim.next_round == 0  # nothing reached the server


@pytest.mark.parametrize("name", PRIVATE)
def test_a_mechanism_swapped_after_the_declaration_is_caught(name):
    """The realistic bug: the client work draws from another mechanism than the one ``release`` declared."""
    sim = simulation(name)
    algorithm = sim.algorithm
    if server_noised(sim):  # central DP: the server's step draws from another multiplier than declared
        other = dataclasses.replace(algorithm, noise_multiplier=2 * algorithm.noise_multiplier)
        sim.algorithm = Wrapped(algorithm, None, lambda inner, *args: other.server_update(*args))
        with pytest.raises(DpflError, match="drawn by the server .* declared"):
            sim.step()
        return
    if not (dataclasses.is_dataclass(algorithm) and hasattr(algorithm, "mechanism")):
        pytest.skip(f"{name} has no mechanism field to swap")
    mechanism = algorithm.mechanism
    if isinstance(getattr(algorithm, "noise", None), torch.Tensor):  # per-client noise, calibrated by the builder
        other = dataclasses.replace(algorithm, noise=2 * algorithm.noise)
    else:
        other = dataclasses.replace(algorithm, mechanism=type(mechanism)(2 * mechanism.noise_multiplier))
    sim.algorithm = Wrapped(algorithm, lambda inner, *args: other.client_round(*args))
    with pytest.raises(DpflError, match="declared"):
        sim.step()


# -- b. epsilon: infinite exactly for the non-private names -------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_epsilon_is_infinite_for_non_private_names_and_finite_for_private_ones(name):
    sim = simulation(name)
    history = sim.run(2)
    assert history and set(history[-1].epsilon) == set(sim.ledger.observers)
    for metrics in history:
        for observer, eps in metrics.epsilon.items():
            if is_private(name):
                assert eps is not None and math.isfinite(eps) and eps > 0, (observer, eps)
            else:
                assert eps is None, (observer, eps)
    assert all(math.isinf(e) for e in sim.ledger.epsilon().values()) != is_private(name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU (CUDA) on this machine")
@pytest.mark.parametrize("name", NAMES)
def test_every_family_runs_on_the_gpu_with_the_cpus_ledger(name):
    """run.device = 'cuda': the state stays on the GPU, the noise drawn is the noise declared (the engine checks it
    every round), and the ledger is the CPU run's (the same events; the noise itself differs: another generator)."""
    gpu, cpu = simulation(name, "run.device='cuda'"), simulation(name, "run.device='cpu'")
    for sim in (gpu, cpu):
        sim.run(2)
        assert sim.next_round == 2 and sim.stopped_reason is None
    assert gpu.model.device.type == "cuda" and bool(torch.isfinite(gpu.model).all())
    assert all(v.device.type == "cuda" for part in (gpu.state.server, gpu.state.clients) for v in part.values())
    assert gpu.ledger.to_dict()["journal"] != [] and gpu.ledger.epsilon() == cpu.ledger.epsilon()
    assert [m.epsilon for m in gpu.history] == [m.epsilon for m in cpu.history]


# -- c. resume = the uninterrupted run ----------------------------------------------------------------------------
def _crash_in_round(t: int):
    def crash(inner, round_index, *args):
        if round_index == t:
            raise RuntimeError(f"simulated crash in round {t}")
        return inner.client_round(round_index, *args)

    return crash


@pytest.mark.parametrize("stop", ["crash in the last round", "crash before the first checkpoint", "stopped at 2"])
@pytest.mark.parametrize("name", NAMES)
def test_resume_gives_the_uninterrupted_run(name, stop, tmp_path):
    """A run that stops (a crash mid-round, after the ledger recorded it, or a clean stop after round 2) and is
    resumed by a fresh simulation with ``load_checkpoint`` ends bit for bit where the uninterrupted run does, with the
    same ledger (replayed rounds are not charged twice)."""
    extra = ("run.checkpoint_every=2",)
    first = simulation(name, *extra, out=tmp_path)  # a secret key, saved beside the ledger before the first round
    reference = simulation(name, *extra, noise_key=first.seed)
    rounds = horizon(reference)
    reference.run(rounds)

    if stop == "stopped at 2":
        first.run(2)
        expected_next = crash_at = 2  # nothing recorded past the checkpoint
    else:
        crash_at = rounds - 1 if stop == "crash in the last round" else 1
        first.algorithm = Wrapped(first.algorithm, _crash_in_round(crash_at))
        with pytest.raises(RuntimeError, match="simulated crash"):
            first.run(rounds)
        assert first.ledger.compositions == crash_at + 1  # its record completed before the crash surfaced
        expected_next = crash_at - crash_at % 2  # the last checkpoint (every 2 rounds), or round 0 without one
    resumed = simulation(name, *extra, out=tmp_path)  # the run directory's key
    assert resumed.seed == first.seed
    resumed.load_checkpoint(tmp_path)
    assert resumed.next_round == expected_next
    resumed.run(rounds)

    assert torch.equal(resumed.model, reference.model)
    assert states_equal(resumed.state, reference.state)
    strip = lambda history: [(m.round, m.train_loss, m.test_accuracy) for m in history]  # noqa: E731
    assert strip(resumed.history) == strip(reference.history)
    # The epsilon in a replayed round's metrics is what the ledger has spent by then: the rounds the stopped run
    # recorded before it stopped (up to crash_at) are spent already, so in rounds expected_next+1..crash_at it is
    # ahead of the uninterrupted run's (never behind); everywhere else it is the same.
    for got, want in zip(resumed.history, reference.history):
        if want.epsilon is None:  # off run.epsilon_every's schedule, in both runs: the same rounds report it
            assert got.epsilon is None, (got, want)
        elif expected_next < got.round <= crash_at:
            assert all(got.epsilon[o] is None if want.epsilon[o] is None else got.epsilon[o] >= want.epsilon[o]
                       for o in want.epsilon), (got, want)
        else:
            assert got.epsilon == want.epsilon, (got, want)
    assert resumed.history[-1] == reference.history[-1]
    assert resumed.ledger.compositions == reference.ledger.compositions == rounds
    assert resumed.ledger.to_dict()["journal"] == reference.ledger.to_dict()["journal"]
    assert resumed.ledger.epsilon() == reference.ledger.epsilon()


# -- d. state round-trips through serialisation -------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_state_round_trips_through_torch_save_and_checkpoint_files(name, tmp_path):
    sim = simulation(name)
    sim.run(2)
    state = sim.state
    assert all(isinstance(v, torch.Tensor) for v in state.server.values())
    assert all(isinstance(v, (torch.Tensor, ClientTable)) for v in state.clients.values())
    assert all(v.shape[0] == sim.train.num_clients for v in state.clients.values())

    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    buffer.seek(0)
    loaded = State.from_state_dict(torch.load(buffer, weights_only=True))
    assert states_equal(loaded, state)
    assert all(loaded.server[k].dtype == v.dtype for k, v in state.server.items())

    path = tmp_path / "checkpoint.pt"
    history = [m.to_dict() for m in sim.history]
    checkpoint.save(path, sim.next_round, sim.release, state, history, wall_seconds=1.5)
    saved = checkpoint.load(path, sim.release, sim.state, sim.next_round)  # the ledger records rounds 1..next_round
    assert saved.next_round == sim.next_round and saved.history == history and saved.wall_seconds == 1.5
    assert states_equal(saved.state, state)
    with pytest.raises(RunDirectoryError, match="another release config"):
        checkpoint.load(path, "0" * 64, sim.state, sim.next_round)


# -- e. a bad config names the key --------------------------------------------------------------------------------
#: An out-of-range value of each numeric [algorithm] key with a documented range. A numeric key of a new algorithm
#: must be added here (or to UNBOUNDED) unless its field metadata gives "min" (then min - 1 is used).
OUT_OF_RANGE = {"rounds": 0, "client_rate": 0.0, "local_steps": 0, "lr": -1.0, "global_lr": 0.0, "weight_decay": -1.0,
                "sample_rate": 1.5, "clip": 0.0, "noise_multiplier": 0.0, "clients_per_round": 7, "mu": 0.0,
                "smoothness": 0.0, "reg_strength": -1.0, "l1_ratio": 1.5, "radius": 0.0,
                "feature_clip": 0.0, "skellam_scale": 0.0, "server_lr": 0.0, "weight_records": 0.0, "max_weight": 0.0,
                "target_quantile": 1.5, "clip_lr": 0.0, "count_noise": 0.0}
UNBOUNDED: set[str] = set()


def _numeric_keys(name: str) -> list[str]:
    return [k for k, (types, *_) in key_schema(name, "logreg")["algorithm"].items()
            if any(t in (int, float) for t in (types if isinstance(types, tuple) else (types,)))]


def _out_of_range(name: str, key: str):
    if key in OUT_OF_RANGE:
        return OUT_OF_RANGE[key]
    spec = registry.spec_of(name)
    fields = spec.keys(name)
    if key in fields and "min" in fields[key].metadata:
        return fields[key].metadata["min"] - 1
    raise AssertionError(f"algorithm.{key} of {name!r}: add an out-of-range value to OUT_OF_RANGE (or the key to "
                         "UNBOUNDED)")


@pytest.mark.parametrize("name", NAMES)
def test_an_out_of_range_value_names_its_key(name):
    keys = [k for k in _numeric_keys(name) if k not in UNBOUNDED]
    assert "rounds" in keys and ("client_rate" in keys) == (registry.spec_of(name).cohort is None)
    for key in keys:
        bad = _out_of_range(name, key)
        with pytest.raises(ConfigError) as caught:
            build_simulation(load_config(None, settings(name, **{key: bad})))
        assert f"algorithm.{key}" in str(caught.value), (key, bad, str(caught.value))
        assert caught.value.field == f"algorithm.{key}"


def test_the_documented_ranges_are_out_of_range_for_the_private_names_too():
    assert {"noise_multiplier", "clip"} <= set(_numeric_keys("dp-fedavg"))
    assert not {"noise_multiplier", "clip"} & set(_numeric_keys("fedavg"))


@pytest.mark.parametrize("name", NAMES)
def test_an_unknown_key_is_rejected_naming_the_allowed_keys(name):
    with pytest.raises(ConfigError) as caught:
        load_config(None, [f"algorithm.name='{name}'", "algorithm.no_such_key=1"])
    message = str(caught.value)
    assert "algorithm.no_such_key" in message
    for key in key_schema(name, "logreg")["algorithm"]:
        assert repr(key) in message, key


@pytest.mark.parametrize("name", NON_PRIVATE)
def test_a_private_only_key_is_rejected_for_a_non_private_name(name):
    spec = registry.spec_of(name)
    private_only = [f.name for f in dataclasses.fields(spec.config) if f.name not in spec.keys(name)]
    if spec.names[0] == "fedavg" or "clip" in {f.name for f in dataclasses.fields(spec.config)}:
        assert "clip" in private_only
    for key in private_only:
        default = dict((f.name, f.default) for f in dataclasses.fields(spec.config))[key]
        with pytest.raises(ConfigError, match="applies only to the private names") as caught:
            load_config(None, [f"algorithm.name='{name}'", f"algorithm.{key}={default!r}"])
        assert f"algorithm.{key}" in str(caught.value)


# -- f. the engine imports no algorithm ---------------------------------------------------------------------------
def _code(path: Path) -> str:
    """The source of ``path`` without its docstrings and comments (protocol.py's docstring may say where algorithms
    register); every other string stays, so ``importlib.import_module("dpfl.algorithms...")`` would be found."""
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                lines[first.lineno - 1 : first.end_lineno] = [""] * (first.end_lineno - first.lineno + 1)
    text = "\n".join(lines) + "\n"
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:  # a comment runs to the end of its line
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return "\n".join(lines)


def test_the_engine_source_never_names_dpfl_algorithms():
    files = sorted(ENGINE.glob("*.py"))
    assert len(files) >= 5
    for path in files:
        code = _code(path)
        assert "import" in code or path.name == "__init__.py"
        assert "dpfl.algorithms" not in code, path.name
        assert not re.search(r"from\s+dpfl\s+import\s+(\([^)]*|[^\n]*)\balgorithms\b", code), path.name
        assert not [m for m in _imports(path) if m.startswith("dpfl.algorithms")], path.name


def test_no_member_of_an_algorithm_is_looked_up_by_name():
    """Every member the engine, the runner and the audit read has its typed default on ``protocol.Algorithm``: none
    is read with getattr or hasattr (where a misspelt member silently falls back to a default)."""
    lookup = re.compile(r"\b(getattr|hasattr)\(\s*[\w.]*algorithm\s*,\s*[\"']")
    found = [f"{path.relative_to(SRC)}: {m.group(0)}" for path in sorted((SRC / "dpfl").rglob("*.py"))
             for m in lookup.finditer(_code(path))]
    assert found == []


def _imports(path: Path) -> set[str]:
    """The dpfl modules ``path`` imports (anywhere in it, lazily too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m == "dpfl" or m.startswith("dpfl.")}


def _file_of(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_nothing_the_engine_imports_imports_dpfl_algorithms():
    """The transitive closure of the engine's dpfl imports (read from the source, lazy imports included)."""
    seen: set[str] = set()
    todo = [f"dpfl.engine.{p.stem}" for p in ENGINE.glob("*.py")]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _file_of(module)
        if path is not None:
            todo += sorted(_imports(path) - seen)
    assert "dpfl.accounting.ledger" in seen  # the closure really was followed
    assert not [m for m in seen if m == "dpfl.algorithms" or m.startswith("dpfl.algorithms.")]


# -- g. results do not depend on run.memory_mb --------------------------------------------------------------------
@pytest.fixture
def threads(request):
    """Runs the test with ``request.param`` torch threads, restoring the count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


#: With more than one thread, MKL's batched matrix products (torch.bmm/baddbmm in the ghost clipping) round a
#: client's row differently when the batch holds one client than when it holds several: chunking then changes the
#: models in the last bits (float rounding; the random draws are the same). With one thread chunking is exact. That
#: is why run.memory_mb and run.threads are part of a run's release config (a resume must keep them).
@pytest.mark.parametrize("name, threads", [*((name, 1) for name in PRIVATE), (PRIVATE[0], 2)],
                         indirect=["threads"])
def test_results_do_not_depend_on_the_memory_chunking(name, threads):
    runs, key = {}, 2**255 + 7  # one noise key for both runs
    for budget in ("one client per chunk", "whole cohort"):
        sim = simulation(name, noise_key=key, client_rate=0.5, sample_rate=0.5, clients_per_round=3)
        if budget == "one client per chunk":
            sim.memory_budget_bytes = 1
        chunks = []

        def record(inner, t, server, clients, data, ctx):
            chunks.append((t, ctx.ids.tolist()))
            return inner.client_round(t, server, clients, data, ctx)

        sim.algorithm = Wrapped(sim.algorithm, record)
        rounds = capped(name, getattr(sim.algorithm, "warm_rounds", 0) + 3,  # 3 rounds past any warm-up
                        client_rate=0.5, sample_rate=0.5, clients_per_round=3)
        history = sim.run(rounds)
        runs[budget] = (sim, history, chunks)
    (small, small_history, small_chunks), (whole, whole_history, whole_chunks) = runs.values()
    assert all(len(ids) == 1 for _, ids in small_chunks)
    assert all(len(ids) == 3 for _, ids in whole_chunks) and len(whole_chunks) == small.next_round
    assert [i for _, ids in small_chunks for i in ids] == [i for _, ids in whole_chunks for i in ids]
    # Poisson record sampling pads each chunk's batches to the chunk's largest realised batch, so the batched
    # products run over other widths (zeros appended): the same draws, float rounding apart, as with more threads
    poisson = getattr(getattr(small.algorithm, "sampler", None), "scheme", None) == "poisson"
    if torch.get_num_threads() > 1 or poisson:  # the same draws, float rounding apart
        torch.testing.assert_close(small.model, whole.model, rtol=1e-5, atol=1e-6)
        return
    assert torch.equal(small.model, whole.model)
    assert states_equal(small.state, whole.state)
    assert small_history == whole_history
    assert small.ledger.to_dict()["journal"] == whole.ledger.to_dict()["journal"]


# -- h. Poisson record sampling -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["dp-fedavg", "dp-scaffold"])
def test_poisson_record_sampling_runs_and_is_accounted_add_remove_with_pld(name):
    # PLD costs ~0.1 s per observer and query at noise 5 (~0.5 s at noise 1): 2 rounds, evaluated once
    sim = simulation(name, "run.eval_every=2", record_sampling="poisson", sample_rate=0.3, noise_multiplier=5.0)
    assert sim.algorithm.neighboring == sim.ledger.neighboring == "zero_out"
    sizes = []
    sampler = sim.algorithm.sampler
    assert sampler.scheme == "poisson"

    def record(inner, t, server, clients, data, ctx):
        keys = ctx.streams("records").uniform([(inner.local_steps, int(c)) for c in data.counts])
        for k in range(inner.local_steps):
            _, mask = sampler.sample(data.counts, keys[:, k])
            sizes.extend(mask.sum(1).tolist())
        return inner.client_round(t, server, clients, data, ctx)

    sim.algorithm = Wrapped(sim.algorithm, record)
    x0 = sim.model.clone()
    history = sim.run(2)
    assert len(history) == 1 and len(set(sizes)) > 1  # the batches really are Poisson: their sizes vary
    assert not torch.equal(sim.model, x0)
    assert all(isinstance(e, dp_event.PoissonSampledDpEvent)
               for e in sim.algorithm.release(2, sim.state, sim.train.counts).step_events)
    assert set(sim.ledger.accountants().values()) == {"pld"}
    for observer, eps in history[-1].epsilon.items():
        assert eps is not None and math.isfinite(eps) and eps > 0, observer


# -- i. the memory guard counts the state each family builds ------------------------------------------------------
@pytest.mark.parametrize("name, model", [(n, m) for m in ("logreg", "mlp") for n in NAMES])
def test_the_memory_estimate_has_the_shapes_of_the_state_built(name, model):
    """``memory.initial_state_shapes`` reads a family's state from ``init_state`` at one and two parameters: the
    shapes it gives for the run's d and M are the state the run builds, tensor for tensor, and one client's work
    estimated before the build is the simulator's."""
    hidden = ["model.hidden=[8]"] if model == "mlp" else []  # a small d: sdp-* calibrate their bits to it
    sim = simulation(name, f"model.name='{model}'", *hidden)
    shapes = initial_state_shapes(sim.algorithm, sim.grads.num_params, sim.train.num_clients)
    for built, estimated in ((sim.state.server, shapes.server), (sim.state.clients, shapes.clients)):
        assert {k: (v.shape, v.dtype) for k, v in built.items()} == \
               {k: (v.shape, v.dtype) for k, v in estimated.items()}
    assert client_work_bytes(sim.algorithm, sim.grads, sim.train, shapes) == sim.client_bytes()


# -- j. the cohort split across ranks: 1 rank = 2 ranks -------------------------------------------------------------
def test_two_ranks_give_the_one_process_ledger_and_model(tmp_path):
    """Every family's tiny run (3 of 6 clients a round: shares of 1 and 2 clients) for 2 rounds, and real secure
    aggregation (a stage that delivers from the rows), in one process and split across 2 ranks: ``ranks_agree``."""
    plans = {name: settings(name, "run.eval_every=2") for name in NAMES}
    plans["dp-fedavg-joint + real secure aggregation"] = settings("dp-fedavg-joint", "run.eval_every=2",
                                                                  "privacy.secure_aggregation=true")
    ranks_agree(plans, tmp_path)


@pytest.mark.slow  # ~40 s of CPU: the calibration of its noise, on each rank
def test_two_ranks_give_the_one_process_ledger_and_model_through_the_real_shuffler(tmp_path):
    ranks_agree({"sdp-prox-sgd": settings("sdp-prox-sgd", "run.eval_every=2", "privacy.shuffler='real'")}, tmp_path)


def ranks_agree(plans: dict[str, list[str]], folder: Path, rounds: int = 2) -> None:
    """Each of ``plans`` (label: its family's name first, then anything) run for ``rounds`` rounds in one process
    and split across 2 ranks (gloo, one group of 2 processes running every plan in turn, ``dpfl.engine.launch``; the
    one-process run in its rank 0 alone, ``rank_runs``): the
    same ledger journal and epsilon (the fingerprints differ: the world size enters them), and the same model within
    float32 rounding: the draws are the same, each rank sums its own clients' messages before the all_reduce adds the
    ranks' sums (a real stage gathers the rows instead), and a rank's memory chunks hold other rows than one process's
    (a batched product may round a row differently, as in test g). On 2026-12-07 the largest difference was
    3.6e-7 (7 of the 25 plans bit for bit); a client's message lost or counted twice would move the model by a
    client's share of an update, far more than the 1e-6 allowed. Every rank holds the same model, bit for bit.
    Every client's state, gathered from the rank that owns it, is the one process's, and rank 0's tables hold rows
    of its own clients only (the even ones: client i is rank i mod 2's)."""
    from dpfl.engine.launch import launch

    key = 2**255 + 11
    plan, out = folder / "plan.json", folder / "ranks.pt"
    plan.write_text(json.dumps({"key": key, "rounds": rounds, "runs": plans}))
    script = Path(__file__).resolve().parents[1] / "helpers" / "rank_runs.py"
    assert launch([sys.executable, str(script), str(plan), str(out)], 2) == 0
    split = torch.load(out, weights_only=False)
    held = 0
    for label, overrides in plans.items():
        alone, ranked = split[label]["alone"], split[label]["ranked"]
        assert ranked["rounds"] == alone["rounds"] == capped(label.split()[0], rounds), label
        assert ranked["journal"] == alone["journal"] and ranked["epsilon"] == alone["epsilon"], label
        assert all(a != b for a, b in zip(alone["fingerprints"], ranked["fingerprints"])), label
        torch.testing.assert_close(ranked["model"], alone["model"], rtol=1e-5, atol=1e-6, msg=label)
        assert ranked["ranks_agree"], label  # every rank holds the same model, bit for bit
        # every client's state, gathered from its owner, is the one process's; rank 0 holds only its own clients'
        assert ranked["clients"].keys() == alone["clients"].keys(), label
        for name, rows in alone["clients"].items():
            torch.testing.assert_close(ranked["clients"][name], rows, rtol=1e-5, atol=1e-6, msg=f"{label}: {name}")
        assert ranked["held"] == [i for i in alone["held"] if i % 2 == 0], label
        held += bool(alone["held"])
    assert held > 0 or len(plans) == 1  # some family keeps client state (SCAFFOLD's c_i)
