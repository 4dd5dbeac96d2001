"""The run config's dataset and partitions: what the ServerApp, the ClientApp and the
centralized baseline load.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..data import (
    ClientData,
    DataBundle,
    Partition,
    PartitionSpec,
    central_test_set,
    client_data,
    default_cache_dir,
    get_bundle,
    partition_dataset,
    read_partitions,
    save_partitions,
)
from .config import RunConfig


def partition_spec(cfg: RunConfig, num_partitions: int) -> PartitionSpec:
    """Build the partition spec of a run config."""
    return PartitionSpec(
        scheme=cfg.partition,
        num_partitions=num_partitions,
        seed=cfg.seed,
        alpha=cfg.partition_alpha,
        classes_per_client=cfg.classes_per_client,
        shards_per_client=cfg.shards_per_client,
        test_fraction=cfg.test_fraction,
        transform_copies=cfg.transform_copies,
    )


def bundle_for(cfg: RunConfig, num_partitions: int) -> DataBundle:
    """Load the run's dataset (synthetic data has one writer per partition)."""
    return get_bundle(
        cfg.dataset,
        cfg.data_dir,
        num_partitions if cfg.dataset == "synthetic" else 0,
        cfg.synthetic_alpha,
        cfg.synthetic_beta,
        cfg.seed,
        cfg.train_examples,
        cfg.test_examples,
    )


def load_client_data(cfg: RunConfig, partition_id: int, num_partitions: int) -> ClientData:
    """Load the arrays of one node's partition.

    Parameters
    ----------
    cfg : RunConfig
        The run config (dataset, partition scheme, seed, ...).
    partition_id : int
        The node's ``partition-id``.
    num_partitions : int
        The node's ``num-partitions``.

    Returns
    -------
    ClientData
        The partition's train and test arrays.

    Raises
    ------
    ValueError
        If ``partition_id`` is outside ``[0, num_partitions)``.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id {partition_id} is outside [0, num-partitions={num_partitions})"
        )
    bundle = bundle_for(cfg, num_partitions)
    return client_data(bundle, load_partitions(cfg, num_partitions)[partition_id])


def partitions_path(cfg: RunConfig, num_partitions: int) -> Path:
    """The file :func:`load_partitions` keeps the run's partitions in: named by the
    dataset, the scheme and a hash of everything that decides them."""
    spec = partition_spec(cfg, num_partitions)
    # Partitions index into the (possibly subsampled) train and test splits.
    key = hashlib.sha1(repr((cfg.dataset, cfg.synthetic_alpha, cfg.synthetic_beta,
                             cfg.train_examples, cfg.test_examples, spec)
                            ).encode()).hexdigest()[:16]
    cache = Path(cfg.data_dir) if cfg.data_dir else default_cache_dir()
    return cache / "partitions" / f"{cfg.dataset.replace('/', '__')}-{spec.scheme}-{key}.npz"


def load_partitions(cfg: RunConfig, num_partitions: int) -> list[Partition]:
    """Return the run's partitions, computed once per machine and cached on disk.

    A deployed SuperNode starts a new process per message: reading the cached indices
    avoids re-partitioning (and importing ``datasets``) every time.
    """
    path = partitions_path(cfg, num_partitions)
    try:
        stat = path.stat()
    except FileNotFoundError:
        pass
    else:
        return list(_read_partitions(path, stat.st_mtime_ns, stat.st_size, stat.st_ino))
    parts = partition_dataset(bundle_for(cfg, num_partitions), partition_spec(cfg, num_partitions))
    save_partitions(parts, path)
    return parts


@lru_cache(maxsize=8)
def _read_partitions(path: Path, mtime_ns: int, size: int, inode: int
                     ) -> tuple[Partition, ...]:
    """The partitions file at ``path`` as it is now (its time, size and inode), read
    once per process: a simulated ClientApp's process loads the data of many nodes, and
    each read of the file cost 2-3 ms (benchmarks/client_data.py)."""
    return tuple(read_partitions(path))


def load_server_test_set(cfg: RunConfig, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Load the server's central test set for the run's dataset and partition."""
    return central_test_set(bundle_for(cfg, num_partitions), partition_spec(cfg, num_partitions))
