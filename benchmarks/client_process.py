"""What a fresh ClientApp process pays before its work: in deployment a SuperNode starts
one per message.

    python benchmarks/client_process.py [--repeats 3] [--out docs/results/client-process.json]

CPU seconds of fresh interpreters, medians over ``--repeats``, alternating:

- ``import``: ``import fedgsp_flwr.app.client_app`` (torch is loaded by the handlers that
  train, not at import); ``import torch`` beside it;
- ``optimizer``: ``import torch`` then building ``torch.optim.SGD`` (which imports
  ``torch._dynamo``) against building our ``fedgsp_flwr.training.SGD``;
- ``partition``: in one process, reading 1,000 flwr-datasets shard partitions of
  200,000 labels as numpy arrays through their ``Column`` (row by row) against one Arrow
  slice each, as ``fedgsp_flwr.data.partition`` does.

Prints JSON and, with ``--out``, writes it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

MODEL = "torch.nn.Linear(60, 4).parameters()"
SNIPPETS = {
    "import-client-app": "import fedgsp_flwr.app.client_app",
    "import-torch": "import torch",
    "torch-sgd": f"import torch; torch.optim.SGD(list({MODEL}), lr=0.1)",
    "our-sgd": f"import torch; from fedgsp_flwr.training import SGD; SGD(list({MODEL}), lr=0.1)",
}


def cpu_seconds(code: str) -> float:
    """CPU seconds (user + system) of a fresh interpreter running ``code``."""
    timed = ("import resource\n" + code + "\nu = resource.getrusage(resource.RUSAGE_SELF)\n"
             "print(u.ru_utime + u.ru_stime)")
    done = subprocess.run([sys.executable, "-c", timed], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return float(done.stdout.split()[-1])


def partition_reads(partitions: int = 1000, labels: int = 200_000) -> dict[str, float]:
    """Seconds to read every partition's indices through its Column, and by a slice."""
    from datasets import Dataset
    from flwr_datasets.partitioner import ShardPartitioner

    y = np.arange(labels) % 10
    partitioner = ShardPartitioner(partitions, "label", num_shards_per_partition=2, seed=0)
    partitioner.dataset = Dataset.from_dict({"idx": np.arange(labels), "label": y})
    loaded = [partitioner.load_partition(k) for k in range(partitions)]
    start = time.perf_counter()
    by_column = [np.asarray(p.with_format("numpy")["idx"], np.int64) for p in loaded]
    middle = time.perf_counter()
    by_slice = [np.asarray(p.with_format("arrow")[:]["idx"], np.int64) for p in loaded]
    end = time.perf_counter()
    same = all(np.array_equal(a, b) for a, b in zip(by_column, by_slice, strict=True))
    return {"column-s": middle - start, "slice-s": end - middle,
            "ratio": (middle - start) / (end - middle), "same-indices": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in SNIPPETS}
    for _ in range(args.repeats):
        for name, code in SNIPPETS.items():
            times[name].append(cpu_seconds(code))
    medians = {name: statistics.median(values) for name, values in times.items()}
    report: dict[str, Any] = {
        "cpu-s": medians,
        "runs": times,
        "optimizer-extra-s": medians["torch-sgd"] - medians["our-sgd"],
        "partition": partition_reads(),
        "python": sys.version.split()[0],
    }
    emit_json(report, args.out)


if __name__ == "__main__":
    main()
