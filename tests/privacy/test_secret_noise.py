"""The noise is secret: nothing the server holds (the config with run.seed, every message, ledger.json, run.json,
results.json) lets it regenerate a client's noise; in the research mode (run.noise_seed) it can, and the run says so.

The attack is the one a server that knows the noise runs: re-simulate the target client's reply under both
neighbouring data sets (one record of client 0 replaced) with every key it can derive, and pick the data set whose
reply equals the one it received. Knowing the noise, it identifies the data set in every trial (delta = 1 at every
epsilon); without it, no re-simulated reply equals the received one, so it can only guess.
"""

import json

import numpy as np
import pytest
import torch

from dpfl.engine.keys import KEY_FILE, load_key
from dpfl.errors import RunDirectoryError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation, run_experiment

FAMILIES = {
    "dp-fedavg": ["algorithm.name='dp-fedavg'", "algorithm.client_rate=1.0", "algorithm.sample_rate=0.5",
                  "algorithm.local_steps=2", "algorithm.noise_multiplier=1.0"],
    "fedsgd-dpc": ["algorithm.name='fedsgd-dpc'", "privacy.epsilon=4.0", "algorithm.sample_rate=1.0"],
}


def write_data(folder, replaced: bool):
    """4 clients x (12 train + 4 test) records, 3 features; ``replaced``: client 0's first record replaced (the
    neighbour)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = rng.integers(0, 2, size=64)
    if replaced:
        x[0], y[0] = np.array([3.0, -3.0, 3.0], dtype=np.float32), 1 - y[0]
    path = folder / f"d{int(replaced)}.npz"
    np.savez(path, x=x, y=y, client=np.repeat(np.arange(4), 16), split=np.arange(64) % 16 >= 12)
    return path


def config_of(path, family, *extra):
    return load_config(None, [*FAMILIES[family], "data.name='npz'", f"data.path='{path}'",
                              "algorithm.rounds=1", "run.threads=1", *extra])


def received(config, out):
    """Runs ``config`` into ``out`` as the server sees it; client 0's round-1 message (what the server receives)."""
    seen = {}

    def spy(cfg, dataset, delta):
        def work(sim, t, cohort):
            for ids, output in sim.in_process(t, cohort):
                seen.update({int(c): {k: v[i].clone() for k, v in output.messages.items()}
                             for i, c in enumerate(ids.tolist())})
                yield ids, output
        return work

    run_experiment(config, out, workers=spy)
    return seen[0]


def resimulated(config, key):
    """Client 0's round-1 message re-simulated with the noise key ``key`` (the attacker's computation)."""
    sim = build_simulation(config, noise_key=key)
    cohort = sim.clients.sample(0, key)
    for ids, output in sim.in_process(0, cohort):
        for i, c in enumerate(ids.tolist()):
            if c == 0:
                return {k: v[i] for k, v in output.messages.items()}
    return None


def keys_the_server_can_derive(out, config):
    """Every key the server could try: run.seed, run.noise_seed, and numbers in the files it holds."""
    run = json.loads((out / "run.json").read_text())
    ledger = json.loads((out / "ledger.json").read_text())
    guesses = {config["run"]["seed"], 0, int(run["run_id"], 16) if run["run_id"] else 0}
    if config["run"]["noise_seed"] is not None:
        guesses.add(config["run"]["noise_seed"])
    guesses |= {int(entry["fingerprint"], 16) for entry in ledger["journal"] if entry.get("fingerprint")}
    return guesses


def identified(out, observed, configs) -> set:
    """The data sets (0, 1) whose re-simulated reply equals the observed one, over every key the server can derive."""
    found = set()
    for key in keys_the_server_can_derive(out, configs[0]):
        for b, config in enumerate(configs):
            guess = resimulated(config, key)
            if guess is not None and all(torch.equal(guess[k], observed[k]) for k in observed):
                found.add(b)
    return found


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_server_cannot_regenerate_the_noise_by_default(tmp_path, family, one_torch_thread):
    paths = [write_data(tmp_path, False), write_data(tmp_path, True)]
    for truth in (0, 1):
        configs = [config_of(p, family) for p in paths]
        out = tmp_path / f"run-{truth}"
        observed = received(configs[truth], out)
        assert identified(out, observed, configs) == set()  # the attacker's best decision is a coin flip
        assert "secret" in json.loads((out / "results.json").read_text())["privacy"]["noise"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_with_a_noise_seed_the_server_identifies_the_data_set_and_the_run_says_so(tmp_path, family,
                                                                                   one_torch_thread):
    paths = [write_data(tmp_path, False), write_data(tmp_path, True)]
    for truth in (0, 1):
        configs = [config_of(p, family, "run.noise_seed=5") for p in paths]
        out = tmp_path / f"run-{truth}"
        observed = received(configs[truth], out)
        assert identified(out, observed, configs) == {truth}  # delta = 1: the noise is public
        results = json.loads((out / "results.json").read_text())
        assert "research mode, run.noise_seed = 5" in results["privacy"]["noise"]
        assert not (out / KEY_FILE).exists()


def test_two_default_runs_draw_different_noise_and_two_seeded_runs_the_same(tmp_path, one_torch_thread):
    config = config_of(write_data(tmp_path, False), "dp-fedavg", "algorithm.rounds=2")
    first, second = (build_simulation(config) for _ in range(2))
    first.run(2), second.run(2)
    assert not torch.equal(first.model, second.model)
    seeded = config_of(write_data(tmp_path, False), "dp-fedavg", "algorithm.rounds=2", "run.noise_seed=3")
    first, second = (build_simulation(seeded) for _ in range(2))
    first.run(2), second.run(2)
    assert torch.equal(first.model, second.model)


def test_the_key_is_kept_owner_only_and_a_resume_replays_the_same_noise(tmp_path, one_torch_thread):
    path = write_data(tmp_path, False)
    out = tmp_path / "run"
    run_experiment(config_of(path, "dp-fedavg", "algorithm.rounds=2", "run.checkpoint_every=1"), out)
    assert (out / KEY_FILE).stat().st_mode & 0o077 == 0
    key = load_key(out / KEY_FILE)
    assert str(key) not in (out / "run.json").read_text() + (out / "results.json").read_text()
    (out / "checkpoint.pt").unlink()  # a crash before the checkpoint: the resume replays both rounds
    resumed = run_experiment(config_of(path, "dp-fedavg", "algorithm.rounds=3", "run.checkpoint_every=1"), out,
                             resume=True)
    ledger = json.loads((out / "ledger.json").read_text())
    assert [entry["round"] for entry in ledger["journal"]] == [1, 2, 3]  # the replayed rounds are not charged twice
    uninterrupted = build_simulation(config_of(path, "dp-fedavg", "algorithm.rounds=3"), noise_key=key)
    history = uninterrupted.run(3)
    assert resumed["final"]["train_loss"] == history[-1].train_loss
    saved = torch.load(out / "checkpoint.pt", weights_only=False)["state"]["server"]["x"]
    assert torch.equal(saved, uninterrupted.model)


def test_a_run_whose_key_is_lost_refuses_to_resume(tmp_path, one_torch_thread):
    path = write_data(tmp_path, False)
    out = tmp_path / "run"
    run_experiment(config_of(path, "dp-fedavg", "algorithm.rounds=1"), out)
    (out / KEY_FILE).unlink()
    with pytest.raises(RunDirectoryError, match="noise.key .*is missing"):
        run_experiment(config_of(path, "dp-fedavg", "algorithm.rounds=2"), out, resume=True)


def test_a_restart_draws_a_new_key_and_archives_the_old_one(tmp_path, one_torch_thread):
    path = write_data(tmp_path, False)
    out = tmp_path / "run"
    run_experiment(config_of(path, "dp-fedavg"), out)
    before = load_key(out / KEY_FILE)
    run_experiment(config_of(path, "dp-fedavg"), out, restart=True)
    archived = next((out / "archive").iterdir())
    assert load_key(archived / KEY_FILE) == before != load_key(out / KEY_FILE)


@pytest.mark.parametrize("overrides, enforced", [
    ([], "nothing to enforce"),
    (["privacy.boundary='secagg'"], "simulated: the ledger charges the server only the sum"),
])
def test_results_say_how_the_boundary_is_enforced(tmp_path, overrides, enforced, one_torch_thread):
    results = run_experiment(config_of(write_data(tmp_path, False), "dp-fedavg", *overrides))
    assert results["privacy"]["enforced"].startswith(enforced)
