"""run.tensorboard (dpfl.experiments.tensorboard_log): a `dpfl run`'s rounds written as TensorBoard events and read back
with TensorBoard's own EventAccumulator; the scalars of a row; the error without the package; a run-only key."""

import importlib.util
import json

import pytest

from dpfl.cli import main
from dpfl.experiments.config import load_config
from dpfl.experiments.run_directory import release_config
from dpfl.experiments.tensorboard_log import round_scalars

TINY = """
[data]
num_clients = 6
samples_per_client = 30

[algorithm]
name = "dp-fedavg"
rounds = 3
local_steps = 2
noise_multiplier = 2.0
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_a_runs_rounds_read_back_from_its_event_files_equal_results_json(config, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, board = tmp_path / "run", tmp_path / "board"
    assert main(["run", str(config), "--out", str(out), "--no-progress", "--set", f"run.tensorboard='{board}'"]) == 0
    rows = json.loads((out / "results.json").read_text())["rounds"]
    events = EventAccumulator(str(board))
    events.Reload()
    observers = ["third_party", "server", "other_silo"]
    assert sorted(events.Tags()["scalars"]) == sorted(["test_accuracy", "train_loss",
                                                       *(f"epsilon/{o}" for o in observers)])

    def read(tag):
        return [(e.step, e.value) for e in events.Scalars(tag)]

    assert [r["round"] for r in rows] == [1, 2, 3]
    for tag, of in [("test_accuracy", lambda r: r["test_accuracy"]), ("train_loss", lambda r: r["train_loss"]),
                    *((f"epsilon/{o}", lambda r, o=o: r["epsilon"][o]) for o in observers)]:
        assert read(tag) == [(r["round"], pytest.approx(of(r), rel=1e-6)) for r in rows], tag  # stored as float32


def test_a_rows_scalars_skip_what_results_json_holds_as_null():
    """An infinite epsilon (null) and an unmeasured loss are not written; the clip C_t is."""
    row = {"round": 4, "test_accuracy": 0.5, "train_loss": None, "clip": 0.25,
           "epsilon": {"third_party": 1.5, "server": None}}
    assert round_scalars(row) == {"test_accuracy": 0.5, "clip": 0.25, "epsilon/third_party": 1.5}


def test_without_the_package_the_error_names_the_key_and_the_install(config, tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else
                        real(name, *a))
    board = tmp_path / "board"
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--no-progress",
                 "--set", f"run.tensorboard='{board}'"]) == 2
    err = capsys.readouterr().err
    assert f"run.tensorboard = '{board}' is not allowed" in err and "pip install tensorboard" in err
    assert not board.exists() and not (tmp_path / "run" / "results.json").exists()


def test_an_empty_directory_is_refused(config, tmp_path, capsys):
    assert main(["run", str(config), "--no-progress", "--set", "run.tensorboard=''"]) == 2
    assert "run.tensorboard = '' is not allowed: expected a directory" in capsys.readouterr().err


def test_the_event_directory_may_change_on_resume():
    """run.tensorboard decides nothing a round releases: it is not part of the release config."""
    written = load_config(None, ["run.tensorboard='a'"])
    assert release_config(written) == release_config(load_config(None, ["run.tensorboard='b'"])) == \
        release_config(load_config(None, []))
