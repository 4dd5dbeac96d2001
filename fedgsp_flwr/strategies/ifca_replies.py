"""IFCA's exchange beyond Flower's: the replies of a round, the check of a node's choice,
and the fallback that runs IFCA on a plain ClientApp (``train`` and ``evaluate`` only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..core.ifca import find_loss_key, pick_model
from ..protocol import ARRAYS, CONFIG, EVALUATE, IFCA_CHOICE, IFCA_LOSSES
from .exchange import collect_reply_list
from .metrics import reply_metrics
from .node_registry import NodeRegistry
from .replies import reply_problem

FALLBACK = ("each node scores the k models with k plain 'evaluate' messages (on its "
            "evaluation data, not its training data) and trains the one with the lowest "
            "loss with a plain 'train' message")


@dataclass
class RoundReplies:
    """The usable training replies of a round and why the others were not.

    Attributes
    ----------
    updates : dict[int, tuple[int, Message]]
        (model trained, reply) by node.
    rejected : dict[int, str]
        Why each other node's reply was unusable.
    messages, replies : list
        Every message sent and reply received (for the byte counts).
    """

    updates: dict[int, tuple[int, Message]] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    replies: list[Message] = field(default_factory=list)

    def sent(self, messages: Sequence[Message], replies: Sequence[Message | None]) -> None:
        """Note messages sent and the replies that came."""
        self.messages.extend(messages)
        self.replies.extend(r for r in replies if r is not None)

    def reject(self, server_round: int, node: int, problem: str) -> None:
        """Refuse ``node``'s reply, logged with ``problem``."""
        self.rejected[node] = problem
        log(WARNING, "IFCA round %d: rejected reply from node %d: %s", server_round, node,
            problem)


def choice_problem(choice: Any, losses: Any, k: int) -> str | None:
    """Why a node's reported choice and losses are unusable, or ``None``.

    The choice must be an integer in [0, k); the losses a list of k numbers; the chosen
    model's loss their minimum (any tie-break is accepted).
    """
    if isinstance(choice, bool) or not isinstance(choice, (int, float)) or not (
            float(choice).is_integer() and 0 <= choice < k):
        return f"metric '{IFCA_CHOICE}' must be an integer in [0, {k}), got {choice!r}"
    if not isinstance(losses, list) or len(losses) != k:
        return f"metric '{IFCA_LOSSES}' must list {k} losses, got {losses!r}"
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in losses):
        return f"metric '{IFCA_LOSSES}' has non-finite values: {losses!r}"
    if losses[int(choice)] > min(losses):
        return (f"model {int(choice)} was chosen with loss {losses[int(choice)]:.6g}, above "
                f"the minimum {min(losses):.6g}")
    return None


def plain_losses(replies: Sequence[Message | None], weighted_by_key: str,
                 loss_key: str | None) -> tuple[list[float] | None, str | None]:
    """The loss of each model from a node's plain ``evaluate`` replies (one a model), or
    why not: ``loss_key``, else the one metric named like a loss."""
    losses = []
    for model, reply in enumerate(replies):
        problem = ("no reply within the round's timeout" if reply is None else
                   reply_problem(reply, reference=None, weighted_by_key=weighted_by_key,
                                 require_arrays=False))
        if problem is not None or reply is None:
            return None, f"evaluation of model {model}: {problem}"
        metrics = reply_metrics(reply.content)
        key = find_loss_key(metrics, loss_key)
        if key is None:
            wanted = (f"'{loss_key}'" if loss_key else
                      "one metric named like a loss (pass loss_key=... to name it)")
            return None, (f"evaluate metrics {sorted(metrics)} have no loss: IFCA's "
                          f"fallback needs {wanted}")
        losses.append(float(cast(float, metrics[key])))
    return losses, None


def plain_choices(server_round: int, grid: Grid, nodes: Sequence[int],
                  models: Sequence[ArrayRecord], config: ConfigRecord, timeout: float,
                  known: NodeRegistry, weighted_by_key: str, loss_key: str | None,
                  out: RoundReplies) -> dict[int, int]:
    """The fallback's choice: each node evaluates the k models (plain ``evaluate``); the
    lowest loss wins. Nodes without k usable losses go to ``out.rejected``."""
    messages = [Message(RecordDict({ARRAYS: model, CONFIG: config}),
                        dst_node_id=node, message_type=EVALUATE)
                for node in nodes for model in models]
    replies = collect_reply_list(grid, messages, timeout)
    out.sent(messages, replies)
    known.forget_unanswered(
        (m.metadata.dst_node_id, r) for m, r in zip(messages, replies, strict=True))
    choices, k = {}, len(models)
    for i, node in enumerate(nodes):
        losses, problem = plain_losses(replies[i * k:(i + 1) * k], weighted_by_key, loss_key)
        if losses is None:
            out.reject(server_round, node, cast(str, problem))
        else:
            choices[node] = pick_model(losses)
    return choices
