"""Node queries: ask nodes for their class histogram or partition id
(``query.histogram``, ``query.partition``) and check what they answer.

A reply's vector, histogram and ``partition-id`` claim are each checked
(:func:`vector_problem`, :func:`histogram_problem`, :func:`partition_problems`) before
they count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING

import numpy as np
from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..protocol import (
    CLUSTER_ID,
    EDGES,
    HISTOGRAM,
    METRICS,
    PARTITION_ID,
    QUERY_HISTOGRAM,
    QUERY_PARTITION,
)
from .decoding import ArrayRefused, decode_array
from .decoding import values as array_values
from .exchange import collect_reply_list, unreachable
from .hook_support import MISSING_HANDLER_TEXT, HookSupport
from .replies import error_text

MAX_HISTOGRAM_COUNT = 10**9


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
        Sends the queries (probes first, see :class:`HookSupport`); ``None`` asks
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
        if not lacks_handler(reason, hooks, QUERY_HISTOGRAM):
            log(WARNING, "query.histogram: no histogram from node %d: %s", node, reason)
    return out


def lacks_handler(reason: str, hooks: HookSupport | None, message_type: str) -> bool:
    """Whether ``reason`` is the missing handler's error of a ClientApp that, as far as
    ``hooks`` knows, no node has the handler of (then :class:`HookSupport` warns once
    for all nodes, or will when a second node confirms it)."""
    return (MISSING_HANDLER_TEXT in reason and hooks is not None
            and message_type not in hooks.present)


def query_partitions(grid: Grid, node_ids: Sequence[int], timeout: float,
                     hooks: HookSupport | None = None, held: Mapping[int, int] | None = None,
                     num_partitions: int | None = None) -> HistogramReplies:
    """Ask nodes for their partition id with ``query.partition`` (no data is shared).

    The parameters are those of :func:`query_histograms` but ``num_classes``; the
    result holds partition ids and, for the other nodes, why they have none. A claim
    refused (not an integer, or see :func:`partition_problems`) is logged, naming the
    node; error replies and replies without a claim are the caller's to count.
    """
    out = HistogramReplies()
    claims: dict[int, int] = {}
    for node, reply in _ask(grid, node_ids, QUERY_PARTITION, timeout, hooks, out):
        if (partition := reported_partition(reply)) is not None:
            claims[node] = partition
        elif reply.has_error():  # counted by the caller, as are the nodes that never answer
            out.failed[node] = f"error reply: {error_text(reply.error.reason)}"
            if MISSING_HANDLER_TEXT in out.failed[node] and not lacks_handler(
                    out.failed[node], hooks, QUERY_PARTITION):
                log(WARNING, "query.partition: node %d has no handler where other nodes "
                    "have one: %s", node, out.failed[node])
        elif (claim := reply.content.metric_records.get(METRICS, MetricRecord()).get(
                PARTITION_ID)) is None:  # a node without a partition id (a deployment's)
            out.failed[node] = "no partition-id in the reply"
        else:
            out.failed[node] = f"partition-id {claim!r} is not an integer"
            log(WARNING, "query.partition: refused the partition id of node %d: %s", node,
                out.failed[node])
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

