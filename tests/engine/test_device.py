"""run.device: its values and errors, the chunk budget on a GPU (mocked free memory), the plumbing with device "cpu"
named explicitly, and checkpoints that are device-independent (CPU tensors, read with map_location, restored onto
the resuming run's device). The CUDA cases run only where torch sees a GPU."""

from __future__ import annotations

import pytest
import torch

from dpfl.engine import checkpoint
from dpfl.engine.device import GPU_MEMORY_SHARE, chunk_budget_bytes, resolve_device, stream_identity
from dpfl.engine.protocol import State
from dpfl.engine.randomness import generator, stream_seed
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.resolved import resolve
from dpfl.experiments.run_directory import release_hash
from dpfl.experiments.runner import build_simulation

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["data.name='synthetic'", "data.num_clients=6", "data.samples_per_client=30", "algorithm.name='dp-fedavg'",
         "algorithm.client_rate=0.5", "algorithm.local_steps=2", "run.noise_seed=7"]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU (CUDA) on this machine")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


# -- run.device's values ------------------------------------------------------------------------------------------
def test_auto_is_the_cpu_without_a_gpu_and_the_gpu_with_one(no_gpu, monkeypatch):
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_cpu_and_cuda_names(two_gpus):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_a_gpu_asked_for_on_a_machine_without_one_is_a_config_error(no_gpu, name):
    with pytest.raises(ConfigError, match=r"run\.device = '" + name + "'.*torch sees no GPU") as err:
        resolve_device(name)
    assert err.value.field == "run.device"


def test_a_gpu_index_beyond_those_torch_sees_is_refused(two_gpus):
    with pytest.raises(ConfigError, match=r"run\.device = 'cuda:2'.*N below 2: torch sees 2 GPU"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("name", ["gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "mps", "", 0])
def test_other_values_are_refused_naming_what_is_allowed(two_gpus, name):
    with pytest.raises(ConfigError, match=r"run\.device = .*expected one of \['auto', 'cpu', 'cuda', 'cuda:N'\]"):
        resolve_device(name)


def test_a_config_asking_for_cuda_is_refused_before_any_data_is_built(no_gpu):
    config = load_config(None, [*SMALL, "run.device='cuda'"])
    with pytest.raises(ConfigError, match=r"run\.device = 'cuda'"):
        resolve(config)


def test_the_device_is_not_part_of_the_release_config():
    """A run resumes on another device (``checkpoint``): run.device is a run-only key."""
    on_cpu, on_gpu = (load_config(None, [*SMALL, f"run.device='{name}'"]) for name in ("cpu", "cuda"))
    assert release_hash(on_cpu) == release_hash(on_gpu) == release_hash(load_config(None, SMALL))


# -- the chunk budget ----------------------------------------------------------------------------------------------
def test_on_the_cpu_a_chunk_takes_run_memory_mb():
    assert chunk_budget_bytes(torch.device("cpu"), 64 * 2**20) == 64 * 2**20


def test_on_a_gpu_a_chunk_takes_a_share_of_its_free_memory_not_run_memory_mb(monkeypatch):
    asked = []

    def mem_get_info(device):
        asked.append(device)
        return 6 * 2**30, 80 * 2**30  # (free, total) bytes

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    gpu = torch.device("cuda", 1)
    assert chunk_budget_bytes(gpu, 64 * 2**20) == int(GPU_MEMORY_SHARE * 6 * 2**30)
    assert asked == [gpu]


def test_a_simulation_built_for_a_gpu_chunks_to_the_gpus_free_memory(two_gpus, monkeypatch):
    """assemble's wiring: the Simulation's chunk budget is chunk_budget_bytes(device, run.memory_mb), not run.memory_mb
    (the run itself is built on the CPU here: the GPU is only named)."""
    seen = []

    def budget(device, configured):
        seen.append((device, configured))
        return 3 * 2**20

    monkeypatch.setattr("dpfl.experiments.assembly.chunk_budget_bytes", budget)
    sim = build_simulation(load_config(None, [*SMALL, "run.device='cpu'", "run.memory_mb=64"]))
    assert seen == [(torch.device("cpu"), 64 * 2**20)] and sim.memory_budget_bytes == 3 * 2**20


# -- the plumbing, with "cpu" named ---------------------------------------------------------------------------------
def test_a_run_on_the_named_cpu_is_the_run_on_auto_without_a_gpu(no_gpu):
    """Nothing changes on the CPU: the same model, metrics and epsilon whether run.device is 'cpu' or 'auto'."""
    runs = []
    for name in ("cpu", "auto"):
        sim = build_simulation(load_config(None, [*SMALL, f"run.device='{name}'"]))
        assert sim.device == torch.device("cpu") and sim.train.x.device.type == "cpu"
        sim.run(3)
        runs.append(sim)
    assert torch.equal(runs[0].model, runs[1].model)
    assert [m.to_dict() for m in runs[0].history] == [m.to_dict() for m in runs[1].history]


def test_the_cpus_fingerprint_has_no_device_part_and_another_devices_has_one(monkeypatch):
    """A round replayed on another kind of device draws other noise onto the same state: its fingerprint differs, so
    the ledger charges it again; on the CPU the fingerprint is that of runs before run.device."""
    assert stream_identity(torch.device("cpu")) == ""
    sim = build_simulation(load_config(None, [*SMALL, "run.device='cpu'"]))
    cohort = sim.clients.sample(0, sim.seed)
    on_cpu = sim._fingerprint(0, cohort)
    monkeypatch.setattr("dpfl.engine.simulator.stream_identity", lambda device: "cuda NVIDIA H100")
    assert sim._fingerprint(0, cohort) != on_cpu


def test_random_streams_are_made_on_the_default_device():
    """The generators follow ``on_device``'s default device (on the CPU: the CPU generator of before)."""
    g = generator(7, 0, 3, "noise")
    assert g.device == torch.device("cpu")
    reference = torch.Generator().manual_seed(stream_seed(7, 0, 3, "noise"))
    assert torch.equal(torch.randn(4, generator=g), torch.randn(4, generator=reference))


# -- checkpoints ------------------------------------------------------------------------------------------------
def _state(device="cpu") -> State:
    return State({"x": torch.arange(4.0, device=device)}, {"c": torch.ones(3, 4, device=device)})


def test_a_checkpoint_is_read_onto_the_cpu_and_restored_onto_the_resuming_runs_device(tmp_path, monkeypatch):
    """map_location='cpu' (a checkpoint written on a GPU loads on a machine without one), then each tensor moves to
    the device of the resuming run's own state: here torch's meta device stands in for a GPU."""
    path = tmp_path / "checkpoint.pt"
    checkpoint.save(path, 2, "r", _state(), [])
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(k) or real_load(*a, **k))
    saved = checkpoint.load(path, "r", _state("meta"), recorded=2)
    assert loads == [{"weights_only": True, "map_location": "cpu"}]
    assert saved.state.server["x"].device.type == "meta" and saved.state.clients["c"].device.type == "meta"
    assert saved.state.clients["c"].shape == (3, 4)


def test_a_checkpoint_holds_cpu_tensors(tmp_path, monkeypatch):
    """save moves every tensor to the CPU first (a no-op for CPU tensors): spied through Tensor.cpu."""
    moved = []
    real_cpu = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: moved.append(tuple(self.shape)) or
                        real_cpu(self, *a, **k))
    checkpoint.save(tmp_path / "checkpoint.pt", 1, "r", _state(), [])
    assert sorted(moved) == [(3, 4), (4,)]
    payload = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert all(t.device.type == "cpu" for part in payload["state"].values() for t in part.values())


def test_a_run_checkpointed_on_the_cpu_resumes_on_the_cpu_through_the_device_mapping(tmp_path):
    reference = build_simulation(load_config(None, [*SMALL, "run.device='cpu'"]))
    reference.run(4)
    first = build_simulation(load_config(None, [*SMALL, "run.device='cpu'", "run.checkpoint_every=2"]), tmp_path)
    first.run(2)
    resumed = build_simulation(load_config(None, [*SMALL, "run.device='auto'", "run.checkpoint_every=2"]), tmp_path)
    resumed.load_checkpoint(tmp_path)
    assert resumed.next_round == 2
    resumed.run(4)
    assert torch.equal(resumed.model, reference.model)
    assert resumed.ledger.epsilon() == reference.ledger.epsilon() and resumed.ledger.compositions == 4


# -- on a GPU -------------------------------------------------------------------------------------------------------
@needs_cuda
def test_a_run_on_the_gpu_keeps_its_tensors_there_and_its_checkpoint_resumes_on_the_cpu(tmp_path):
    gpu = build_simulation(load_config(None, [*SMALL, "run.device='cuda'", "run.checkpoint_every=2"]), tmp_path)
    assert gpu.train.x.device.type == "cuda" and gpu.model.device.type == "cuda"
    gpu.run(2)
    assert all(v.device.type == "cuda" for v in gpu.state.clients.values())
    epsilon = gpu.ledger.epsilon()
    cpu = build_simulation(load_config(None, [*SMALL, "run.device='cpu'", "run.checkpoint_every=2"]), tmp_path)
    cpu.load_checkpoint(tmp_path)
    assert cpu.next_round == 2 and cpu.model.device.type == "cpu"
    assert torch.allclose(cpu.model, gpu.model.cpu())
    assert cpu.ledger.epsilon() == epsilon
    cpu.run(3)
    assert cpu.ledger.compositions == 3


@needs_cuda
def test_the_gpus_chunk_budget_is_read_from_its_free_memory():
    free, _total = torch.cuda.mem_get_info()
    assert 0 < chunk_budget_bytes(torch.device("cuda"), 1) <= free


@needs_cuda
@pytest.mark.parametrize("model", ["model.name='logreg'", "model.name='mlp'"])
def test_a_gpu_run_chunked_one_client_a_call_is_the_one_call_run(model, monkeypatch):
    """The cohort in one call (the GPU's free memory) and one client a call (a 1-byte chunk budget): the same model and
    metrics to float tolerance, and the same ledger (the noise streams are per client, not per chunk)."""
    runs = []
    for budget in (None, 1):
        if budget is not None:
            monkeypatch.setattr("dpfl.experiments.assembly.chunk_budget_bytes", lambda device, configured: budget)
        sim = build_simulation(load_config(None, [*SMALL, model, "run.device='cuda'"]))
        sim.run(3)
        runs.append(sim)
    whole, chunked = runs
    assert whole.chunk_size(6) > 1 and chunked.chunk_size(6) == 1
    assert torch.allclose(whole.model, chunked.model, rtol=1e-4, atol=1e-6)
    assert whole.ledger.epsilon() == chunked.ledger.epsilon()
    for a, b in zip(whole.history, chunked.history):
        assert a.test_accuracy == pytest.approx(b.test_accuracy, abs=0.05)
