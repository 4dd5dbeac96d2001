"""FedAvg and FedProx with per-reply validation and a per-round history."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import FedProx as FlowerFedProx

from ..checkpoint import Checkpointable
from .replies import filter_replies


def check_parameters(owner: str, checks: Iterable[tuple[bool, str]]) -> None:
    """Raise ``ValueError("<owner>: <message>")`` for the first failed (ok, message).

    Raises
    ------
    ValueError
        Naming the strategy and the parameter.
    """
    for ok, message in checks:
        if not ok:
            raise ValueError(f"{owner}: {message}")


def average_arrays(records: Sequence[ArrayRecord], weights: Sequence[float]) -> ArrayRecord:
    """The weighted mean of models with the same keys, shapes and dtypes.

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
    for key in records[0].keys():
        values = [r[key].numpy() for r in records]
        mean = sum(wi * v for wi, v in zip(w, values, strict=True))
        averaged[key] = Array(np.asarray(mean).astype(values[0].dtype))
    return ArrayRecord(averaged)


def array_bytes(messages: Iterable[Message]) -> int:
    """Bytes of the ArrayRecords the messages carry (error replies carry none)."""
    return sum(record.count_bytes() for m in messages if m.has_content()
               for record in m.content.array_records.values())


class ValidatedAggregation(Checkpointable):
    """Mixin for Flower message-API strategies: validate each reply, keep a history.

    Placed before a Flower strategy in the bases (``class S(ValidatedAggregation,
    FedAvg)``), it drops unsound replies one by one (see
    :func:`~fedgsp_flwr.strategies.replies.filter_replies`) before the strategy's own
    aggregation runs, and records per round the aggregated client metrics, the number
    of replies used, the rejected nodes, the model bytes sent and received in
    training (``bytes-sent``, ``bytes-received``, as the relay strategies report them),
    the models uploaded (``uploads``: replies with content)
    and the seconds from sending a stage's messages to aggregating their replies
    (``train-round-trip``, ``eval-round-trip``) in :attr:`history`.
    """

    weighted_by_key: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.history: dict[int, dict[str, Any]] = {}
        self._sent_arrays: ArrayRecord | None = None
        self._sent_at: dict[str, float] = {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember the arrays sent, to check the replies' shapes against them."""
        self._sent_arrays = arrays
        messages = list(super().configure_train(  # type: ignore[misc]
            server_round, arrays, config, grid))
        self.history.setdefault(server_round, {})["bytes-sent"] = (
            len(messages) * arrays.count_bytes())
        self._start_clock("train", messages)
        return messages

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Note when the evaluation messages leave, to time their round trip."""
        messages = list(super().configure_evaluate(  # type: ignore[misc]
            server_round, arrays, config, grid))
        self._start_clock("evaluate", messages)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the sound training replies only."""
        self._stop_clock(server_round, "train")
        replies = list(replies)
        sound, rejected = filter_replies(
            replies,
            reference=self._sent_arrays,
            weighted_by_key=self.weighted_by_key,
            require_arrays=True,
            stage="aggregate_train",
        )
        # Float sums depend on their order and replies arrive in any order: sort them
        # by content so that a seed gives the same model bit for bit.
        sound.sort(key=lambda m: next(iter(m.content.array_records.values())).object_id)
        arrays, metrics = super().aggregate_train(server_round, sound)  # type: ignore[misc]
        self._record(server_round, "train", metrics, len(sound), rejected)
        self.history[server_round]["bytes-received"] = array_bytes(replies)
        self.history[server_round]["uploads"] = sum(r.has_content() for r in replies)
        return arrays, metrics

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Aggregate the sound evaluation replies only."""
        self._stop_clock(server_round, "evaluate")
        sound, rejected = filter_replies(
            replies,
            reference=None,
            weighted_by_key=self.weighted_by_key,
            require_arrays=False,
            stage="aggregate_evaluate",
        )
        sound.sort(key=lambda m: sorted(
            next(iter(m.content.metric_records.values())).items()))
        metrics = super().aggregate_evaluate(server_round, sound)  # type: ignore[misc]
        self._record(server_round, "evaluate", metrics, len(sound), rejected)
        return metrics

    def _start_clock(self, stage: str, messages: list[Message]) -> None:
        # Flower skips aggregation when nothing is sent: a clock started then would be
        # stopped by a later round's replies.
        if messages:
            self._sent_at[stage] = time.monotonic()
        else:
            self._sent_at.pop(stage, None)

    def _stop_clock(self, server_round: int, stage: str) -> None:
        if (sent_at := self._sent_at.pop(stage, None)) is not None:
            key = "train-round-trip" if stage == "train" else "eval-round-trip"
            self.history.setdefault(server_round, {})[key] = time.monotonic() - sent_at

    def _record(
        self,
        server_round: int,
        stage: str,
        metrics: MetricRecord | None,
        num_sound: int,
        rejected: dict[int, str],
    ) -> None:
        entry = self.history.setdefault(server_round, {})
        prefix = "" if stage == "train" else "eval-"  # train metrics keep their names
        for key, value in (metrics or {}).items():
            entry[key if key.startswith(prefix) else prefix + key] = value
        entry[f"{prefix or 'train-'}replies"] = num_sound
        entry[f"{prefix or 'train-'}rejected"] = len(rejected)


class FedAvg(ValidatedAggregation, FlowerFedAvg):
    """Flower's FedAvg with per-reply validation (see :class:`ValidatedAggregation`).

    Takes the parameters of :class:`flwr.serverapp.strategy.FedAvg`.
    """


class FedProx(ValidatedAggregation, FlowerFedProx):
    """Flower's FedProx with per-reply validation (see :class:`ValidatedAggregation`).

    Takes the parameters of :class:`flwr.serverapp.strategy.FedProx`; clients add
    ``proximal-mu``/2 ||w - w_global||^2 to their loss.
    """


class ServerSideRound(FedAvg):
    """Base of strategies that run a whole training round inside ``configure_train``,
    driving the grid themselves (relay chains, edge rounds), and hand the round's model
    to Flower's loop through ``aggregate_train``.

    Subclasses end ``configure_train`` with ``return self.finish_round(...)``.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._round_result: tuple[ArrayRecord | None, MetricRecord | None] = (None, None)

    def finish_round(self, server_round: int, arrays: ArrayRecord | None,
                     metrics: dict[str, Any], used: int,
                     rejected: dict[int, str]) -> list[Message]:
        """Keep the round's model and metrics for ``aggregate_train``, record the round,
        and return no messages (Flower's loop then has none to send).
        """
        self._round_result = (arrays, MetricRecord(metrics))
        self._record(server_round, "train", self._round_result[1], used, rejected)
        return []

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Return the model and metrics of this round (computed in configure_train)."""
        result, self._round_result = self._round_result, (None, None)
        return result
