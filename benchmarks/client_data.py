"""A simulated ClientApp's data load per message: a worker process answers for many
nodes, in a different order every round.

    python benchmarks/client_data.py [--nodes 100] [--workers 2] [--rounds 5]
        [--dataset mnist] [--out FILE.json]

One process plays one of ``--workers`` simulation workers over ``--rounds`` rounds of
``--nodes`` nodes (one class per node, as in the Semi-FL and HierFL experiments): each
round it loads the data of a random share of the nodes, in random order, the same
sequence for every variant. The median and the mean milliseconds per message of:

- ``read-partitions``: reading the run's partitions file alone;
- ``load-up-to-0.7.0``: the client app's data load up to 0.7.0: 16 nodes kept
  (``functools.lru_cache``), and on a miss the partitions file read again and the node's
  arrays materialised;
- ``load-now``: :func:`fedgsp_flwr.app.client_app.load_data` (nodes kept within
  ``DATA_CACHE_BYTES``, the partitions file read once per process);

and the ratio of the last two's means (misses are rare and costly, so the median alone
hides them; same process, so the ratio holds on a loaded machine). ``--out`` also
writes them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import lru_cache

import numpy as np
from benchmark_io import emit_json
from flwr.app import Context, RecordDict

from fedgsp_flwr.app import client_app
from fedgsp_flwr.app.config import RunConfig
from fedgsp_flwr.app.datasets import bundle_for, load_client_data, partitions_path
from fedgsp_flwr.data import client_data, read_partitions


def seconds(load: Callable[[int], object], order: list[int]) -> list[float]:
    """Seconds of ``load(partition)`` for each partition of ``order``."""
    out = []
    for partition in order:
        started = time.perf_counter()
        load(partition)
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    """Time the variants and print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--out", default="", help="also write the JSON here")
    args = parser.parse_args()
    mapping = {"dataset": args.dataset, "partition": "one-class"}
    cfg = RunConfig.from_mapping(mapping, allow_unknown=True)
    load_client_data(cfg, 0, args.nodes)  # the dataset loaded, the partitions file written
    bundle, path = bundle_for(cfg, args.nodes), partitions_path(cfg, args.nodes)
    rng = np.random.default_rng(0)
    share = args.nodes // args.workers
    order = [int(p) for _ in range(args.rounds)
             for p in rng.permutation(args.nodes)[:share]]

    @lru_cache(maxsize=16)
    def before(partition: int) -> object:
        return client_data(bundle, read_partitions(path)[partition])

    contexts = {p: Context(run_id=1, node_id=p + 1, state=RecordDict(), run_config=mapping,
                           node_config={"partition-id": p, "num-partitions": args.nodes})
                for p in range(args.nodes)}
    timed = {"read-partitions": seconds(lambda _: read_partitions(path), order),
             "load-up-to-0.7.0": seconds(before, order),
             "load-now": seconds(lambda p: client_app.load_data(contexts[p]), order)}
    report: dict[str, object] = {
        "benchmark": "client_data", "dataset": args.dataset, "nodes": args.nodes,
        "workers": args.workers, "rounds": args.rounds, "messages": len(order),
        "command": " ".join(["python", "benchmarks/client_data.py", *sys.argv[1:]]),
        "partition": "one-class"}
    for name, values in timed.items():
        report[f"{name}-ms-median"] = 1e3 * statistics.median(values)
        report[f"{name}-ms-mean"] = 1e3 * statistics.mean(values)
    report["before-over-now-mean"] = (statistics.mean(timed["load-up-to-0.7.0"])
                                      / statistics.mean(timed["load-now"]))
    emit_json(report, args.out)


if __name__ == "__main__":
    main()
