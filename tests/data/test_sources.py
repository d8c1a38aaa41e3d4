import json

import numpy as np
import pytest
import torch

from dpfl.data.sources import build_dataset, load_csv, load_npz
from dpfl.errors import ConfigError


def _client_train_moments(dataset):
    """Feature means and stds of each client's real training records."""
    moments = []
    for i in range(dataset.num_clients):
        x = dataset.train.x[i, : dataset.train.counts[i]].double()
        moments.append((x.mean(dim=0), x.std(dim=0, unbiased=False)))
    return moments


@pytest.mark.parametrize("name, features, classes, records", [("digits", 64, 10, 1797), ("breast_cancer", 30, 2, 569)])
def test_sklearn_sources_shapes_and_counts(name, features, classes, records):
    dataset = build_dataset(name, num_clients=6, seed=1)
    assert dataset.num_features == features and dataset.num_classes == classes and dataset.num_clients == 6
    total = int(dataset.train.counts.sum() + dataset.test.counts.sum())
    assert total == records
    assert abs(int(dataset.test.counts.sum()) / records - 0.2) < 0.01
    mask = dataset.train.mask
    assert torch.all(dataset.train.x[~mask] == 0) and torch.all(dataset.train.y[~mask] == 0)
    info = json.loads(json.dumps(dataset.info))
    assert info["partition"] == {"scheme": "iid", "param": None} and info["source"]["num_records"] == records


def test_standardisation_uses_each_clients_own_training_split():
    dataset = build_dataset("breast_cancer", num_clients=4, partition="dirichlet", partition_param=1.0, seed=0,
                            standardize="client")
    for mean, std in _client_train_moments(dataset):
        assert torch.allclose(mean, torch.zeros_like(mean), atol=1e-5)
        assert torch.allclose(std, torch.ones_like(std), atol=1e-4)
    assert dataset.info["preprocessing"][0]["scope"] == "client"


def test_pooled_standardisation_centres_all_training_records_together():
    dataset = build_dataset("breast_cancer", num_clients=4, partition="one_class", seed=0, standardize="pooled")
    x, _ = dataset.train.flat()
    assert torch.allclose(x.double().mean(dim=0), torch.zeros(30, dtype=torch.float64), atol=1e-5)
    means = [mean for mean, _ in _client_train_moments(dataset)]
    assert max(float(m.abs().max()) for m in means) > 0.5  # one-class clients differ: not centred per client


def test_samples_per_client_trims_each_client_to_exactly_that_many():
    dataset = build_dataset("digits", num_clients=10, partition="k_labels", partition_param=2, samples_per_client=50)
    counts = dataset.train.counts + dataset.test.counts
    assert counts.tolist() == [50] * 10 and dataset.train.counts.tolist() == [40] * 10
    for i in range(10):
        labels = torch.cat([dataset.train.y[i, :40], dataset.test.y[i, :10]])
        assert len(labels.unique()) == 2
    with pytest.raises(ConfigError, match=r"data.samples_per_client = 1000 .*\[1, 17\d\]"):
        build_dataset("digits", num_clients=10, samples_per_client=1000)


def test_build_dataset_is_deterministic_in_seed():
    options = dict(num_clients=5, partition="similar", partition_param=20, seed=4)
    first, again = build_dataset("digits", **options), build_dataset("digits", **options)
    assert torch.equal(first.train.x, again.train.x) and torch.equal(first.test.y, again.test.y)


def test_build_dataset_synthetic_maps_config_keys():
    dataset = build_dataset("synthetic", num_clients=3, samples_per_client=20, alpha=1, beta=0.5, seed=2)
    assert dataset.train.x.shape == (3, 16, 40) and dataset.info["generator"]["beta"] == 0.5
    assert dataset.info["seed"] == 2


@pytest.mark.parametrize(
    "name, options, field",
    [
        ("imagenet", {}, "data.name"),
        ("digits", {"num_clients": 0}, "data.num_clients"),
        ("digits", {"num_clients": 2.5}, "data.num_clients"),
        ("digits", {"alpha": 1.0}, "data.alpha"),
        ("digits", {"partition": "k_labels", "partition_param": 20}, "data.partition_param"),
        ("digits", {"seed": -1}, "data.seed"),
        ("digits", {"test_fraction": 1.0}, "data.test_fraction"),
        ("digits", {"standardize": "global"}, "data.standardize"),
        ("digits", {"scale": 0.0}, "data.scale"),
        ("digits", {"scale": float("nan")}, "data.scale"),
        ("synthetic", {"scale": float("inf")}, "data.scale"),
        ("synthetic", {"alpha": -1.0}, "data.alpha"),
        ("synthetic", {"beta": float("inf")}, "data.beta"),
        ("synthetic", {"partition": "iid"}, "data.partition"),
        ("synthetic", {"samples_per_client": 0}, "data.samples_per_client"),
    ],
)
def test_bad_values_name_the_config_field(name, options, field):
    options = {"num_clients": 4, **options}
    with pytest.raises(ConfigError) as error:
        build_dataset(name, **options)
    assert error.value.field == field and "expected" in str(error.value)


def test_load_npz_with_client_ids_is_partitioned_naturally(tmp_path):
    rng = np.random.default_rng(0)
    clients = np.repeat(["hospital_b", "hospital_a", "hospital_c"], [10, 25, 5])
    x, y = rng.standard_normal((40, 2, 3)), rng.integers(0, 3, size=40)
    np.savez(tmp_path / "silos.npz", x=x, y=y, client=clients)
    dataset = load_npz(tmp_path / "silos.npz", seed=0)
    assert dataset.name == "silos" and dataset.train.feature_shape == (2, 3) and dataset.num_features == 6
    assert (dataset.train.counts + dataset.test.counts).tolist() == [25, 10, 5]  # clients in sorted id order
    assert dataset.info["partition"]["client_ids"] == ["hospital_a", "hospital_b", "hospital_c"]
    assert dataset.num_classes == 3 and json.dumps(dataset.info)


def test_load_npz_without_client_ids_uses_a_partition(tmp_path):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "pooled.npz", x=rng.standard_normal((60, 4)), y=np.repeat([3, 7, 9], 20))
    dataset = load_npz(tmp_path / "pooled.npz", num_clients=3, partition="one_class", seed=0)
    assert dataset.info["classes"] == [3, 7, 9] and dataset.num_classes == 3
    for i in range(3):
        assert len(dataset.train.y[i, : dataset.train.counts[i]].unique()) == 1
    with pytest.raises(ConfigError, match=r"data.num_clients = 100 .*\[1, 60\]"):  # the default M, > 60 records
        load_npz(tmp_path / "pooled.npz")


def test_load_npz_rejects_bad_files(tmp_path):
    np.savez(tmp_path / "wrong.npz", features=np.zeros((3, 2)), y=np.zeros(3))
    with pytest.raises(ConfigError, match="'x' and 'y'"):
        load_npz(tmp_path / "wrong.npz", num_clients=1)
    np.savez(tmp_path / "ragged.npz", x=np.zeros((3, 2)), y=np.zeros(4))
    with pytest.raises(ConfigError, match=r"one entry per record .*found x \[3, 2\], y \[4\]"):
        load_npz(tmp_path / "ragged.npz", num_clients=1)
    np.savez(tmp_path / "ids.npz", x=np.zeros((4, 2)), y=np.array([0, 1, 0, 1]), client=np.array([0, 0, 1, 1]))
    with pytest.raises(ConfigError, match="data.num_clients = 3 .*2, the number of distinct client ids"):
        load_npz(tmp_path / "ids.npz", num_clients=3)
    with pytest.raises(ConfigError, match="data.partition = 'iid'"):
        load_npz(tmp_path / "ids.npz", partition="iid")


def _write_csv(path, text):
    path.write_text(text)
    return path


def test_load_csv_with_label_and_client_columns(tmp_path):
    rows = ["age,site,bmi,outcome"] + [
        f"{30 + i},{'north' if i % 3 else 'south'},{20 + i / 2},{'sick' if i % 2 else 'well'}" for i in range(30)
    ]
    path = _write_csv(tmp_path / "patients.csv", "\n".join(rows) + "\n")
    dataset = load_csv(path, label_column="outcome", client_column="site", seed=0)
    assert dataset.num_clients == 2 and dataset.num_features == 2 and dataset.num_classes == 2
    assert dataset.info["classes"] == ["sick", "well"]
    assert dataset.info["source"]["feature_columns"] == ["age", "bmi"]
    assert (dataset.train.counts + dataset.test.counts).tolist() == [20, 10]  # north, south


def test_load_csv_integer_labels_and_partition(tmp_path):
    rows = ["f1,f2,label"] + [f"{i},{i * i},{i % 11}" for i in range(44)]
    dataset = load_csv(_write_csv(tmp_path / "numbers.csv", "\n".join(rows)), "label", num_clients=4, seed=0)
    assert dataset.info["classes"] == list(range(11))  # numeric order: 10 after 9
    assert int(dataset.train.counts.sum() + dataset.test.counts.sum()) == 44


def test_load_csv_rejects_bad_files(tmp_path):
    path = _write_csv(tmp_path / "bad.csv", "a,b,label\n1,x,0\n2,3,1\n")
    with pytest.raises(ConfigError, match="column 'b'"):
        load_csv(path, "label", num_clients=1)
    with pytest.raises(ConfigError, match="'target'"):
        load_csv(path, "target", num_clients=1)
    short = _write_csv(tmp_path / "short.csv", "a,label\n1,0\n\n2\n")
    with pytest.raises(ConfigError, match=r"2 fields in every row.*found 1 in line 4"):
        load_csv(short, "label", num_clients=1)
