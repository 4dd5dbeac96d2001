"""A FedAvg round's server side, checks and mean, against 0.5.0's (arrays decoded twice).

    python benchmarks/reply_decoding.py [--clients 30] [--repeats 5]
        [--out docs/results/reply-decoding.json]

``--clients`` training replies, each an ArrayRecord of float32 arrays shaped as
``cnn-leaf`` (6.5M parameters, 8 arrays), random values. Through 0.5.0 a reply's check
compared the *declared* shapes and dtypes, decoded every array with ``Array.numpy()``
to look for NaN, and Flower's ``aggregate_arrayrecords`` decoded every array again for
the mean. Now :func:`~fedgsp_flwr.strategies.replies.filter_replies` decodes each array
once, its bytes checked against its declaration
(:mod:`fedgsp_flwr.strategies.decoding`), and :meth:`FedAvg.combine_models` averages
those values. Reports the median seconds and peak traced memory (tracemalloc) of each
form in the same process, their ratio, whether the two means are bit-identical, and
the time to refuse a reply that declares a small shape over 64 MB of bytes. Prints
JSON and, with ``--out``, writes it.
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
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from flwr.supercore.task_identity import TaskIdentity

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.strategies import FedAvg
from fedgsp_flwr.strategies.replies import filter_replies

SHAPES = ((32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (2048, 3136), (2048,), (10, 2048),
          (10,))


def replies(clients: int) -> tuple[ArrayRecord, list[Message]]:
    """The model sent and one reply per client (fresh Arrays: nothing decoded yet)."""
    rng = np.random.default_rng(0)
    sent = ArrayRecord({f"a{i}": Array(np.zeros(s, np.float32)) for i, s in enumerate(SHAPES)})
    out = []
    for node in range(clients):
        request = Message(RecordDict({"arrays": sent}), dst_node_id=node + 1,
                          message_type="train")
        arrays = ArrayRecord({f"a{i}": Array(rng.standard_normal(s, dtype=np.float32))
                              for i, s in enumerate(SHAPES)})
        out.append(Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(
            {"num-examples": int(rng.integers(10, 100))})}), reply_to=request))
    return sent, out


def round_0_5_0(sent: ArrayRecord, messages: list[Message]) -> dict[str, np.ndarray]:
    """0.5.0: declared metadata compared, every array decoded for the NaN check, then
    decoded again by Flower's mean."""
    for message in messages:
        record = message.content["arrays"]
        for key, array in record.items():
            assert tuple(array.shape) == tuple(sent[key].shape) and array.dtype == sent[key].dtype
            assert np.isfinite(array.numpy()).all()
    mean = aggregate_arrayrecords([m.content for m in messages], "num-examples")
    return {k: a.numpy() for k, a in mean.items()}


def round_now(sent: ArrayRecord, messages: list[Message]) -> dict[str, np.ndarray]:
    """Now: each array decoded once by the check, the mean from those values."""
    sound, rejected = filter_replies(messages, reference=sent, weighted_by_key="num-examples",
                                     require_arrays=True, stage="train")
    assert not rejected
    mean = FedAvg().combine_models(1, [m.content for m in sound])
    return {k: a.numpy() for k, a in mean.items()}


def measure(form: Callable[[ArrayRecord, list[Message]], dict[str, np.ndarray]],
            clients: int, repeats: int) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Median seconds and peak traced MB of ``form`` on fresh replies, its last result."""
    seconds, peaks, result = [], [], {}
    for _ in range(repeats):
        sent, messages = replies(clients)
        tracemalloc.start()
        start = time.perf_counter()
        result = form(sent, messages)
        seconds.append(time.perf_counter() - start)
        peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
    return {"seconds": statistics.median(seconds), "peak-mb": statistics.median(peaks)}, result


def oversized_refusal(repeats: int) -> float:
    """Median seconds to refuse a (3, 2) float32 declaration over 64 MB of bytes."""
    sent = ArrayRecord({"w": Array(np.zeros((3, 2), np.float32))})
    request = Message(RecordDict({"arrays": sent}), dst_node_id=1, message_type="train")
    data = Array(np.zeros((3, 2), np.float32)).data + bytes(64 * 2**20)
    lie = Message(RecordDict({"arrays": ArrayRecord({"w": Array(
        dtype="float32", shape=(3, 2), stype="numpy.ndarray", data=data)}),
        "metrics": MetricRecord({"num-examples": 5})}), reply_to=request)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _, rejected = filter_replies([lie], reference=sent, weighted_by_key="num-examples",
                                     require_arrays=True, stage="train")
        times.append(time.perf_counter() - start)
        assert rejected
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    old, old_mean = measure(round_0_5_0, args.clients, args.repeats)
    new, new_mean = measure(round_now, args.clients, args.repeats)
    report: dict[str, Any] = {
        "clients": args.clients, "parameters": int(sum(np.prod(s) for s in SHAPES)),
        "repeats": args.repeats, "0.5.0": old, "now": new,
        "time-ratio-now-over-0.5.0": new["seconds"] / old["seconds"],
        "peak-ratio-now-over-0.5.0": new["peak-mb"] / old["peak-mb"],
        "means-bit-identical": all(old_mean[k].tobytes() == new_mean[k].tobytes()
                                   for k in old_mean),
        "refuse-64mb-lie-seconds": oversized_refusal(args.repeats),
    }
    emit_json(report, args.out)


if __name__ == "__main__":
    main()
