"""FedAvg and FedProx with per-reply validation and a per-round history; the base of
every strategy of this package.

Shared behaviour lives in objects a strategy holds, not in mixins: the node registry
(:class:`~fedgsp_flwr.strategies.nodes.NodeHistograms`, ``self.known``), the reply
checks (:func:`~fedgsp_flwr.strategies.replies.filter_replies`) and the checkpoint
state (:class:`~fedgsp_flwr.strategies.state.StrategyState`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from .nodes import NodeHistograms
from .replies import filter_replies
from .state import NodeMap, StrategyState


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


class FedAvg(FlowerFedAvg):
    """Flower's FedAvg that validates each reply and keeps a per-round history.

    Takes the parameters of :class:`flwr.serverapp.strategy.FedAvg`. Unsound replies
    are dropped one by one (see :func:`~fedgsp_flwr.strategies.replies.filter_replies`)
    before Flower's aggregation runs. :attr:`history` records per round the aggregated
    client metrics, the replies used and rejected, the model bytes sent and received in
    training (``bytes-sent``, ``bytes-received``), the models uploaded (``uploads``:
    replies with content) and the seconds from sending a stage's messages to
    aggregating their replies (``train-time``, ``eval-time``).

    Attributes
    ----------
    history : dict[int, dict[str, Any]]
        Per-round metrics, by round.
    known : NodeHistograms | None
        What the strategy knows of the nodes (strategies that ask for histograms); it
        goes into the checkpoint and translates node ids on resume.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history: dict[int, dict[str, Any]] = {}
        self.known: NodeHistograms | None = None
        self._sent_arrays: ArrayRecord | None = None
        self._sent_at: dict[str, float] = {}

    # --- checkpoint (written and read by fedgsp_flwr.app.checkpoint) -------------------

    def checkpoint_state(self) -> StrategyState:
        """The state to save after a round: what is known of the nodes."""
        state = StrategyState()
        if self.known is not None:
            state.merge("known", self.known.checkpoint_state())
        return state

    def restore_state(self, state: StrategyState, node_map: NodeMap) -> None:
        """Take back :meth:`checkpoint_state`, node ids translated by ``node_map``."""
        if self.known is not None:
            self.known.restore_state(state.part("known"), node_map)

    def node_partitions(self) -> dict[int, int]:
        """The ``partition-id`` each known node reported (to translate node ids)."""
        return dict(self.known.partition_ids) if self.known is not None else {}

    def artifacts(self, final: bool) -> dict[str, bytes | str]:
        """Files of the strategy's own state for the run's results folder (by name)."""
        return {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember the arrays sent, to check the replies' shapes against them."""
        self._sent_arrays = arrays
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.history.setdefault(server_round, {})["bytes-sent"] = (
            len(messages) * arrays.count_bytes())
        self._start_clock("train", messages)
        return messages

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Note when the evaluation messages leave, to time their round trip."""
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
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
        arrays, metrics = super().aggregate_train(server_round, sound)
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
        metrics = super().aggregate_evaluate(server_round, sound)
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
            key = "train-time" if stage == "train" else "eval-time"
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


class FedProx(FedAvg):
    """FedProx (Li et al., 2020): FedAvg whose clients add ``proximal_mu``/2
    ||w - w_global||^2 to their loss.

    The weight goes to the clients as ``proximal-mu`` in every training config, as in
    :class:`flwr.serverapp.strategy.FedProx`.

    Parameters
    ----------
    proximal_mu : float (default: 0.0)
        Weight of the proximal term (>= 0).
    **kwargs : Any
        FedAvg's parameters.
    """

    def __init__(self, *, proximal_mu: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_parameters("FedProx", [(proximal_mu >= 0, "proximal_mu must be >= 0")])
        self.proximal_mu = proximal_mu

    def summary(self) -> None:
        """Log the proximal weight, then FedAvg's settings."""
        log(INFO, "\t├──> FedProx: proximal-mu %g", self.proximal_mu)
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's messages, with ``proximal-mu`` in their config."""
        config["proximal-mu"] = self.proximal_mu
        return super().configure_train(server_round, arrays, config, grid)


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
