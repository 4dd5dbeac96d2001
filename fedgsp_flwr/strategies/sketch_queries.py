"""StoCFL's ``query.sketch``: the messages at the anchor, and the checks of the replies.

A sketch counts only when it decodes to one finite vector of the expected length with a
non-zero norm, and its reply's ``partition-id`` claim holds
(:func:`~fedgsp_flwr.strategies.node_queries.agreed_vectors`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from ..protocol import ARRAYS, CONFIG, EVALUATE, QUERY_SKETCH, SKETCH
from .exchange import unreachable
from .hook_support import HookSupport
from .node_queries import agreed_vectors, reply_vector, vector_problem

# State-dict entries of a torch model that are buffers, not parameters (no gradient).
BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


@dataclass
class SketchReplies:
    """Answers to ``query.sketch``, by node.

    Attributes
    ----------
    sketches : dict[int, np.ndarray]
        The usable sketches (float32).
    problems : dict[int, str]
        Why the other nodes have none.
    partitions : dict[int, int]
        The partition ids the replies reported.
    """

    sketches: dict[int, np.ndarray] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)
    partitions: dict[int, int] = field(default_factory=dict)


def sketch_messages(anchor: ArrayRecord, config: ConfigRecord, nodes: Sequence[int]
                    ) -> list[Message]:
    """``query.sketch`` messages: the anchor and ``config`` (the sketch settings beside
    the round's training config, with which the ``update`` sketch trains)."""
    return [Message(RecordDict({ARRAYS: anchor, CONFIG: config}), dst_node_id=n,
                    message_type=QUERY_SKETCH) for n in nodes]


def sketch_length(anchor: ArrayRecord | None, sketch_dim: int, known: int | None
                  ) -> int | None:
    """The sketch length to expect: ``sketch_dim``, else the anchor's parameter count
    (its float arrays' sizes, BatchNorm's running statistics aside: a sketch is over the
    trainable parameters); without an anchor, ``known`` (the clustering's length, or
    ``None``: then the length most replies agree on, never the first reply's).
    """
    if sketch_dim:
        return sketch_dim
    if anchor is None:
        return known
    return sum(math.prod(a.shape) for k, a in anchor.items()
               if np.dtype(a.dtype).kind == "f" and not k.endswith(BUFFER_SUFFIXES))


def query_sketches(grid: Grid, messages: Sequence[Message], size: int | None,
                   hooks: HookSupport, timeout: float, node_of: Mapping[int, int],
                   num_partitions: int | None) -> SketchReplies:
    """Send ``messages`` and check each reply's sketch (``node_of``: the partition ids
    known so far, to check the replies' claims against).

    Returns
    -------
    SketchReplies
        The usable sketches (float32), why the other nodes have none, and the
        partition ids the replies reported.
    """
    out = SketchReplies()
    if not messages:
        return out
    nodes = [m.metadata.dst_node_id for m in messages]
    sound: dict[int, Message] = {}
    for node, reply in zip(nodes, hooks.collect(grid, list(messages), timeout), strict=True):
        problem = (f"no reply within {timeout:g}s" if reply is None
                   else vector_problem(reply, SKETCH, size))
        if problem is None and reply is not None:
            if not np.linalg.norm(reply_vector(reply, SKETCH).astype(np.float64)) > 0:
                problem = "sketch has zero norm"
            else:
                sound[node] = reply
        if problem is not None:
            out.problems[node] = problem
    kept, out.partitions, refused = agreed_vectors(sound, SKETCH, size, node_of,
                                                   num_partitions)
    out.problems.update(refused)
    out.sketches = {node: vector.astype(np.float32) for node, vector in kept.items()}
    return out


def silent_still(grid: Grid, queries: Sequence[Message], hooks: HookSupport,
                 timeout: float) -> set[int]:
    """The nodes of ``queries`` (``query.sketch``, one per node that did not answer its
    last message) that still do not answer; where the ClientApp has no sketch handler
    each is asked with an ``evaluate`` of the same model, which every ClientApp answers.
    """
    if not hooks.has(QUERY_SKETCH):
        queries = [Message(RecordDict({ARRAYS: m.content[ARRAYS]}),
                           dst_node_id=m.metadata.dst_node_id, message_type=EVALUATE)
                   for m in queries]
    replies = hooks.collect(grid, list(queries), timeout)
    return {m.metadata.dst_node_id for m, r in zip(queries, replies, strict=True)
            if unreachable(r)}
