"""A simulated ClientApp's data load when its process answers for more nodes than the
client app's per-node cache holds (16): the partitions file read on every message
against once per process.

    python benchmarks/client_data.py [--nodes 100] [--dataset mnist] [--out FILE.json]

In one process, ``--nodes`` partitions (one class per node, as in the Semi-FL and HierFL
experiments) are loaded in turn with :func:`fedgsp_flwr.app.datasets.load_client_data`,
three times over, as two simulation workers cycle through a 100-node round: medians in
milliseconds of the file read alone (``read_partitions``, what every load paid up to
0.7.0), of a load up to 0.7.0 (the read, then the node's arrays) and of a load now (the
partitions kept in the process), and the ratio of the last two (same process, so it
holds on a loaded machine). ``--out`` also writes them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from benchmark_io import emit_json

from fedgsp_flwr.app.config import RunConfig
from fedgsp_flwr.app.datasets import (
    bundle_for,
    load_client_data,
    load_partitions,
    partitions_path,
)
from fedgsp_flwr.data import client_data, read_partitions


def median_ms(load: Callable[[int], object], nodes: int, passes: int = 3) -> float:
    """Median milliseconds of ``load(partition)`` over ``passes`` passes of every node."""
    seconds = []
    for _ in range(passes):
        for partition in range(nodes):
            started = time.perf_counter()
            load(partition)
            seconds.append(time.perf_counter() - started)
    return 1e3 * statistics.median(seconds)


def main() -> None:
    """Time the three and print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--out", default="", help="also write the JSON here")
    args = parser.parse_args()
    cfg = RunConfig.from_mapping({"dataset": args.dataset, "partition": "one-class"},
                                 allow_unknown=True)
    load_client_data(cfg, 0, args.nodes)  # the dataset, and the partitions file written
    bundle = bundle_for(cfg, args.nodes)
    path = partitions_path(cfg, args.nodes)
    read = median_ms(lambda _: read_partitions(path), args.nodes)
    before = median_ms(lambda k: client_data(bundle, read_partitions(path)[k]), args.nodes)
    now = median_ms(lambda k: load_client_data(cfg, k, args.nodes), args.nodes)
    assert len(load_partitions(cfg, args.nodes)) == args.nodes
    emit_json({"benchmark": "client_data", "dataset": args.dataset, "nodes": args.nodes,
               "partition": "one-class",
               "command": "python benchmarks/client_data.py"
                          + (f" --nodes {args.nodes}" if args.nodes != 100 else "")
                          + (f" --dataset {args.dataset}" if args.dataset != "mnist" else ""),
               "read-partitions-ms": read, "load-up-to-0.7.0-ms": before,
               "load-now-ms": now, "before-over-now": before / now}, args.out)


if __name__ == "__main__":
    main()
