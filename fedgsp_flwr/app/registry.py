"""Strategy names of the run config -> strategies, built from the parsed run config.

The ServerApp builds the strategy once the data is known, so that clustering
strategies get the partitions' latent groups (``ground_truth``, for ARI/NMI) and
FeSEM and IFCA their seeded models (``centre_factory``) through their constructors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord

from ..core.edge_assignment import load_topology
from ..strategies import (
    CFL,
    IDA,
    IFCA,
    Ditto,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedFusion,
    FedGSP,
    FedMMD,
    FedProx,
    FedYogi,
    FeSEM,
    HierFL,
    SemiFL,
    StoCFL,
)
from ..strategies.cfl import PARAMS as CFL_PARAMS
from ..strategies.ditto import PARAMS as DITTO_PARAMS
from ..strategies.fedgsp import PARAMS as FEDGSP_PARAMS
from ..strategies.fedprox import PARAMS as FEDPROX_PARAMS
from ..strategies.fesem import PARAMS as FESEM_PARAMS
from ..strategies.hierfl import PARAMS as HIERFL_PARAMS
from ..strategies.ida import PARAMS as IDA_PARAMS
from ..strategies.ifca import PARAMS as IFCA_PARAMS
from ..strategies.semifl import CLUSTER_SOURCES, load_cluster_assignment
from ..strategies.semifl import PARAMS as SEMIFL_PARAMS
from ..strategies.sequential import PARAMS as RELAY_PARAMS
from ..strategies.stocfl import PARAMS as STOCFL_PARAMS
from ..strategies.twostream import FEDFUSION_PARAMS, FEDMMD_PARAMS
from .config import RunConfig


@dataclass(frozen=True)
class RunContext:
    """What the run knows beside its config when it builds the strategy.

    Attributes
    ----------
    ground_truth : Mapping[int, int]
        Latent group of each partition id (clustering strategies report ARI / NMI).
    centre_factory : Callable[[int], ArrayRecord] | None
        Model k's initial weights (FeSEM's and IFCA's ``seeds`` initialisation).
    """

    ground_truth: Mapping[int, int] = field(default_factory=dict)
    centre_factory: Callable[[int], ArrayRecord] | None = None


def common_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Every strategy's FedAvg parameters (node sampling, the stop rule) from the run
    config.
    """
    return {
        "max_untrained_rounds": cfg.max_untrained_rounds,
        "query_timeout": cfg.query_timeout,
        "server_threads": cfg.server_threads or None,
        "fraction_train": cfg.fraction_train,
        "fraction_evaluate": cfg.fraction_evaluate,
        "min_available_nodes": cfg.min_available_nodes,
        "min_train_nodes": 1,
        "min_evaluate_nodes": 1 if cfg.fraction_evaluate > 0 else 0,
    }


def fedopt_kwargs(cfg: RunConfig, moments: bool = False) -> dict[str, Any]:
    """The server optimizer's settings (FedAdagrad has no moments); ``fedopt-eta`` 0
    keeps each strategy's own default.
    """
    out: dict[str, Any] = {"tau": cfg.fedopt_tau, "eta_l": cfg.lr}
    if cfg.fedopt_eta:
        out["eta"] = cfg.fedopt_eta
    if moments:
        out.update(beta_1=cfg.fedopt_beta_1, beta_2=cfg.fedopt_beta_2)
    return out


def timeout_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """The training timeout of the strategies that collect their replies themselves
    (``query_timeout`` is in :func:`common_kwargs`)."""
    return {"train_timeout": cfg.train_timeout}


def relay_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """The relay strategies' settings (FedGSP and Semi-FL) from the run config."""
    return {**timeout_kwargs(cfg), **RELAY_PARAMS.arguments(cfg.options), "seed": cfg.seed}


def _fedgsp(cfg: RunConfig, grouping: str, fixed_groups: bool, run: RunContext) -> FedAvg:
    kwargs = common_kwargs(cfg)
    del kwargs["fraction_train"]  # FedGSP samples groups with kappa instead
    return FedGSP(
        **FEDGSP_PARAMS.arguments(cfg.options),
        grouping=grouping,
        num_groups=(cfg.fedgsp_num_groups or cfg.options["fedgsp-growth-beta"])
        if fixed_groups else None,
        **relay_kwargs(cfg),
        **kwargs,
    )


def _hierfl(cfg: RunConfig, run: RunContext) -> FedAvg:
    return HierFL(
        **HIERFL_PARAMS.arguments(cfg.options),
        topology=load_topology(cfg.hierfl_topology) if cfg.hierfl_topology else None,
        **timeout_kwargs(cfg),
        seed=cfg.seed,
        **common_kwargs(cfg),
    )


def _stocfl(cfg: RunConfig, run: RunContext) -> FedAvg:
    return StoCFL(
        **STOCFL_PARAMS.arguments(cfg.options),
        sketch_seed=cfg.seed,
        ground_truth=run.ground_truth,
        **timeout_kwargs(cfg),
        seed=cfg.seed,
        **common_kwargs(cfg),
    )


def _names(text: str) -> list[str] | None:
    """A comma-separated run-config list of array names; ``None`` if it names none."""
    return [n.strip() for n in text.split(",") if n.strip()] or None


def _fesem(cfg: RunConfig, run: RunContext) -> FedAvg:
    return FeSEM(
        **FESEM_PARAMS.arguments(cfg.options),
        layers=_names(cfg.fesem_layers),
        centre_factory=run.centre_factory,
        ground_truth=run.ground_truth,
        **timeout_kwargs(cfg),
        seed=cfg.seed,
        **common_kwargs(cfg),
    )


def _ifca(cfg: RunConfig, run: RunContext) -> FedAvg:
    return IFCA(
        **IFCA_PARAMS.arguments(cfg.options),
        model_factory=run.centre_factory,
        head_layers=_names(cfg.ifca_head_layers),
        loss_key=cfg.ifca_loss_key or None,
        ground_truth=run.ground_truth,
        **timeout_kwargs(cfg),
        seed=cfg.seed,
        **common_kwargs(cfg),
    )


def _cfl(cfg: RunConfig, run: RunContext) -> FedAvg:
    return CFL(
        **CFL_PARAMS.arguments(cfg.options),
        ground_truth=run.ground_truth,
        **timeout_kwargs(cfg),
        seed=cfg.seed,
        **common_kwargs(cfg),
    )


def _ditto(cfg: RunConfig, run: RunContext) -> FedAvg:
    return Ditto(
        **DITTO_PARAMS.arguments(cfg.options),
        train_timeout=cfg.train_timeout,
        **common_kwargs(cfg),
    )


def _semifl(cfg: RunConfig, run: RunContext) -> FedAvg:
    kwargs = common_kwargs(cfg)
    del kwargs["fraction_train"]  # every cluster trains every round
    rule = cfg.semifl_clusters
    is_file = rule not in CLUSTER_SOURCES
    return SemiFL(
        clusters="file" if is_file else rule,
        assignment=load_cluster_assignment(rule) if is_file else None,
        **SEMIFL_PARAMS.arguments(cfg.options),
        **relay_kwargs(cfg),
        **kwargs,
    )


STRATEGIES: dict[str, Callable[[RunConfig, RunContext], FedAvg]] = {
    "fedavg": lambda cfg, run: FedAvg(**common_kwargs(cfg)),
    "fedprox": lambda cfg, run: FedProx(**FEDPROX_PARAMS.arguments(cfg.options),
                                        **common_kwargs(cfg)),
    "fedgsp": lambda cfg, run: _fedgsp(cfg, "icg", False, run),
    "naivegsp": lambda cfg, run: _fedgsp(cfg, "random", True, run),
    "naivegsp-icg": lambda cfg, run: _fedgsp(cfg, "icg", True, run),
    "hierfl": _hierfl,
    "stocfl": _stocfl,
    "fesem": _fesem,
    "semifl": _semifl,
    "ifca": _ifca,
    "cfl": _cfl,
    "ditto": _ditto,
    "fedadagrad": lambda cfg, run: FedAdagrad(**fedopt_kwargs(cfg), **common_kwargs(cfg)),
    "fedadam": lambda cfg, run: FedAdam(**fedopt_kwargs(cfg, moments=True),
                                        **common_kwargs(cfg)),
    "fedyogi": lambda cfg, run: FedYogi(**fedopt_kwargs(cfg, moments=True),
                                        **common_kwargs(cfg)),
    "ida": lambda cfg, run: IDA(**IDA_PARAMS.arguments(cfg.options), **common_kwargs(cfg)),
    "fedmmd": lambda cfg, run: FedMMD(**FEDMMD_PARAMS.arguments(cfg.options),
                                      train_timeout=cfg.train_timeout, **common_kwargs(cfg)),
    "fedfusion": lambda cfg, run: FedFusion(**FEDFUSION_PARAMS.arguments(cfg.options),
                                            seed=cfg.seed, train_timeout=cfg.train_timeout,
                                            **common_kwargs(cfg)),
}


def build_strategy(cfg: RunConfig, run: RunContext | None = None) -> FedAvg:
    """Build the strategy named by ``cfg.strategy`` (one of
    :data:`~fedgsp_flwr.app.config.STRATEGY_NAMES`, checked when ``cfg`` was parsed).
    """
    return STRATEGIES[cfg.strategy](cfg, run or RunContext())
