"""The server-side work timed inside the engine and in a plain process, and the relay
hop's training, defined once for both sides.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from fedgsp_flwr.core.clustering import SketchClustering
from fedgsp_flwr.core.grouping import icg
from fedgsp_flwr.core.multicenter import e_step

MLP_PARAMS = 784 * 2048 + 2048 + 2048 * 10 + 10  # StoCFL's / FeSEM's MLP
HOP_EXAMPLES = 4800  # MNIST examples per relay hop (60k over 12 nodes, as measured before)
HOP_BATCH, HOP_LR = 32, 0.01


def histograms(k: int, classes: int, seed: int) -> np.ndarray:
    """(k, classes) label counts with Dirichlet(0.5) skew and 50-500 examples each."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(50, 500, k)
    return np.stack([rng.multinomial(n, rng.dirichlet(np.full(classes, 0.5)))
                     for n in sizes]).astype(np.float64)


def _icg(k: int, m: int) -> Callable[[], object]:
    v = histograms(k, 62, seed=k)
    return lambda: icg(v, m, np.random.default_rng(0))


def _stocfl_round(dim: int = 1000, clients: int = 1200, sampled: int = 120,
                  groups: int = 4) -> Callable[[], object]:
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(groups, dim))
    members = rng.integers(0, groups, clients)
    sketches = centres[members] + 0.8 * rng.normal(size=(clients, dim))
    sketches /= np.linalg.norm(sketches, axis=1, keepdims=True)
    seen = rng.permutation(clients)

    def run() -> object:
        # The 10th round of a 10% sampled run: 1,080 clients clustered, 120 arrive.
        clustering = SketchClustering(tau=0.5)
        clustering.add([int(c) for c in seen[:-sampled]], sketches[seen[:-sampled]])
        clustering.merge()
        started = time.perf_counter()
        clustering.add([int(c) for c in seen[-sampled:]], sketches[seen[-sampled:]])
        clustering.merge()
        return time.perf_counter() - started

    return run


def _fesem_e_step(models: int = 100, centres: int = 4) -> Callable[[], object]:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(models, MLP_PARAMS)).astype(np.float32)
    c = rng.normal(size=(centres, MLP_PARAMS)).astype(np.float32)
    return lambda: e_step(x, c)


def _weighted_average(replies: int = 100) -> Callable[[], object]:
    from flwr.app import Array, ArrayRecord

    from fedgsp_flwr.strategies.aggregation import average_arrays

    rng = np.random.default_rng(3)
    shapes = {"0.weight": (2048, 784), "0.bias": (2048,), "2.weight": (10, 2048),
              "2.bias": (10,)}
    records = [ArrayRecord({k: Array(rng.normal(size=s).astype(np.float32))
                            for k, s in shapes.items()}) for _ in range(replies)]
    weights = rng.integers(50, 500, replies).astype(float)
    return lambda: average_arrays(records, weights)


WORKLOADS: dict[str, Callable[[], Callable[[], object]]] = {
    "icg-K364-M52": lambda: _icg(364, 52),
    "icg-K10000-M100": lambda: _icg(10_000, 100),
    "stocfl-round-120-of-1200": _stocfl_round,
    "fesem-e-step-100-mlps": _fesem_e_step,
    "average-100-mlps": _weighted_average,
}


def time_workloads(repeats: int) -> dict[str, float]:
    """Median seconds of each workload over ``repeats`` runs (after one warm-up)."""
    out = {}
    for name, make in WORKLOADS.items():
        work = make()
        work()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            inner = work()
            elapsed = time.perf_counter() - started
            times.append(inner if isinstance(inner, float) else elapsed)
        out[name] = float(np.median(times))
        del work
    return out


@lru_cache(maxsize=4)
def hop_data(partition: int) -> tuple[np.ndarray, np.ndarray]:
    """The relay hop's training data: ``HOP_EXAMPLES`` MNIST images of one node (kept,
    as the bundled ClientApp keeps its partitions)."""
    from fedgsp_flwr.data.sources import load_dataset

    bundle = load_dataset("mnist")
    part = slice(partition * HOP_EXAMPLES, (partition + 1) * HOP_EXAMPLES)
    return bundle.x_train[part].astype(np.float32) / 255.0, bundle.y_train[part].astype(np.int64)


def hop_training(model: object, partition: int, seed: int) -> float:
    """Train ``model`` one epoch on the node's hop data; return the seconds it took."""
    from fedgsp_flwr.training import train

    x, y = hop_data(partition)
    started = time.perf_counter()
    train(model, x, y, epochs=1, lr=HOP_LR, batch_size=HOP_BATCH, seed=seed)
    return time.perf_counter() - started
