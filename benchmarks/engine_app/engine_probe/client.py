"""ClientApp of the engine probe: a no-op, a logistic model, or a relay hop's CNN."""

from __future__ import annotations

import os
import time

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedgsp_flwr.clients import threads_mod

from .workloads import hop_training

app = ClientApp(mods=[threads_mod])


def _logistic(context: Context, arrays: ArrayRecord) -> ArrayRecord:
    import torch

    from fedgsp_flwr.training import train

    model = torch.nn.Linear(60, 10)
    model.load_state_dict({"weight": torch.from_numpy(arrays["weight"].numpy()),
                           "bias": torch.from_numpy(arrays["bias"].numpy())})
    rng = np.random.default_rng(int(context.node_config.get("partition-id", 0)))
    x = rng.normal(size=(200, 60)).astype(np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int64)
    train(model, x, y, epochs=1, lr=0.05, batch_size=32, seed=0)
    return ArrayRecord({k: Array(v.detach().numpy()) for k, v in model.state_dict().items()})


def _hop(context: Context, arrays: ArrayRecord) -> tuple[ArrayRecord, float]:
    from fedgsp_flwr.models import build_model

    model = build_model("cnn", (1, 28, 28), 10, 0)
    model.load_state_dict(arrays.to_torch_state_dict())
    seconds = hop_training(model, int(context.node_config.get("partition-id", 0)), seed=0)
    return ArrayRecord(model.state_dict()), seconds


@app.train()
def train(message: Message, context: Context) -> Message:
    """Do the message's ``work`` and reply with the model and what it cost."""
    import torch

    config = message.content["config"]
    arrays = message.content["arrays"]
    started = time.perf_counter()
    seconds = 0.0
    if config["work"] == "logistic":
        arrays = _logistic(context, arrays)
    elif config["work"] == "hop":
        arrays, seconds = _hop(context, arrays)
    metrics = MetricRecord({"num-examples": 1, "train-seconds": seconds,
                            "handler-seconds": time.perf_counter() - started,
                            "threads": torch.get_num_threads(), "pid": os.getpid()})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=message)
