"""The node registry: asking nodes for their metadata (class histograms, partition ids,
stated edges and clusters) through the Grid, and remembering the answers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any, cast

import numpy as np
from flwr.app import Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..core.sampling import partition_order
from ..grids import GridView
from ..protocol import (
    BASIC_TYPES,
    CLUSTER_ID,
    EDGES,
    HISTOGRAM,
    METRICS,
    PARTITION,
    PARTITION_ID,
    QUERY_HISTOGRAM,
    QUERY_PARTITION,
    UNSUPPORTED_HOOK_TEXT,
)
from .decoding import ArrayRefused, decode_array
from .decoding import values as array_values
from .replies import error_text
from .state import NodeMap, StrategyState, from_pairs, pairs, stack_rows

MAX_HISTOGRAM_COUNT = 10**9
# What IFCA, CFL and FeSEM do for nodes that state no partition id (asks="partition").
PARTITION_FALLBACK = ("nodes are ordered by node id (no partition ids: the order differs "
                      "from run to run and no ARI is reported)")
# What Flower's own sampling (the FedAvg family) does for such nodes.
SAMPLING_FALLBACK = ("nodes are sampled in node-id order, as Flower's FedAvg does (the "
                     "simulation engine draws new node ids at each launch, so a seed "
                     "then trains other clients each time)")
# Error replies the SuperLink makes for a node that is gone, not ones its ClientApp sent.
UNREACHABLE_ERRORS = (ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE,
                      ErrorCode.REPLY_MESSAGE_UNAVAILABLE)
# What Flower's ClientApp raises for a message type it has no function for.
MISSING_HANDLER_TEXT = "function registered with name"
ADD_HOOKS = ("from fedgsp_flwr.clients import ClientHooks, register_hooks\n"
             "    register_hooks(app, ClientHooks(load_data=<your data>, "
             "build_model=<your model>))")


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
    """Which of our message types the nodes' ClientApp handles, learnt from at most one
    failed message per type and run.

    The first message of a type not yet answered goes alone; if the ClientApp has no
    handler for it, the other messages of that type are not sent (their replies are
    that same error) and one WARNING names the handler, the strategy's fallback and
    the lines that add our hooks. A ClientApp without a handler then logs one
    traceback per run, not one per node.

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
        """:func:`collect_reply_list`, a type not yet answered probed with one message.

        The other messages wait for the probe's reply; if the probe's node is silent,
        they are sent when its ``timeout`` ends and get a ``timeout`` of their own (so
        the call can take up to twice ``timeout``, and the type is probed again next
        time).

        Returns
        -------
        list[Message | None]
            The reply to each message in order (the probe's error for the messages of
            a missing type; ``None`` where none came in time).
        """
        replies: list[Message | None] = [None] * len(messages)
        probes: dict[str, int] = {}
        for i, message in enumerate(messages):
            kind = message.metadata.message_type
            if kind not in self.present and kind not in self.missing:
                probes.setdefault(kind, i)
        if probes:
            answers = collect_reply_list(grid, [messages[i] for i in probes.values()],
                                         timeout, poll_interval)
            for (kind, i), reply in zip(probes.items(), answers, strict=True):
                replies[i] = reply
                if missing_handler(reply):
                    self._mark_missing(kind, cast(Message, reply))
                elif reply is not None and not reply.has_error():
                    self.present.add(kind)
        rest = [i for i, m in enumerate(messages) if i not in probes.values()
                and m.metadata.message_type not in self.missing]
        for i, reply in zip(rest, collect_reply_list(grid, [messages[i] for i in rest],
                                                     timeout, poll_interval), strict=True):
            replies[i] = reply
        for i, message in enumerate(messages):
            if replies[i] is None and message.metadata.message_type in self.missing:
                replies[i] = self.missing_reply(message)
        return replies

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


def node_label(node: int, partition_ids: Mapping[int, int]) -> str:
    """``partition-<id>`` for a node that reported its partition, else ``node-<id>``: the
    name results files give a node (node ids change from run to run).
    """
    return f"partition-{partition_ids[node]}" if node in partition_ids else f"node-{node}"


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


def vector_problem(reply: Message, key: str, size: int | None) -> str | None:
    """Why a reply does not carry one finite numeric vector ``key`` (of ``size``), or
    ``None``. The vector is decoded and checked once
    (:func:`~fedgsp_flwr.strategies.decoding.decode_array`); :func:`reply_vector` then
    gives its values.
    """
    if reply.has_error():
        return f"error reply: {error_text(reply.error.reason)}"
    record = reply.content.array_records.get(key)
    if record is None or key not in record:
        return f"no ArrayRecord '{key}' with an array '{key}'"
    array = record[key]
    if len(array.shape) != 1 or not array.shape[0]:
        return f"{key} must be a non-empty vector, got shape {tuple(array.shape)}"
    if size is not None and array.shape[0] != size:
        return f"{key} has {array.shape[0]} entries, expected {size}"
    try:
        decode_array(array, name=key, kinds="iuf")
    except ArrayRefused as refused:
        return str(refused)
    return None


def reply_vector(reply: Message, key: str) -> np.ndarray:
    """The vector ``key`` of a reply :func:`vector_problem` passed (its decoded values)."""
    return array_values(reply.content.array_records[key][key])


def agreed_length(vectors: Iterable[np.ndarray]) -> int | None:
    """The length most vectors have, ``None`` for no vectors: the expected length when
    the server has none of its own, so that one node cannot set it for the others.
    Ties go to the length met first (the vectors come in partition order).
    """
    counts = Counter(len(v) for v in vectors).most_common(1)
    return counts[0][0] if counts else None


def agreed_vectors(sound: Mapping[int, Message], key: str, size: int | None,
                   held: Mapping[int, int], num_partitions: int | None,
                   ) -> tuple[dict[int, np.ndarray], dict[int, int], dict[int, str]]:
    """The vectors ``key`` of replies :func:`vector_problem` passed, kept where they have
    the expected length (``size``, else :func:`agreed_length`) and their partition claim
    stands (:func:`partition_problems`).

    Returns
    -------
    tuple[dict[int, np.ndarray], dict[int, int], dict[int, str]]
        The kept vectors and the partition ids their nodes claimed, by node, and why
        each other node's reply is refused.
    """
    vectors = {node: reply_vector(reply, key) for node, reply in sound.items()}
    size = size or agreed_length(vectors.values())
    claims = {n: p for n, r in sound.items() if (p := reported_partition(r)) is not None}
    refused = partition_problems(claims, held, num_partitions)
    for node, vector in vectors.items():
        if len(vector) != size:
            refused[node] = (f"{key} has {len(vector)} entries, expected {size} (the "
                             "length most nodes sent)")
    kept = {n: v for n, v in vectors.items() if n not in refused}
    return kept, {n: p for n, p in claims.items() if n in kept}, refused


def partition_problems(claims: Mapping[int, int], held: Mapping[int, int],
                       num_partitions: int | None) -> dict[int, str]:
    """Why each refused ``partition-id`` claim is refused, by node.

    Parameters
    ----------
    claims : Mapping[int, int]
        The partition id each new node reports, by node id.
    held : Mapping[int, int]
        The partitions known nodes hold, by partition id (node ids as values).
    num_partitions : int | None
        The federation's partition count, when known: ids must be below it.

    Returns
    -------
    dict[int, str]
        A negative or out-of-range id, one another node holds (the holder keeps it), or
        one that several new nodes claim (all of them refused: none is believed).
    """
    problems: dict[int, str] = {}
    by_partition: dict[int, list[int]] = {}
    for node, partition in claims.items():
        if partition < 0 or (num_partitions is not None and partition >= num_partitions):
            bound = "" if num_partitions is None else f" below {num_partitions}"
            problems[node] = f"partition-id {partition} is not an id >= 0{bound}"
        elif (holder := held.get(partition, node)) != node:
            problems[node] = f"partition-id {partition} is held by node {holder}"
        else:
            by_partition.setdefault(partition, []).append(node)
    for partition, nodes in by_partition.items():
        for node in nodes if len(nodes) > 1 else ():
            others = ", ".join(f"node {n}" for n in sorted(nodes) if n != node)
            problems[node] = f"partition-id {partition} is claimed by {others} as well"
    return problems


def reported_partition(reply: Message) -> int | None:
    """The ``partition-id`` a query reply reports, if any (an error reply reports none)."""
    if not reply.has_content():
        return None
    metrics = reply.content.metric_records.get(METRICS)
    partition = None if metrics is None else metrics.get(PARTITION_ID)
    return partition if isinstance(partition, int) else None


def histogram_problem(reply: Message, num_classes: int | None) -> str | None:
    """Why a ``query.histogram`` reply is unusable, or ``None`` (``num_classes=None``
    checks all but the length)."""
    if (problem := vector_problem(reply, HISTOGRAM, num_classes)) is not None:
        return problem
    values = reply_vector(reply, HISTOGRAM).astype(np.float64)
    if (values < 0).any():
        return "histogram has negative counts"
    if not np.array_equal(values, np.round(values)):
        return "histogram counts are not integers"
    if values.sum() <= 0 or values.sum() > MAX_HISTOGRAM_COUNT:
        return f"histogram total {values.sum():g} is not in (0, {MAX_HISTOGRAM_COUNT}]"
    return None


@dataclass
class HistogramReplies:
    """What :func:`query_histograms` collected.

    Attributes
    ----------
    histograms : dict[int, np.ndarray]
        Label counts by node id.
    failed : dict[int, str]
        Why each other node has none.
    partition_ids : dict[int, int]
        The ``partition-id`` nodes reported (for a run-independent node order).
    edges : dict[int, list[int]]
        The HierFL edges nodes reported in range (their ``edges`` node config).
    cluster_ids : dict[int, int]
        The Semi-FL clusters nodes reported (their ``cluster-id`` node config).
    unreachable : set[int]
        The failed nodes that did not answer at all (see :func:`unreachable`).
    """

    histograms: dict[int, np.ndarray] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    unreachable: set[int] = field(default_factory=set)
    partition_ids: dict[int, int] = field(default_factory=dict)
    edges: dict[int, list[int]] = field(default_factory=dict)
    cluster_ids: dict[int, int] = field(default_factory=dict)


def query_histograms(
    grid: Grid,
    node_ids: Sequence[int],
    timeout: float,
    num_classes: int | None = None,
    hooks: HookSupport | None = None,
    held: Mapping[int, int] | None = None,
    num_partitions: int | None = None,
) -> HistogramReplies:
    """Ask nodes for their class histograms with ``query.histogram``.

    Parameters
    ----------
    grid : Grid
        Flower's grid.
    node_ids : Sequence[int]
        Nodes to ask.
    timeout : float
        Seconds to wait for all replies.
    num_classes : int | None
        Expected histogram length (``None``: the length most sound replies have).
    hooks : HookSupport | None
        Sends the queries (one probe first, see :class:`HookSupport`); ``None`` asks
        every node at once.
    held : Mapping[int, int] | None
        Partitions that known nodes hold (partition id -> node id): a new node that
        claims one is refused (see :func:`partition_problems`).
    num_partitions : int | None
        The federation's partition count, when known.

    Returns
    -------
    HistogramReplies
        Histograms, reasons for the nodes without one, reported partition ids.
    """
    out = HistogramReplies()
    sound: dict[int, Message] = {}
    for node, reply in _ask(grid, node_ids, QUERY_HISTOGRAM, timeout, hooks, out):
        if (problem := histogram_problem(reply, num_classes)) is None:
            sound[node] = reply
        else:
            out.failed[node] = problem
    kept, out.partition_ids, refused = agreed_vectors(sound, HISTOGRAM, num_classes,
                                                      held or {}, num_partitions)
    out.failed.update(refused)
    for node, hist in kept.items():
        out.histograms[node] = hist.astype(np.int64)
        metrics = sound[node].content.metric_records.get(METRICS)
        edges = None if metrics is None else metrics.get(EDGES)
        if isinstance(edges, list) and edges and all(
                isinstance(e, int) and e >= 0 for e in edges):
            out.edges[node] = [int(e) for e in edges]
        cluster = None if metrics is None else metrics.get(CLUSTER_ID)
        if isinstance(cluster, int) and cluster >= 0:
            out.cluster_ids[node] = cluster
    for node, reason in out.failed.items():
        if MISSING_HANDLER_TEXT not in reason or hooks is None:  # HookSupport warned
            log(WARNING, "query.histogram: no histogram from node %d: %s", node, reason)
    return out


def query_partitions(grid: Grid, node_ids: Sequence[int], timeout: float,
                     hooks: HookSupport | None = None, held: Mapping[int, int] | None = None,
                     num_partitions: int | None = None) -> HistogramReplies:
    """Ask nodes for their partition id with ``query.partition`` (no data is shared).

    The parameters are those of :func:`query_histograms` but ``num_classes``; the
    result holds partition ids and, for the other nodes, why they have none. A refused
    claim (see :func:`partition_problems`) is logged, naming the node.
    """
    out = HistogramReplies()
    claims: dict[int, int] = {}
    for node, reply in _ask(grid, node_ids, QUERY_PARTITION, timeout, hooks, out):
        if (partition := reported_partition(reply)) is not None:
            claims[node] = partition
        else:
            out.failed[node] = (f"error reply: {error_text(reply.error.reason)}"
                                if reply.has_error() else "no integer partition-id in the reply")
    refused = partition_problems(claims, held or {}, num_partitions)
    for node, partition in claims.items():
        if node in refused:
            out.failed[node] = refused[node]
            log(WARNING, "query.partition: refused the partition id of node %d: %s", node,
                refused[node])
        else:
            out.partition_ids[node] = partition
    return out


def _ask(grid: Grid, node_ids: Sequence[int], message_type: str, timeout: float,
         hooks: HookSupport | None, out: HistogramReplies) -> list[tuple[int, Message]]:
    """Send an empty ``message_type`` query to each node; the nodes that replied, with
    their replies. The others go into ``out.failed`` (and ``out.unreachable``).
    """
    queries = [Message(content=RecordDict(), dst_node_id=n, message_type=message_type)
               for n in node_ids]
    send = collect_reply_list if hooks is None else hooks.collect
    answered = []
    for node, reply in zip(node_ids, send(grid, queries, timeout), strict=True):
        if unreachable(reply):
            out.unreachable.add(node)
        if reply is None:
            out.failed[node] = f"no reply within {timeout:g}s"
        else:
            answered.append((node, reply))
    return answered


class NodeRegistry:
    """What the nodes seen so far said about themselves, each asked once.

    Parameters
    ----------
    owner : str
        Strategy name for log lines.
    timeout : float
        Seconds to wait for the query replies.
    fallback : str
        What the strategy does for nodes that cannot answer (named in the warning when
        the nodes' ClientApp has no handler for the query).
    asks : str
        ``"histogram"`` (default): ``query.histogram``, the class histogram plus the
        partition id, edges and cluster the node config states (FedGSP, HierFL,
        Semi-FL). ``"partition"``: ``query.partition``, the partition id only, no data
        (for strategies that only order nodes by it: IFCA, CFL, FeSEM, the FedAvg
        family).
    absent : str
        What happens to nodes that did not answer at all (said in the warning).
    missing_level : int (default: WARNING)
        Log level of the line that says the nodes' ClientApp lacks the query's handler
        (see :class:`HookSupport`) or that nodes answered without a usable reply.
    num_classes : int | None (default: None)
        The histograms' length when the caller knows it (else the length most of the
        first replies agree on).
    num_partitions : int | None (default: None)
        The federation's partition count when known: a ``partition-id`` must be below
        it. Ids are always checked to be >= 0 and held by one node only.

    Attributes
    ----------
    histograms : dict[int, np.ndarray]
        Label counts by node id (empty when ``asks="partition"``).
    without : dict[int, str]
        Why each node that answered told nothing usable (asked once only).
    partition_ids : dict[int, int]
        The ``partition-id`` nodes reported.
    edges : dict[int, list[int]]
        The HierFL edges nodes reported in range.
    cluster_ids : dict[int, int]
        The Semi-FL clusters nodes reported.
    unreachable : set[int]
        Nodes that did not answer their last query at all (asked again next time).
    """

    def __init__(self, owner: str, timeout: float,
                 fallback: str = "nodes without a histogram are placed at random",
                 asks: str = HISTOGRAM, absent: str = "they sit out until they do",
                 missing_level: int = WARNING, num_classes: int | None = None,
                 num_partitions: int | None = None) -> None:
        if asks not in (HISTOGRAM, PARTITION):
            raise ValueError(f"asks must be 'histogram' or 'partition', got {asks!r}")
        self.owner, self.timeout, self.asks, self.absent = owner, timeout, asks, absent
        self.num_classes, self.num_partitions = num_classes, num_partitions
        self.message_type = f"query.{asks}"
        self.hooks = HookSupport(owner, {self.message_type: fallback}, missing_level)
        self.histograms: dict[int, np.ndarray] = {}
        self.without: dict[int, str] = {}
        self.partition_ids: dict[int, int] = {}
        self.edges: dict[int, list[int]] = {}
        self.cluster_ids: dict[int, int] = {}
        self.unreachable: set[int] = set()

    def refresh(self, grid: Grid, nodes: Sequence[int]) -> None:
        """Ask the nodes not seen before (or forgotten) the registry's query.

        A node that answers without a usable answer (a ClientApp without our handler)
        is remembered as such; one that does not answer at all is put in
        :attr:`unreachable` and asked again on the next call.
        """
        known = self.known_nodes()
        new = [n for n in nodes if n not in known]
        self.unreachable.difference_update(nodes)
        if not new:
            return
        held = {p: n for n, p in self.partition_ids.items()}
        if self.asks == PARTITION:
            replies = query_partitions(grid, new, self.timeout, self.hooks, held,
                                       self.num_partitions)
        else:
            width = next(iter(self.histograms.values()), None)
            replies = query_histograms(
                grid, new, self.timeout,
                self.num_classes or (None if width is None else len(width)), self.hooks,
                held, self.num_partitions)
        self.histograms.update(replies.histograms)
        self.partition_ids.update(replies.partition_ids)
        self.edges.update(replies.edges)
        self.cluster_ids.update(replies.cluster_ids)
        self.unreachable |= replies.unreachable
        answered = {n: r for n, r in replies.failed.items() if n not in replies.unreachable}
        self.without.update(answered)
        if any(MISSING_HANDLER_TEXT not in reason for reason in answered.values()):
            log(self.hooks.level, "%s: %d node(s) without a usable %s reply: %s", self.owner,
                len(answered), self.message_type, self.hooks.fallbacks[self.message_type])
        if self.unreachable:
            log(WARNING, "%s: node(s) %s did not answer; %s", self.owner,
                sorted(self.unreachable), self.absent)

    def reachable(self, grid: Grid, connected: Sequence[int]) -> list[int]:
        """The connected nodes that can take part in a round, in :meth:`order`.

        Forgets nodes that are no longer connected, asks new and forgotten nodes (see
        :meth:`forget`) for their histograms, and leaves out those that did not answer.
        """
        self.update(grid, connected)
        return self.order([n for n in connected if n not in self.unreachable])

    def update(self, grid: Grid, connected: Sequence[int],
               skip: Iterable[int] = ()) -> None:
        """Forget the nodes no longer ``connected`` and :meth:`refresh` the others,
        except those in ``skip``.
        """
        here, skipped = set(connected), set(skip)
        self.forget([n for n in self.known_nodes() if n not in here])
        self.refresh(grid, [n for n in connected if n not in skipped])

    def known_nodes(self) -> set[int]:
        """Nodes with an answer (histogram or partition id) or a reason for having none."""
        return set(self.histograms) | set(self.partition_ids) | set(self.without)

    def forget_unanswered(self, answers: Iterable[tuple[int, Message | None]]) -> None:
        """Forget the nodes whose message got no answer (see :func:`unreachable`): a node
        that is gone answers the registry's query again before it takes part again.
        """
        self.forget([node for node, reply in answers if unreachable(reply)])

    def forget(self, nodes: Sequence[int]) -> None:
        """Drop what is known of nodes that left (a node that comes back is asked anew)."""
        for node in nodes:
            self.histograms.pop(node, None)
            self.without.pop(node, None)
            self.partition_ids.pop(node, None)
            self.edges.pop(node, None)
            self.cluster_ids.pop(node, None)

    def order(self, nodes: Sequence[int]) -> list[int]:
        """The nodes in :func:`partition_order`."""
        return partition_order(nodes, self.partition_ids)

    def checkpoint_state(self) -> StrategyState:
        """Everything known of the nodes (see :mod:`fedgsp_flwr.checkpoint`)."""
        nodes, matrix = stack_rows(self.histograms)
        meta = {"histogram-nodes": nodes, "without": pairs(self.without),
                "partition-ids": pairs(self.partition_ids), EDGES: pairs(self.edges),
                "cluster-ids": pairs(self.cluster_ids), "unreachable": sorted(self.unreachable)}
        return StrategyState(meta, {"histograms": matrix})

    def restore_state(self, state: StrategyState, nodes: NodeMap) -> None:
        """Take back :meth:`checkpoint_state`, node ids translated by ``nodes``."""
        meta = state.meta
        self.histograms = {nodes(n): row.astype(np.int64) for n, row in
                           zip(meta["histogram-nodes"], state.arrays["histograms"],
                               strict=True)}
        self.without = from_pairs(meta["without"], nodes)
        self.partition_ids = from_pairs(meta["partition-ids"], nodes)
        self.edges = from_pairs(meta[EDGES], nodes)
        self.cluster_ids = from_pairs(meta["cluster-ids"], nodes)
        self.unreachable = {nodes(n) for n in meta["unreachable"]}


class PartitionOrderGrid(GridView):
    """A view of ``grid`` whose ``get_node_ids()`` lists the connected nodes in
    :func:`partition_order`, asking new nodes their partition id first.

    Flower's ``sample_nodes`` draws with the seeded ``random.sample`` from that list, so
    a seed samples the same partitions in every launch, whatever node ids the engine or
    the SuperLink gave the nodes. A node that did not answer stays in the list (Flower
    sends it its message, as it would have) and is asked again by the next view.

    Parameters
    ----------
    grid : Grid
        The run's grid (every other call goes to it).
    registry : NodeRegistry
        What is known of the nodes; it asks the new ones.
    """

    def __init__(self, grid: Grid, registry: NodeRegistry) -> None:
        super().__init__(grid)
        self.registry = registry
        self.asked: set[int] = set()

    def get_node_ids(self) -> list[int]:
        connected = list(self.grid.get_node_ids())
        self.registry.update(self.grid, connected, skip=self.asked)
        self.asked.update(connected)  # Flower asks again while it waits for nodes
        return self.registry.order(connected)
