import numpy as np
import pytest

from dpfl.data.partition import PARTITIONS, partition, stratified_subsample
from dpfl.errors import ConfigError

NUM_CLASSES = 10


def _labels(per_class=200, seed=0):
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(NUM_CLASSES), per_class))


def _histograms(parts, labels):
    return np.stack([np.bincount(labels[p], minlength=NUM_CLASSES) / len(p) for p in parts])


def _distance_to_global(parts, labels):
    pooled = np.bincount(labels, minlength=NUM_CLASSES) / len(labels)
    return 0.5 * np.abs(_histograms(parts, labels) - pooled).sum(axis=1)


def _run(scheme, param=None, num_clients=10, labels=None, seed=0):
    labels = _labels() if labels is None else labels
    return partition(labels, num_clients, scheme, param, rng=np.random.default_rng(seed)), labels


@pytest.mark.parametrize(
    "scheme, param", [("iid", None), ("similar", 30), ("k_labels", 3), ("one_class", None), ("dirichlet", 0.5)]
)
def test_every_scheme_gives_disjoint_nonempty_seeded_parts(scheme, param):
    parts, labels = _run(scheme, param, num_clients=7)
    assert len(parts) == 7 and all(len(p) > 0 for p in parts)
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined) and joined.min() >= 0 and joined.max() < len(labels)
    again, _ = _run(scheme, param, num_clients=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


@pytest.mark.parametrize("scheme, param", [("iid", None), ("similar", 40), ("dirichlet", 0.5)])
def test_schemes_that_keep_every_record(scheme, param):
    parts, labels = _run(scheme, param, num_clients=7)
    assert sum(len(p) for p in parts) == len(labels)


def test_iid_histograms_are_close_to_global_and_sizes_equal():
    parts, labels = _run("iid", num_clients=5)
    assert [len(p) for p in parts] == [400] * 5
    assert _distance_to_global(parts, labels).max() < 0.1


def test_similar_gamma_100_is_iid_and_gamma_0_is_sorted():
    iid_like, labels = _run("similar", 100)
    assert _distance_to_global(iid_like, labels).max() < 0.15
    sorted_parts, _ = _run("similar", 0)  # 10 clients, 10 balanced classes: one class each
    assert all(len(np.unique(labels[p])) == 1 for p in sorted_parts)
    assert sorted(int(labels[p][0]) for p in sorted_parts) == list(range(NUM_CLASSES))


def test_similar_gamma_sets_the_iid_share():
    parts, labels = _run("similar", 40)
    dominant = _histograms(parts, labels).max(axis=1)
    # At most 60% from a sorted label block (blocks may straddle two labels) plus ~4% of the iid 40%.
    assert np.all((dominant > 0.55) & (dominant < 0.7))


@pytest.mark.parametrize("k, num_clients", [(1, 10), (2, 7), (3, 13), (10, 4)])
def test_k_labels_gives_exactly_k_labels(k, num_clients):
    parts, labels = _run("k_labels", k, num_clients=num_clients)
    assert [len(np.unique(labels[p])) for p in parts] == [k] * num_clients
    if num_clients * k >= NUM_CLASSES:
        assert len(np.unique(labels[np.concatenate(parts)])) == NUM_CLASSES


def test_one_class_is_pure_and_reuses_classes_when_clients_outnumber_them():
    parts, labels = _run("one_class", num_clients=25)
    assert all(len(np.unique(labels[p])) == 1 for p in parts)
    held = [int(labels[p][0]) for p in parts]
    assert sorted(set(held)) == list(range(NUM_CLASSES)) and max(np.bincount(held)) == 3
    # The records of a class are divided equally among its holders.
    for label in range(NUM_CLASSES):
        sizes = [len(p) for p, h in zip(parts, held) if h == label]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 200


def test_dirichlet_small_alpha_concentrates_and_large_alpha_is_near_iid():
    concentrated, labels = _run("dirichlet", 0.05, num_clients=20)
    assert _histograms(concentrated, labels).max(axis=1).mean() > 0.8
    spread, _ = _run("dirichlet", 1000.0, num_clients=20)
    assert _distance_to_global(spread, labels).mean() < 0.1


def test_dirichlet_gives_every_client_a_record():
    labels = _labels(per_class=6)
    for seed in range(5):
        parts, _ = _run("dirichlet", 0.01, num_clients=50, labels=labels, seed=seed)
        assert min(len(p) for p in parts) >= 1 and sum(len(p) for p in parts) == len(labels)


def test_stratified_subsample_keeps_label_proportions():
    labels = np.repeat([0, 1, 2], [600, 300, 100])
    chosen = stratified_subsample(np.arange(len(labels)), labels, 100, np.random.default_rng(0))
    assert len(np.unique(chosen)) == 100
    assert np.allclose(np.bincount(labels[chosen]), [60, 30, 10], atol=1)


@pytest.mark.parametrize(
    "scheme, param, field",
    [
        ("iid", 3, "data.partition_param"),
        ("similar", None, "data.partition_param"),
        ("similar", 150, "data.partition_param"),
        ("k_labels", 0, "data.partition_param"),
        ("k_labels", 11, "data.partition_param"),
        ("k_labels", 2.5, "data.partition_param"),
        ("dirichlet", 0.0, "data.partition_param"),
        ("dirichlet", float("nan"), "data.partition_param"),
    ],
)
def test_bad_parameters_name_the_config_field(scheme, param, field):
    with pytest.raises(ConfigError) as error:
        _run(scheme, param)
    assert error.value.field == field and repr(param) in str(error.value)


def test_bad_client_counts_are_rejected():
    with pytest.raises(ConfigError, match="data.num_clients = 0"):
        _run("iid", num_clients=0)
    with pytest.raises(ConfigError, match="data.num_clients = 2001"):
        _run("iid", num_clients=2001)
    scarce = np.repeat(np.arange(NUM_CLASSES), [1] + [5] * (NUM_CLASSES - 1))  # class 0 has a single record
    with pytest.raises(ConfigError, match="data.num_clients = 20.*class 0 has 1 records for 2 clients"):
        _run("one_class", num_clients=20, labels=scarce)


def test_unknown_scheme_lists_the_known_ones():
    with pytest.raises(ConfigError) as error:
        _run("shards")
    assert error.value.field == "data.partition" and "'shards'" in str(error.value)
    assert all(name in str(error.value) for name in PARTITIONS)


def test_parity_pairs_gives_each_even_odd_pair_one_client_and_divides_each_class_equally():
    labels = _labels(per_class=203)  # 203 = 5 x 40 + 3: three of a class's five holders get one record more
    parts, _ = _run("parity_pairs", num_clients=25, labels=labels)
    held = [sorted(set(labels[p].tolist())) for p in parts]
    assert held == [sorted([2 * e, 2 * o + 1]) for e in range(5) for o in range(5)]
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined) == len(labels)  # every record, once
    for c in range(NUM_CLASSES):
        shares = sorted(int((labels[p] == c).sum()) for p in parts if c in labels[p])
        assert shares == [40, 40, 41, 41, 41]
    again, _ = _run("parity_pairs", num_clients=25, labels=labels)
    other, _ = _run("parity_pairs", num_clients=25, labels=labels, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_parity_pairs_names_the_client_count_it_needs():
    with pytest.raises(ConfigError, match=r"data.num_clients = 24 .*expected 25: .*'parity_pairs'.*\(5 x 5\)"):
        _run("parity_pairs", num_clients=24)
    three = np.repeat([0, 1, 2], 10)  # two even classes (0, 2), one odd
    parts, _ = _run("parity_pairs", num_clients=2, labels=three)
    assert [sorted(set(three[p].tolist())) for p in parts] == [[0, 1], [1, 2]]
    with pytest.raises(ConfigError, match=r"data.partition = 'parity_pairs'.* 1 class"):
        _run("parity_pairs", num_clients=1, labels=np.zeros(10, dtype=np.int64))
    with pytest.raises(ConfigError, match="data.partition_param = 2"):
        _run("parity_pairs", 2, num_clients=25)


def test_the_parity_label_map_is_applied_after_the_partition_and_refused_for_synthetic_data():
    from dpfl.data import build_dataset

    mapped = build_dataset("digits", num_clients=25, partition="parity_pairs", labels="parity")
    assert mapped.num_classes == 2 and mapped.info["classes"] == ["odd", "even"]
    for i in range(25):  # silo 5e + o: digit 2e (label 1) and digit 2o + 1 (label 0), about half each
        y = mapped.train.y[i, : mapped.train.counts[i]]
        assert set(y.tolist()) == {0, 1} and 0.35 < float(y.float().mean()) < 0.65
    with pytest.raises(ConfigError, match="data.labels = 'parity' .*'original' for data.name = 'synthetic'"):
        build_dataset("synthetic", num_clients=2, labels="parity")
    with pytest.raises(ConfigError, match=r"data.labels = 'digit' .*one of \('original', 'parity'\)"):
        build_dataset("digits", num_clients=5, labels="digit")
