"""Base class of strategies that train through sequential relay chains."""

from __future__ import annotations

import json
import time
from abc import abstractmethod
from collections.abc import Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..protocol import METRICS, SERVER_ROUND, TRAIN
from . import saved
from .aggregation import GroupModel, average_arrays
from .exchange import MAX_POLL_INTERVAL
from .metrics import MetricsAggregation
from .node_registry import NodeRegistry, node_label
from .params import non_negative, positive, setting
from .relay import HOP_LOST, HOP_OK, HOP_TIMEOUT, ChainResult, run_relay
from .rounds import TrainResult
from .server_round import ServerSideRound


def relay_message_type_problem(message_type: str) -> str | None:
    """Why ``message_type`` cannot carry relay hops, or ``None``."""
    category, dot, action = message_type.partition(".")
    if category != TRAIN or (dot and not action.isidentifier()):
        return (f"relay_message_type must be 'train' or 'train.<identifier>', "
                f"got {message_type!r}")
    return None


class RelayStrategy(ServerSideRound):
    """A FedAvg whose training rounds run as sequential chains of nodes.

    Flower's ``Strategy.start`` loop is kept: :meth:`configure_train` runs the round's
    chains through :func:`~fedgsp_flwr.strategies.relay.run_relay` (which needs many
    push/pull exchanges, not one ``send_and_receive``) and returns no messages;
    :meth:`aggregate_train` then returns the average of the chains' models. Evaluation
    is FedAvg's.

    Every hop is a ``train`` message that any ClientApp's train handler answers: it
    carries the round's training config (``lr``, ... as given to ``start``, unchanged)
    plus ``server-round``, ``relay-group`` and ``relay-hop``. The nodes' class
    histograms are asked once per node (``query.histogram``) and kept in :attr:`known`.
    """

    histogram_fallback = "nodes without a histogram are grouped at random"

    # The state a checkpoint saves (node ids translated on resume):
    rng = saved.generator("relay-rng")
    plain_nodes = saved.node_set("relay-plain-nodes", optional=True)  # no relay handler
    # Every round's chains in hop order, by partition id where known (chains.json).
    chain_log = saved.int_keyed("relay-chains", optional=True)

    relay_message_type: str = setting(
        default=TRAIN, help="message type of relay hops (train: any ClientApp's train "
        "handler; a node without a train.<name> handler gets train)",
        check=lambda v: relay_message_type_problem(v) is None,
        rule="'train' or 'train.<identifier>'", key="relay-message")
    weighted_average: bool = setting(default=True, help="average the chains' models by "
                                     "the examples trained along each (false: the "
                                     "uniform mean)")
    poll_interval: float = setting(
        default=0.02, help="seconds the relay waits after a poll that brought no hop "
        f"reply, doubled with each further empty poll up to {MAX_POLL_INTERVAL:g} (or "
        "this value if longer; 3.0 behaves as send_and_receive in deployment)",
        check=positive, key="relay-poll")
    seed: int = setting(default=0, help="seed of the grouping, sampling and orders (the "
                        "app: its seed)", check=non_negative)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rng = np.random.default_rng(self.seed)
        self.last_chains: list[ChainResult] = []

    def registry(self) -> NodeRegistry:
        """Class histograms and partition ids (and Semi-FL's clusters), for grouping."""
        return NodeRegistry(type(self).__name__, self.query_timeout, self.histogram_fallback)

    @abstractmethod
    def make_chains(self, server_round: int, grid: Grid) -> tuple[list[list[int]], dict[str, Any]]:
        """Return this round's chains (node ids in training order) and round metrics."""

    def artifacts(self, final: bool) -> dict[str, bytes | str]:
        """``chains.json``: ``{"<round>": [[partition ids in hop order], ...]}`` (a node
        that reported no partition id appears as ``"node-<id>"``)."""
        return {**super().artifacts(final),
                "chains.json": json.dumps({str(r): c for r, c in self.chain_log.items()})}

    def traffic_estimate(self, model_bytes: int) -> dict[str, float]:
        """A method's own estimate of a round's traffic, reported beside the measured."""
        return {}

    def summary(self) -> None:
        """Log the relay settings, then FedAvg's."""
        log(INFO, "\t├──> Relay: message '%s', hop timeout %gs, %s average",
            self.relay_message_type, self.train_timeout,
            "example-weighted" if self.weighted_average else "uniform")
        super().summary()

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """Run the round's relay chains; the round's result waits for aggregate_train."""
        chains, metrics = self.make_chains(server_round, grid)
        partitions = self.known.partition_ids
        self.chain_log[server_round] = [
            [partitions.get(n, node_label(n, partitions)) for n in chain] for chain in chains]
        hop_config = ConfigRecord(dict(config))
        hop_config[SERVER_ROUND] = server_round
        started = time.monotonic()
        results = run_relay(grid, chains, arrays, hop_config, train_timeout=self.reply_timeout,
                            message_type=self.relay_message_type,
                            weighted_by_key=self.weighted_by_key,
                            poll_interval=self.poll_interval, plain_nodes=self.plain_nodes)
        self.last_chains = results
        metrics.update(relay_metrics(results, time.monotonic() - started,
                                     self.train_metrics_aggr_fn, self.weighted_by_key))
        metrics.update(self.traffic_estimate(arrays.count_bytes()))
        skipped = {node: reason for r in results for node, reason in r.skipped.items()}
        # A node that is gone or timed out must answer a histogram query again before it
        # is chained again (a dead node would otherwise cost every round a timeout).
        self.known.forget([h.node_id for r in results for h in r.hops
                           if h.status in (HOP_LOST, HOP_TIMEOUT)])
        return self.finish_round(server_round, self.average(results), metrics,
                                 sum(r.trained for r in results), skipped)

    def group_models(self) -> dict[int, GroupModel]:
        """The last round's chains: each chain's model and its nodes, by chain index."""
        return {r.group: GroupModel(r.arrays, list(r.nodes), {
            n: self.known.partition_ids[n] for n in r.nodes if n in self.known.partition_ids})
            for r in self.last_chains if r.trained}

    def average(self, results: Sequence[ChainResult]) -> ArrayRecord | None:
        """Average the trained chains' models (example-weighted or uniform)."""
        trained = [r for r in results if r.trained]
        if not trained:
            return None
        return average_arrays([r.arrays for r in trained],
                              [r.num_examples if self.weighted_average else 1.0
                               for r in trained])


def relay_metrics(results: Sequence[ChainResult], seconds: float,
                  aggregate: MetricsAggregation, weighted_by_key: str) -> dict[str, Any]:
    """Per-round relay figures: the hops' own metrics aggregated by ``aggregate``
    (whatever the ClientApp names them), then groups trained, uploads, hops, the
    longest chain (hops that trained, for the cost model), skips, bytes, time.

    ``uploads`` counts the models that enter the aggregate (one per trained chain,
    Semi-FL's cluster heads); every hop also passes through the server (``hops``).
    """
    hops = [h for r in results for h in r.hops]
    trained = [RecordDict({METRICS: h.metrics}) for h in hops if h.status == HOP_OK]
    metrics: dict[str, Any] = dict(aggregate(trained, weighted_by_key)) if trained else {}
    metrics.update({
        "groups-trained": sum(r.trained for r in results),
        "uploads": sum(r.trained for r in results),
        "hops": len(hops),
        "longest-chain": max((sum(h.status == HOP_OK for h in r.hops) for r in results),
                             default=0),
        "skipped-nodes": sum(len(r.skipped) for r in results),
        "bytes-sent": sum(h.bytes_sent for h in hops),
        "bytes-received": sum(h.bytes_received for h in hops),
        "train-time": seconds,
        "hop-latency-mean": float(np.mean([h.latency for h in hops])) if hops else 0.0,
    })
    return metrics


PARAMS = RelayStrategy.spec
