"""Hook support: which of our message types the nodes' ClientApp handles.

:class:`HookSupport` learns it from at most two failed messages per type and run;
:func:`missing_handler` tells such a failure from other error replies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING
from typing import Any, cast

from flwr.app import Error, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..protocol import BASIC_TYPES, UNSUPPORTED_HOOK_TEXT
from .exchange import collect_reply_list, unreachable
from .replies import error_text

# What Flower's ClientApp raises for a message type it has no function for.
MISSING_HANDLER_TEXT = "function registered with name"
ADD_HOOKS = ("from fedgsp_flwr.clients import ClientHooks, register_hooks\n"
             "    register_hooks(app, ClientHooks(load_data=<your data>, "
             "build_model=<your model>))")


def missing_handler(reply: Message | None) -> bool:
    """Whether a reply is the ClientApp's error for a message type it has no handler
    for, or our handler's error saying it cannot serve the app (``UNSUPPORTED_HOOK_TEXT``).
    An error saying the node is unreachable says nothing of its handlers, whatever its
    text (the SuperLink's, or one forged as it).
    """
    if reply is None or not reply.has_error() or unreachable(reply):
        return False
    reason = reply.error.reason or ""
    return MISSING_HANDLER_TEXT in reason or UNSUPPORTED_HOOK_TEXT in reason


class HookSupport:
    """Which of our message types the nodes' ClientApp handles, learnt from at most two
    failed messages per type and run.

    The first message of a type not yet answered goes alone; if its node answers that
    the ClientApp has no handler for it, a message to another node goes alone too (in
    the same call, or the next that has one), so that one node cannot switch a hook off
    for all. Once two nodes say so, the other messages of that type are not sent (their
    replies are that same error) and one WARNING names the handler, the strategy's
    fallback and the lines that add our hooks: a ClientApp without a handler logs two
    tracebacks per run, not one per node. If the second node has the handler, the first
    node's answer is that node's alone (its caller refuses it, naming it).

    Parameters
    ----------
    owner : str
        The strategy's name, for the warning.
    fallbacks : Mapping[str, str]
        What the strategy does instead, by message type.
    level : int (default: WARNING)
        Log level of that message (INFO where the fallback loses nothing the user had
        with Flower's own strategy).
    """

    def __init__(self, owner: str, fallbacks: Mapping[str, str], level: int = WARNING
                 ) -> None:
        self.owner, self.fallbacks, self.level = owner, dict(fallbacks), level
        self.present: set[str] = set(BASIC_TYPES)
        self.missing: dict[str, Message] = {}  # message type -> the ClientApp's error
        self.last_sent: list[int] = []  # positions of the messages the last collect sent
        # Type -> the node that said its ClientApp lacks it, until another node confirms
        # (not in checkpoints: a resumed run asks again).
        self.doubted: dict[str, int] = {}

    def state(self) -> dict[str, Any]:
        """What the run learnt of the ClientApp's handlers, JSON-able, for checkpoints.

        A resumed run that learnt it anew would probe a type again with one message
        alone: in simulation that node, and the others after it, would then train
        with other thread counts than in the uninterrupted run
        (:class:`~fedgsp_flwr.threads.ThreadHintGrid`), and their results differ in
        the last bits.
        """
        return {"present": sorted(self.present),
                "missing": {kind: [reply.error.code, reply.error.reason]
                            for kind, reply in self.missing.items()}}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take back :meth:`state` (an older checkpoint's, without it: probe again)."""
        self.present.update(state.get("present", ()))
        for kind, (code, reason) in state.get("missing", {}).items():
            asked = Message(RecordDict(), dst_node_id=0, message_type=kind)
            self.missing[kind] = Message(Error(code=int(code), reason=reason),
                                         reply_to=asked)

    def has(self, message_type: str) -> bool:
        """Whether the type is not known to be missing."""
        return message_type not in self.missing

    def collect(self, grid: Grid, messages: Sequence[Message], timeout: float,
                poll_interval: float = 0.02) -> list[Message | None]:
        """:func:`collect_reply_list`, a type not yet answered probed first.

        A type neither known present nor missing goes first with one message alone; if
        its node says the ClientApp has no handler, a message to another node goes alone
        next (or, with none here, in a later call): the type is missing once two nodes
        say so. The other messages wait for the probes' replies; a probe whose node is
        silent or fails otherwise decides nothing, and the others are sent when its
        ``timeout`` ends, with a ``timeout`` of their own (so the call can take up to
        three times ``timeout``).

        Returns
        -------
        list[Message | None]
            The reply to each message in order (the probe's error for the messages of
            a missing type; ``None`` where none came in time).
        """
        replies: list[Message | None] = [None] * len(messages)
        sent: set[int] = set()
        undecided: set[str] = set()  # probed in this call without an answer that decides
        for _ in range(2):  # a probe, then another node's where the first said "none"
            probes = self._probes(messages, sent, undecided)
            if not probes:
                break
            answers = collect_reply_list(grid, [messages[i] for i in probes.values()],
                                         timeout, poll_interval)
            sent.update(probes.values())
            for (kind, i), reply in zip(probes.items(), answers, strict=True):
                replies[i] = reply
                if not self._learn(kind, messages[i].metadata.dst_node_id, reply):
                    undecided.add(kind)
        rest = [i for i, m in enumerate(messages) if i not in sent
                and m.metadata.message_type not in self.missing]
        for i, reply in zip(rest, collect_reply_list(grid, [messages[i] for i in rest],
                                                     timeout, poll_interval), strict=True):
            replies[i] = reply
        sent.update(rest)
        self.last_sent = sorted(sent)
        for i, message in enumerate(messages):
            if i not in sent and message.metadata.message_type in self.missing:
                replies[i] = self.missing_reply(message)
        return replies

    def _probes(self, messages: Sequence[Message], sent: set[int], undecided: set[str]
                ) -> dict[str, int]:
        """Per type still to learn: the first message not sent yet to a node other than
        the one that said its ClientApp has no handler."""
        probes: dict[str, int] = {}
        for i, message in enumerate(messages):
            kind = message.metadata.message_type
            if (i not in sent and kind not in probes and kind not in undecided
                    and kind not in self.present and kind not in self.missing
                    and message.metadata.dst_node_id != self.doubted.get(kind)):
                probes[kind] = i
        return probes

    def _learn(self, kind: str, node: int, reply: Message | None) -> bool:
        """Take a probe's reply from ``node``; whether it settled what this call can
        learn of ``kind`` (``False``: silent, or an error that says nothing of it)."""
        if reply is not None and not reply.has_error():
            self.present.add(kind)
            self.doubted.pop(kind, None)  # that node's reply was its own
            return True
        if not missing_handler(reply):
            return False
        if self.doubted.get(kind, node) != node:
            self._mark_missing(kind, cast(Message, reply))  # two nodes say so
            del self.doubted[kind]
        else:
            self.doubted[kind] = node
        return True

    def missing_reply(self, message: Message) -> Message:
        """The error reply of a message of a missing type, as if its node had answered."""
        error = self.missing[message.metadata.message_type].error
        return Message(Error(code=error.code, reason=error.reason), reply_to=message)

    def _mark_missing(self, kind: str, reply: Message) -> None:
        self.missing[kind] = reply
        log(self.level, "%s: the nodes' ClientApp has no '%s' handler (node %d answered: %s). "
            "Fallback: %s. The other nodes are not asked. To add our handlers to your "
            "ClientApp:\n    %s", self.owner, kind, reply.metadata.src_node_id,
            error_text(reply.error.reason),
            self.fallbacks.get(kind, "the run goes on without it"),
            ADD_HOOKS)

