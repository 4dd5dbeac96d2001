"""Client metrics aggregated whatever the ClientApp calls them.

Flower's ``aggregate_metricrecords`` needs every reply to report the same keys (its
strategies check that first and give up on the round otherwise). A ClientApp of a user
names its metrics as it likes (``train_loss``, ``eval_acc``), and two kinds of nodes in
one federation may report different ones; :func:`aggregate_metrics` averages each key
over the replies that report it, so no reply is ever dropped for its metric names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import MetricRecord, RecordDict

MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]
"""Flower's ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn`` signature."""


def reply_metrics(content: RecordDict) -> MetricRecord:
    """The (first) MetricRecord of a reply's content; an empty one if it has none."""
    return next(iter(content.metric_records.values()), MetricRecord())


def metrics_order(content: RecordDict) -> list[tuple[str, tuple[float, ...]]]:
    """A sort key for replies by their metrics, total whatever the values are: a
    number is compared as a one-element tuple, so a node that sends a list where
    others send numbers is ordered, not a TypeError (numbers alone sort as before).
    """
    return [(key, tuple(value) if isinstance(value, list) else (value,))
            for key, value in sorted(reply_metrics(content).items())]


def aggregate_metrics(records: list[RecordDict], weighted_by_key: str) -> MetricRecord:
    """Weighted mean of every metric the replies report, each over the replies that
    report it (the default ``train_metrics_aggr_fn`` and ``evaluate_metrics_aggr_fn``
    of our strategies).

    Each reply weighs its ``weighted_by_key`` metric (1 where absent). Numbers are
    averaged; lists element-wise when they all have one length (a key whose lists
    differ in length is left out); the weight key itself is left out, as in Flower.

    Parameters
    ----------
    records : list[RecordDict]
        Reply contents, each with one MetricRecord.
    weighted_by_key : str
        The metric that weighs each reply (e.g. ``num-examples``).

    Returns
    -------
    MetricRecord
        The means, keys in order of first appearance.
    """
    metrics = [reply_metrics(r) for r in records]
    return MetricRecord(weighted_means(
        ((m, float(m.get(weighted_by_key, 1.0))) for m in metrics),  # type: ignore[arg-type]
        exclude=(weighted_by_key,)))


def weighted_means(
    entries: Iterable[tuple[Mapping[str, Any], float]], exclude: Sequence[str] = ()
) -> dict[str, Any]:
    """Per key, the weighted mean over the entries that have it (see
    :func:`aggregate_metrics`).
    """
    sums: dict[str, tuple[Any, float]] = {}
    dropped: set[str] = set(exclude)
    for values, weight in entries:
        for key, value in values.items():
            if key in dropped or isinstance(value, (str, bytes)):
                continue
            current = np.asarray(value, dtype=np.float64) * weight
            if key in sums:
                total, weights = sums[key]
                if total.shape != current.shape:
                    dropped.add(key)
                    del sums[key]
                    continue
                sums[key] = (total + current, weights + weight)
            else:
                sums[key] = (current, weight)
    out: dict[str, Any] = {}
    for key, (total, weights) in sums.items():
        if weights <= 0:
            continue
        mean = total / weights
        out[key] = mean.tolist() if mean.ndim else float(mean)
    return out


def renamed(metrics: Mapping[str, Any], suffix: str) -> dict[str, Any]:
    """The metrics with ``-<suffix>`` appended to every name (``eval_acc-global``)."""
    return {f"{key}-{suffix}": value for key, value in metrics.items()}


def ours_if_none(aggregation: MetricsAggregation | None) -> MetricsAggregation:
    """``aggregation``, or :func:`aggregate_metrics` for ``None`` (which Flower's
    constructors pass on for "the default")."""
    return aggregation or aggregate_metrics
