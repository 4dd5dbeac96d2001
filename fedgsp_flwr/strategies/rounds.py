"""The round loop of our strategies: Flower's ``Strategy.start`` with its steps named.

:func:`run_rounds` is the loop of ``flwr.serverapp.strategy.Strategy.start`` (Flower
1.42): the same log lines, the same ``evaluate_fn`` calls and the same ``Result``; but
each round is two explicit steps of the strategy, ``train_round`` (plan, exchange,
aggregate) and ``evaluate_round``. FedAvg implements them with Flower's own
``configure_*`` / ``aggregate_*`` pair; a strategy that drives the grid itself (relay
chains, edge rounds, bi-level models, k models per node) overrides them, so no round
runs out of the loop's sight.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from logging import INFO
from typing import Protocol

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info

TrainResult = tuple[ArrayRecord | None, MetricRecord | None]
"""A training round's model (``None``: nothing trained) and aggregated metrics."""
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


class Rounds(Protocol):
    """What :func:`run_rounds` calls: a strategy's two steps of a round."""

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """Train round ``server_round`` from ``arrays``."""
        ...

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       grid: Grid, timeout: float) -> MetricRecord | None:
        """Evaluate round ``server_round``'s ``arrays`` on the nodes."""
        ...


def run_rounds(
    strategy: Rounds,
    grid: Grid,
    initial_arrays: ArrayRecord,
    *,
    num_rounds: int,
    timeout: float,
    train_config: ConfigRecord | None,
    evaluate_config: ConfigRecord | None,
    evaluate_fn: EvaluateFn | None,
    name: str,
    summary: Callable[[], None],
    offset: int = 0,
    should_stop: Callable[[], bool] | None = None,
) -> Result:
    """Run ``num_rounds`` rounds as Flower's ``Strategy.start`` runs them.

    Parameters
    ----------
    strategy : Rounds
        Whose ``train_round`` and ``evaluate_round`` make each round.
    grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn
        As in ``Strategy.start``.
    name : str
        The strategy's name in the first log line (``Starting <name> strategy:``).
    summary : Callable[[], None]
        Logs the strategy's settings after the run's.
    offset : int (default: 0)
        Rounds already done (a resumed run): round r of this loop is round
        ``offset + r`` to the strategy, and r in the result, the log and ``evaluate_fn``.
    should_stop : Callable[[], bool] | None
        Asked before each round; ``True`` ends the run with the rounds done.

    Returns
    -------
    Result
        The last model trained (``arrays``) and every round's metrics.
    """
    log(INFO, "Starting %s strategy:", name)
    log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
    summary()
    if offset:
        log(INFO, "\t└──> Resumed after round %d", offset)
    log(INFO, "")
    train_config = ConfigRecord() if train_config is None else train_config
    evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
    result = Result()
    t_start = time.time()
    if evaluate_fn:
        res = evaluate_fn(0, initial_arrays)
        log(INFO, "Initial global evaluation results: %s", res)
        if res is not None:
            result.evaluate_metrics_serverapp[0] = res
    arrays = initial_arrays
    for current_round in range(1, num_rounds + 1):
        if should_stop is not None and should_stop():
            log(INFO, "Stopped before round %s of %s", current_round, num_rounds)
            break
        log(INFO, "")
        log(INFO, "[ROUND %s/%s]", current_round, num_rounds)
        agg_arrays, train_metrics = strategy.train_round(offset + current_round, arrays,
                                                         train_config, grid, timeout)
        if agg_arrays is not None:
            result.arrays = arrays = agg_arrays
        if train_metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", train_metrics)
            result.train_metrics_clientapp[current_round] = train_metrics
        evaluate_metrics = strategy.evaluate_round(offset + current_round, arrays,
                                                   evaluate_config, grid, timeout)
        if evaluate_metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", evaluate_metrics)
            result.evaluate_metrics_clientapp[current_round] = evaluate_metrics
        if evaluate_fn:
            log(INFO, "Global evaluation")
            res = evaluate_fn(current_round, arrays)
            log(INFO, "\t└──> MetricRecord: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[current_round] = res
    log(INFO, "")
    log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
    log(INFO, "")
    log(INFO, "Final results:")
    log(INFO, "")
    for line in io.StringIO(str(result)):
        log(INFO, "\t%s", line.strip("\n"))
    log(INFO, "")
    return result


def own_rounds_error(strategy: object, method: str) -> TypeError:
    """The error of a Flower ``configure_*`` / ``aggregate_*`` call on a strategy whose
    round is not one send-and-aggregate."""
    name = type(strategy).__name__
    return TypeError(
        f"{name}.{method}: {name} drives the grid itself within a round, so Flower's "
        "configure/aggregate pair cannot run its round; call start(), or train_round() / "
        "evaluate_round() from your own loop")
