"""StoCFL's ``query.sketch``: the messages at the anchor, the checks of the replies, and
:class:`SketchRegistry`, what StoCFL knows of its nodes from them.

A sketch counts only when it decodes to one finite vector of the expected length with a
non-zero norm as float32, and its reply's ``partition-id`` claim holds
(:func:`~fedgsp_flwr.strategies.node_queries.agreed_vectors`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..core.clustering import SketchClustering
from ..core.sampling import partition_order
from ..protocol import ARRAYS, CONFIG, EVALUATE, QUERY_SKETCH, SKETCH, SKETCH_DIM
from . import saved
from .exchange import unreachable
from .hook_support import HookSupport
from .node_queries import agreed_vectors, query_partitions, reply_vector, vector_problem
from .node_registry import NodeRegistry

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


def sketch_problem(vector: np.ndarray) -> str | None:
    """Why a decoded sketch cannot be clustered, or ``None``. The clustering keeps
    sketches as float32, so the check is of the float32 values: a float64 sketch of
    tiny values would be all zeros there."""
    if not np.linalg.norm(vector.astype(np.float32, copy=False).astype(np.float64)) > 0:
        return "sketch has zero norm (as float32)" if vector.any() else "sketch has zero norm"
    return None


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
            problem = sketch_problem(reply_vector(reply, SKETCH))
            if problem is None:
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


class SketchRegistry:
    """What StoCFL knows of its nodes from their sketches: the anchor they are taken at,
    the partition ids they reported, the nodes without a sketch (plain) and those that
    went silent, and the evaluation's sketches, kept apart for inference only.

    Its attributes go into StoCFL's checkpoint beside StoCFL's own, under the keys its
    checkpoints always had.

    Parameters
    ----------
    hooks : HookSupport
        StoCFL's: which query types the ClientApp answers.
    config : ConfigRecord
        The sketch settings every ``query.sketch`` carries.
    timeout : float
        Seconds to wait for the replies to a query.
    known : NodeRegistry
        The strategy's registry (its ``num_partitions`` bounds the reported ids).
    """

    anchor = saved.record("anchor")  # the initial global model: sketches are taken at it
    plain = saved.node_map("plain")  # node -> why no sketch
    partition_ids = saved.node_map("partition-ids")
    suspects = saved.node_set("suspects")  # nodes that did not answer their last message
    eval_partitions = saved.node_map("eval-partitions", optional=True)  # with an eval sketch
    eval_sketches = saved.node_vectors("eval-sketch-nodes", "eval-sketch")  # for inference

    def __init__(self, hooks: HookSupport, config: ConfigRecord, timeout: float,
                 known: NodeRegistry) -> None:
        self.hooks, self.config, self.timeout, self.known = hooks, config, timeout, known
        self.train_config = ConfigRecord()  # the last round's: the update sketch trains
        self._asked: set[int] = set()  # nodes asked for their partition id

    def order(self, nodes: Iterable[int]) -> list[int]:
        """The nodes in :func:`~fedgsp_flwr.core.sampling.partition_order`."""
        return partition_order(nodes, self.partition_ids)

    def labels(self) -> dict[int, int]:
        """Every partition id reported, with a sketch for training or for evaluation."""
        return {**self.eval_partitions, **self.partition_ids}

    def queries(self, nodes: Sequence[int]) -> list[Message]:
        """``query.sketch`` messages at the anchor: the sketch settings and the last
        round's training config."""
        assert self.anchor is not None
        return sketch_messages(self.anchor, ConfigRecord(
            {**dict(self.train_config), **dict(self.config)}), nodes)

    def query(self, grid: Grid, nodes: Sequence[int], dim: int | None) -> SketchReplies:
        """Ask the nodes for their sketches at the anchor (of length ``dim`` once the
        clustering has one); change no state."""
        if not nodes:
            return SketchReplies()
        size = sketch_length(self.anchor, cast(int, self.config[SKETCH_DIM]), dim)
        return query_sketches(grid, self.queries(nodes), size, self.hooks, self.timeout,
                              {p: n for n, p in self.partition_ids.items()},
                              self.known.num_partitions)

    def learn_partitions(self, grid: Grid, nodes: Sequence[int]) -> None:
        """Ask the nodes not asked yet for their partition id (``query.partition``: no
        data), so that hold-out and samples follow partition ids, the same in every run
        of a seed, from the first round on. A node asked once is not asked again.
        """
        new = [n for n in nodes if n not in self.partition_ids and n not in self._asked]
        self._asked.update(new)
        if new:
            replies = query_partitions(grid, new, self.timeout, self.hooks)
            self.partition_ids.update(replies.partition_ids)

    def reachable(self, grid: Grid, connected: Sequence[int]) -> list[int]:
        """The connected nodes less the suspects that still do not answer.

        A node that did not answer its last message (crashed, or its SuperNode went
        offline) is asked for its sketch anew (:func:`silent_still`) before it is
        sampled again; it keeps its cluster. Suspects that left the grid are dropped.
        """
        self.suspects &= set(connected)
        probe = self.order(self.suspects)
        if probe:
            self.suspects = silent_still(grid, self.queries(probe), self.hooks, self.timeout)
            log(INFO, "StoCFL: %d of %d silent node(s) answer again; %s sit out",
                len(probe) - len(self.suspects), len(probe), sorted(self.suspects) or "none")
        return [n for n in connected if n not in self.suspects]

    def ask(self, grid: Grid, nodes: Sequence[int], clustering: SketchClustering
            ) -> dict[int, np.ndarray]:
        """Ask the nodes neither clustered nor plain yet for their sketches (training);
        those without a usable sketch become plain nodes."""
        nodes = [n for n in nodes if n not in clustering.cluster_of and n not in self.plain]
        replies = self.query(grid, nodes, clustering.dim)
        self.partition_ids.update(replies.partitions)
        for node in nodes:  # an evaluation's sketch is never reused for the clustering
            self.eval_sketches.pop(node, None)
        for node in replies.partitions:
            self.eval_partitions.pop(node, None)
        for node, problem in replies.problems.items():
            self.plain[node] = problem
            if self.hooks.has(QUERY_SKETCH):  # else HookSupport warned once for all
                log(WARNING, "StoCFL: node %d has no sketch (%s); it stays a singleton "
                    "trained on the global model", node, problem)
        return replies.sketches

    def fetch_eval(self, grid: Grid, nodes: Sequence[int], dim: int | None) -> None:
        """Ask the nodes without one in :attr:`eval_sketches` for a sketch and keep it
        there, for inference only (never in the clustering; a node without a sketch
        does not become plain).

        Only once training's queries showed that the ClientApp answers ``query.sketch``:
        an evaluation's probe must not decide which nodes training clusters.
        """
        if QUERY_SKETCH not in self.hooks.present:
            return
        for node in [n for n in nodes if dim is not None and n in self.eval_sketches
                     and len(self.eval_sketches[n]) != dim]:
            del self.eval_sketches[node]  # sent before the clustering had a dimension
        replies = self.query(grid, [n for n in nodes if n not in self.eval_sketches], dim)
        self.eval_sketches.update(replies.sketches)
        self.eval_partitions.update(replies.partitions)
        for node, problem in replies.problems.items():
            log(WARNING, "StoCFL evaluation: node %d has no sketch (%s); it is scored with "
                "the global model", node, problem)

    def inferred(self, clustering: SketchClustering, nodes: Iterable[int] | None = None
                 ) -> dict[int, int]:
        """The nearest cluster of each node (default: all) with a sketch in
        :attr:`eval_sketches`, by the read-only :meth:`SketchClustering.infer_all`."""
        chosen = self.eval_sketches if nodes is None else nodes
        usable = {n: self.eval_sketches[n] for n in chosen if n in self.eval_sketches
                  and len(self.eval_sketches[n]) == clustering.dim}
        if not usable or not clustering.num_clusters:
            return {}
        placements = clustering.infer_all(np.stack(list(usable.values())))
        return {n: cast(int, p.nearest) for n, p in zip(usable, placements, strict=True)}
