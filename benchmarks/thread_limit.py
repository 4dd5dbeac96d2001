"""The cost ``threads_mod`` adds to every message: one :func:`thread_limit` block.

    python benchmarks/thread_limit.py [--calls 200] [--out FILE.json]

In a process with what a simulated ClientApp has loaded (numpy, scipy, torch, flwr,
ray), times ``calls`` blocks of ``thread_limit(1)`` (the pools looked up once and kept
until a module is imported) against threadpoolctl's ``threadpool_limits(limits=1)``
(every loaded library read again on each call, as ``thread_limit`` did up to 0.7.0),
and one message through ``threads_mod`` with a no-op handler. Prints the medians in
milliseconds and their ratio (same process, so the ratio holds on a loaded machine);
``--out`` also writes them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import flwr.simulation  # noqa: F401  # loaded, as in a ClientApp's process
import numpy as np
import ray  # noqa: F401
import scipy.linalg  # noqa: F401
import torch
from benchmark_io import emit_json
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from threadpoolctl import threadpool_limits

from fedgsp_flwr.clients import threads_mod
from fedgsp_flwr.threads import thread_limit


def median_ms(block: Callable[[], object], calls: int) -> float:
    """Median milliseconds of ``calls`` calls of ``block`` (after two warm-up calls)."""
    for _ in range(2):
        block()
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        block()
        seconds.append(time.perf_counter() - started)
    return 1e3 * statistics.median(seconds)


def entered(make: Callable[[], AbstractContextManager[object]]) -> Callable[[], None]:
    def block() -> None:
        with make():
            pass
    return block


def main() -> None:
    """Time the three and print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", default="", help="also write the JSON here")
    args = parser.parse_args()
    np.ones((4, 4)) @ np.ones((4, 4))  # BLAS and torch's OpenMP loaded and started
    torch.ones(4) + 1
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    message = Message(RecordDict({"config": ConfigRecord({"num-threads": 1})}),
                      dst_node_id=1, message_type="train")
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    lookup = median_ms(entered(lambda: threadpool_limits(limits=1)), args.calls)
    ours = median_ms(entered(lambda: thread_limit(1)), args.calls)
    mod = median_ms(lambda: threads_mod(message, context, lambda m, c: m), args.calls)
    emit_json({"benchmark": "thread_limit", "calls": args.calls,
               "command": "python benchmarks/thread_limit.py"
                          + (f" --calls {args.calls}" if args.calls != 200 else ""),
               "threadpool-limits-ms": lookup, "thread-limit-ms": ours,
               "threads-mod-ms": mod, "lookup-over-ours": lookup / ours}, args.out)


if __name__ == "__main__":
    main()
