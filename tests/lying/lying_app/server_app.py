"""A ServerApp that runs every strategy exported by :mod:`fedgsp_flwr.strategies` in
turn, at default arguments, against the lying ClientApp, and records per strategy:

- whether ``start()`` completed (else the exception and the end of its traceback);
- whether the final model decodes, is finite and has the initial model's keys, shapes
  and dtypes (FedFusion may add its ``fusion.*`` arrays);
- every train message sent to partition 0's node (its type and the lie it asked for):
  each one is an exchange whose reply is a lie and must be refused;
- every WARNING line the ``flwr`` logger emitted while the strategy ran.

The lie goes to the ClientApp in the train config's ``lie``: with ``every-lie``, each
strategy runs once per lie, else the strategies alternate them (``garbage``,
``shape``, ``garbage``, ...). Rows go to ``<out-dir>/summary.json`` after each strategy.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

import fedgsp_flwr.strategies as exported
from lying_app.client_app import LIAR, LIES
from lying_app.task import Net

# Exported base classes, not strategies one runs (RelayStrategy is abstract).
BASES = ("ServerSideRound", "RelayStrategy")
REPLY_TIMEOUT = 120.0

app = ServerApp()


def exported_strategies() -> list[str]:
    """Names of the concrete strategies exported by fedgsp_flwr.strategies."""
    return [name for name in exported.__all__
            if inspect.isclass(cls := getattr(exported, name)) and issubclass(cls, Strategy)
            and not inspect.isabstract(cls) and name not in BASES]


class Warnings(logging.Handler):
    """Collects the WARNING (and worse) lines of the ``flwr`` logger."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class SpyGrid(Grid):
    """The run's Grid, recording the train messages sent to ``liar``."""

    def __init__(self, grid: Grid, liar: int) -> None:
        self.grid, self.liar = grid, liar
        self.asked: list[dict[str, str]] = []

    def _record(self, messages: Iterable[Message]) -> list[Message]:
        messages = list(messages)
        for message in messages:
            kind = message.metadata.message_type
            if message.metadata.dst_node_id == self.liar and kind.split(".")[0] == "train":
                configs = message.content.config_records
                lie = configs["config"].get("lie", "") if "config" in configs else ""
                self.asked.append({"message-type": kind, "lie": str(lie)})
        return messages

    def set_run(self, run: Any) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(self._record(messages))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return self.grid.send_and_receive(self._record(messages), timeout=timeout)


def model_check(arrays: ArrayRecord | None, initial: ArrayRecord) -> dict[str, Any]:
    """Whether ``arrays`` decode to finite values of the initial model's keys, shapes and
    dtypes (extra arrays: only FedFusion's ``fusion.*``, as declared)."""
    if arrays is None:
        return {"model-ok": False, "model-problem": "no model"}
    try:
        values = {k: a.numpy() for k, a in arrays.items()}
    except Exception as err:  # noqa: BLE001 - a lie that reached the model
        return {"model-ok": False, "model-problem": f"does not decode: {err}"}
    problems = [f"'{k}' missing" for k in initial if k not in values]
    for key, value in values.items():
        declared = arrays[key]
        ref = initial.get(key, declared)
        if key not in initial and not key.startswith("fusion."):
            problems.append(f"unexpected array '{key}'")
        if tuple(value.shape) != tuple(ref.shape) or str(value.dtype) != ref.dtype:
            problems.append(f"'{key}' is {value.dtype}{list(value.shape)}, "
                            f"expected {ref.dtype}{list(ref.shape)}")
        elif value.dtype.kind in "fc" and not np.isfinite(value).all():
            problems.append(f"'{key}' is not finite")
    return {"model-ok": not problems, "model-problem": "; ".join(problems)}


def run_one(name: str, lie: str, grid: Grid, liar: int, rounds: int,
            lr: float) -> dict[str, Any]:
    """One strategy at default arguments for ``rounds`` rounds."""
    spy = SpyGrid(grid, liar)
    torch.manual_seed(0)
    initial = ArrayRecord(Net().state_dict())
    warnings = Warnings()
    logger = logging.getLogger("flwr")
    logger.addHandler(warnings)
    started = time.monotonic()
    completed, error, trace, arrays = False, "", "", None
    try:
        strategy = getattr(exported, name)()
        result = strategy.start(grid=spy, initial_arrays=initial, num_rounds=rounds,
                                timeout=REPLY_TIMEOUT,
                                train_config=ConfigRecord({"lr": lr, "lie": lie}))
        completed, arrays = True, result.arrays
    except Exception as err:  # noqa: BLE001 - recorded, the next strategy runs
        error = f"{type(err).__name__}: {err}"
        trace = "".join(traceback.format_exception(err)[-6:])
        arrays = getattr(err, "arrays", None)
    finally:
        logger.removeHandler(warnings)
    return {"strategy": name, "lie": lie, "completed": completed, "error": error,
            "traceback": trace, "seconds": round(time.monotonic() - started, 2),
            **model_check(arrays, initial), "asked": spy.asked, "warnings": warnings.lines}


def partition_nodes(grid: Grid, num_nodes: int) -> dict[int, int]:
    """Node id by partition id, asked with our ``query.partition`` hook."""
    deadline = time.monotonic() + REPLY_TIMEOUT
    while len(nodes := list(grid.get_node_ids())) < num_nodes:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(nodes)} of {num_nodes} nodes connected")
        time.sleep(0.5)
    replies = grid.send_and_receive(
        [Message(RecordDict(), dst_node_id=n, message_type="query.partition") for n in nodes],
        timeout=REPLY_TIMEOUT)
    return {int(r.content["metrics"]["partition-id"]): r.metadata.src_node_id
            for r in replies if not r.has_error()}


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run every exported strategy (or the run config's ``strategies``) in turn."""
    cfg = context.run_config
    out = Path(str(cfg["out-dir"])).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    nodes = partition_nodes(grid, int(cfg["num-nodes"]))
    liar = nodes[LIAR]
    names = [n.strip() for n in str(cfg["strategies"]).split(",") if n.strip()]
    names = names or exported_strategies()
    if bool(cfg["every-lie"]):
        plan = [(name, lie) for name in names for lie in LIES]
    else:
        plan = [(name, LIES[index % len(LIES)]) for index, name in enumerate(names)]
    rows: list[dict[str, Any]] = []
    for name, lie in plan:
        rows.append(run_one(name, lie, grid, liar, int(cfg["num-server-rounds"]),
                            float(cfg["lr"])))
        (out / "summary.json").write_text(json.dumps(
            {"liar-node": liar, "liar-partition": LIAR,
             "nodes": {str(p): n for p, n in sorted(nodes.items())}, "rows": rows},
            indent=1))
