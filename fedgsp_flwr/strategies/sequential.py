"""Base class of strategies that train through sequential relay chains."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from .fedavg import ServerSideRound, average_arrays, check_parameters
from .nodes import NodeHistograms
from .relay import HOP_LOST, HOP_TIMEOUT, ChainResult, run_relay
from .state import NodeMap, StrategyState, generator_state, set_generator_state

RELAY_MESSAGE_TYPES = ("train.relay", "train")


class RelayStrategy(ServerSideRound):
    """A FedAvg whose training rounds run as sequential chains of nodes.

    Flower's ``Strategy.start`` loop is kept: :meth:`configure_train` runs the round's
    chains through :func:`~fedgsp_flwr.strategies.relay.run_relay` (which needs many
    push/pull exchanges, not one ``send_and_receive``) and returns no messages;
    :meth:`aggregate_train` then returns the average of the chains' models. Evaluation
    is FedAvg's.

    Every hop carries the round's training config (``local-epochs``, ``lr``, ... as
    given to ``start``) plus ``server-round``. The nodes' class histograms are asked
    once per node (``query.histogram``) and kept in :attr:`known`.

    Parameters
    ----------
    train_timeout : float (default: 3600.0)
        Seconds a node may take for one hop before it is skipped.
    query_timeout : float (default: 300.0)
        Seconds to wait for ``query.histogram`` replies.
    relay_message_type : str (default: "train.relay")
        ``train.relay`` (our handler) or ``train`` (any ClientApp's train handler).
    weighted_average : bool (default: True)
        Average the chains' models weighted by the examples trained along each chain;
        ``False`` takes the uniform mean.
    poll_interval : float (default: 0.02)
        Seconds between polls for hop replies while none arrived.
    seed : int (default: 0)
        Seed of the strategy's own random choices (grouping, sampling, order).
    **kwargs : Any
        FedAvg's parameters (sampling of evaluation nodes, keys, ...).
    """

    def __init__(
        self,
        *,
        train_timeout: float = 3600.0,
        query_timeout: float = 300.0,
        relay_message_type: str = "train.relay",
        weighted_average: bool = True,
        poll_interval: float = 0.02,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_parameters(type(self).__name__, [
            (train_timeout > 0 and query_timeout > 0, "timeouts must be > 0"),
            (relay_message_type in RELAY_MESSAGE_TYPES,
             f"relay_message_type must be one of {RELAY_MESSAGE_TYPES}, "
             f"got {relay_message_type!r}"),
            (poll_interval > 0, f"poll_interval must be > 0, got {poll_interval}"),
        ])
        self.train_timeout = train_timeout
        self.relay_message_type = relay_message_type
        self.weighted_average = weighted_average
        self.poll_interval = poll_interval
        self.rng = np.random.default_rng(seed)
        self.known: NodeHistograms = NodeHistograms(type(self).__name__, query_timeout)

    @abstractmethod
    def make_chains(self, server_round: int, grid: Grid) -> tuple[list[list[int]], dict[str, Any]]:
        """Return this round's chains (node ids in training order) and round metrics."""

    def checkpoint_state(self) -> StrategyState:
        """The random generator, beside what is known of the nodes."""
        state = super().checkpoint_state()
        state.meta["relay-rng"] = generator_state(self.rng)
        return state

    def restore_state(self, state: StrategyState, node_map: NodeMap) -> None:
        """Take back :meth:`checkpoint_state`."""
        super().restore_state(state, node_map)
        set_generator_state(self.rng, state.meta["relay-rng"])

    def traffic_estimate(self, model_bytes: int) -> dict[str, float]:
        """A method's own estimate of a round's traffic, reported beside the measured."""
        return {}

    def summary(self) -> None:
        """Log the relay settings, then FedAvg's."""
        log(INFO, "\t├──> Relay: message '%s', hop timeout %gs, %s average",
            self.relay_message_type, self.train_timeout,
            "example-weighted" if self.weighted_average else "uniform")
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Run the round's relay chains; the round's result waits for aggregate_train."""
        chains, metrics = self.make_chains(server_round, grid)
        hop_config = ConfigRecord(dict(config))
        hop_config["server-round"] = server_round
        started = time.monotonic()
        results = run_relay(grid, chains, arrays, hop_config, train_timeout=self.train_timeout,
                            message_type=self.relay_message_type,
                            weighted_by_key=self.weighted_by_key,
                            poll_interval=self.poll_interval)
        metrics.update(relay_metrics(results, time.monotonic() - started))
        metrics.update(self.traffic_estimate(arrays.count_bytes()))
        skipped = {node: "skipped" for r in results for node in r.skipped}
        # A node that is gone or timed out must answer a histogram query again before it
        # is chained again (a dead node would otherwise cost every round a timeout).
        self.known.forget([h.node_id for r in results for h in r.hops
                           if h.status in (HOP_LOST, HOP_TIMEOUT)])
        return self.finish_round(server_round, self.average(results), metrics,
                                 sum(r.trained for r in results), skipped)

    def average(self, results: Sequence[ChainResult]) -> ArrayRecord | None:
        """Average the trained chains' models (example-weighted or uniform)."""
        trained = [r for r in results if r.trained]
        if not trained:
            return None
        return average_arrays([r.arrays for r in trained],
                              [r.num_examples if self.weighted_average else 1.0
                               for r in trained])


def relay_metrics(results: Sequence[ChainResult], seconds: float) -> dict[str, Any]:
    """Per-round relay figures: groups trained, uploads, hops, skips, bytes, time, loss.

    ``uploads`` counts the models that enter the aggregate (one per trained chain,
    Semi-FL's cluster heads); every hop also passes through the server (``hops``).
    """
    hops = [h for r in results for h in r.hops]
    losses = [(loss, r.num_examples) for r in results
              if (loss := r.mean_metric("train-loss")) is not None]
    metrics: dict[str, Any] = {
        "groups-trained": sum(r.trained for r in results),
        "uploads": sum(r.trained for r in results),
        "hops": len(hops),
        "skipped-nodes": sum(len(r.skipped) for r in results),
        "bytes-sent": sum(h.bytes_sent for h in hops),
        "bytes-received": sum(h.bytes_received for h in hops),
        "train-time": seconds,
        "hop-latency-mean": float(np.mean([h.latency for h in hops])) if hops else 0.0,
    }
    if losses:  # mean_metric is None for chains without examples
        metrics["train-loss"] = sum(v * n for v, n in losses) / sum(n for _, n in losses)
    return metrics
