"""Test helpers: small in-memory datasets and Flower message plumbing."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, RecordDict

from fedgsp_flwr.data import ClientData, DataBundle


def image_bundle(n_train: int = 2000, n_test: int = 500, seed: int = 0) -> DataBundle:
    """A 10-class image dataset of random 8x8 uint8 images with balanced labels."""
    rng = np.random.default_rng(seed)
    return DataBundle(
        name="tiny",
        x_train=rng.integers(0, 256, (n_train, 1, 8, 8), dtype=np.uint8),
        y_train=np.arange(n_train) % 10,
        x_test=rng.integers(0, 256, (n_test, 1, 8, 8), dtype=np.uint8),
        y_test=np.arange(n_test) % 10,
        num_classes=10,
    )


def vector_data(n: int = 60, dim: int = 5, classes: int = 3, seed: int = 0) -> ClientData:
    """Separable-ish random vectors for fast handler and training tests."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = (rng.normal(size=(n, dim)) + np.eye(classes, dim)[y] * 3).astype(np.float32)
    y_test = rng.integers(0, classes, n // 2)
    x_test = (rng.normal(size=(n // 2, dim)) + np.eye(classes, dim)[y_test] * 3).astype(
        np.float32
    )
    return ClientData(x, y, x_test, y_test, classes)


def make_context(partition_id: int = 0, num_partitions: int = 2, **run_config: object) -> Context:
    return Context(
        run_id=1,
        node_id=100 + partition_id,
        node_config={"partition-id": partition_id, "num-partitions": num_partitions},
        state=RecordDict(),
        run_config=dict(run_config),
    )


def instruction(content: RecordDict, message_type: str, dst: int = 100) -> Message:
    return Message(content=content, dst_node_id=dst, message_type=message_type)


def arrays_of(model: object) -> ArrayRecord:
    return ArrayRecord(model.state_dict())  # type: ignore[attr-defined]
