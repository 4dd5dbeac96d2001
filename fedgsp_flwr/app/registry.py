"""Strategy names of the run config -> strategies (:data:`~fedgsp_flwr.app.catalog.CATALOG`),
built from the parsed run config.

The ServerApp builds the strategy once the data is known, so that clustering
strategies get the partitions' latent groups (``ground_truth``, for ARI/NMI) and
FeSEM and IFCA their seeded models (``centre_factory``) through their constructors.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flwr.app import ArrayRecord

from ..strategies import FedAvg
from ..strategies.configured import class_specs
from ..strategies.semifl import CLUSTER_SOURCES, load_cluster_assignment
from ..strategies.sequential import RelayStrategy
from .catalog import CATALOG
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


def app_arguments(cfg: RunConfig, run: RunContext) -> dict[str, Any]:
    """What the app gives any strategy whose constructor takes it (by keyword): FedAvg's
    parameters, the run's seed (also the sketches' projection seed), the training
    timeout, the latent groups, the seeded model factory and the clients' learning rate
    (the server optimizers log it)."""
    return {**common_kwargs(cfg), "seed": cfg.seed, "sketch_seed": cfg.seed,
            "train_timeout": cfg.train_timeout, "ground_truth": run.ground_truth,
            "centre_factory": run.centre_factory, "model_factory": run.centre_factory,
            "eta_l": cfg.lr}


def _fixed_groups(grouping: str) -> Callable[[RunConfig], dict[str, Any]]:
    """NaiveGSP's settings: ``grouping`` into ``fedgsp-num-groups`` groups (0: as many
    as FedGSP's first round, ``fedgsp-growth-beta``)."""
    return lambda cfg: {"grouping": grouping, "num_groups": cfg.fedgsp_num_groups
                        or cfg.options["fedgsp-growth-beta"]}


def _semifl_clusters(cfg: RunConfig) -> dict[str, Any]:
    """Semi-FL's cluster source: a rule, ``node-config``, or a cluster file."""
    rule = cfg.semifl_clusters
    is_file = rule not in CLUSTER_SOURCES
    return {"clusters": "file" if is_file else rule,
            "assignment": load_cluster_assignment(rule) if is_file else None}


# What a strategy gets beyond its declared keys and app_arguments, by run-config name.
FIXED: dict[str, Callable[[RunConfig], dict[str, Any]]] = {
    "fedgsp": lambda cfg: {"grouping": "icg", "num_groups": None},
    "naivegsp": _fixed_groups("random"),
    "naivegsp-icg": _fixed_groups("icg"),
    "semifl": _semifl_clusters,
}


def build_strategy(cfg: RunConfig, run: RunContext | None = None) -> FedAvg:
    """Build the strategy named by ``cfg.strategy`` (one of
    :data:`~fedgsp_flwr.app.config.STRATEGY_NAMES`, checked when ``cfg`` was parsed):
    :func:`app_arguments` its class takes, then the run-config keys it and its bases
    declare (:meth:`~fedgsp_flwr.strategies.params.Spec.arguments`), then its
    :data:`FIXED` arguments.
    """
    cls = CATALOG[cfg.strategy]
    takes = inspect.signature(cls).parameters
    # A relay strategy samples groups or clusters, not nodes: it keeps fraction_train.
    own_sampling = issubclass(cls, RelayStrategy)
    kwargs = {k: v for k, v in app_arguments(cfg, run or RunContext()).items()
              if k in takes and not (own_sampling and k == "fraction_train")}
    for spec in class_specs(cls):
        kwargs.update(spec.arguments(cfg.options))
    if (fixed := FIXED.get(cfg.strategy)) is not None:
        kwargs.update(fixed(cfg))
    return cls(**kwargs)


def _builders() -> dict[str, Callable[[RunConfig, RunContext], FedAvg]]:
    """0.6.0's ``STRATEGIES``: name -> builder of that strategy from a run config."""
    def builder(name: str) -> Callable[[RunConfig, RunContext], FedAvg]:
        return lambda cfg, run: build_strategy(replace(cfg, strategy=name), run)

    return {name: builder(name) for name in CATALOG}


def _fedopt_kwargs(cfg: RunConfig, moments: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"tau": cfg.options["fedopt-tau"], "eta_l": cfg.lr}
    if cfg.options["fedopt-eta"]:
        out["eta"] = cfg.options["fedopt-eta"]
    if moments:
        out.update(beta_1=cfg.options["fedopt-beta-1"], beta_2=cfg.options["fedopt-beta-2"])
    return out


def _timeout_kwargs(cfg: RunConfig) -> dict[str, Any]:
    return {"train_timeout": cfg.train_timeout}


def _relay_kwargs(cfg: RunConfig) -> dict[str, Any]:
    return {**_timeout_kwargs(cfg), "poll_interval": cfg.options["relay-poll"],
            "relay_message_type": cfg.options["relay-message"], "seed": cfg.seed}


# 0.6.0's builder helpers: the same values, now read from the declared keys by
# build_strategy; each goes in 0.8.0.
_GONE: dict[str, Callable[[], object]] = {
    "STRATEGIES": _builders, "fedopt_kwargs": lambda: _fedopt_kwargs,
    "timeout_kwargs": lambda: _timeout_kwargs, "relay_kwargs": lambda: _relay_kwargs}


def __getattr__(name: str) -> object:
    if name not in _GONE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} is deprecated (0.7.0): build_strategy(cfg) reads "
                  "every declared key itself; the name goes in 0.8.0", DeprecationWarning,
                  stacklevel=2)
    return _GONE[name]()
