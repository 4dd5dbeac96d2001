"""Flower message-API strategies for non-IID federated learning.

Use them in any Flower ServerApp like Flower's own strategies, or by name from the run
config of this app (``strategy = "fedavg"``) through :func:`build_strategy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.serverapp.strategy import Strategy

from ..config import ConfigError, RunConfig
from .edge_assignment import load_topology
from .fedavg import FedAvg, FedProx, ValidatedAggregation
from .fedgsp import FedGSP
from .fesem import FeSEM
from .hierfl import HierFL
from .replies import filter_replies, reply_problem
from .semifl import CLUSTER_SOURCES, SemiFL, load_cluster_assignment
from .sequential import RelayStrategy
from .stocfl import StoCFL


def sampling_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Flower's FedAvg sampling parameters from the run config."""
    return {
        "fraction_train": cfg.fraction_train,
        "fraction_evaluate": cfg.fraction_evaluate,
        "min_available_nodes": cfg.min_available_nodes,
        "min_train_nodes": 1,
        "min_evaluate_nodes": 1 if cfg.fraction_evaluate > 0 else 0,
    }


def _fedgsp(cfg: RunConfig, grouping: str, fixed_groups: bool) -> Strategy:
    kwargs = sampling_kwargs(cfg)
    del kwargs["fraction_train"]  # FedGSP samples groups with kappa instead
    return FedGSP(
        growth=cfg.growth,
        alpha=cfg.growth_alpha,
        beta=cfg.growth_beta,
        kappa=cfg.kappa,
        grouping=grouping,
        num_groups=(cfg.num_groups or cfg.growth_beta) if fixed_groups else None,
        icg_iterations=cfg.icg_iterations,
        icg_leftover=cfg.icg_leftover,
        icg_normalize=cfg.icg_normalize,
        icg_balance=cfg.icg_balance,
        hop_timeout=cfg.hop_timeout,
        histogram_timeout=cfg.hop_timeout,
        poll_interval=cfg.relay_poll,
        relay_message_type=cfg.relay_message,
        local_epochs=cfg.local_epochs,
        seed=cfg.seed,
        **kwargs,
    )


def _hierfl(cfg: RunConfig) -> Strategy:
    return HierFL(
        policy=cfg.hier_policy,
        num_edges=cfg.hier_edges,
        reach_per_user=cfg.hier_reach,
        topology=load_topology(cfg.hier_topology) if cfg.hier_topology else None,
        tau1=cfg.tau1,
        tau2=cfg.tau2,
        time_limit=cfg.hier_time_limit,
        edge_round_timeout=cfg.round_timeout,
        seed=cfg.seed,
        **sampling_kwargs(cfg),
    )


def _stocfl(cfg: RunConfig) -> Strategy:
    return StoCFL(
        tau=cfg.stocfl_tau,
        lambda_=cfg.stocfl_lambda,
        sketch=cfg.sketch,
        sketch_dim=cfg.sketch_dim,
        sketch_epochs=cfg.sketch_epochs,
        sketch_seed=cfg.seed,
        merge_model=cfg.merge_model,
        holdout_fraction=cfg.holdout_fraction,
        query_timeout=cfg.hop_timeout,
        train_timeout=cfg.round_timeout,
        seed=cfg.seed,
        **sampling_kwargs(cfg),
    )


def _fesem(cfg: RunConfig) -> Strategy:
    return FeSEM(
        k=cfg.fesem_k,
        init=cfg.fesem_init,
        new_clients=cfg.fesem_new_clients,
        layers=[n.strip() for n in cfg.fesem_layers.split(",") if n.strip()] or None,
        train_timeout=cfg.round_timeout,
        seed=cfg.seed,
        **sampling_kwargs(cfg),
    )


def _semifl(cfg: RunConfig) -> Strategy:
    kwargs = sampling_kwargs(cfg)
    del kwargs["fraction_train"]  # every cluster trains every round
    rule = cfg.semifl_clusters
    is_file = rule not in CLUSTER_SOURCES
    return SemiFL(
        clusters="file" if is_file else rule,
        assignment=load_cluster_assignment(rule) if is_file else None,
        cluster_size=cfg.cluster_size,
        offset=cfg.semifl_offset,
        shuffle_order=cfg.semifl_shuffle,
        weighted_average=cfg.semifl_weighted,
        hop_timeout=cfg.hop_timeout,
        histogram_timeout=cfg.hop_timeout,
        poll_interval=cfg.relay_poll,
        relay_message_type=cfg.relay_message,
        local_epochs=cfg.local_epochs,
        seed=cfg.seed,
        **kwargs,
    )


STRATEGIES: dict[str, Callable[[RunConfig], Strategy]] = {
    "fedavg": lambda cfg: FedAvg(**sampling_kwargs(cfg)),
    "fedprox": lambda cfg: FedProx(**sampling_kwargs(cfg), proximal_mu=cfg.proximal_mu),
    "fedgsp": lambda cfg: _fedgsp(cfg, "icg", fixed_groups=False),
    "naivegsp": lambda cfg: _fedgsp(cfg, "random", fixed_groups=True),
    "naivegsp-icg": lambda cfg: _fedgsp(cfg, "icg", fixed_groups=True),
    "hierfl": _hierfl,
    "stocfl": _stocfl,
    "fesem": _fesem,
    "semifl": _semifl,
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
    "FeSEM",
    "FedAvg",
    "FedGSP",
    "FedProx",
    "HierFL",
    "RelayStrategy",
    "SemiFL",
    "StoCFL",
    "ValidatedAggregation",
    "build_strategy",
    "filter_replies",
    "reply_problem",
    "sampling_kwargs",
]
