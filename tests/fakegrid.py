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

    def set_run(self, run: object) -> None:  # noqa: D102 - Grid interface
        pass

    @property
    def run(self) -> object:  # noqa: D102
        return None

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:  # noqa: D102
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102
        return list(self.handlers)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # noqa: D102
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

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102
        now, out = time.monotonic(), []
        for message_id in list(message_ids):
            ready = self._ready.get(message_id)
            if ready is not None and ready[0] <= now:
                out.append(self._ready.pop(message_id)[1])
        return out

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:  # noqa: D102
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
