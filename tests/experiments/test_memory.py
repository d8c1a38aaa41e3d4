"""The memory guard of a run beyond its data (dpfl.experiments.memory): a model or a per-client state that cannot fit
is refused before it is built, naming the keys to turn (never an allocator's traceback after gigabytes); ordinary runs
pass; the estimate follows the state each family builds."""

from __future__ import annotations

import resource

import pytest
import torch

from dpfl.cli import main
from dpfl.data import footprint
from dpfl.data.memory_limit import MemoryLimit
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.memory import HEADROOM, check_run_memory, initial_state_shapes
from dpfl.experiments.assembly import build_simulation

GB = 2**30
#: DP-SCAFFOLD with an MLP of 40 x 1000 + 1000 + 1000 x 10 + 10 = 51,010 parameters: each client's control variate
#: is 204,040 bytes.
SCAFFOLD_MLP = ("algorithm.name='dp-scaffold'", "model.name='mlp'", "model.hidden=[1000]", "data.samples_per_client=5",
                "algorithm.local_steps=2", "run.threads=1")
#: An MLP of 40 x 20000 + 20000 + 20000 x 20000 + 20000 + 20000 x 10 + 10 = 401,040,010 parameters (1.5 GB a copy).
HUGE_MLP = ("model.name='mlp'", "model.hidden=[20000, 20000]", "data.samples_per_client=10", "run.threads=1")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def available(monkeypatch, num_bytes: int) -> None:
    """The machine has ``num_bytes`` available, whatever this one has."""
    monkeypatch.setattr(footprint, "available_memory", lambda: MemoryLimit(num_bytes, "MemAvailable in /proc/meminfo"))


def peak_growth(build) -> float:
    """Bytes by which this process's peak resident memory grew while ``build()`` ran (and raised)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ConfigError) as caught:
        build()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, caught.value


def test_scaffold_clients_state_that_does_not_fit_is_refused_before_it_is_built(monkeypatch):
    """2,000 clients' control variates are 2,000 x 204,040 bytes = 389 MB, and a round's messages (dy and dc of 400
    clients, chunked and then concatenated) 311 MB more: refused with 1 GB available, naming data.num_clients and
    how many clients fit, before the state is allocated (before: the state was built)."""
    available(monkeypatch, GB)
    grown, error = peak_growth(lambda: build_simulation(load_config(None, [*SCAFFOLD_MLP, "data.num_clients=2000"])))
    message = str(error)
    assert error.field == "data.num_clients" and error.value == 2000
    assert "the clients' state 2,000 x 0.2 MB = 389.2 MB" in message and "1.0 GB available" in message
    assert "lower data.num_clients" in message and "model.hidden" in message
    fit = int(message.split("at most about ")[1].split(" clients")[0].replace(",", ""))
    assert 1000 < fit < 1200  # (0.9 GB - 512 MB of a chunk) / (204,040 bytes of state + 0.2 x 2 x 408,080 of messages)
    assert grown < 100 * 2**20


def test_the_fitting_number_of_clients_fits(monkeypatch):
    """The number of clients the refusal names passes the same guard, and twice as many do not (it is conservative:
    fewer clients may also take a smaller chunk of work)."""
    available(monkeypatch, GB)
    with pytest.raises(ConfigError) as caught:
        build_simulation(load_config(None, [*SCAFFOLD_MLP, "data.num_clients=3000"]))
    fit = int(str(caught.value).split("at most about ")[1].split(" clients")[0].replace(",", ""))
    build_simulation(load_config(None, [*SCAFFOLD_MLP, f"data.num_clients={fit}"]))
    with pytest.raises(ConfigError, match="data.num_clients"):
        build_simulation(load_config(None, [*SCAFFOLD_MLP, f"data.num_clients={2 * fit}"]))


def test_a_model_of_4e8_parameters_is_refused_before_it_is_built(monkeypatch, tmp_path, capsys):
    """401,040,010 parameters (1.5 GB a copy; SCAFFOLD-warm keeps x, c, each client's c and 50 noise draws a
    client): refused with 16 GB available naming model.hidden, without allocating a copy (before: 9.7 GB, then the
    allocator's traceback)."""
    available(monkeypatch, 16 * GB)
    grown, error = peak_growth(lambda: build_simulation(load_config(None, HUGE_MLP)))
    message = str(error)
    assert error.field == "model.hidden" and error.value == [20000, 20000]
    assert "the model (401,040,010 parameters)" in message and "16.0 GB available" in message
    assert "use a smaller model (model.hidden)" in message
    assert grown < 100 * 2**20
    config = tmp_path / "huge.toml"
    config.write_text("")
    code = main(["run", "--out", str(tmp_path / "run"), "--no-progress",
                 *[a for s in HUGE_MLP for a in ("--set", s)], str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "model.hidden = [20000, 20000] is not allowed" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "ledger.json").exists()


@pytest.mark.slow
def test_scaffold_with_200000_clients_is_refused_naming_the_clients(monkeypatch):
    """The issue's case: 200,000 clients' control variates of a 51,010-parameter MLP, 38 GB (and the round's
    messages of 40,000 clients another 30 GB), on a 16 GB machine. About 30 s: it builds the 200,000 clients' data."""
    available(monkeypatch, 16 * GB)
    grown, error = peak_growth(lambda: build_simulation(load_config(None, [*SCAFFOLD_MLP, "data.num_clients=200000"])))
    assert error.field == "data.num_clients" and "200,000 x 0.2 MB = 38.0 GB" in str(error)
    assert grown < 2 * GB  # the data (200,000 clients of 5 records) and no state


def test_ordinary_runs_pass_and_the_estimate_covers_the_state_built():
    """The server's state as estimated; the clients' (SCAFFOLD's c_i in a ClientTable) at most min(M, L T) rows,
    here 2 rounds of 4 of 20 clients: the rows of the (at most 8) clients sampled, of the 20 a dense tensor takes."""
    for overrides in (("algorithm.name='dp-scaffold'",), ("algorithm.name='dp-fedavg'", "model.name='mlp'"),
                      SCAFFOLD_MLP):
        config = load_config(None, ["data.num_clients=20", "data.samples_per_client=50", "algorithm.rounds=2",
                                    "algorithm.client_rate=0.2", *overrides])
        seen = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("dpfl.experiments.assembly.check_run_memory",
                          lambda config, estimate: seen.append(estimate) or check_run_memory(config, estimate))
            sim = build_simulation(config)
        sim.run(2)
        (estimate,) = seen
        server = sum(t.numel() * t.element_size() for t in sim.state.server.values())
        shapes = initial_state_shapes(sim.algorithm, sim.grads.num_params, sim.train.num_clients)
        assert server == estimate.server_bytes == sum(t.numel() * t.element_size() for t in shapes.server.values())
        held = sum(t.held for t in sim.state.clients.values())
        sampled = torch.cat([sim.clients.sample(t, sim.seed) for t in range(sim.next_round)]).unique().numel()
        assert held == (sampled if sim.state.clients else 0) and sampled <= estimate.holders == 8
        assert held * estimate.client_state_bytes <= estimate.clients_bytes
        assert estimate.total_bytes < HEADROOM * footprint.available_memory().available


def test_one_clients_work_counts_its_noise_draws():
    """dp-scaffold's K local steps draw K model-sized noise vectors a client: one client's work grows by 4 d bytes a
    step, so a chunk holds what run.memory_mb allows (before, one client's work left its model-sized vectors out: with
    this MLP, K = 2 and 4,000 clients the round's one chunk of 800 clients took about 1.6 GB of a 512 MB budget)."""
    sims = [build_simulation(load_config(None, [*SCAFFOLD_MLP, "data.num_clients=20", f"algorithm.local_steps={k}"]))
            for k in (2, 5)]
    assert sims[1].client_bytes() - sims[0].client_bytes() == 3 * 4 * 51_010


def test_check_run_memory_takes_the_memory_given(monkeypatch):
    sim_config = load_config(None, [*SCAFFOLD_MLP, "data.num_clients=20"])
    seen = []
    monkeypatch.setattr("dpfl.experiments.assembly.check_run_memory",
                        lambda config, estimate: seen.append(estimate) or check_run_memory(config, estimate))
    build_simulation(sim_config)
    (estimate,) = seen
    assert check_run_memory(sim_config, estimate, MemoryLimit(estimate.total_bytes * 2, "given")) is estimate
    with pytest.raises(ConfigError, match=r"is not allowed: expected .* needs about .* available \(given\) once"):
        check_run_memory(sim_config, estimate, MemoryLimit(estimate.total_bytes, "given"))
