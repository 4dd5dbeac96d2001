"""The model and data: a one-hidden-layer perceptron on 40 synthetic examples per node
(a ``Sequential`` with features before its last linear layer, which FedFusion's hook
needs; a logistic regression would make FedFusion fall back to FedAvg)."""

from __future__ import annotations

import numpy as np
import torch

CLASSES, FEATURES, HIDDEN = 4, 6, 8


class Net(torch.nn.Sequential):
    """Linear(6, 8), ReLU, Linear(8, 4): 92 parameters."""

    def __init__(self) -> None:
        super().__init__(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                         torch.nn.Linear(HIDDEN, CLASSES))


def load_partition(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Node i holds mostly class i mod 4 (label skew): 40 examples."""
    rng = np.random.default_rng(partition_id)
    y = np.where(rng.random(40) < 0.8, partition_id % CLASSES, rng.integers(0, CLASSES, 40))
    x = (rng.normal(size=(40, FEATURES)) + np.eye(CLASSES, FEATURES)[y] * 2).astype(np.float32)
    return x, y.astype(np.int64)
