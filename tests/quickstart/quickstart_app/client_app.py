"""The ClientApp of Flower's quickstart-pytorch (message API), unchanged but for MNIST.

``app`` is the plain app; ``app_with_hooks`` is the same app after the lines that add
fedgsp-flwr's hooks (class histograms, sketches, bi-level training).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader

from quickstart_app.task import Net, load_data
from quickstart_app.task import test as test_fn
from quickstart_app.task import train as train_fn

torch.set_num_threads(1)


def _node_data(context: Context) -> tuple[DataLoader, DataLoader]:
    """The node's partition, as the quickstart loads it."""
    return load_data(int(context.node_config["partition-id"]),
                     int(context.node_config["num-partitions"]),
                     int(context.run_config["train-examples"]))


def _train(msg: Message, context: Context) -> Message:
    """Train the model on local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader, _ = _node_data(context)
    train_loss = train_fn(model, trainloader, int(context.run_config["local-epochs"]),
                          float(msg.content["config"]["lr"]))
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


def _evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the model on local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, valloader = _node_data(context)
    eval_loss, eval_acc = test_fn(model, valloader)
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc,
               "num-examples": len(valloader.dataset)}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def make_app() -> ClientApp:
    """A ClientApp with the quickstart's two handlers."""
    client = ClientApp()
    client.train()(_train)
    client.evaluate()(_evaluate)
    return client


app = make_app()


# --- the same app with fedgsp-flwr's hooks: these lines are all it takes -------------
# (the defaults are the settings of the app's own loop, for the training our hooks do:
# StoCFL's sketches and bi-level update)
from fedgsp_flwr.clients import ClientHooks, TrainSettings, register_hooks

app_with_hooks = register_hooks(make_app(), ClientHooks(
    load_data=_node_data, build_model=lambda *_: Net(),
    defaults=lambda _context: TrainSettings(momentum=0.9, batch_size=32)))
