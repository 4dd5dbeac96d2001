"""What strategies compute from their nodes' models: weighted means in the models'
dtypes, the bytes a round moves, and the models a strategy keeps beside the global one.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict

from ..core.arrays import as_dtype
from .decoding import values as array_values


def average_arrays(records: Sequence[ArrayRecord], weights: Sequence[float]) -> ArrayRecord:
    """The weighted mean of models with the same keys, shapes and dtypes, in their
    dtypes (integer arrays rounded).

    Raises
    ------
    ValueError
        If there is no model, or the weights are not positive.
    """
    w = np.asarray(weights, dtype=np.float64)
    if not records or len(w) != len(records) or not (w > 0).all():
        raise ValueError(f"need models and positive weights, got {len(records)} models "
                         f"and weights {w.tolist()}")
    w /= w.sum()
    averaged = {}
    for key in records[0]:
        values = [array_values(r[key]) for r in records]
        mean = sum(wi * v for wi, v in zip(w, values, strict=True))
        averaged[key] = Array(as_dtype(mean, values[0].dtype))
    return ArrayRecord(averaged)


def weighted_mean(contents: Sequence[RecordDict], weighted_by_key: str
                  ) -> dict[str, np.ndarray]:
    """Flower's ``aggregate_arrayrecords`` (the same sums in the same order, so the same
    bits) over the values the reply checks decoded, each model decoded once.
    """
    weights = [float(next(iter(c.metric_records.values()))[weighted_by_key])  # type: ignore[arg-type]
               for c in contents]
    total = sum(weights)
    mean: dict[str, np.ndarray] = {}
    for content, weight in zip(contents, (w / total for w in weights), strict=True):
        for record in content.array_records.values():
            for key, array in record.items():
                if key not in mean:
                    mean[key] = array_values(array) * weight
                else:
                    mean[key] += array_values(array) * weight
    return {k: np.asarray(v) for k, v in mean.items()}


def mean_in_dtypes(contents: Sequence[RecordDict], weighted_by_key: str) -> ArrayRecord:
    """:func:`weighted_mean` in the first reply's dtypes. Flower's mean of an integer
    array (BatchNorm's ``num_batches_tracked``) is float64: sent on as such, every later
    int64 reply would misfit the model."""
    dtypes = {k: a.dtype for k, a in next(iter(contents[0].array_records.values())).items()}
    mean = weighted_mean(contents, weighted_by_key)
    return ArrayRecord({k: Array(v if str(v.dtype) == dtypes[k] else as_dtype(v, dtypes[k]))
                        for k, v in mean.items()})


def array_bytes(messages: Iterable[Message]) -> int:
    """Bytes of the ArrayRecords the messages carry (error replies carry none)."""
    return sum(record.count_bytes() for m in messages if m.has_content()
               for record in m.content.array_records.values())


@dataclass(frozen=True)
class GroupModel:
    """A model a strategy keeps beside the global one (a cluster's, a centre's, an
    edge's, a relay group's) and the nodes it belongs to.

    Attributes
    ----------
    arrays : ArrayRecord
        The model.
    nodes : list[int]
        Its members' node ids, in partition-id order where known.
    partition_ids : dict[int, int]
        The ``partition-id`` of the members that reported one.
    metrics : dict[str, Any]
        Its last federated evaluation on its members (the ClientApp's metric names),
        empty if it was not evaluated.
    """

    arrays: ArrayRecord
    nodes: list[int]
    partition_ids: dict[int, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """``arrays`` as the bytes of an ``.npz`` file (a results folder's model files)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub wants positional
    return buffer.getvalue()
