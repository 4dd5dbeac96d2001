"""IDA's aggregation of one round of FedGSP's Table 1: layer by layer against 0.5.0's.

    python benchmarks/ida_aggregation.py [--clients 30] [--repeats 3]
        [--out docs/results/ida-aggregation.json]

``--clients`` replies, each an ArrayRecord of float32 arrays shaped as ``cnn-leaf``
(6.5M parameters, 8 arrays) with random values: the IDA strategy's ``combine_models``
(weights computed a layer at a time, each reply's arrays deserialised once) against the
form it had through 0.5.0 (each model flattened to a float64 vector, all stacked,
distances to the stacked mean, the arrays deserialised twice). Reports median seconds
and peak traced memory (tracemalloc: numpy's allocations) of each, in the same
process, and the largest difference between their aggregated models. Prints JSON and,
with ``--out``, writes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.strategies.ida import IDA

SHAPES = ((32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (2048, 3136), (2048,), (10, 2048),
          (10,))


def combine_0_5_0(contents: list[RecordDict]) -> dict[str, np.ndarray]:
    """IDA's aggregation as 0.5.0 computed it (inverse distance alone)."""
    records = [next(iter(c.array_records.values())) for c in contents]
    keys = list(records[0].keys())
    flat = [np.concatenate([r[k].numpy().ravel().astype(np.float64) for k in keys])
            for r in records]
    stacked = np.stack([np.asarray(m, dtype=np.float64).ravel() for m in flat])
    inverse = 1 / np.linalg.norm(stacked - stacked.mean(axis=0), axis=1)
    weights = inverse / inverse.sum()
    out = {}
    for k in keys:
        values = [r[k].numpy() for r in records]
        mean = sum(w * v.astype(np.float64) for w, v in zip(weights, values, strict=True))
        out[k] = np.asarray(mean).astype(values[0].dtype)
    return out


def measure(form: Callable[[], dict[str, np.ndarray]], repeats: int
            ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Median seconds and peak traced MB of ``form``, and its last result."""
    seconds, peaks = [], []
    for _ in range(repeats):
        tracemalloc.start()
        began = time.perf_counter()
        result = form()
        seconds.append(time.perf_counter() - began)
        peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
    return {"seconds": statistics.median(seconds), "peak-mb": max(peaks)}, result


def run(clients: int, repeats: int) -> dict[str, Any]:
    """Both forms on the same replies."""
    rng = np.random.default_rng(0)
    contents = [RecordDict({
        "arrays": ArrayRecord({f"layer{i}": Array(rng.standard_normal(shape, dtype=np.float32))
                               for i, shape in enumerate(SHAPES)}),
        "metrics": MetricRecord({"num-examples": 226})}) for _ in range(clients)]
    strategy = IDA()

    def now() -> dict[str, np.ndarray]:
        return {k: a.numpy() for k, a in strategy.combine_models(1, contents).items()}

    by_layer, new = measure(now, repeats)
    before, old = measure(lambda: combine_0_5_0(contents), repeats)
    return {
        "setting": {"clients": clients, "parameters": sum(int(np.prod(s)) for s in SHAPES),
                    "dtype": "float32", "repeats": repeats},
        "by-layer": by_layer,
        "stacked-0.5.0": before,
        "speed-ratio": before["seconds"] / by_layer["seconds"],
        "memory-ratio": before["peak-mb"] / by_layer["peak-mb"],
        "max-model-difference": max(float(np.abs(new[k] - old[k]).max()) for k in new),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.clients < 1 or args.repeats < 1:
        parser.error("--clients and --repeats must be >= 1")
    emit_json(run(args.clients, args.repeats), args.out)


if __name__ == "__main__":
    main()
