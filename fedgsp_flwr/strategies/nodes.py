"""Kept for compatibility: the names this module held now live in four modules, and are
re-exported here so that ``from fedgsp_flwr.strategies.nodes import X`` keeps working.

- :mod:`~fedgsp_flwr.strategies.exchange`: reply collection (:class:`Exchange`,
  :class:`PollBackoff`, :func:`collect_reply_list`, :func:`collect_replies`,
  :func:`unreachable`, :func:`from_superlink`, ``UNREACHABLE_ERRORS``,
  ``MAX_POLL_INTERVAL``).
- :mod:`~fedgsp_flwr.strategies.hook_support`: hook support (:class:`HookSupport`,
  :func:`missing_handler`, ``MISSING_HANDLER_TEXT``, ``ADD_HOOKS``).
- :mod:`~fedgsp_flwr.strategies.node_queries`: the node queries and their checks
  (:func:`query_histograms`, :func:`query_partitions`, :class:`HistogramReplies`,
  :func:`vector_problem`, :func:`reply_vector`, :func:`agreed_length`,
  :func:`agreed_vectors`, :func:`partition_problems`, :func:`reported_partition`,
  :func:`histogram_problem`, ``MAX_HISTOGRAM_COUNT``).
- :mod:`~fedgsp_flwr.strategies.node_registry`: the node registry
  (:class:`NodeRegistry`, :class:`PartitionOrderGrid`, :func:`node_label`,
  ``PARTITION_FALLBACK``, ``SAMPLING_FALLBACK``).

New code imports from those modules.
"""

from __future__ import annotations

from ..core._moved import moved
from .exchange import (
    MAX_POLL_INTERVAL,
    UNREACHABLE_ERRORS,
    Exchange,
    PollBackoff,
    collect_replies,
    collect_reply_list,
    from_superlink,
    unreachable,
)
from .hook_support import ADD_HOOKS, MISSING_HANDLER_TEXT, HookSupport, missing_handler
from .node_queries import (
    MAX_HISTOGRAM_COUNT,
    HistogramReplies,
    agreed_length,
    agreed_vectors,
    histogram_problem,
    partition_problems,
    query_histograms,
    query_partitions,
    reply_vector,
    reported_partition,
    vector_problem,
)
from .node_registry import (
    PARTITION_FALLBACK,
    SAMPLING_FALLBACK,
    NodeRegistry,
    PartitionOrderGrid,
    node_label,
)

__all__ = [
    "ADD_HOOKS",
    "MAX_HISTOGRAM_COUNT",
    "MAX_POLL_INTERVAL",
    "MISSING_HANDLER_TEXT",
    "PARTITION_FALLBACK",
    "SAMPLING_FALLBACK",
    "UNREACHABLE_ERRORS",
    "Exchange",
    "HistogramReplies",
    "HookSupport",
    "NodeRegistry",
    "PartitionOrderGrid",
    "PollBackoff",
    "agreed_length",
    "agreed_vectors",
    "collect_replies",
    "collect_reply_list",
    "from_superlink",
    "histogram_problem",
    "missing_handler",
    "node_label",
    "partition_problems",
    "query_histograms",
    "query_partitions",
    "reply_vector",
    "reported_partition",
    "unreachable",
    "vector_problem",
]
_MOVED = {"BASIC_TYPES": "fedgsp_flwr.protocol:BASIC_TYPES"}
__getattr__ = moved(__name__, _MOVED)
