import numpy as np
import pytest
import torch

from dpfl.data.federated import ClientArrays, FederatedDataset, num_test_records, split_clients


def _ragged(sizes, feature_shape=(2, 3), seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((n, *feature_shape)) + 1.0 for n in sizes]
    ys = [rng.integers(1, 5, size=n) for n in sizes]
    return xs, ys


def test_from_lists_pads_with_zeros_past_counts():
    xs, ys = _ragged([3, 1, 5, 0])
    arrays = ClientArrays.from_lists(xs, ys)
    assert arrays.x.shape == (4, 5, 2, 3) and arrays.y.shape == (4, 5)
    assert arrays.x.dtype == torch.float32 and arrays.y.dtype == torch.int64
    assert arrays.counts.tolist() == [3, 1, 5, 0]
    assert arrays.num_clients == 4 and arrays.feature_shape == (2, 3)
    mask = arrays.mask
    assert mask.dtype == torch.bool and mask.sum(dim=1).tolist() == [3, 1, 5, 0]
    assert torch.all(arrays.x[~mask] == 0) and torch.all(arrays.y[~mask] == 0)
    for i, (x_i, y_i) in enumerate(zip(xs, ys)):
        assert torch.allclose(arrays.x[i, : len(y_i)], torch.from_numpy(x_i).float())
        assert arrays.y[i, : len(y_i)].tolist() == y_i.tolist()


def test_flat_concatenates_real_records_in_client_order():
    xs, ys = _ragged([2, 4, 1])
    x, y = ClientArrays.from_lists(xs, ys).flat()
    assert x.shape == (7, 2, 3)
    assert torch.allclose(x, torch.from_numpy(np.concatenate(xs)).float())
    assert y.tolist() == np.concatenate(ys).tolist()


def test_from_lists_rejects_inconsistent_clients():
    xs, ys = _ragged([2, 3])
    with pytest.raises(ValueError, match="client 1"):
        ClientArrays.from_lists(xs, [ys[0], ys[1][:2]])
    with pytest.raises(ValueError, match="one x and one y"):
        ClientArrays.from_lists(xs, ys[:1])


def test_client_arrays_checks_dtypes_and_shapes():
    x, y, counts = torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.int64), torch.tensor([3, 1])
    with pytest.raises(TypeError, match="float32"):
        ClientArrays(x.double(), y, counts)
    with pytest.raises(ValueError, match="shapes disagree"):
        ClientArrays(x, y[:, :2], counts)


def test_federated_dataset_properties_and_consistency():
    xs, ys = _ragged([3, 2])
    train = ClientArrays.from_lists(xs, ys)
    dataset = FederatedDataset(train=train, test=train, num_classes=5, name="toy", info={})
    assert dataset.num_features == 6 and dataset.num_clients == 2
    other = ClientArrays.from_lists(*_ragged([3, 2, 1]))
    with pytest.raises(ValueError, match="train and test disagree"):
        FederatedDataset(train=train, test=other, num_classes=5, name="toy", info={})


@pytest.mark.parametrize(
    "n, fraction, expected", [(5000, 0.2, 1000), (5, 0.2, 1), (1, 0.5, 0), (2, 0.9, 1), (7, 0.0, 0)]
)
def test_num_test_records_rounds_and_keeps_one_training_record(n, fraction, expected):
    assert num_test_records(n, fraction) == expected


def test_split_clients_is_a_seeded_partition_of_each_client():
    xs = [np.arange(n, dtype=float)[:, None] for n in (10, 5, 1)]
    ys = [np.arange(n) for n in (10, 5, 1)]
    train_xs, train_ys, test_xs, test_ys = split_clients(xs, ys, 0.2, np.random.default_rng(3))
    assert [len(y) for y in train_ys] == [8, 4, 1] and [len(y) for y in test_ys] == [2, 1, 0]
    for y, train_y, test_y, train_x in zip(ys, train_ys, test_ys, train_xs):
        assert sorted(np.concatenate([train_y, test_y]).tolist()) == y.tolist()
        assert train_x[:, 0].tolist() == train_y.tolist()  # rows stay paired with their labels
    again = split_clients(xs, ys, 0.2, np.random.default_rng(3))
    assert all(np.array_equal(a, b) for a, b in zip(test_ys, again[3]))
