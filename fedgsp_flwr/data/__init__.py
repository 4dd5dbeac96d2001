"""Datasets (offline first) and client partitions; nothing here knows the run config
(:mod:`fedgsp_flwr.app.datasets` maps a run config onto these)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .partition import (
    SCHEMES,
    ClientData,
    Partition,
    PartitionSpec,
    central_test_set,
    client_data,
    partition_dataset,
    read_partitions,
    save_partitions,
)
from .sources import (
    LOCAL_DATASETS,
    DataBundle,
    DatasetUnavailableError,
    default_cache_dir,
    load_dataset,
    subsample,
)

__all__ = [
    "LOCAL_DATASETS",
    "SCHEMES",
    "ClientData",
    "DataBundle",
    "DatasetUnavailableError",
    "Partition",
    "PartitionSpec",
    "central_test_set",
    "client_data",
    "default_cache_dir",
    "get_bundle",
    "partition_dataset",
    "read_partitions",
    "save_partitions",
    "subsample",
]


@lru_cache(maxsize=4)
def get_bundle(
    name: str,
    cache_dir: str,
    num_writers: int,
    synthetic_alpha: float,
    synthetic_beta: float,
    seed: int,
    train_examples: int = 0,
    test_examples: int = 0,
) -> DataBundle:
    """Load a dataset once per process (simulation actors serve many nodes), optionally
    a seeded subset of it (see :func:`subsample`).
    """
    bundle = load_dataset(
        name,
        Path(cache_dir) if cache_dir else default_cache_dir(),
        num_writers=num_writers,
        synthetic_alpha=synthetic_alpha,
        synthetic_beta=synthetic_beta,
        seed=seed,
    )
    return subsample(bundle, train_examples, test_examples, seed)
