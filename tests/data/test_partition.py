"""Partitions: sizes, label sets, latent groups, transforms, test splits, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import image_bundle

from fedgsp_flwr.data import (
    DataBundle,
    PartitionSpec,
    central_test_set,
    client_data,
    partition_dataset,
)
from fedgsp_flwr.data.partition import LABEL_GROUPS, read_partitions, save_partitions
from fedgsp_flwr.data.sources import make_synthetic


def labels(bundle: DataBundle, idx: np.ndarray) -> set[int]:
    return set(np.unique(bundle.y_train[idx]).tolist())


def assert_disjoint_cover(bundle: DataBundle, parts: list, exact: bool = True) -> None:
    everything = np.concatenate([p.train_idx for p in parts])
    assert len(np.unique(everything)) == len(everything), "partitions overlap"
    if exact:
        assert len(everything) == len(bundle.y_train)


@pytest.mark.parametrize(
    "scheme", ["iid", "dirichlet", "pathological", "shards", "label-groups", "rotated",
               "shifted", "rotated-label-groups", "one-class"],
)
def test_every_scheme_is_deterministic_and_disjoint(bundle: DataBundle, scheme: str) -> None:
    spec = PartitionSpec(scheme, num_partitions=20, seed=3)
    first, again = partition_dataset(bundle, spec), partition_dataset(
        bundle, PartitionSpec(scheme, num_partitions=20, seed=3))
    assert len(first) == 20
    assert [p.partition_id for p in first] == list(range(20))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.train_idx, b.train_idx)
        np.testing.assert_array_equal(a.test_idx, b.test_idx)
    assert_disjoint_cover(bundle, first, exact=scheme != "shards")
    other = partition_dataset(bundle, PartitionSpec(scheme, num_partitions=20, seed=4))
    assert any(not np.array_equal(a.train_idx, b.train_idx)
               for a, b in zip(first, other, strict=True)), "seed has no effect"


def test_iid_sizes_are_equal_and_cover_all_classes(bundle: DataBundle) -> None:
    parts = partition_dataset(bundle, PartitionSpec("iid", 10, seed=0))
    assert {len(p.train_idx) for p in parts} == {200}
    assert all(len(labels(bundle, p.train_idx)) >= 8 for p in parts)


def test_pathological_gives_each_client_its_number_of_classes(bundle: DataBundle) -> None:
    parts = partition_dataset(bundle, PartitionSpec("pathological", 20, classes_per_client=2))
    assert all(len(labels(bundle, p.train_idx)) == 2 for p in parts)
    # the latent group identifies the label set
    by_group: dict[int, set] = {}
    for p in parts:
        assert by_group.setdefault(p.latent_group, labels(bundle, p.train_idx)) == labels(
            bundle, p.train_idx)


def test_pathological_rejects_more_classes_than_exist(bundle: DataBundle) -> None:
    with pytest.raises(ValueError, match="classes-per-client=11"):
        partition_dataset(bundle, PartitionSpec("pathological", 5, classes_per_client=11))


def test_shards_give_equal_sizes_and_few_classes(bundle: DataBundle) -> None:
    parts = partition_dataset(bundle, PartitionSpec("shards", 10, shards_per_client=2))
    assert {len(p.train_idx) for p in parts} == {200}
    assert all(len(labels(bundle, p.train_idx)) <= 2 for p in parts)


def test_dirichlet_small_alpha_is_skewed(bundle: DataBundle) -> None:
    skewed = partition_dataset(bundle, PartitionSpec("dirichlet", 10, alpha=0.05))
    flat = partition_dataset(bundle, PartitionSpec("dirichlet", 10, alpha=100.0))

    def top_share(parts: list) -> float:
        return float(np.mean([np.bincount(bundle.y_train[p.train_idx], minlength=10).max()
                              / len(p.train_idx) for p in parts]))

    assert top_share(skewed) > 0.5 and top_share(flat) < 0.2


def test_label_groups_are_stocfls(bundle: DataBundle) -> None:
    parts = partition_dataset(bundle, PartitionSpec("label-groups", 8))
    for p in parts:
        assert p.latent_group == p.partition_id % 4
        assert labels(bundle, p.train_idx) == set(LABEL_GROUPS[p.latent_group])


def test_rotated_label_groups_cross_rotation_with_label_groups(bundle: DataBundle) -> None:
    parts = partition_dataset(bundle, PartitionSpec("rotated-label-groups", 16))
    for p in parts:
        label_group = (p.partition_id // 2) % 4
        assert labels(bundle, p.train_idx) == set(LABEL_GROUPS[label_group])
        assert p.rotation == 2 * (p.partition_id % 2)
        assert p.latent_group == 4 * (p.partition_id % 2) + label_group
    assert len({p.latent_group for p in parts}) == 8


def test_one_class_per_client(bundle: DataBundle) -> None:
    parts = partition_dataset(bundle, PartitionSpec("one-class", 20))
    for p in parts:
        assert labels(bundle, p.train_idx) == {p.partition_id % 10}
        assert set(np.unique(bundle.y_test[p.test_idx]).tolist()) == {p.partition_id % 10}
    assert {len(p.train_idx) for p in parts} == {100}


def test_rotated_clients_see_rotated_images(bundle: DataBundle) -> None:
    parts = partition_dataset(bundle, PartitionSpec("rotated", 8))
    for p in parts:
        data = client_data(bundle, p)
        assert p.rotation == p.latent_group == p.partition_id % 4
        raw = bundle.x_train[p.train_idx].astype(np.float32) / 255.0
        np.testing.assert_allclose(data.x_train, np.rot90(raw, p.rotation, axes=(2, 3)))
        np.testing.assert_array_equal(data.y_train, bundle.y_train[p.train_idx])


def test_shifted_clients_see_shifted_labels(bundle: DataBundle) -> None:
    parts = partition_dataset(bundle, PartitionSpec("shifted", 8))
    for p in parts:
        data = client_data(bundle, p)
        shift = (0, 3, 6, 9)[p.partition_id % 4]
        np.testing.assert_array_equal(data.y_train, (bundle.y_train[p.train_idx] + shift) % 10)
        np.testing.assert_array_equal(data.y_test, (bundle.y_test[p.test_idx] + shift) % 10)


def test_test_split_follows_train_label_proportions(bundle: DataBundle) -> None:
    parts = partition_dataset(bundle, PartitionSpec("pathological", 10, test_fraction=0.25))
    for p in parts:
        assert len(p.test_idx) == round(0.25 * len(p.train_idx))
        assert set(np.unique(bundle.y_test[p.test_idx]).tolist()) <= labels(bundle, p.train_idx)


def test_hybrid_needs_the_hybrid_dataset(bundle: DataBundle) -> None:
    with pytest.raises(ValueError, match="needs dataset 'hybrid'"):
        partition_dataset(bundle, PartitionSpec("hybrid", 4))
    hybrid = DataBundle(
        "hybrid", bundle.x_train, bundle.y_train, bundle.x_test, bundle.y_test, 10,
        source_train=np.arange(len(bundle.y_train)) % 2,
        source_test=np.arange(len(bundle.y_test)) % 2,
    )
    for p in partition_dataset(hybrid, PartitionSpec("hybrid", 6)):
        assert p.latent_group == p.partition_id % 2
        assert set(hybrid.source_train[p.train_idx]) == {p.latent_group}
        assert set(hybrid.source_test[p.test_idx]) == {p.latent_group}


def test_natural_partition_of_synthetic_data_is_per_writer() -> None:
    synthetic = make_synthetic(num_writers=6, alpha=1.0, beta=1.0, seed=0)
    parts = partition_dataset(synthetic, PartitionSpec("natural", 6))
    for p in parts:
        assert set(synthetic.source_train[p.train_idx]) == {p.partition_id}
        assert set(synthetic.source_test[p.test_idx]) == {p.partition_id}
    with pytest.raises(ValueError, match="needs dataset 'synthetic'"):
        partition_dataset(image_bundle(), PartitionSpec("natural", 6))


def test_unknown_scheme_and_empty_clients_are_clear_errors(bundle: DataBundle) -> None:
    with pytest.raises(ValueError, match="Unknown partition 'zipf'"):
        PartitionSpec("zipf", 4)
    with pytest.raises(ValueError, match="without data"):
        partition_dataset(image_bundle(n_train=10), PartitionSpec("iid", 20))


def test_central_test_set_covers_every_rotation(bundle: DataBundle) -> None:
    x, _y = central_test_set(bundle, PartitionSpec("rotated", 4, seed=0))
    assert x.shape == (len(bundle.y_test), 1, 8, 8)
    order = np.random.default_rng(0).permutation(len(bundle.y_test))
    first_of_last = np.array_split(order, 4)[3][0]
    quarter = len(np.array_split(order, 4)[0]) * 3
    expected = np.rot90(bundle.x_test[first_of_last].astype(np.float32) / 255, 3, axes=(1, 2))
    np.testing.assert_allclose(x[quarter], expected)


def test_partitions_survive_the_disk_cache(bundle: DataBundle, tmp_path) -> None:
    parts = partition_dataset(bundle, PartitionSpec("rotated", 7, seed=1))
    save_partitions(parts, tmp_path / "p.npz")
    back = read_partitions(tmp_path / "p.npz")
    assert back[3].rotation == parts[3].rotation
    for a, b in zip(parts, back, strict=True):
        np.testing.assert_array_equal(a.train_idx, b.train_idx)
        np.testing.assert_array_equal(a.test_idx, b.test_idx)
        assert (a.latent_group, a.label_shift) == (b.latent_group, b.label_shift)


def test_subsampled_runs_get_their_own_partition_cache(tmp_path) -> None:
    from fedgsp_flwr.app.config import RunConfig
    from fedgsp_flwr.app.datasets import bundle_for, load_partitions

    base = {"dataset": "synthetic", "partition": "iid", "data-dir": str(tmp_path)}
    for extra in ({}, {"test-examples": 15}, {"train-examples": 40, "test-examples": 15},
                  {}):
        cfg = RunConfig.from_mapping({**base, **extra})
        parts = load_partitions(cfg, 4)
        bundle = bundle_for(cfg, 4)
        assert max(int(p.test_idx.max()) for p in parts) < len(bundle.y_test)
        assert sum(len(p.train_idx) for p in parts) == len(bundle.y_train)
    assert len(list((tmp_path / "partitions").glob("*.npz"))) == 3


def test_a_process_reads_the_partitions_file_once_until_it_changes(tmp_path,
                                                                   monkeypatch) -> None:
    import os

    from fedgsp_flwr.app import datasets
    from fedgsp_flwr.app.config import RunConfig

    cfg = RunConfig.from_mapping({"dataset": "synthetic", "partition": "iid",
                                  "data-dir": str(tmp_path)})
    written = datasets.load_partitions(cfg, 4)
    reads = []
    monkeypatch.setattr(datasets, "read_partitions",
                        lambda path: reads.append(path) or read_partitions(path))
    for _ in range(3):
        for a, b in zip(datasets.load_partitions(cfg, 4), written, strict=True):
            np.testing.assert_array_equal(a.train_idx, b.train_idx)
    assert len(reads) == 1, "a simulated ClientApp paid the file read on every message"
    path = datasets.partitions_path(cfg, 4)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    datasets.load_partitions(cfg, 4)
    assert len(reads) == 2, "a rewritten file is read again"


@pytest.mark.parametrize("scheme", ["rotated", "shifted"])
def test_transform_copies_give_every_group_the_whole_training_set(
    bundle: DataBundle, scheme: str
) -> None:
    parts = partition_dataset(bundle, PartitionSpec(scheme, 12, seed=2, transform_copies=True))
    plain = partition_dataset(bundle, PartitionSpec(scheme, 12, seed=2))
    total = len(bundle.y_train)
    for g in range(4):
        group = [p for p in parts if p.partition_id % 4 == g]
        assert {p.latent_group for p in group} == {g}
        assert_disjoint_cover(bundle, group)  # each group: a partition of the whole set
        sizes = [len(p.train_idx) for p in group]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == total
    assert sum(len(p.train_idx) for p in parts) == 4 * sum(len(p.train_idx) for p in plain)
    # the groups draw their splits independently
    assert not np.array_equal(parts[0].train_idx, parts[1].train_idx)


def test_transform_copies_are_refused_where_they_mean_nothing() -> None:
    with pytest.raises(ValueError, match="transform-copies applies to partition 'rotated'"):
        PartitionSpec("dirichlet", 8, transform_copies=True)
