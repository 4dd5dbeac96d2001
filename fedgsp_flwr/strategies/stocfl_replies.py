"""StoCFL's exchange beyond Flower's: a node's bi-level training messages (and their
fallback for a plain ClientApp), the check of a bi-level reply, the round's sound
replies split into the global model's and each cluster's parts, and the evaluation's
scores grouped by model and by node kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from ..protocol import (
    ARRAYS,
    CLUSTER,
    CONFIG,
    GLOBAL,
    METRICS,
    QUERY_PARTITION,
    QUERY_SKETCH,
    TRAIN,
    TRAIN_BILEVEL,
)
from .exchange import Screened
from .metrics import MetricsAggregation, renamed, reply_metrics
from .replies import arrays_problem, reply_problem

FALLBACKS = {
    QUERY_PARTITION: "nodes are sampled in node-id order, so a seed's samples differ from run "
                     "to run (node ids are random)",
    QUERY_SKETCH: "those nodes stay out of the clustering: they train the global model with "
                  "plain 'train' messages and are scored with it (FedAvg)",
    TRAIN_BILEVEL: "each clustered node trains its cluster model and the global model with "
                   "two plain 'train' messages (without the cluster model's pull to the "
                   "global one: lambda = 0, plain clustered FL)",
}
OWN = "own"  # an evaluated node's own model (its cluster's, inferred, or w)
Part = tuple[ArrayRecord, float]  # a trained model and its weight


def bilevel_messages(node: int, w: ArrayRecord, theta: ArrayRecord | None, config: ConfigRecord,
                  bilevel: bool) -> list[tuple[int, str, Message]]:
    """A sampled node's training messages, as (node, kind, message).

    A plain node (``theta`` None): one ``train`` of w (kind ``global``). A clustered
    node: ``train.bilevel`` with w and theta_k; or, where the ClientApp has no bi-level
    handler (``bilevel`` False), a ``train`` of theta_k (kind ``cluster``) and a
    ``train`` of w: a plain train handler has no pull of theta_k to w, so that is StoCFL
    with lambda = 0.
    """
    def message(kind: str, content: RecordDict) -> tuple[int, str, Message]:
        message_type = TRAIN_BILEVEL if kind == TRAIN_BILEVEL else TRAIN
        return node, kind, Message(content, dst_node_id=node, message_type=message_type)

    if theta is None:
        return [message(GLOBAL, RecordDict({ARRAYS: w, CONFIG: config}))]
    if bilevel:
        return [message(TRAIN_BILEVEL, RecordDict({GLOBAL: w, CLUSTER: theta, CONFIG: config}))]
    return [message(CLUSTER, RecordDict({ARRAYS: theta, CONFIG: config})),
            message(GLOBAL, RecordDict({ARRAYS: w, CONFIG: config}))]


def train_reply_problem(reply: Message, sent: ArrayRecord, weighted_by_key: str,
                        bilevel: bool) -> str | None:
    """Why a training reply must not be aggregated, or ``None``.

    A bi-level reply carries ``global`` and ``cluster`` models shaped like the global
    model; a plain ``train`` reply one model, whatever its record's name.
    """
    problem = reply_problem(reply, reference=sent, weighted_by_key=weighted_by_key,
                            require_arrays=not bilevel)
    if problem is not None or not bilevel:
        return problem
    records = reply.content.array_records
    if set(records) != {GLOBAL, CLUSTER}:
        return f"expected ArrayRecords '{GLOBAL}' and '{CLUSTER}', got {sorted(records)}"
    for key in (GLOBAL, CLUSTER):
        if (problem := arrays_problem(records[key], sent)) is not None:
            return f"{key}: {problem}"
    return None


@dataclass
class BilevelParts:
    """A round's sound training replies, sorted into the models they train.

    Attributes
    ----------
    global_parts : list[Part]
        The trained global models w, with their weights.
    cluster_parts : dict[int, list[Part]]
        The trained models theta_k, by cluster.
    reported : list[RecordDict]
        Each reply's metrics (a plain ``train`` of w by a clustered node: ``global-``
        before every name but the weight's).
    trained : set[int]
        The nodes with a sound reply.
    """

    global_parts: list[Part] = field(default_factory=list)
    cluster_parts: dict[int, list[Part]] = field(default_factory=dict)
    reported: list[RecordDict] = field(default_factory=list)
    trained: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, sound: Iterable[tuple[int, str, Message]], cluster_of: Mapping[int, int],
           weighted_by_key: str) -> BilevelParts:
        """Sort ``sound`` (node, kind, reply) by the models each reply trained."""
        out = cls()
        for node, kind, reply in sound:
            cluster = cluster_of.get(node)
            metrics = reply_metrics(reply.content)
            weight = float(cast(float, metrics[weighted_by_key]))
            records = reply.content.array_records
            out.trained.add(node)
            if kind == TRAIN_BILEVEL:
                out.global_parts.append((records[GLOBAL], weight))
                out.cluster_parts.setdefault(cast(int, cluster), []).append(
                    (records[CLUSTER], weight))
            elif kind == CLUSTER:
                out.cluster_parts.setdefault(cast(int, cluster), []).append(
                    (next(iter(records.values())), weight))
            else:
                out.global_parts.append((next(iter(records.values())), weight))
                if cluster is not None:  # the global half of two plain trainings
                    metrics = MetricRecord({k if k == weighted_by_key else f"global-{k}": v
                                            for k, v in metrics.items()})
            out.reported.append(RecordDict({METRICS: metrics}))
        return out


@dataclass
class BilevelScores:
    """An evaluation's replies (each node scored with its own model and with w), grouped.

    Attributes
    ----------
    subsets : dict[str, list[RecordDict]]
        The replies by label: ``""`` (own models), ``global`` (w), ``trained`` / ``new``
        (own models of nodes that trained / did not) and ``global-trained`` /
        ``global-new``.
    by_cluster : dict[int, list[RecordDict]]
        The own-model replies of each cluster's members.
    rejected : dict[int, str]
        Why each other node has no score (both scores or none).
    """

    subsets: dict[str, list[RecordDict]] = field(default_factory=dict)
    by_cluster: dict[int, list[RecordDict]] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Sequence[int], screened: Screened[str], trained: set[int],
           cluster_of: Mapping[int, int]) -> BilevelScores:
        """Group the ``screened`` replies of ``nodes`` (keys ``own`` and ``global``)."""
        scores: dict[int, dict[str, RecordDict]] = {}
        for node, kind, reply in screened.sound:
            scores.setdefault(node, {})[kind] = reply.content
        out = cls()
        for node in nodes:
            if node in screened.problems:
                out.rejected[node] = screened.why(node)
                continue
            own_reply, global_reply = scores[node][OWN], scores[node][GLOBAL]
            group = "trained" if node in trained else "new"
            for label, content in (("", own_reply), (GLOBAL, global_reply),
                                   (group, own_reply), (f"global-{group}", global_reply)):
                out.subsets.setdefault(label, []).append(content)
            if (cluster := cluster_of.get(node)) is not None:
                out.by_cluster.setdefault(cluster, []).append(own_reply)
        return out

    def metrics(self, aggregate: MetricsAggregation, weighted_by_key: str) -> dict[str, Any]:
        """The subsets' means, renamed by label (``eval_acc-global``, ...), and the node
        count of every own-model subset (``eval-clients``, ``eval-trained-clients``)."""
        result: dict[str, Any] = {}
        for label, contents in self.subsets.items():
            means = aggregate(contents, weighted_by_key)
            result.update(renamed(means, label) if label else means)
            if not label.startswith(GLOBAL):
                result["-".join(filter(None, ("eval", label, "clients")))] = len(contents)
        return result


def cluster_state(labels: Callable[[int], str], clusters: Mapping[int, Iterable[int]],
                  trained: Iterable[int], plain: Mapping[int, str], held_out: Iterable[int],
                  inferred: Mapping[int, int], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The content of ``clusters.json``: ``settings``, each cluster's members (by
    ``labels``), the clusters not trained yet (their model is w), the plain and held-out
    nodes, and the nearest cluster of each node scored by inference."""
    done = set(trained)
    return {**settings,
            "clusters": {str(c): [labels(n) for n in members] for c, members in clusters.items()},
            "untrained": [c for c in clusters if c not in done],
            "plain": {labels(n): reason for n, reason in plain.items()},
            "held-out": sorted(labels(n) for n in held_out),
            "inferred": {labels(n): c for n, c in inferred.items()}}
