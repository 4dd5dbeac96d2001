"""Flower message-API strategies for non-IID federated learning.

Use them in any Flower ServerApp like Flower's own strategies, or by name from the run
config of this app (``strategy = "fedavg"``) through :func:`build_strategy`.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.serverapp.strategy import Strategy

from ..config import ConfigError, RunConfig
from .fedavg import FedAvg, FedProx, ValidatedAggregation
from .replies import filter_replies, reply_problem


def _fedavg(cfg: RunConfig) -> Strategy:
    return FedAvg(
        fraction_train=cfg.fraction_train,
        fraction_evaluate=cfg.fraction_evaluate,
        min_available_nodes=cfg.min_available_nodes,
        min_train_nodes=1,
        min_evaluate_nodes=1 if cfg.fraction_evaluate > 0 else 0,
    )


def _fedprox(cfg: RunConfig) -> Strategy:
    return FedProx(
        fraction_train=cfg.fraction_train,
        fraction_evaluate=cfg.fraction_evaluate,
        min_available_nodes=cfg.min_available_nodes,
        min_train_nodes=1,
        min_evaluate_nodes=1 if cfg.fraction_evaluate > 0 else 0,
        proximal_mu=cfg.proximal_mu,
    )


STRATEGIES: dict[str, Callable[[RunConfig], Strategy]] = {
    "fedavg": _fedavg,
    "fedprox": _fedprox,
}


def build_strategy(cfg: RunConfig) -> Strategy:
    """Build the strategy named by ``cfg.strategy``.

    Raises
    ------
    ConfigError
        If the name is not one of :data:`STRATEGIES`.
    """
    if cfg.strategy not in STRATEGIES:
        raise ConfigError(
            f"Unknown strategy '{cfg.strategy}'. Choose one of {', '.join(STRATEGIES)}."
        )
    return STRATEGIES[cfg.strategy](cfg)


__all__ = [
    "STRATEGIES",
    "FedAvg",
    "FedProx",
    "ValidatedAggregation",
    "build_strategy",
    "filter_replies",
    "reply_problem",
]
