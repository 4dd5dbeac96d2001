"""Test helpers: small in-memory datasets, Flower message plumbing, nodes running our
handlers, and a strategy's rounds on a fake grid.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedgsp_flwr.clients import HANDLERS, ClientHooks, register_hooks
from fedgsp_flwr.data import ClientData, DataBundle
from fedgsp_flwr.models import build_model


def image_bundle(n_train: int = 2000, n_test: int = 500, seed: int = 0) -> DataBundle:
    """A 10-class image dataset of random 8x8 uint8 images with balanced labels."""
    rng = np.random.default_rng(seed)
    return DataBundle(
        name="tiny",
        x_train=rng.integers(0, 256, (n_train, 1, 8, 8), dtype=np.uint8),
        y_train=np.arange(n_train) % 10,
        x_test=rng.integers(0, 256, (n_test, 1, 8, 8), dtype=np.uint8),
        y_test=np.arange(n_test) % 10,
        num_classes=10,
    )


def vector_data(n: int = 60, dim: int = 5, classes: int = 3, seed: int = 0) -> ClientData:
    """Separable-ish random vectors for fast handler and training tests."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = (rng.normal(size=(n, dim)) + np.eye(classes, dim)[y] * 3).astype(np.float32)
    y_test = rng.integers(0, classes, n // 2)
    x_test = (rng.normal(size=(n // 2, dim)) + np.eye(classes, dim)[y_test] * 3).astype(
        np.float32
    )
    return ClientData(x, y, x_test, y_test, classes)


def make_context(partition_id: int = 0, num_partitions: int = 2, **run_config: object) -> Context:
    return Context(
        run_id=1,
        node_id=100 + partition_id,
        node_config={"partition-id": partition_id, "num-partitions": num_partitions},
        state=RecordDict(),
        run_config=dict(run_config),
    )


def instruction(content: RecordDict, message_type: str, dst: int = 100) -> Message:
    return Message(content=content, dst_node_id=dst, message_type=message_type)


def arrays_of(model: object) -> ArrayRecord:
    return ArrayRecord(model.state_dict())  # type: ignore[attr-defined]


def logistic(features: int = 6, classes: int = 4) -> Callable[..., Any]:
    """A model builder (``ClientHooks.build_model`` or no arguments): logistic
    regression with a fixed seed.
    """
    return lambda *_: build_model("logistic", (features,), classes, seed=0)


def node_app(
    data: Callable[[int], ClientData],
    node: int,
    model: Callable[..., Any],
    *,
    partition: int | None = None,
    handlers: Iterable[str] = HANDLERS,
    node_config: Mapping[str, Any] | None = None,
) -> Callable[[Message], Message]:
    """A node (for :class:`fakegrid.FakeGrid`) running our handlers over
    ``data(partition)``; its partition id is ``partition`` (default: ``node``) of 100.
    """
    partition = node if partition is None else partition
    hooks = ClientHooks(load_data=lambda _c: data(partition), build_model=model)
    app = register_hooks(ClientApp(), hooks, handlers=handlers)
    context = make_context(partition, 100)
    context.node_config.update(node_config or {})
    return lambda message: app(message, context)


def run_rounds(strategy: Any, grid: Any, initial: ArrayRecord, rounds: int,
               **train_config: Any) -> Any:
    """``strategy.start`` on ``grid`` for ``rounds`` rounds, 30 s timeout, the train
    config given as keyword arguments (``lr=0.1`` ...).
    """
    return strategy.start(grid, initial, num_rounds=rounds, timeout=30,
                          train_config=ConfigRecord(train_config),
                          evaluate_config=ConfigRecord())


QUICKSTART = Path(__file__).resolve().parent / "quickstart"
REPO = Path(__file__).resolve().parent.parent
# One round over three real SuperNodes, the smallest data (tests/tools/test_deployment*.py).
# A SuperNode's SuperExec looks for a message to start a ClientApp for every 0.5 s
# instead of Flower's 1 s: ~0.25 s less per message on average. At 0.2 s an idle
# 3-node federation burnt 0.137 CPU-s a second, at 1 s 0.065 (2026-12-02): the suite is
# CPU-bound on 2 cores, so a wait saved costs the other tests' CPU.
DEPLOYMENT_NODE_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5"}
DEPLOYMENT_RUN: dict[str, Any] = {
    "dataset": "synthetic", "partition": "natural", "batch-size": 16, "lr": 0.1,
    "min-available-nodes": 3, "num-server-rounds": 1, "fraction-evaluate": 0.0}


def completed_scenario(out: Path, name: str) -> dict[str, Any]:
    """The row that the test app tests/scenarios wrote for scenario ``name`` into
    ``out``, asserting that the scenario completed (else its error and traceback).
    """
    row: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    assert row["completed"], f"{name}: {row['error']}\n{row['traceback']}"
    return row


def bundled_app(folder: Path) -> Path:
    """A copy of the bundled app in ``folder``: ``pyproject.toml`` and ``fedgsp_flwr/``,
    the files its FAB takes (``fab-include``), so the same FAB.

    ``flwr run`` builds the FAB by walking every file under the app's directory before
    it filters them: in a clone with its ``.venv`` (64,000 files) that cost ~6 CPU-s a
    run (2026-12-03), where a copy costs nothing. tests/app/test_config.py builds the
    FAB of the repository itself.
    """
    app = folder / "bundled-app"
    app.mkdir(parents=True)
    shutil.copy2(REPO / "pyproject.toml", app)
    shutil.copytree(REPO / "fedgsp_flwr", app / "fedgsp_flwr",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return app


def quickstart_app(folder: Path, hooks: bool = False) -> Path:
    """A copy of the quickstart-shaped test app in ``folder``; with ``hooks``, its
    ClientApp is the one with our hooks registered (``app_with_hooks``).
    """
    app = folder / ("quickstart-hooks" if hooks else "quickstart")
    shutil.copytree(QUICKSTART, app, ignore=shutil.ignore_patterns("__pycache__"))
    if hooks:
        pyproject = app / "pyproject.toml"
        pyproject.write_text(pyproject.read_text().replace(
            'client_app:app"', 'client_app:app_with_hooks"'))
    return app
