"""`dpfl flower-app`, `dpfl write-silos` and the silo files a ClientApp reads: these need no flwr."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from dpfl.cli import main
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.flower.silo import load_silo

CONFIG = '[data]\nname = "synthetic"\nnum_clients = 3\nsamples_per_client = 40\n\n[algorithm]\nname = "dp-fedavg"\n' \
         'rounds = 2\nclient_rate = 1.0\n\n[run]\nthreads = 1\n'


def test_flower_app_writes_a_flower_project_carrying_the_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    out = tmp_path / "app"
    assert main(["flower-app", str(path), "--out", str(out), "--set", "algorithm.rounds=5"]) == 0
    project = tomllib.loads((out / "pyproject.toml").read_text())
    app = project["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "dpfl_app.server_app:app", "clientapp": "dpfl_app.client_app:app"}
    expected = load_config(path, ["algorithm.rounds=5"])
    metadata = {"name": "silos", "num_clients": 3, "num_classes": 10, "feature_shape": [40]}  # synthetic's
    secure = {**expected["run"], "secure_noise": True}  # the default on Flower where the algorithm supports it
    members = {**expected["privacy"], "cohort": "members"}  # each job states the cohort's size (app_config)
    assert json.loads(app["config"]["dpfl-config"]) == {**expected, "data": metadata, "run": secure,
                                                        "privacy": members}
    assert app["config"]["out"] == str((out / "run").resolve()) and app["config"]["evaluation"] == "none"
    assert project["project"]["dependencies"] == ["dpfl[flower]"]
    carried = (out / "dpfl.toml").read_text()
    assert carried.startswith("# The config this Flower App carries") and 'name = "silos"' in carried
    assert tomllib.loads(carried)["algorithm"]["rounds"] == 5
    assert "from dpfl.flower.server_app import app" in (out / "dpfl_app" / "server_app.py").read_text()
    assert main(["flower-app", str(path), "--out", str(out)]) == 0  # regenerating over its own app is allowed
    (out / "notes.txt").write_text("mine")
    assert main(["flower-app", str(path), "--out", str(out)]) == 2  # another folder's files are not overwritten


@pytest.mark.parametrize("case", ["default", "turned off", "in the file", "unsupported"])
def test_secure_noise_is_the_default_of_a_flower_app_where_the_algorithm_supports_it(tmp_path, capsys, case):
    """`dpfl flower-app` sets run.secure_noise = true unless the config file or the command line sets it, or the
    algorithm cannot take it (then it says why); `dpfl write-silos` pins the same release (`dpfl silo pin`)."""
    path = tmp_path / "c.toml"
    text = {"in the file": CONFIG + "secure_noise = false\n",
            "unsupported": CONFIG + '\n[privacy]\nanalysis = "paper"\n'}.get(case, CONFIG)
    path.write_text(text)
    extra = ["--set", "run.secure_noise=false"] if case == "turned off" else []
    assert main(["flower-app", str(path), "--out", str(tmp_path / "app"), *extra]) == 0
    carried = json.loads(tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
                         ["tool"]["flwr"]["app"]["config"]["dpfl-config"])
    err = capsys.readouterr().err
    assert carried["run"]["secure_noise"] is (case == "default")
    assert ("run.secure_noise = true: the default on Flower" in err) is (case == "default")
    assert ("run.secure_noise stays false (the default on Flower only where dpfl supports it" in err) is \
        (case == "unsupported")
    assert main(["write-silos", str(path), "--out", str(tmp_path / "silos"), *extra]) == 0
    pinned = set(re_pins(capsys.readouterr().err))
    from dpfl.experiments.assembly import build_data

    counts = ",".join(str(int(n)) for n in build_data(load_config(path)["data"]).train.counts)
    assert main(["silo", "pin", str(tmp_path / "app"), "--counts", counts]) == 0
    assert pinned == {capsys.readouterr().out.strip()}


def re_pins(text: str) -> list[str]:
    import re

    return re.findall(r'release-sha256="([0-9a-f]{64})"', text)


def test_flower_app_is_a_valid_flower_project(tmp_path):
    pytest.importorskip("flwr")
    from flwr.common.config import validate_fields_in_config

    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    assert main(["flower-app", str(path), "--out", str(tmp_path / "app")]) == 0
    valid, errors, _ = validate_fields_in_config(tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text()))
    assert valid, errors


def test_flower_app_carries_the_federations_metadata_and_no_path_to_the_data(tmp_path, capsys):
    """Before, the app's config held data.path, which the ServerApp read for the counts and evaluation. Now it holds
    the public metadata (clients, classes, feature shape): taken from the data on the launching machine in a
    rehearsal, or given with --classes and --features, when no file is read (here: the data is gone)."""
    data = tmp_path / "private" / "pooled-records.csv"
    data.parent.mkdir()
    rows = [f"{i % 7}.5,{i % 3},{i % 2}" for i in range(90)]
    data.write_text("a,b,label\n" + "\n".join(rows) + "\n")
    path = tmp_path / "c.toml"
    path.write_text(f'[data]\nname = "csv"\npath = "{data}"\nnum_clients = 3\n\n[algorithm]\nname = "dp-fedavg"\n'
                    'rounds = 2\nclient_rate = 1.0\n\n[run]\nthreads = 1\n')
    metadata = {"name": "silos", "num_clients": 3, "num_classes": 2, "feature_shape": [2]}
    for name, options in (("rehearsal", []), ("given", ["--classes", "2", "--features", "2"])):
        if name == "given":
            data.rename(tmp_path / "moved.csv")
        out = tmp_path / name
        assert main(["flower-app", str(path), "--out", str(out), *options]) == 0, capsys.readouterr().err
        assert "the app holds no path to data" in capsys.readouterr().err
        app = tomllib.loads((out / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
        assert json.loads(app["dpfl-config"])["data"] == metadata
        for file in (out / "pyproject.toml", out / "dpfl.toml"):
            assert "pooled-records" not in file.read_text() and str(data.parent) not in file.read_text()
    assert main(["flower-app", str(path), "--out", str(tmp_path / "e"), "--classes", "2"]) == 2
    assert "--features" in capsys.readouterr().err
    assert main(["flower-app", str(path), "--out", str(tmp_path / "e"), "--classes", "2", "--features", "1,x"]) == 2
    assert "--features = '1,x'" in capsys.readouterr().err
    assert main(["flower-app", str(path), "--out", str(tmp_path / "e"), "--classes", "2", "--features", "2",
                 "--evaluation", "holdout.txt"]) == 2
    assert "--evaluation = 'holdout.txt'" in capsys.readouterr().err and not (tmp_path / "e").exists()


def test_silo_npz_keeps_its_training_records_and_names_its_client(tmp_path):
    x = np.arange(12, dtype=np.float64).reshape(6, 2)
    np.savez(tmp_path / "s.npz", x=x, y=np.array([0, 1, 2, 0, 1, 2]), client=np.full(6, 4),
             split=np.array(["train", "test"] * 3))
    silo = load_silo(tmp_path / "s.npz")
    assert silo.client == 4 and silo.y.tolist() == [0, 2, 1] and silo.x[:, 0].tolist() == [0.0, 4.0, 8.0]


def test_silo_csv_with_and_without_a_client_column(tmp_path):
    (tmp_path / "s.csv").write_text("a,b,label,site\n1,2,0,7\n3,4,1,7\n")
    silo = load_silo(tmp_path / "s.csv", client_column="site")
    assert silo.client == 7 and silo.x.tolist() == [[1.0, 2.0], [3.0, 4.0]] and silo.y.tolist() == [0, 1]
    assert load_silo(tmp_path / "s.csv").x.shape == (2, 3)  # without a client column "site" is a feature
    assert load_silo(tmp_path / "s.csv").client is None


def test_an_evaluation_set_is_its_files_test_records_or_all_of_them(tmp_path):
    """The server's evaluation set (run config ``evaluation``) is read as a silo file is: a split column keeps its
    "test" records, a file without one is all evaluation records; errors name the run config key."""
    from dpfl.flower.silo import load_records

    (tmp_path / "split.csv").write_text("a,label,split\n1,0,train\n2,1,test\n3,2,test\n")
    (tmp_path / "all.csv").write_text("a,label\n1,0\n2,1\n")
    x, y = load_records(tmp_path / "split.csv", "evaluation")
    assert x.tolist() == [[2.0], [3.0]] and y.tolist() == [1, 2]
    assert load_records(tmp_path / "all.csv", "evaluation")[1].tolist() == [0, 1]
    with pytest.raises(ConfigError, match="evaluation = .*a .npz or .csv file"):
        load_records(tmp_path / "holdout.txt", "evaluation")


@pytest.mark.parametrize("write, message", [
    (lambda p: np.savez(p / "s.npz", x=np.ones((2, 2)), y=[0, 1], client=[1, 2]), "one integer client id"),
    (lambda p: np.savez(p / "s.npz", x=np.ones((2, 2)), y=["cat", "dog"]), "class indices"),
    (lambda p: (p / "s.txt").write_text("x"), "a .npz or .csv file"),
])
def test_unusable_silo_files_are_refused_naming_the_node_config_key(tmp_path, write, message):
    write(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(ConfigError, match=message) as err:
        load_silo(path)
    assert "data-path" in str(err.value)


def test_write_silos_gives_each_client_a_file_its_node_reads_back(tmp_path):
    from dpfl.experiments.assembly import build_data
    from dpfl.flower.silo import write_silos

    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    dataset = build_data(load_config(path)["data"])
    train, test = dataset.train, dataset.test
    paths = write_silos(dataset, tmp_path)
    assert [p.name for p in paths] == ["silo-0.npz", "silo-1.npz", "silo-2.npz"]
    for i, p in enumerate(paths):
        silo, n, m = load_silo(p), int(train.counts[i]), int(test.counts[i])
        assert silo.client == i and silo.y.tolist() == train.y[i, :n].tolist()
        assert silo.x.equal(train.x[i, :n])
        assert m > 0 and silo.test_x.equal(test.x[i, :m]) and silo.test_y.equal(test.y[i, :m])


@pytest.mark.parametrize("overrides, message", [
    (["privacy.boundary='secagg'"], "only with privacy.secure_aggregation = true"),
    (["algorithm.name='sdp-prox-sgd'", "privacy.boundary='shuffler'", "privacy.shuffler='real'",
      "privacy.epsilon=2.0", "data.num_clients=5"], "a shuffler must be a party other than the server"),
])
def test_a_boundary_flower_does_not_enforce_is_refused(tmp_path, capsys, overrides, message):
    """The ServerApp receives every silo's message with its node id unless secure aggregation runs between the
    nodes: a ledger charging it a sum or a shuffled multiset would under-state its epsilon (2.20 for a plain 4.41)."""
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    assert main(["flower-app", str(path), "--out", str(tmp_path / "app"),
                 *[a for o in overrides for a in ("--set", o)]]) == 2
    err = capsys.readouterr().err
    assert "privacy.boundary" in err and message in err
    assert not (tmp_path / "app").exists()


def test_dpfl_write_silos_writes_the_configs_clients_as_silo_files_without_flwr(tmp_path, capsys):
    """Before, only the tests knew ``write_silos``; now `dpfl write-silos` writes the files a test bed's SuperNodes
    read, one per client of the config's data (as `dpfl run` builds it), refuses a folder of other files, and replaces the silos of a previous, larger federation."""
    from dpfl.experiments.assembly import build_data

    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    out = tmp_path / "silos"
    assert main(["write-silos", str(path), "--out", str(out), "--set", "data.num_clients=5"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["secagg", *[f"silo-{i}.npz" for i in range(5)]]
    assert main(["write-silos", str(path), "--out", str(out)]) == 0
    assert "wrote 3 silo files to" in capsys.readouterr().err
    train = build_data(load_config(path)["data"]).train
    assert sorted(p.name for p in out.iterdir()) == ["secagg", "silo-0.npz", "silo-1.npz", "silo-2.npz"]
    for i in range(3):
        silo, n = load_silo(out / f"silo-{i}.npz"), int(train.counts[i])
        assert silo.client == i and silo.x.equal(train.x[i, :n]) and silo.y.equal(train.y[i, :n])
    (out / "notes.txt").write_text("mine")
    assert main(["write-silos", str(path), "--out", str(out)]) == 2
    assert "--out = " in capsys.readouterr().err and (out / "silo-2.npz").exists()
    assert main(["write-silos", "--help"]) == 0 and "--out OUT" in capsys.readouterr().out
    src = Path(__file__).resolve().parents[2] / "src"
    check = ("import sys; from dpfl.cli import main; "
             f"assert main(['write-silos', {str(path)!r}, '--out', {str(tmp_path / 'again')!r}]) == 0; "
             "assert 'flwr' not in sys.modules, 'write-silos imported flwr'")
    subprocess.run([sys.executable, "-c", check], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(src)})
