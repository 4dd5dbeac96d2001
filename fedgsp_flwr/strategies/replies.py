"""Reply validation: a bad client reply never reaches an aggregate.

Flower's own strategies validate replies as a batch and give up on the whole round when
one reply is inconsistent. Here every reply is checked on its own; a bad one is dropped
with one logged reason naming its node, and the others are aggregated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from logging import WARNING

from flwr.app import ArrayRecord, Message
from flwr.common.logger import log

from .decoding import MAX_ABS_VALUE, ArrayRefused, decode_like
from .metrics import reply_metrics

# A reply's weight (its examples) above this is absurd and would swamp an average.
MAX_WEIGHT = 10**9
# How the ClientApp's exception reaches the server: in the simulation engine as Ray's
# traceback ending "... occurred. Message: <text>", in deployment as
# "<class 'ValueError'>:<'<text>'>".
_SIMULATION_ERROR = re.compile(r"occurred\. Message: (.+?)(?:'>)?$", re.MULTILINE)
_DEPLOYMENT_ERROR = re.compile(r"<class '(?:[\w]+\.)*(\w+)'>:<'(.*)'>", re.DOTALL)


def error_text(reason: str | None, limit: int = 300) -> str:
    """The ClientApp's own error message in an error reply's reason, on one line."""
    reason = reason or ""
    if found := _SIMULATION_ERROR.findall(reason):
        text = found[-1]
        named = [line.strip() for line in reason.splitlines()
                 if line.strip().endswith(f": {text}") and "Exception " not in line]
        text = named[-1] if named else text
    elif match := _DEPLOYMENT_ERROR.fullmatch(reason.strip()):
        inner = error_text(match.group(2), limit)
        text = inner if match.group(1) in inner else f"{match.group(1)}: {inner}"
    else:
        lines = [line.strip() for line in reason.splitlines() if line.strip()]
        text = lines[-1] if lines else reason
    return text if len(text) <= limit else text[:limit - 3] + "..."


def reply_problem(
    reply: Message,
    *,
    reference: ArrayRecord | None,
    weighted_by_key: str,
    require_arrays: bool,
) -> str | None:
    """Return why a reply must not be aggregated, or ``None`` if it is sound.

    Parameters
    ----------
    reply : Message
        A reply from a node.
    reference : ArrayRecord | None
        The arrays that were sent; a returned ArrayRecord must match their keys,
        shapes and dtypes. ``None`` skips that comparison.
    weighted_by_key : str
        Metric that weights the reply (e.g. ``num-examples``): must be a number in
        (0, :data:`MAX_WEIGHT`].
    require_arrays : bool
        Whether the reply must carry exactly one ArrayRecord (training replies).

    Returns
    -------
    str | None
        A human-readable reason, or ``None``.
    """
    if reply.has_error():
        return f"error reply: {error_text(reply.error.reason)}"
    content = reply.content
    if len(content.metric_records) != 1:
        return f"expected one MetricRecord, got {len(content.metric_records)}"
    metrics = reply_metrics(content)
    weight = metrics.get(weighted_by_key)
    if weight is None:
        return f"metric '{weighted_by_key}' is missing"
    if isinstance(weight, list) or not math.isfinite(weight) or not 0 < weight <= MAX_WEIGHT:
        return (f"metric '{weighted_by_key}' must be a number in (0, {MAX_WEIGHT:g}], "
                f"got {weight!r}")
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if not all(math.isfinite(v) for v in values):
            return f"metric '{key}' is not finite: {value!r}"
        if not all(abs(v) <= MAX_ABS_VALUE for v in values):
            return f"metric '{key}' is beyond +-{MAX_ABS_VALUE:.3g}: {value!r}"
    if require_arrays:
        if len(content.array_records) != 1:
            return f"expected one ArrayRecord, got {len(content.array_records)}"
        problem = arrays_problem(next(iter(content.array_records.values())), reference)
        if problem:
            return problem
    return None


def arrays_problem(arrays: ArrayRecord, reference: ArrayRecord | None) -> str | None:
    """Return why ``arrays`` cannot be averaged with ``reference``, or ``None``.

    Every array is decoded and checked by :func:`~fedgsp_flwr.strategies.decoding.decode_like`
    (its bytes against its declaration, the declaration against ``reference``, finite
    values); the decoded values stay with the arrays for the aggregation.
    """
    try:
        decode_like(arrays, reference)
    except ArrayRefused as refused:
        return str(refused)
    return None


def filter_replies(
    replies: Iterable[Message],
    *,
    reference: ArrayRecord | None,
    weighted_by_key: str,
    require_arrays: bool,
    stage: str,
    partition_ids: Mapping[int, int] | None = None,
) -> tuple[list[Message], dict[int, str]]:
    """Keep the sound replies; log and return the reason for every other one.

    A reply is never rejected for its metric names: metrics are aggregated per name
    (:func:`~fedgsp_flwr.strategies.metrics.aggregate_metrics`).

    Parameters
    ----------
    replies : Iterable[Message]
        Replies of one round.
    reference : ArrayRecord | None
        The arrays that were sent (see :func:`reply_problem`).
    weighted_by_key : str
        The weighting metric.
    require_arrays : bool
        Whether replies must carry arrays.
    stage : str
        Name used in log lines (e.g. ``"train"``).
    partition_ids : Mapping[int, int] | None
        The nodes' partition ids, named beside the node where known.

    Returns
    -------
    tuple[list[Message], dict[int, str]]
        The sound replies, and the rejected ones' reasons by source node id.
    """
    sound: list[Message] = []
    rejected: dict[int, str] = {}
    for reply in replies:
        problem = reply_problem(
            reply,
            reference=reference,
            weighted_by_key=weighted_by_key,
            require_arrays=require_arrays,
        )
        if problem is None:
            sound.append(reply)
        else:
            rejected[reply.metadata.src_node_id] = problem
    for node_id, reason in rejected.items():
        partition = (partition_ids or {}).get(node_id)
        log(WARNING, "%s: rejected reply from node %d%s: %s", stage, node_id,
            "" if partition is None else f" (partition {partition})", reason)
    return sound, rejected
