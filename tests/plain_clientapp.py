"""A plain Flower ClientApp shaped like Flower's quickstart-pytorch: only ``@app.train()``
and ``@app.evaluate()``, its own model, data and training loop, its own metric names
(``train_loss``, ``eval_loss``, ``eval_acc``), ``lr`` read from the message config only,
nothing of ours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

CLASSES, FEATURES = 4, 6


class Net(torch.nn.Module):
    """A linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class BatchNormNet(Net):
    """The linear classifier followed by batch normalisation of its logits: an int64
    buffer (``bn.num_batches_tracked``) and running statistics beside the weights.
    """

    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x))


def load_partition(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Node i holds mostly class i mod 4 (label skew): 40 examples."""
    rng = np.random.default_rng(partition_id)
    y = np.where(rng.random(40) < 0.8, partition_id % CLASSES, rng.integers(0, CLASSES, 40))
    x = (rng.normal(size=(40, FEATURES)) + np.eye(CLASSES, FEATURES)[y] * 2).astype(np.float32)
    return x, y


def make_app(seen: list[tuple[str, dict[str, Any]]] | None = None,
             fail: Callable[[Message], str | None] = lambda _msg: None,
             net: Callable[[], torch.nn.Module] = Net) -> ClientApp:
    """A fresh ClientApp (each test registers its own handlers on it).

    ``seen`` receives (message type, config) of every message the app handles;
    ``fail`` returns an error text for the train messages the app must fail (raised
    as the app's own exception), ``None`` for the others; ``net`` builds the model.
    """
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        config = dict(msg.content["config"])
        if seen is not None:
            seen.append((msg.metadata.message_type, config))
        if (error := fail(msg)) is not None:
            raise RuntimeError(error)
        model = net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = load_partition(int(context.node_config["partition-id"]))
        optimizer = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)),
                                                 torch.from_numpy(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        metrics = MetricRecord({"train_loss": loss.item(), "num-examples": len(y)})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        if seen is not None:
            seen.append((msg.metadata.message_type, dict(msg.content["config"])))
        model = net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = load_partition(int(context.node_config["partition-id"]))
        with torch.no_grad():
            logits = model(torch.from_numpy(x))
        metrics = MetricRecord({
            "eval_loss": float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))),
            "eval_acc": float((logits.argmax(1).numpy() == y).mean()),
            "num-examples": len(y)})
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

    return app


def plain_grid(nodes: int) -> Any:
    """A FakeGrid of ``nodes`` nodes running this app, node i holding partition i."""
    from fakegrid import FakeGrid
    from helpers import make_context

    handlers = {}
    for node in range(nodes):
        app, context = make_app(), make_context(node, nodes)
        handlers[node] = lambda message, a=app, c=context: a(message, c)
    return FakeGrid(handlers)
