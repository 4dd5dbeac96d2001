"""Reply collection: push messages through the Grid, poll for their replies and match
each reply to the message it answers.

Exchanges refuse forged, stray and doubled replies (:class:`Exchange`), wait between
polls with a backoff (:class:`PollBackoff`) and tell a node that is gone
(:func:`unreachable`, :func:`from_superlink`) from one that answered with an error;
:func:`screen` sorts a round's replies into the sound ones and each node's problems.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Generic, TypeVar

from flwr.app import Error, Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

# Error replies the SuperLink makes for a node that is gone, not ones its ClientApp sent.
UNREACHABLE_ERRORS = (ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE,
                      ErrorCode.REPLY_MESSAGE_UNAVAILABLE)


Key = TypeVar("Key")
NO_REPLY = "no reply within the round's timeout"


class Exchange:
    """The replies of one exchange, matched to the messages sent.

    A reply counts only as the answer of the node its message went to: one that answers
    no message of this exchange, or comes from another node than the one asked (a
    forged reply), is ignored with a WARNING naming its node; the SuperLink's error
    reply for a node gone offline (:func:`from_superlink`) is that node's answer. A
    node that answers one message twice has both answers refused, whatever their
    order: its answer becomes one error reply saying so (logged once, where error
    replies are).

    Parameters
    ----------
    messages : Sequence[Message] | None
        The messages sent, with the ids the grid gave them; ``None``: not known (a
        caller that drives the aggregation itself), then only duplicates, by node, are
        refused: both replies are dropped, logged once (the SuperLink's error replies,
        all from ``SUPERLINK_NODE_ID``, are kept: one per node gone).
    stage : str
        Name used in log lines.
    pushed : Iterable[str] | None
        The ids of the messages the grid took (default: every message with an id).
    """

    def __init__(self, messages: Sequence[Message] | None, stage: str,
                 pushed: Iterable[str] | None = None) -> None:
        self.messages, self.stage = messages, stage
        taken = None if pushed is None else set(pushed)
        self.position = None if messages is None else {
            m.metadata.message_id: i for i, m in enumerate(messages)
            if m.metadata.message_id and (taken is None or m.metadata.message_id in taken)}
        self.replies: list[Message | None] = [None] * (len(messages or ()))
        self.answered: dict[object, int] = {}
        self.loose: list[Message] = []  # replies kept when the messages are not known
        self.twice: set[int] = set()

    def take(self, reply: Message) -> None:
        """Count ``reply`` (or ignore it, see the class doc)."""
        src = reply.metadata.src_node_id
        if self.position is None or self.messages is None:
            if from_superlink(reply):  # one per node gone, all from SUPERLINK_NODE_ID
                self.loose.append(reply)
            elif src in self.answered:
                self.twice.add(self.answered[src])
            else:
                self.answered[src] = len(self.loose)
                self.loose.append(reply)
            return
        key = reply.metadata.reply_to_message_id
        i = self.position.get(key)
        if i is None:
            log(WARNING, "%s: ignored a reply from node %d to no message of this exchange",
                self.stage, src)
        elif src != (dst := self.messages[i].metadata.dst_node_id) and not from_superlink(reply):
            log(WARNING, "%s: ignored a reply from node %d to the message sent to node %d",
                self.stage, src, dst)
        elif key in self.answered:
            self.twice.add(i)
        else:
            self.answered[key] = i
            # The SuperLink's verdict as the node's own error reply: replies are named,
            # and told apart, by their source node.
            self.replies[i] = (Message(reply.error, reply_to=self.messages[i])
                               if src != dst else reply)

    def pending(self) -> list[str]:
        """Ids of the messages not answered yet."""
        return [k for k in (self.position or {}) if k not in self.answered]

    @classmethod
    def answers(cls, messages: Sequence[Message] | None, stage: str,
                replies: Iterable[Message]) -> list[Message]:
        """The replies that answer ``messages``, each from the node asked and once."""
        exchange = cls(messages, stage)
        for reply in replies:
            exchange.take(reply)
        return [r for r in exchange.result() if r is not None]

    def result(self) -> list[Message | None]:
        """The answer to each message in order (``None``: none); without known
        messages, the replies in their order. A node that answered twice gets one error
        reply instead.
        """
        if self.messages is None:
            for i in sorted(self.twice):
                log(WARNING, "%s: refused both replies of node %d: it replied twice",
                    self.stage, self.loose[i].metadata.src_node_id)
            return [r for i, r in enumerate(self.loose) if i not in self.twice]
        out = list(self.replies)
        for i in self.twice:
            out[i] = Message(Error(code=ErrorCode.UNKNOWN, reason=(
                f"node {self.messages[i].metadata.dst_node_id} replied twice to one "
                "message; both replies are refused")), reply_to=self.messages[i])
        return out


# The longest wait between two empty polls for replies: a reply is seen at most this late,
# and a deployment's SuperLink serves a waiting ServerApp a few polls a second, not 50
# (polls every 0.02 s kept a TLS SuperLink at ~40% of a core with four runs waiting).
MAX_POLL_INTERVAL = 0.5


class PollBackoff:
    """The wait between polls for replies: ``first`` seconds after an empty poll,
    doubling with each further empty poll up to ``max(first, MAX_POLL_INTERVAL)``; a
    poll that brought replies starts again from ``first``.
    """

    def __init__(self, first: float) -> None:
        self.first = first
        self.longest = max(first, MAX_POLL_INTERVAL)
        self.next = first

    def after(self, replied: bool) -> None:
        """Sleep after a poll unless it brought replies (``replied``)."""
        if replied:
            self.next = self.first
            return
        time.sleep(self.next)
        self.next = min(2 * self.next, self.longest)


def collect_reply_list(
    grid: Grid,
    messages: Sequence[Message],
    timeout: float,
    poll_interval: float = 0.02,
) -> list[Message | None]:
    """Push messages and poll until every one is answered or ``timeout`` passed
    (``poll_interval`` after an empty poll, doubling up to ``MAX_POLL_INTERVAL``).

    ``timeout`` counts from the end of the push, as in Flower's ``send_and_receive``:
    pushing many large messages takes its own time, and no node starts before it has
    its message.

    Returns
    -------
    list[Message | None]
        The reply to each message, in order; ``None`` where none came in time (or the
        grid did not take the message: a node that left).
    """
    pushed = set(grid.push_messages(list(messages)))
    deadline = time.monotonic() + timeout
    # Grids set each message's id as they push it; one they refused has none in `pushed`.
    exchange = Exchange(messages, messages[0].metadata.message_type if messages else "",
                        pushed)
    backoff = PollBackoff(poll_interval)
    while (waiting := exchange.pending()) and time.monotonic() < deadline:
        batch = list(grid.pull_messages(waiting))
        for reply in batch:
            exchange.take(reply)
        backoff.after(bool(batch))
    return exchange.result()


def collect_replies(
    grid: Grid,
    messages: Sequence[Message],
    timeout: float,
    poll_interval: float = 0.02,
) -> dict[int, Message]:
    """Push messages (at most one per node) and poll, as :func:`collect_reply_list`.

    Returns
    -------
    dict[int, Message]
        Replies by destination node id; nodes that did not reply in time are absent.
    """
    replies = collect_reply_list(grid, messages, timeout, poll_interval)
    return {m.metadata.dst_node_id: r for m, r in zip(messages, replies, strict=True)
            if r is not None}


def unreachable(reply: Message | None) -> bool:
    """Whether a message got no answer from the node itself.

    That is no reply in time, or the SuperLink's error reply for a node that went
    offline. An error the node's ClientApp sent (e.g. for a query it has no handler
    for) proves the node is there.
    """
    return reply is None or (reply.has_error() and reply.error.code in UNREACHABLE_ERRORS)


def from_superlink(reply: Message) -> bool:
    """Whether ``reply`` is the SuperLink's own answer for a node it found gone (an
    :data:`UNREACHABLE_ERRORS` error from ``SUPERLINK_NODE_ID``, as a deployment's
    SuperLink sends once the node's heartbeat has lapsed): it answers the message sent to
    that node, though the node did not send it.
    """
    return (reply.metadata.src_node_id == SUPERLINK_NODE_ID and reply.has_error()
            and reply.error.code in UNREACHABLE_ERRORS)


@dataclass
class Screened(Generic[Key]):
    """A round's replies sorted by :func:`screen`.

    Attributes
    ----------
    sound : list[tuple[int, Key, Message]]
        (node, key, reply) of each usable reply, in the plan's order.
    problems : dict[int, list[str]]
        Why each refused reply of a node was refused, by node.
    """

    sound: list[tuple[int, Key, Message]] = field(default_factory=list)
    problems: dict[int, list[str]] = field(default_factory=dict)

    def rejected(self) -> dict[int, str]:
        """Why each node with no usable reply has none (its problems joined)."""
        kept = {node for node, _, _ in self.sound}
        return {n: self.why(n) for n in self.problems if n not in kept}

    def why(self, node: int) -> str:
        """``node``'s problems, each once, joined."""
        return "; ".join(dict.fromkeys(self.problems[node]))


def screen(owner: str, server_round: int, plan: Sequence[tuple[int, Key]],
           replies: Sequence[Message | None],
           problem: Callable[[Key, Message], str | None],
           partition_ids: Mapping[int, int] | None = None) -> Screened[Key]:
    """Sort the replies to a round's messages (``plan[i]`` = (node, key) of message i)
    into the usable ones and, for the others, why: no reply in time, or ``problem``'s
    answer. Each node with a refused reply is logged once: ``<owner> round <r>:
    rejected reply from node <n> (partition <p>): <why>`` (the partition where
    ``partition_ids`` knows it).
    """
    out: Screened[Key] = Screened()
    for (node, key), reply in zip(plan, replies, strict=True):
        why = NO_REPLY if reply is None else problem(key, reply)
        if why is not None or reply is None:
            out.problems.setdefault(node, []).append(why or "")
        else:
            out.sound.append((node, key, reply))
    for node in out.problems:
        partition = (partition_ids or {}).get(node)
        log(WARNING, "%s round %d: rejected reply from node %d%s: %s", owner, server_round,
            node, "" if partition is None else f" (partition {partition})", out.why(node))
    return out
