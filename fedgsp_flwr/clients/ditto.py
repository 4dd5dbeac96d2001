"""The ``train.ditto`` and ``evaluate.ditto`` handlers: Ditto's client side (Li, Hu,
Beirami, Smith, ICML 2021, Algorithm 1).

The node keeps a personal model v in its node state (``context.state``, ArrayRecord
:data:`PERSONAL_KEY`). It never leaves the node.

``train.ditto``
    in: ``arrays`` (the global model w^t) and ``config`` (the training settings of
    ``train``; ``lambda`` >= 0, required; optional ``personal-epochs`` or
    ``personal-steps``, 0 or absent: the same epochs / steps as w's training). v (w^t if
    the node has none yet) trains on the local loss + lambda/2 ||v - w^t||^2 and is
    stored; w^t trains exactly as ``train`` trains it (same settings, same seed: the same
    mini-batches as v's, as in the authors' code). out: ``arrays`` (the trained w only),
    ``metrics`` (``train-loss`` of w, ``personal-train-loss``, ``num-examples``).
``evaluate.ditto``
    in: ``arrays`` (w). out: ``metrics``: ``eval-loss``, ``eval-acc`` and
    ``num-examples`` of the personal model on the node's test split (of w if the node has
    no personal model yet: one that never trained would start from w),
    ``eval-loss-global`` and ``eval-acc-global`` of w, and ``personal-model``: 1 if the
    node has a personal model, else 0.

Any ClientApp can register them next to its own handlers::

    app.train("ditto")(make_ditto_train_handler(hooks))
    app.evaluate("ditto")(make_ditto_evaluate_handler(hooks))

The node state lives as long as the node's Context: the run in simulation; the
SuperNode process in deployment (a restarted SuperNode starts again from w).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from ..core.ditto import PERSONAL_FLAG, TRAIN_TYPE
from ..data import ClientData
from ..training import evaluate
from .handlers import (
    ARRAYS_KEY,
    METRICS_KEY,
    ClientHooks,
    TrainSettings,
    model_from_message,
    train_with_settings,
    local_seed,
    message_config,
)

if TYPE_CHECKING:
    import torch

PERSONAL_KEY = "ditto-personal"
"""The node state's ArrayRecord holding the personal model."""


def ditto_lambda(config: ConfigRecord) -> float:
    """The message config's ``lambda``.

    Raises
    ------
    ValueError
        If it is missing or not a finite number >= 0.
    """
    lam = config.get("lambda")
    if (isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam)
            or lam < 0):
        raise ValueError(f"a '{TRAIN_TYPE}' message config needs 'lambda', a finite number "
                         f">= 0, got {lam!r}")
    return float(lam)


def personal_settings(config: ConfigRecord, settings: TrainSettings) -> TrainSettings:
    """The personal model's training settings: w's, with ``personal-steps`` or
    ``personal-epochs`` from the config where set (> 0).

    Raises
    ------
    ValueError
        If either is not an integer >= 0, or both are > 0.
    """
    counts = {}
    for key in ("personal-epochs", "personal-steps"):
        value = config.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"message config '{key}' must be an integer >= 0, got {value!r}")
        counts[key] = value
    epochs, steps = counts["personal-epochs"], counts["personal-steps"]
    if epochs and steps:
        raise ValueError("message config sets both 'personal-epochs' and 'personal-steps'; "
                         "set at most one")
    if steps:
        return replace(settings, local_steps=steps)
    if epochs:
        return replace(settings, local_epochs=epochs, local_steps=0)
    return settings


def _personal_model(hooks: ClientHooks, context: Context, data: ClientData,
                    start: ArrayRecord) -> torch.nn.Module:
    """The node's personal model, or a model holding ``start`` if it has none.

    Raises
    ------
    ValueError
        If the stored personal model does not fit the app's model.
    """
    model = hooks.build_model(context, data)
    stored = context.state.array_records.get(PERSONAL_KEY)
    try:
        model.load_state_dict((start if stored is None else stored).to_torch_state_dict())
    except RuntimeError as err:
        if stored is None:
            raise
        raise ValueError(f"the node's personal model (context.state['{PERSONAL_KEY}']) "
                         f"does not fit the model: {err}") from err
    return model


def make_ditto_train_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``train.ditto`` (see the module docstring).

    The personal step is the ``train`` loop's proximal term with weight ``lambda`` and
    centre w^t, the model received (Algorithm 1: v_k <- v_k - eta (grad F_k(v_k) +
    lambda (v_k - w^t))). The personal model is built and trained first, with torch's
    global random state restored afterwards, so that w trains bit for bit as a plain
    ``train`` message would train it (also with dropout).
    """

    def handle(message: Message, context: Context) -> Message:
        import torch

        config = message_config(message)
        data = hooks.client_data(context)
        settings = TrainSettings.from_config(config, hooks.defaults(context))
        lam = ditto_lambda(config)
        own = personal_settings(config, settings)
        seed = local_seed(context, config)
        received = model_from_message(message, hooks, context, data)
        with torch.random.fork_rng(devices=[]):
            personal = _personal_model(hooks, context, data,
                                       message.content.array_records[ARRAYS_KEY])
            personal_result = train_with_settings(personal, data, own, seed, lam, received)
        global_result = train_with_settings(received, data, settings, seed)
        context.state[PERSONAL_KEY] = ArrayRecord(personal.state_dict())
        metrics = MetricRecord({
            "train-loss": global_result.loss,
            "personal-train-loss": personal_result.loss,
            "num-examples": global_result.num_examples,
        })
        content = RecordDict({ARRAYS_KEY: ArrayRecord(received.state_dict()),
                              METRICS_KEY: metrics})
        return Message(content=content, reply_to=message)

    return handle


def make_ditto_evaluate_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``evaluate.ditto`` (see the module docstring): the node's
    personal model and the received global model on its test split. Changes no state.
    """

    def handle(message: Message, context: Context) -> Message:
        data = hooks.client_data(context)
        received = model_from_message(message, hooks, context, data)
        global_loss, global_acc = evaluate(received, data.x_test, data.y_test)
        loss, accuracy = global_loss, global_acc
        has_personal = PERSONAL_KEY in context.state.array_records
        if has_personal:
            personal = _personal_model(hooks, context, data,
                                       message.content.array_records[ARRAYS_KEY])
            loss, accuracy = evaluate(personal, data.x_test, data.y_test)
        metrics = MetricRecord({
            "eval-loss": loss,
            "eval-acc": accuracy,
            "num-examples": len(data.y_test),
            "eval-loss-global": global_loss,
            "eval-acc-global": global_acc,
            PERSONAL_FLAG: int(has_personal),
        })
        return Message(content=RecordDict({METRICS_KEY: metrics}), reply_to=message)

    return handle
