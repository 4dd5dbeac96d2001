"""FedAvg rounds whose training messages go as one of our hook types (``train.<x>``),
and optionally their evaluations (``evaluate.<x>``), with plain ``train`` and
``evaluate`` for every node whose ClientApp lacks the handler.

Ditto, FedMMD and FedFusion build on it: their global model is FedAvg's, only the
clients' step differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING
from typing import ClassVar, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..protocol import EVALUATE, TRAIN
from . import saved
from .aggregation import array_bytes
from .exchange import collect_reply_list
from .fedavg import FedAvg
from .hook_support import HookSupport, missing_handler
from .replies import error_text
from .rounds import TrainResult
from .server_round import ServerSideRound


def retyped(message: Message, message_type: str) -> Message:
    """A new message with the content and destination of ``message``."""
    return Message(message.content, dst_node_id=message.metadata.dst_node_id,
                   message_type=message_type)


class HookedTrain(ServerSideRound):
    """FedAvg whose training messages are ``train_type`` (see the module docstring).

    The first ``train_type`` message goes to one node; if its ClientApp has no handler,
    one WARNING names the fallback and every node gets plain ``train`` messages (see
    :class:`~fedgsp_flwr.strategies.hook_support.HookSupport`). In a mixed federation, each
    node without the handler (after a successful probe) is logged once and takes the
    fallback alone.

    With an ``evaluate_type``, evaluations go as that type too, to the nodes that train
    with the hook; a node without its handler is evaluated with plain ``evaluate`` (one
    WARNING), and the round's evaluation metrics are computed in
    :meth:`evaluate_round`. Flower's ``configure_evaluate`` / ``aggregate_evaluate``
    pair, driven from another loop, evaluates the global model with plain ``evaluate``
    messages.

    Subclasses set the message config (:meth:`hook_config`), may change what a plain
    node is sent (:meth:`as_plain`) and how its evaluation reply reads
    (:meth:`complete_eval_reply`), and name the count of nodes that ran the hook
    (``hooked_metric``).

    A subclass names, as class attributes, its ``owner`` (the strategy's name, for the
    log), ``train_type`` (the hook's message type), ``fallbacks`` (what happens
    instead, by message type), ``hooked_metric`` (per-round metric: the nodes that
    trained with the hook) and ``evaluate_type`` (the hook's evaluation message type;
    ``None``: plain ``evaluate``). Its parameters are ServerSideRound's and FedAvg's.

    Attributes
    ----------
    plain : dict[int, str]
        Nodes whose ClientApp has no ``train_type`` handler, with why.
    """

    owner: ClassVar[str]
    train_type: ClassVar[str]
    fallbacks: ClassVar[Mapping[str, str]]
    hooked_metric: ClassVar[str]
    evaluate_type: ClassVar[str | None] = None

    # The state a checkpoint saves (node ids translated on resume):
    hooks = saved.learnt("hooks", HookSupport)  # the handlers found missing
    plain = saved.node_map("plain", optional=True)  # node -> why
    _plain_eval = saved.node_set("plain-eval", optional=True)  # lack evaluate_type alone

    def __post_init__(self) -> None:
        super().__post_init__()
        self.hooks = HookSupport(self.owner, self.fallbacks)

    # --- messages ---------------------------------------------------------------------

    def message_type(self, node: int, hook_type: str, plain_type: str) -> str:
        """``hook_type`` unless the node or the federation is known to lack it or the
        training hook.
        """
        if node in self.plain or not self.hooks.has(self.train_type) or not self.hooks.has(
                hook_type) or (hook_type == self.evaluate_type and node in self._plain_eval):
            return plain_type
        return hook_type

    def as_plain(self, message: Message, plain_type: str) -> Message:
        """The message a node without the hook gets instead (the same content)."""
        return retyped(message, plain_type)

    def route(self, message: Message, hook_type: str, plain_type: str) -> Message:
        """``message`` as ``hook_type``, or as the plain message where the hook lacks."""
        kind = self.message_type(message.metadata.dst_node_id, hook_type, plain_type)
        return retyped(message, kind) if kind == hook_type else self.as_plain(message, kind)

    def send_hooked(self, grid: Grid, messages: Sequence[Message], plain_type: str
                    ) -> tuple[list[Message], list[Message | None], list[Message]]:
        """Send the messages (a hook type probed first, see :class:`HookSupport`), then send
        again, as ``plain_type``, those a node answered without a handler for.

        Returns
        -------
        tuple[list[Message], list[Message | None], list[Message]]
            The message each reply answers (the plain one where sent again), the
            replies (``None``: none in time), and every message pushed.
        """
        if not messages:
            return [], [], []
        replies = self.hooks.collect(grid, messages, self.reply_timeout)
        pushed = [messages[i] for i in self.hooks.last_sent]
        final = list(messages)
        redo = [i for i, reply in enumerate(replies) if missing_handler(reply)]
        for i in redo:
            self.note_plain(messages[i], cast(Message, replies[i]))
            final[i] = self.as_plain(messages[i], plain_type)
        again = [final[i] for i in redo]
        for i, reply in zip(redo, collect_reply_list(grid, again, self.reply_timeout),
                            strict=True):
            replies[i] = reply
        return final, replies, pushed + again

    def note_plain(self, message: Message, reply: Message) -> None:
        """Remember a node whose ClientApp has no handler for ``message``'s type (logged
        here where :class:`HookSupport` did not warn for all nodes at once).
        """
        node, kind = message.metadata.dst_node_id, message.metadata.message_type
        if kind == self.train_type:
            self.plain[node] = f"no '{kind}' handler"
        self.plain_for(node, kind)
        if self.hooks.has(kind):
            log(WARNING, "%s: node %d has no '%s' handler (%s); it takes the fallback: "
                "%s", self.owner, node, kind, error_text(reply.error.reason),
                self.hooks.fallbacks[kind])

    def plain_for(self, node: int, kind: str) -> None:
        """Called when ``node`` turns out to lack the handler of ``kind``: remember a node
        that has the training hook but not the evaluation one."""
        if kind == self.evaluate_type:
            self._plain_eval.add(node)

    # --- training ---------------------------------------------------------------------

    def hook_config(self, config: ConfigRecord) -> None:
        """Add the hook's settings to the round's train config."""

    def train_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The model the round sends (FedFusion adds its fusion module)."""
        return arrays

    def complete_reply(self, message: Message, reply: Message) -> None:
        """Make a plain node's reply comparable with the hooked ones (in place)."""

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """FedAvg's round with ``train_type`` messages (a round that sends nothing is
        recorded as FedAvg records it).
        """
        self.hook_config(config)
        arrays = self.train_arrays(arrays)
        messages = [self.route(m, self.train_type, TRAIN)
                    for m in FedAvg.configure_train(self, server_round, arrays, config, grid)]
        sent, replies, pushed = self.send_hooked(grid, messages, TRAIN)
        for message, reply in zip(sent, replies, strict=True):
            if reply is not None and message.metadata.message_type == TRAIN:
                self.complete_reply(message, reply)
        self.history.answered(TRAIN, sent)
        arrays_out, metrics = FedAvg.aggregate_train(
            self, server_round, [r for r in replies if r is not None])
        counts = {
            self.hooked_metric: sum(
                m.metadata.message_type == self.train_type and r is not None
                and r.has_content() for m, r in zip(sent, replies, strict=True)),
            "plain-clients": sum(m.metadata.message_type == TRAIN for m in sent),
        }
        self.history[server_round].update(counts)
        self.history[server_round]["bytes-sent"] = array_bytes(pushed)
        if metrics is not None:
            metrics = MetricRecord({**dict(metrics), **counts})
        return arrays_out, metrics

    # --- evaluation -------------------------------------------------------------------

    def complete_eval_reply(self, reply: Message) -> None:
        """Make a plain node's evaluation reply comparable with the hooked ones (in
        place)."""

    def eval_counts(self) -> dict[str, int]:
        """Per-round counts added to the evaluation metrics."""
        return {}

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       grid: Grid, timeout: float) -> MetricRecord | None:
        """FedAvg's evaluation; with an ``evaluate_type``, sent as that type (plain
        ``evaluate`` where the hook lacks) and aggregated here.
        """
        if self.evaluate_type is None:
            return super().evaluate_round(server_round, arrays, config, grid, timeout)
        messages = list(self.configure_evaluate(server_round, arrays, config, grid))
        if not messages:
            return None
        messages = [self.route(m, self.evaluate_type, EVALUATE) for m in messages]
        sent, replies, _ = self.send_hooked(grid, messages, EVALUATE)
        for message, reply in zip(sent, replies, strict=True):
            if message.metadata.message_type == EVALUATE and reply is not None:
                self.complete_eval_reply(reply)
        self.history.answered(EVALUATE, sent)
        metrics = self.aggregate_evaluate(server_round, [r for r in replies if r is not None])
        counts = self.eval_counts()
        self.history[server_round].update(counts)
        return None if metrics is None else MetricRecord({**dict(metrics), **counts})
