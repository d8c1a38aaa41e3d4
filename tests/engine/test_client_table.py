"""ClientTable: per-client state stored only for the clients that write a row, read and written like a dense
[M, ...] tensor, and restored bit for bit from its state_dict (what a checkpoint holds)."""

import io

import pytest
import torch

from dpfl.engine import checkpoint
from dpfl.engine.client_table import ClientTable
from dpfl.engine.protocol import State
from dpfl.errors import RunDirectoryError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation


def test_reads_and_writes_agree_with_a_dense_tensor_written_the_same_way():
    g = torch.Generator().manual_seed(0)
    initial = torch.randn(3, 2, generator=g)
    table, dense = ClientTable(50, initial), initial.expand(50, 3, 2).clone()
    for _ in range(30):
        ids = torch.randperm(50, generator=g)[:7]
        rows = torch.randn(7, 3, 2, generator=g)
        table[ids], dense[ids] = rows, rows
        probe = torch.randint(0, 50, (11,), generator=g)
        assert torch.equal(table[probe], dense[probe])
    assert torch.equal(table.dense(), dense)
    assert table.shape == dense.shape and table.dtype == dense.dtype
    assert table.held == int((dense != initial).flatten(1).any(1).sum())


def test_holds_only_the_rows_written():
    """10^5 clients of which 1,000 wrote: 1,000 rows and the slots, not 10^5 rows."""
    table = ClientTable.zeros(100_000, 1_000)
    assert torch.equal(table[torch.tensor([5, 99_999])], torch.zeros(2, 1_000))
    table[torch.arange(0, 100_000, 100)] = torch.ones(1_000, 1_000)
    assert table.held == 1_000
    assert table.nbytes == 1_001 * 4_000 + 8 * 100_000  # 4.8 MB, where the dense table takes 400 MB
    assert float(table[torch.tensor([100])].sum()) == 1_000 and float(table[torch.tensor([101])].sum()) == 0


def test_state_dict_round_trips_through_torch_save_weights_only():
    table = ClientTable.zeros(20, 4)
    table[torch.tensor([7, 3])] = torch.arange(8.0).reshape(2, 4)
    table[torch.tensor([3, 11])] = -torch.ones(2, 4)
    buffer = io.BytesIO()
    torch.save(State({"x": torch.zeros(4)}, {"c": table}).state_dict(), buffer)
    buffer.seek(0)
    loaded = State.from_state_dict(torch.load(buffer, weights_only=True)).clients["c"]
    assert isinstance(loaded, ClientTable) and torch.equal(loaded.dense(), table.dense())
    assert loaded.state_dict()["clients"].tolist() == [7, 3, 11]  # in the order they first wrote


@pytest.mark.parametrize("corrupt, problem", [
    (lambda d: d.update(clients=torch.tensor([1, 1])), "disagree"),
    (lambda d: d.update(clients=torch.tensor([1, 20])), "disagree"),
    (lambda d: d.update(rows=torch.zeros(2, 5)), "disagree"),
    (lambda d: d.update(num_clients=20.0), "num_clients"),
])
def test_a_checkpoint_with_an_inconsistent_table_is_refused_naming_the_file(tmp_path, corrupt, problem):
    table = ClientTable.zeros(20, 4)
    table[torch.tensor([1, 2])] = torch.ones(2, 4)
    state = State({"x": torch.zeros(4)}, {"c": table})
    path = tmp_path / "checkpoint.pt"
    checkpoint.save(path, 1, "r", state, [])
    payload = torch.load(path, weights_only=True)
    corrupt(payload["state"]["clients"]["c"])
    torch.save(payload, path)
    with pytest.raises(RunDirectoryError, match=f"{path}.*not a valid checkpoint.*{problem}"):
        checkpoint.load(path, "r", state, recorded=1)


def test_a_table_checkpoint_of_another_population_is_refused(tmp_path):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save(path, 1, "r", State({"x": torch.zeros(4)}, {"c": ClientTable.zeros(20, 4)}), [])
    with pytest.raises(RunDirectoryError, match=r"clients c has shape \(20, 4\), this config's \(30, 4\)"):
        checkpoint.load(path, "r", State({"x": torch.zeros(4)}, {"c": ClientTable.zeros(30, 4)}), recorded=1)


def test_scaffold_on_ten_thousand_clients_holds_the_rows_of_the_clients_it_sampled():
    sim = build_simulation(load_config(None, [
        "algorithm.name='dp-scaffold'", "data.name='synthetic'", "data.num_clients=10000", "data.samples_per_client=10",
        "algorithm.client_rate=0.001", "algorithm.local_steps=2", "run.noise_seed=0", "run.eval_every=100"]))
    sim.run(3)
    sampled = torch.cat([sim.clients.sample(t, sim.seed) for t in range(3)]).unique()
    table = sim.state.clients["c"]
    assert table.held == sampled.numel() <= 30
    assert torch.equal(table.dense().abs().sum(1).gt(0).nonzero().flatten(), sampled)


def test_a_rank_keeps_its_own_clients_rows_and_the_work_returns_to_cohort_order():
    """``Ranks.own_state`` cuts a table to the rank's clients (i mod N), a dense tensor kept whole; ``in_cohort_order``
    puts rows that arrived rank by rank back in the cohort's order, and refuses rows that are not the cohort's."""
    from dpfl.engine.cohort_round import in_cohort_order
    from dpfl.engine.ranks import Ranks
    from dpfl.errors import DpflError

    table = ClientTable.zeros(7, 2)
    table[torch.tensor([5, 0, 3, 4])] = torch.arange(8.0).reshape(4, 2)
    dense_rows = torch.arange(14.0).reshape(7, 2)
    own = Ranks(1, 2).own_state(State({"x": torch.zeros(2)}, {"c": table, "d": dense_rows}))
    assert own.clients["c"].state_dict()["clients"].tolist() == [5, 3]
    assert torch.equal(own.clients["c"].dense()[[5, 3, 0]], torch.tensor([[0.0, 1], [4, 5], [0, 0]]))
    assert own.clients["d"] is dense_rows
    cohort, arrived = torch.tensor([4, 1, 6, 3]), torch.tensor([4, 6, 1, 3])
    messages = {"dy": torch.tensor([[4.0], [6], [1], [3]])}
    assert torch.equal(in_cohort_order(messages, arrived, cohort)["dy"], torch.tensor([[4.0], [1], [6], [3]]))
    assert in_cohort_order(messages, cohort, cohort) is messages
    with pytest.raises(DpflError, match="not the cohort's"):
        in_cohort_order(messages, torch.tensor([4, 6, 1, 2]), cohort)
    with pytest.raises(DpflError, match="not the cohort's"):
        in_cohort_order({"dy": messages["dy"][:3]}, arrived[:3], cohort)
