"""What a ClientApp message pays beside its work: the thread limit and the seeding.

    python benchmarks/message_overhead.py [--calls 200] [--out FILE.json]

In a process with what a simulated ClientApp has loaded (numpy, scipy, torch, flwr,
ray), medians in milliseconds over ``calls`` calls, each against what it replaced in the
same process (so the ratios hold on a loaded machine):

- ``thread_limit(1)`` (the pools looked up once and kept until a module is imported)
  against threadpoolctl's ``threadpool_limits(limits=1)`` (every loaded library read
  again on each call, as ``thread_limit`` did up to 0.7.0), and one message through
  ``threads_mod`` with a no-op handler;
- seeding the CPU generator (``torch.default_generator.manual_seed``, what
  ``build_model`` and ``training.train`` do) against ``torch.manual_seed`` (up to 0.7.0:
  it also queues a seed for every accelerator, with a stack trace each), called
  ``depth`` frames down, about as deep as a handler runs under Flower's ClientApp and
  our mods.

``--out`` also writes them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
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

DEPTH = 40  # frames above a handler's seeding: Flower's ClientApp, the mods, the handler


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


def deep(call: Callable[[], object], depth: int = DEPTH) -> Callable[[], object]:
    """``call`` made ``depth`` frames down the stack."""
    def down(level: int) -> object:
        return call() if level == 0 else down(level - 1)
    return lambda: down(depth)


def main() -> None:
    """Time the pairs and print the JSON."""
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
    with torch.random.fork_rng(devices=[]):
        every = median_ms(deep(lambda: torch.manual_seed(0)), args.calls)
        cpu = median_ms(deep(lambda: torch.default_generator.manual_seed(0)), args.calls)
    emit_json({"benchmark": "message_overhead", "calls": args.calls, "depth": DEPTH,
               "command": " ".join(["python", "benchmarks/message_overhead.py",
                                    *sys.argv[1:]]),
               "threadpool-limits-ms": lookup, "thread-limit-ms": ours,
               "threads-mod-ms": mod, "lookup-over-ours": lookup / ours,
               "torch-manual-seed-ms": every, "cpu-generator-seed-ms": cpu,
               "manual-seed-over-cpu": every / cpu}, args.out)


if __name__ == "__main__":
    main()
