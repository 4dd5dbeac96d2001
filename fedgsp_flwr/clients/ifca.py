"""The ``train.ifca`` handler: IFCA's client step (Ghosh et al., 2020, Algorithm 1).

``train.ifca``
    in: ArrayRecords ``model-0`` ... ``model-{k-1}`` (the k cluster models) and
    ``config`` (the training settings of ``train``). The node computes the loss of every
    model on its training data, chooses the lowest (ties: the lower index), trains that
    model as ``train`` does and returns it. out: ``arrays`` (the trained chosen model),
    ``metrics`` (``train-loss``, ``num-examples``, ``ifca-choice``, ``ifca-losses``: the
    k losses before training, a non-finite one reported as the largest float).

Any ClientApp can register it next to its own handlers::

    app.train("ifca")(make_ifca_handler(ClientHooks(load_data=..., build_model=...)))
"""

from __future__ import annotations

import re
from collections.abc import Callable

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from ..core.ifca import (
    pick_model,
    reported_losses,
)
from ..protocol import (
    ARRAYS,
    IFCA_CHOICE,
    IFCA_LOSSES,
    IFCA_MODEL_PREFIX,
    METRICS,
    NUM_EXAMPLES,
    TRAIN_LOSS,
    ifca_model_record,
)
from ..training import evaluate
from .handlers import (
    ClientHooks,
    TrainSettings,
    local_seed,
    message_config,
    model_from_message,
    train_with_settings,
)

_MODEL_NAME = re.compile(rf"{re.escape(IFCA_MODEL_PREFIX)}(\d+)")


def model_count(message: Message) -> int:
    """The number k of models a ``train.ifca`` message carries.

    Raises
    ------
    ValueError
        If its ``model-<i>`` ArrayRecords are not exactly ``model-0`` ... ``model-{k-1}``.
    """
    indices = sorted(int(m.group(1)) for key in message.content.array_records
                     if (m := _MODEL_NAME.fullmatch(key)))
    if not indices or indices != list(range(len(indices))):
        raise ValueError(
            f"a '{message.metadata.message_type}' message must carry ArrayRecords "
            f"{ifca_model_record(0)} ... {ifca_model_record(len(indices) - 1 if indices else 0)}, "
            f"got {sorted(message.content.array_records)}")
    return len(indices)


def make_ifca_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``train.ifca`` (see the module docstring).

    The losses are the mean cross-entropy of each model on the node's whole training
    split, in evaluation mode (the same loop as ``evaluate``); the chosen model then
    trains exactly as the ``train`` handler trains a model it receives (same settings,
    same seed), so a node with one model is a FedAvg node.
    """

    def handle(message: Message, context: Context) -> Message:
        k = model_count(message)
        config = message_config(message)
        data = hooks.client_data(context)
        settings = TrainSettings.from_config(config, hooks.defaults(context))
        records = message.content.array_records
        model = model_from_message(message, hooks, context, data, ifca_model_record(0))
        losses = []
        for index in range(k):
            if index:
                model.load_state_dict(records[ifca_model_record(index)].to_torch_state_dict())
            losses.append(evaluate(model, data.x_train, data.y_train)[0])
        choice = pick_model(losses)
        model.load_state_dict(records[ifca_model_record(choice)].to_torch_state_dict())
        result = train_with_settings(model, data, settings, local_seed(context, config))
        metrics = MetricRecord({
            TRAIN_LOSS: result.loss,
            NUM_EXAMPLES: result.num_examples,
            IFCA_CHOICE: choice,
            IFCA_LOSSES: reported_losses(losses),
        })
        content = RecordDict({ARRAYS: ArrayRecord(model.state_dict()),
                              METRICS: metrics})
        return Message(content=content, reply_to=message)

    return handle
