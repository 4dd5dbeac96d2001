"""The ``train.ditto`` and ``evaluate.ditto`` handlers: Ditto's client side (Li, Hu,
Beirami, Smith, ICML 2021, Algorithm 1).

The node keeps a personal model v in its node state (``context.state``, ArrayRecord
:data:`PERSONAL_KEY`), or, when the app's hooks name a node-local state directory
(:attr:`ClientHooks.state_dir <fedgsp_flwr.clients.ClientHooks.state_dir>`), in a file
there (:class:`PersonalStore`), so that it outlives the run: a resumed run is a new
Flower run with a new node state. It never leaves the node.

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
SuperNode process in deployment (a restarted SuperNode starts again from w). A state
directory keeps v across runs and restarts.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from ..data import ClientData
from ..protocol import (
    ARRAYS,
    EVAL_ACC,
    EVAL_LOSS,
    LAMBDA,
    METRICS,
    NUM_EXAMPLES,
    PARTITION_ID,
    PERSONAL_EPOCHS,
    PERSONAL_MODEL,
    PERSONAL_STEPS,
    SERVER_ROUND,
    TRAIN_DITTO,
    TRAIN_LOSS,
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

if TYPE_CHECKING:
    import torch

PERSONAL_KEY = "ditto-personal"
"""The node state's ArrayRecord holding the personal model."""

StateDict = Mapping[str, Any]


class PersonalStore:
    """A node's personal models on disk, by the server round that trained them.

    ``<directory>/ditto-<node>-r<round>.pt`` (``<node>``: ``partition-<id>`` when the
    node config has a ``partition-id``, else ``node-<id>``). Saving round t keeps the
    newest earlier version beside it and deletes the others: a run interrupted in round
    t after this node trained, and resumed from the checkpoint of round t - 1, trains
    round t again from the version before t, bit for bit as the uninterrupted run did.

    Parameters
    ----------
    directory : str | Path
        The node-local directory (created on the first save).
    node : str
        The node's name in the file names.
    """

    def __init__(self, directory: str | Path, node: str) -> None:
        self.directory, self.node = Path(directory), node
        self._pattern = re.compile(rf"ditto-{re.escape(node)}-r(\d+)\.pt")

    @classmethod
    def of(cls, directory: str | Path, context: Context) -> PersonalStore:
        """The store of the context's node in ``directory``."""
        partition = context.node_config.get(PARTITION_ID)
        node = f"node-{context.node_id}" if partition is None else f"partition-{partition}"
        return cls(directory, node)

    def versions(self) -> dict[int, Path]:
        """The stored versions, by round."""
        if not self.directory.is_dir():
            return {}
        found = (self._pattern.fullmatch(p.name) for p in self.directory.iterdir())
        return {int(m.group(1)): self.directory / m.group(0) for m in found if m}

    def load(self, before: int) -> StateDict | None:
        """The newest personal model trained in a round before ``before``, if any."""
        import torch

        versions = self.versions()
        earlier = [r for r in versions if r < before]
        if not earlier:
            return None
        return torch.load(versions[max(earlier)], weights_only=True)

    def save(self, server_round: int, state: StateDict) -> None:
        """Store the personal model trained in ``server_round`` (atomically)."""
        import torch

        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"ditto-{self.node}-r{server_round}.pt"
        tmp = path.with_name(path.name + ".tmp")
        torch.save(dict(state), tmp)
        os.replace(tmp, path)
        versions = self.versions()
        keep = {server_round, max((r for r in versions if r < server_round), default=-1)}
        for round_, old in versions.items():
            if round_ not in keep:
                old.unlink(missing_ok=True)


def _server_round(config: ConfigRecord) -> int:
    value = config.get(SERVER_ROUND)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(  # noqa: TRY004 - a bad message, as the other config checks
            f"a Ditto message config needs 'server-round' (an integer) to "
            f"version the stored personal model, got {value!r}")
    return value


def _store(hooks: ClientHooks, context: Context) -> PersonalStore | None:
    directory = hooks.state_dir(context)
    return PersonalStore.of(directory, context) if directory else None


def load_personal(hooks: ClientHooks, context: Context, config: ConfigRecord, *,
                  evaluating: bool) -> StateDict | None:
    """The node's personal model as of the message's round, or None if it has none.

    From the hooks' state directory if they name one (for training round t: the version
    of a round before t; for evaluating round t, which follows its training: of round t
    or before), else from the node state.
    """
    store = _store(hooks, context)
    if store is None:
        stored = context.state.array_records.get(PERSONAL_KEY)
        return None if stored is None else stored.to_torch_state_dict()
    return store.load(before=_server_round(config) + int(evaluating))


def save_personal(hooks: ClientHooks, context: Context, config: ConfigRecord,
                  state: StateDict) -> None:
    """Keep the trained personal model: in the state directory or the node state."""
    store = _store(hooks, context)
    if store is None:
        context.state[PERSONAL_KEY] = ArrayRecord(dict(state))
    else:
        store.save(_server_round(config), state)


def ditto_lambda(config: ConfigRecord) -> float:
    """The message config's ``lambda``.

    Raises
    ------
    ValueError
        If it is missing or not a finite number >= 0.
    """
    lam = config.get(LAMBDA)
    if (isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam)
            or lam < 0):
        raise ValueError(f"a '{TRAIN_DITTO}' message config needs 'lambda', a finite number "
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
    for key in (PERSONAL_EPOCHS, PERSONAL_STEPS):
        value = config.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"message config '{key}' must be an integer >= 0, got {value!r}")
        counts[key] = value
    epochs, steps = counts[PERSONAL_EPOCHS], counts[PERSONAL_STEPS]
    if epochs and steps:
        raise ValueError("message config sets both 'personal-epochs' and 'personal-steps'; "
                         "set at most one")
    if steps:
        return replace(settings, local_steps=steps)
    if epochs:
        return replace(settings, local_epochs=epochs, local_steps=0)
    return settings


def _personal_model(hooks: ClientHooks, context: Context, data: ClientData,
                    stored: StateDict | None, start: ArrayRecord) -> torch.nn.Module:
    """A model holding the node's personal model ``stored``, or ``start`` if it has none.

    Raises
    ------
    ValueError
        If the stored personal model does not fit the app's model.
    """
    model = hooks.build_model(context, data)
    try:
        model.load_state_dict(start.to_torch_state_dict() if stored is None else stored)
    except RuntimeError as err:
        if stored is None:
            raise
        store = _store(hooks, context)
        where = f"context.state['{PERSONAL_KEY}']" if store is None else str(store.directory)
        raise ValueError(f"the node's personal model ({where}) does not fit the model: "
                         f"{err}") from err
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
        stored = load_personal(hooks, context, config, evaluating=False)
        with torch.random.fork_rng(devices=[]):
            personal = _personal_model(hooks, context, data, stored,
                                       message.content.array_records[ARRAYS])
            personal_result = train_with_settings(personal, data, own, seed, lam, received)
        global_result = train_with_settings(received, data, settings, seed)
        save_personal(hooks, context, config, personal.state_dict())
        metrics = MetricRecord({
            TRAIN_LOSS: global_result.loss,
            "personal-train-loss": personal_result.loss,
            NUM_EXAMPLES: global_result.num_examples,
        })
        content = RecordDict({ARRAYS: ArrayRecord(received.state_dict()),
                              METRICS: metrics})
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
        stored = load_personal(hooks, context, message_config(message), evaluating=True)
        has_personal = stored is not None
        if has_personal:
            personal = _personal_model(hooks, context, data, stored,
                                       message.content.array_records[ARRAYS])
            loss, accuracy = evaluate(personal, data.x_test, data.y_test)
        metrics = MetricRecord({
            EVAL_LOSS: loss,
            EVAL_ACC: accuracy,
            NUM_EXAMPLES: len(data.y_test),
            "eval-loss-global": global_loss,
            "eval-acc-global": global_acc,
            PERSONAL_MODEL: int(has_personal),
        })
        return Message(content=RecordDict({METRICS: metrics}), reply_to=message)

    return handle
