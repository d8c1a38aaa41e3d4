"""The memory estimate (dpfl.data.footprint): a config whose data cannot be built on this machine is refused from
the config alone, at once, naming the estimate and the knobs; ordinary configs pass; the estimate covers what a build
really keeps; a run.memory_mb below one client's work is refused naming the smallest value that works."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpfl.cli import main
from dpfl.data import footprint
from dpfl.data.footprint import HEADROOM, check_data_memory, data_footprint
from dpfl.data.memory_limit import MemoryLimit, available_memory
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments import assembly
from dpfl.experiments.assembly import build_simulation

GB = 2**30
MILLION = ("data.num_clients=1000000", "data.samples_per_client=60")


@pytest.fixture
def sixteen_gb(monkeypatch):
    """The machine has 16 GB available, whatever this one has."""
    monkeypatch.setattr(footprint, "available_memory", lambda: MemoryLimit(16 * GB, "MemAvailable in /proc/meminfo"))


def test_a_million_clients_of_60_records_is_refused_at_once_naming_the_knobs(sixteen_gb, tmp_path, capsys,
                                                                             monkeypatch):
    config = load_config(None, MILLION)
    built = []
    with monkeypatch.context() as patched, pytest.raises(ConfigError) as caught:
        patched.setattr(assembly, "build_dataset", lambda **data: built.append(data))
        build_simulation(config)
    assert built == []  # refused from the config alone, before any data is generated
    message = str(caught.value)
    assert caught.value.field == "data.num_clients" and "23.7 GB at its peak" in message
    assert "16.0 GB available" in message and "data.samples_per_client" in message
    assert f"at most {int(HEADROOM * 16 * GB // (25440)):,} clients of 60 records" in message  # 25440 bytes a client
    code = main(["run", "--out", str(tmp_path / "run"), "--no-progress", *[a for s in MILLION for a in ("--set", s)],
                 str(_empty_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and "data.num_clients = 1000000 is not allowed" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def _empty_config(tmp_path):
    path = tmp_path / "defaults.toml"
    path.write_text("")
    return path


def test_ordinary_configs_pass_the_check_on_this_machine():
    for overrides in ((), ("data.name='digits'",), ("data.num_clients=1000", "data.samples_per_client=600")):
        estimate = check_data_memory(load_config(None, overrides)["data"])
        assert 0 < estimate.peak_bytes < HEADROOM * available_memory().available
    assert data_footprint(load_config(None, [])["data"]).peak_bytes == 100 * 5000 * 424  # M R (4F + 8 (0.8) F + 8)


def test_the_estimate_covers_what_a_build_keeps(tmp_path):
    """The dataset's tensors and the simulator's flat copies are all resident at once after a build: the estimate of
    the peak is at least that, and within a few times of it (the rest is the build's temporaries)."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((3000, 20)).astype(np.float32), y=rng.integers(0, 3, 3000),
             client=rng.integers(0, 7, 3000))
    configs = [("data.num_clients=50", "data.samples_per_client=100"),
               ("data.name='npz'", f"data.path='{tmp_path / 'd.npz'}'")]
    for overrides in configs:
        config = load_config(None, [*overrides, "algorithm.name='fedavg'"])
        sim = build_simulation(config)
        kept = sum(t.numel() * t.element_size() for split in (sim.train, sim.test)
                   for t in (split.x, split.y, *split.flat()))
        estimate = data_footprint(config["data"]).peak_bytes
        assert kept <= estimate <= 4 * kept, (overrides, kept, estimate)


def test_a_file_too_large_is_refused_naming_the_path_and_the_knobs(tmp_path, monkeypatch):
    np.savez(tmp_path / "d.npz", x=np.zeros((1000, 50), np.float32), y=np.arange(1000) % 2)
    cgroup = MemoryLimit(2**20, "cgroup v2 memory.max = 3.0 MB, 2.0 MB of it in use (/sys/fs/cgroup)")
    monkeypatch.setattr(footprint, "available_memory", lambda: cgroup)
    with pytest.raises(ConfigError, match=r"data.path = .*d.npz.*1 client x 1,000 records x 50 features.*lower "
                                          r"data.samples_per_client .*or use a smaller file") as caught:
        build_simulation(load_config(None, ["data.name='npz'", f"data.path='{tmp_path / 'd.npz'}'",
                                            "data.num_clients=1", "algorithm.client_rate=1.0"]))
    assert "this process has 1.0 MB available (cgroup v2 memory.max = 3.0 MB, 2.0 MB of it in use (/sys/fs/cgroup))" \
        in str(caught.value)


def test_available_memory_is_positive_and_at_most_the_machines():
    with open("/proc/meminfo") as meminfo:
        total = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:"))
    assert 0 < available_memory().available <= total


def test_run_memory_mb_below_one_clients_work_is_refused_naming_the_smallest_that_works():
    """Synthetic, 2 clients of 5000 records (4000 for training), fedavg's minibatches of 0.2 * 4000 = 800 records:
    one client's work is its minibatch's per-example state (ghost norms: 4 (40 + 3 (40 + 2 10)) = 880 bytes each),
    its 4000 x 40 padded features and its model-sized vectors (one noise draw and ROUND_VECTORS = 6 more, of the
    410 parameters): 800 * 880 + 4 * 4000 * 40 + 4 * 410 * 7 = 1,355,480 bytes, 1.3 MB: run.memory_mb = 1 is
    refused, 2 runs."""
    base = ["algorithm.name='fedavg'", "data.num_clients=2", "data.samples_per_client=5000", "algorithm.rounds=1",
            "algorithm.client_rate=1.0", "algorithm.local_steps=1"]
    torch.set_num_threads(1)
    with pytest.raises(ConfigError, match=r"run.memory_mb = 1 is not allowed: expected at least 2: .*800 records, "
                                          r"and its model-sized vectors\) takes 1.3 MB"):
        build_simulation(load_config(None, [*base, "run.memory_mb=1"]))
    sim = build_simulation(load_config(None, [*base, "run.memory_mb=2"]))
    assert sim.client_bytes() == 1_355_480 and sim.chunk_size(2) == 1
    sim.run(1)
    assert sim.next_round == 1
