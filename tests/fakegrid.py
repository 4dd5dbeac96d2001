"""An in-process Grid for strategy tests: nodes are Python callables."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable

from flwr.app import Error, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

Handler = Callable[[Message], Message | None]


def partition_node(partition: int, handler: Handler | None = None) -> Handler:
    """A node that answers ``query.partition`` with ``partition`` (as our client hooks
    do) and every other message with ``handler`` (none: no reply).
    """
    def handle(message: Message) -> Message | None:
        if message.metadata.message_type == "query.partition":
            return Message(RecordDict({"metrics": MetricRecord({"partition-id": partition})}),
                           reply_to=message)
        return handler(message) if handler is not None else None

    return handle


class FakeGrid(Grid):
    """Nodes answer through handlers, after an optional delay; ``None`` = no reply.

    ``pushed`` records (time, node, message type, message) of every push, in order.
    A handler that raises gives an error reply, as Flower does.
    """

    def __init__(self, handlers: dict[int, Handler], delays: dict[int, float] | None = None):
        self.handlers = handlers
        self.delays = delays or {}
        self.pushed: list[tuple[float, int, str, Message]] = []
        self._ready: dict[str, tuple[float, Message]] = {}

    def set_run(self, run: object) -> None:
        pass

    @property
    def run(self) -> object:
        return None

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.handlers)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message_id = str(uuid.uuid4())
            message.metadata.__dict__["_message_id"] = message_id
            node = message.metadata.dst_node_id
            now = time.monotonic()
            self.pushed.append((now, node, message.metadata.message_type, message))
            try:
                reply = self.handlers[node](message)
            except Exception as err:  # noqa: BLE001 - mirrors Flower's error replies
                reply = Message(Error(code=0, reason=f"{type(err).__name__}: {err}"),
                                reply_to=message)
            if reply is not None:
                self._ready[message_id] = (now + self.delays.get(node, 0.0), reply)
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        now, out = time.monotonic(), []
        for message_id in list(message_ids):
            ready = self._ready.get(message_id)
            if ready is not None and ready[0] <= now:
                out.append(self._ready.pop(message_id)[1])
        return out

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        ids = list(self.push_messages(messages))
        deadline = time.monotonic() + (timeout or 0)
        out: list[Message] = []
        while ids and (timeout is None or time.monotonic() < deadline):
            got = list(self.pull_messages(ids))
            out.extend(got)
            done = {m.metadata.reply_to_message_id for m in got}
            ids = [i for i in ids if i not in done]
            time.sleep(0.005)
        return out


# --- a grid that can deliver more than one reply to a message ---------------------------

Extra = Callable[[Message, Message | None], list[Message]]


def forged(reply: Message, src_node_id: int, reply_to_message_id: str | None = None) -> Message:
    """``reply`` (a fresh copy) claiming to come from ``src_node_id``, and to answer
    ``reply_to_message_id`` when given (a message id never issued, say).
    """
    copy = Message(reply.error, reply_to=request_of(reply)) if reply.has_error() else (
        Message(reply.content, reply_to=request_of(reply)))
    copy.metadata.__dict__["_src_node_id"] = src_node_id
    if reply_to_message_id is not None:
        copy.metadata.__dict__["_reply_to_message_id"] = reply_to_message_id
    return copy


def request_of(reply: Message) -> Message:
    """A stand-in for the request ``reply`` answers (same id, type and nodes): to build
    another reply to it with ``Message(..., reply_to=request_of(reply))``."""
    request = Message(RecordDict(), dst_node_id=reply.metadata.src_node_id,
                      message_type=reply.metadata.message_type)
    request.metadata.__dict__["_message_id"] = reply.metadata.reply_to_message_id
    request.metadata.__dict__["_src_node_id"] = reply.metadata.dst_node_id
    return request


class MultiReplyGrid(FakeGrid):
    """A :class:`FakeGrid` on which a message can get several replies, as no SuperLink
    would deliver them: ``extra(message, reply)`` returns the replies to deliver for
    each pushed message (``reply`` is its node's own, ``None`` if it gave none), in
    that order, all in the same pull (a strategy that waits for one reply per message
    still sees them all). The helpers :func:`twice` and :func:`with_forgery` build
    ``extra``.

    Everything else is FakeGrid's: handlers, delays, ``pushed``, error replies for a
    handler that raises.
    """

    def __init__(self, handlers: dict[int, Handler], extra: Extra,
                 delays: dict[int, float] | None = None):
        super().__init__(handlers, delays)
        self.extra = extra
        self._queues: dict[str, list[tuple[float, Message]]] = {}
        self.delivered: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = list(super().push_messages(messages))
        for message, message_id in zip(messages, ids, strict=True):
            ready = self._ready.pop(message_id, None)
            replies = self.extra(message, None if ready is None else ready[1])
            at = ready[0] if ready is not None else (
                time.monotonic() + self.delays.get(message.metadata.dst_node_id, 0.0))
            if replies:
                self._queues[message_id] = [(at, r) for r in replies]
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        now, out = time.monotonic(), []
        for message_id in list(message_ids):
            queue = self._queues.get(message_id)
            if queue and queue[0][0] <= now:
                out.extend(r for _, r in self._queues.pop(message_id))
        self.delivered.extend(out)
        return out


def twice(node: int, second: Handler, *, types: Callable[[str], bool],
          second_first: bool = False) -> Extra:
    """``extra`` for :class:`MultiReplyGrid`: ``node`` answers each message whose type
    ``types`` accepts twice, with its own reply and ``second(message)``, in that order
    or (``second_first``) the other way round. Other messages get their one reply.
    """
    def extra(message: Message, reply: Message | None) -> list[Message]:
        replies = [] if reply is None else [reply]
        if message.metadata.dst_node_id == node and types(message.metadata.message_type):
            other = second(message)
            if other is not None:
                replies = [other, *replies] if second_first else [*replies, other]
        return replies
    return extra


def with_forgery(victim: int, forger: int, make: Handler, *, fresh_id: bool = False,
                 forgery_first: bool = True,
                 types: Callable[[str], bool] = lambda _kind: True) -> Extra:
    """``extra`` for :class:`MultiReplyGrid`: beside each reply of ``victim`` (to a
    message whose type ``types`` accepts) comes ``make(message)`` claiming to be from
    ``forger``, a node that was not sent that message: as a reply to the victim's
    message, or (``fresh_id``) to a message id never issued. It comes first
    (``forgery_first``) or after the victim's own reply.
    """
    def extra(message: Message, reply: Message | None) -> list[Message]:
        replies = [] if reply is None else [reply]
        if message.metadata.dst_node_id == victim and types(message.metadata.message_type):
            made = make(message)
            if made is not None:
                fake = forged(made, forger, str(uuid.uuid4()) if fresh_id else None)
                replies = [fake, *replies] if forgery_first else [*replies, fake]
        return replies
    return extra
