"""ServerApp of the engine probe: times server-side work, FedAvg rounds or relay hops
inside the simulation engine and writes them to the run config's ``out`` file.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp import strategy as flower

from fedgsp_flwr.strategies import FedAvg
from fedgsp_flwr.strategies.relay import run_relay
from fedgsp_flwr.threads import ThreadHintGrid, frozen_gc, thread_limit

from .workloads import time_workloads

app = ServerApp()


def _nodes(grid: Grid, minimum: int) -> list[int]:
    while len(nodes := sorted(grid.get_node_ids())) < minimum:
        time.sleep(0.5)
    return nodes


def _cores(grid: Grid, repeats: int) -> dict:
    """The workloads as our strategies run them here (one BLAS thread, the objects alive
    before the run frozen for the cyclic GC), and with the GC as it is.
    """
    nodes = len(_nodes(grid, 1))
    with thread_limit(1):
        out = {"nodes": nodes, "gc-tracked-objects": len(gc.get_objects()),
               "threads-1-gc-as-is": time_workloads(repeats)}
        with frozen_gc():
            out["ours"] = time_workloads(repeats)
    return out


class TimedFlowerFedAvg(flower.FedAvg):
    """Flower's own FedAvg, timed as ours times a round (``train-time``): from the
    messages leaving :meth:`configure_train` to the replies reaching
    :meth:`aggregate_train`."""

    def __init__(self, *, min_available_nodes: int) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0,
                         min_available_nodes=min_available_nodes)
        self.sent_at = 0.0
        self.round_seconds: list[float] = []

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.sent_at = time.monotonic()
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.round_seconds.append(time.monotonic() - self.sent_at)
        return super().aggregate_train(server_round, replies)


def _round(grid: Grid, work: str, rounds: int, kind: str) -> dict:
    """``rounds`` rounds of FedAvg, every node training: ours, or Flower's (``kind``)."""
    nodes = _nodes(grid, 1)
    rng = np.random.default_rng(0)
    initial = ArrayRecord({"weight": Array(rng.normal(size=(10, 60)).astype(np.float32)),
                           "bias": Array(np.zeros(10, np.float32))})
    strategy = (FedAvg(fraction_train=1.0, fraction_evaluate=0.0,
                       min_available_nodes=len(nodes)) if kind == "ours" else
                TimedFlowerFedAvg(min_available_nodes=len(nodes)))
    started = time.perf_counter()
    strategy.start(grid, initial, num_rounds=rounds, timeout=3600,
                   train_config=ConfigRecord({"work": work}))
    seconds = (strategy.round_seconds if isinstance(strategy, TimedFlowerFedAvg) else
               [strategy.history[r]["train-time"] for r in range(1, rounds + 1)])
    return {"nodes": len(nodes), "work": work, "strategy": kind,
            "wall": time.perf_counter() - started, "round_seconds": seconds}


def _relay(grid: Grid, hops: int, hint: bool, poll: float) -> dict:
    from fedgsp_flwr.models import build_model

    nodes = _nodes(grid, hops)[:hops]
    arrays = ArrayRecord(build_model("cnn", (1, 28, 28), 10, 0).state_dict())
    run_grid = ThreadHintGrid(grid) if hint else grid
    with thread_limit(1 if hint else None):
        (chain,) = run_relay(run_grid, [nodes], arrays, ConfigRecord({"work": "hop"}),
                             train_timeout=600, poll_interval=poll)
    return {"hint": hint, "poll_interval": poll, "hops": [
        {"latency": h.latency, "train_seconds": h.metrics.get("train-seconds"),
         "handler_seconds": h.metrics.get("handler-seconds"),
         "threads": h.metrics.get("threads"), "status": h.status} for h in chain.hops]}


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the configured measurement and write its JSON."""
    cfg = context.run_config
    if cfg["mode"] == "cores":
        out = _cores(grid, int(cfg["repeats"]))
    elif cfg["mode"] == "round":
        out = _round(grid, str(cfg["work"]), int(cfg["rounds"]), str(cfg["strategy"]))
    else:
        out = _relay(grid, int(cfg["hops"]), bool(cfg["hint"]), float(cfg["poll"]))
    Path(str(cfg["out"])).write_text(json.dumps(out, indent=2))
