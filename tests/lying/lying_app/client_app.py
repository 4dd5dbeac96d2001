"""A plain ClientApp (Flower quickstart-shaped ``@app.train()`` / ``@app.evaluate()``,
its own metric names) with fedgsp-flwr's hooks registered, so that every strategy can
run, and a mod through which partition 0 lies in every train reply.

The lie is named by the message config's ``lie`` (the ServerApp's train config):

``garbage``
    the first array of each ArrayRecord keeps its declared dtype, shape and byte length,
    its bytes are garbage (behind numpy's magic string, so a decoder reads a header);
``shape``
    the first array of each ArrayRecord keeps its declared dtype and shape, its bytes
    are those of a (1,)-shaped array of that dtype (numpy would broadcast it).
"""

from __future__ import annotations

import io

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedgsp_flwr.clients import ClientHooks, TrainSettings, register_hooks
from lying_app.task import CLASSES, Net, load_partition

torch.set_num_threads(1)
LIAR = 0
"""The partition that lies."""
LIES = ("garbage", "shape")


def _partition(context: Context) -> int:
    return int(context.node_config["partition-id"])


def _train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_partition(_partition(context))
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.1)))
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    metrics = MetricRecord({"train_loss": loss.item(), "num-examples": len(y)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


def _evaluate(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_partition(_partition(context))
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
    metrics = MetricRecord({
        "eval_loss": float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))),
        "eval_acc": float((logits.argmax(1).numpy() == y).mean()),
        "num-examples": len(y)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


def lying_array(array: Array, lie: str) -> Array:
    """``array``'s declaration (dtype, shape, stype) over the bytes of ``lie``."""
    if lie == "shape":
        buffer = io.BytesIO()
        np.save(buffer, np.full((1,), 7, dtype=np.dtype(array.dtype)), allow_pickle=False)
        data = buffer.getvalue()
    else:
        magic = b"\x93NUMPY"
        data = magic + np.random.default_rng(46).bytes(max(len(array.data) - len(magic), 8))
    return Array(dtype=array.dtype, shape=tuple(array.shape), stype=array.stype, data=data)


def lie_mod(msg: Message, context: Context, call_next) -> Message:
    """Partition ``LIAR`` corrupts the first array of every ArrayRecord of its replies to
    ``train`` and ``train.<x>`` messages (error replies pass as they are).
    """
    reply = call_next(msg, context)
    if (_partition(context) != LIAR or msg.metadata.message_type.split(".")[0] != "train"
            or reply.has_error()):
        return reply
    configs = msg.content.config_records
    lie = str(configs["config"].get("lie", "garbage")) if "config" in configs else "garbage"
    for record in reply.content.array_records.values():
        key = next(iter(record.keys()), None)
        if key is not None:
            record[key] = lying_array(record[key], lie)
    return reply


def make_app() -> ClientApp:
    """The plain app with our hooks, behind the lying mod."""
    client = ClientApp(mods=[lie_mod])
    client.train()(_train)
    client.evaluate()(_evaluate)
    return register_hooks(client, ClientHooks(
        load_data=lambda context: load_partition(_partition(context)),
        build_model=lambda *_: Net(), num_classes=CLASSES,
        defaults=lambda _context: TrainSettings(lr=0.1, batch_size=16)))


app = make_app()
