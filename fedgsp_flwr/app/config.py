"""Typed, validated run configuration.

Flower hands the ServerApp and the ClientApp the run config as a flat mapping with
kebab-case keys (``num-server-rounds``, ``local-epochs``, ...). :class:`RunConfig`
validates them: the app's own keys are declared here, typed, range-checked, checked
against their choices and documented; a strategy's keys come from its parameter spec
(``PARAMS`` beside the strategy, :mod:`fedgsp_flwr.strategies.params`). The
``[tool.flwr.app.config]`` table of
``pyproject.toml`` must declare the same keys with the same defaults (a test checks
it). Settings of one strategy carry its name as a prefix (``fedgsp-kappa``,
``hierfl-tau1``, ...).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..clients.handlers import TrainSettings
from ..data import LOCAL_DATASETS, SCHEMES
from ..models import MODELS
from ..strategies.params import Param, Spec, non_negative, positive, rule_of
from ..strategies.semifl import CLUSTER_SOURCES
from .catalog import CATALOG, keyed_specs

# The strategies the app builds by name (fedgsp_flwr.app.catalog); ``centralized`` is
# the experiment runner's baseline, not a strategy.
STRATEGY_NAMES = tuple(CATALOG)

# The parameter specs that declare run-config keys (fedgsp_flwr.strategies.params), of
# the strategies' classes and their bases; the app's own keys are RunConfig's fields.
def spec_keys(specs: tuple[Spec, ...]) -> dict[str, Param]:
    """The run-config keys the specs declare, each with its parameter.

    A subclass may declare an inherited key again with its own constructor default
    (FedYogi's server learning rate); what the run config reads of it must be the same.

    Raises
    ------
    ValueError
        Naming a key two declarations read differently.
    """
    keys: dict[str, Param] = {}
    for param in (p for spec in specs for p in spec.keyed()):
        first = keys.setdefault(str(param.key), param)
        if first.run_side != param.run_side:
            raise ValueError(f"run-config key {param.key!r} is declared twice, "
                             f"differently: {first.run_side} and {param.run_side}")
    return keys


SPECS = keyed_specs()
SPEC_KEYS = spec_keys(SPECS)


def _spec_defaults() -> dict[str, Any]:
    return {key: param.run_default for key, param in SPEC_KEYS.items()}


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type, or out of range."""


def _fraction(value: float) -> bool:
    return 0.0 < value <= 1.0


def _closed_fraction(value: float) -> bool:
    return 0.0 <= value <= 1.0


def run_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a run's results sub-folder (``None``: it can).

    A run name is one folder inside ``results-dir``: not a path (no ``/`` or ``\\``),
    not ``.`` or ``..``, not blank, no NUL character. ``''`` is allowed: it means the
    automatic name.
    """
    if name == "":
        return None
    if "/" in name or "\\" in name:
        return "it is a path (it holds '/' or '\\')"
    if name in (".", ".."):
        return f"'{name}' is not a folder of its own"
    if not name.strip():
        return "it is blank"
    if "\0" in name:
        return "it holds a NUL character"
    return None


def _is_run_name(value: str) -> bool:
    return run_name_problem(value) is None


def _is_dataset(value: str) -> bool:
    return value in LOCAL_DATASETS or "/" in value


def _is_cluster_source(value: str) -> bool:
    return (value in CLUSTER_SOURCES and value != "file") or value.lower().endswith(
        (".json", ".csv"))


def _setting(
    default: Any, help: str, check: Callable[[Any], bool] | None = None, rule: str = "",
    choices: tuple[str, ...] | None = None, fix: str = "",
) -> Any:
    """Declare one run-config field with its default, help text and range check (or
    its choices); ``fix`` ends the error message of a value the check refuses.
    """
    if choices is not None:
        check, rule = (lambda v: v in choices), "one of " + ", ".join(choices)
    return field(default=default, metadata={"help": help, "check": check,
                                            "rule": rule or rule_of(check), "fix": fix})


@dataclass(frozen=True)
class RunConfig:
    """The app's run configuration.

    Attribute ``local_epochs`` is run-config key ``local-epochs``, and so on; the keys a
    strategy's parameter spec declares (:data:`SPECS`) are in ``options``, by key
    (``cfg.options["stocfl-tau"]``). Build it with :meth:`from_mapping`, which validates
    every value; unknown keys, wrong types and out-of-range values raise
    :class:`ConfigError` naming the key.
    """

    num_server_rounds: int = _setting(5, "number of server rounds", positive)
    strategy: str = _setting("fedgsp", "strategy name (see fedgsp_flwr.app.registry)",
                             choices=STRATEGY_NAMES)
    dataset: str = _setting(
        "mnist", "a local dataset or a Hugging Face hub name (org/name)", _is_dataset,
        f"one of {', '.join(LOCAL_DATASETS)} or a Hugging Face hub name (org/name)")
    partition: str = _setting("iid", "partition scheme (see fedgsp_flwr.data.partition)",
                              choices=SCHEMES)
    partition_alpha: float = _setting(
        0.5, "Dirichlet concentration of partition=dirichlet", positive
    )
    classes_per_client: int = _setting(
        2, "classes per client of partition=pathological", positive
    )
    shards_per_client: int = _setting(
        2, "shards per client of partition=shards", positive
    )
    test_fraction: float = _setting(
        0.2, "size of a client's test split relative to its train split", _fraction,
        "in (0, 1]",
    )
    transform_copies: bool = _setting(
        False, "rotated/shifted: every latent group splits a transformed copy of the whole "
        "training set (IFCA's and StoCFL's Rotated MNIST)")
    synthetic_alpha: float = _setting(
        1.0, "model heterogeneity alpha of the Synthetic(alpha, beta) data", non_negative,
    )
    synthetic_beta: float = _setting(
        1.0, "data heterogeneity beta of the Synthetic(alpha, beta) data", non_negative,
    )
    train_examples: int = _setting(
        0, "training examples drawn (seeded) from the dataset before partitioning "
        "(0 = all)", non_negative)
    test_examples: int = _setting(
        0, "examples drawn (seeded) from the test split, for central evaluation and the "
        "clients' test splits (0 = all)", non_negative)
    model: str = _setting("auto", "model (auto: cnn for images, logistic for vectors)",
                          choices=MODELS)
    fraction_train: float = _setting(
        1.0, "fraction of connected nodes sampled for training", _fraction, "in (0, 1]"
    )
    fraction_evaluate: float = _setting(
        1.0, "fraction of connected nodes sampled for federated evaluation",
        _closed_fraction, "in [0, 1]",
    )
    min_available_nodes: int = _setting(
        2, "nodes to wait for before sampling", positive
    )
    node_wait_timeout: float = _setting(
        600.0, "seconds to wait for min-available-nodes connected nodes, at the start and "
        "whenever a round samples, before the run fails naming the count (deployment; a "
        "simulation with fewer nodes fails at once)", positive)
    # Sent to the clients in every training message's config (the one route).
    local_epochs: int = _setting(TrainSettings.local_epochs, "local epochs per training "
                                 "message", positive)
    lr: float = _setting(TrainSettings.lr, "client SGD learning rate", positive)
    momentum: float = _setting(
        TrainSettings.momentum, "client SGD momentum", lambda v: 0.0 <= v < 1.0, "in [0, 1)"
    )
    batch_size: int = _setting(TrainSettings.batch_size, "client mini-batch size", positive)
    fedgsp_num_groups: int = _setting(
        0, "fixed number of groups of naivegsp / naivegsp-icg (0 = fedgsp-growth-beta)",
        non_negative)
    query_timeout: float = _setting(
        600.0, "seconds to wait for the replies to a query (partition id, histogram, sketch)",
        positive)
    histogram_epsilon: float = _setting(
        0.0, "Laplace noise on the class histograms nodes report: privacy budget epsilon "
        "(0 = exact counts; a node's own histogram-epsilon node config wins)",
        non_negative)
    semifl_clusters: str = _setting(
        "c3", "Semi-FL static clusters: a rule (the paper: c3), node-config (each node's "
        "cluster-id) or a .json/.csv file (partition id -> cluster id)",
        _is_cluster_source, "one of " + ", ".join(s for s in CLUSTER_SOURCES if s != "file")
        + " or a .json/.csv cluster file")
    cost_flops_per_example: float = _setting(
        0.0, "cost model (FedGSP Eq. 15): training FLOPs per example (0 = counted from the "
        "run's model)", non_negative)
    cost_aggregation_flops: float = _setting(
        0.0, "cost model: FLOPs to aggregate one model (0 = the model's parameter count)",
        non_negative)
    cost_device_flops: float = _setting(
        567e9, "cost model: device throughput, FLOP/s (the paper's Snapdragon 835)", positive)
    cost_rate_in: float = _setting(
        567.0, "cost model (Eq. 16): inbound link rate, Mbit/s (the paper's)", positive)
    cost_rate_out: float = _setting(
        567.0, "cost model (Eq. 16): outbound link rate, Mbit/s (the paper's)", positive)
    seed: int = _setting(42, "seed of data partitions, model init and sampling", non_negative)
    train_timeout: float = _setting(
        3600.0, "seconds to wait for the replies to training or evaluation messages (a "
        "round, an edge round, a relay hop)", positive)
    max_untrained_rounds: int = _setting(
        3, "rounds in a row that train nothing before the run stops with their cause", positive)
    server_threads: int = _setting(
        0, "BLAS/OpenMP threads of the ServerApp's numpy and torch work (0 = automatic: 1 "
        "in simulation, whose ClientApps own the cores; the process's default in "
        "deployment)", non_negative)
    data_dir: str = _setting(
        "", "dataset cache directory ('' = $FEDGSP_DATA_DIR or ~/.cache/fedgsp-flwr)"
    )
    results_dir: str = _setting(
        "results", "folder that receives one sub-folder of results per run"
    )
    run_name: str = _setting(
        "", "results sub-folder name ('' = <strategy>-<time>)", _is_run_name,
        "a single folder name inside results-dir ('' = automatic; no '/' or '\\', not "
        "'.', '..' or blank)", fix="put the parent folders in results-dir and the last "
        "one in run-name")
    resume_from: str = _setting(
        "", "results folder of an interrupted run: continue it from its last complete "
        "round ('' = a new run)")
    client_state_dir: str = _setting(
        "", "node-local folder where clients keep state that must survive a resumed run "
        "(Ditto's personal models; '' = the node state only)")

    # The keys of SPECS, by key: validated by their strategy's spec.
    options: dict[str, Any] = field(default_factory=_spec_defaults, hash=False)

    @classmethod
    def keys(cls) -> list[str]:
        """Return the run-config keys: the fields' in declaration order, then the
        strategy specs' ones."""
        return [*(to_key(f.name) for f in _fields(cls)), *SPEC_KEYS]

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Return the default run config as a kebab-case mapping."""
        return {**{to_key(f.name): f.default for f in _fields(cls)}, **_spec_defaults()}

    @classmethod
    def types(cls) -> dict[str, str]:
        """Return each run-config key's type name (``int``, ``float``, ``str``,
        ``bool``)."""
        return {**{to_key(f.name): str(f.type) for f in _fields(cls)},
                **{key: p.run_type.__name__ for key, p in SPEC_KEYS.items()}}

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], *, allow_unknown: bool = False
    ) -> RunConfig:
        """Validate a kebab-case mapping (e.g. ``context.run_config``).

        Parameters
        ----------
        values : Mapping[str, Any]
            Run-config values; missing keys take their defaults.
        allow_unknown : bool (default: False)
            Ignore keys this app does not declare (an app embedding ours may add its
            own) instead of rejecting them.

        Returns
        -------
        RunConfig
            The validated configuration.

        Raises
        ------
        ConfigError
            On an unknown key, a value of the wrong type or out of range.
        """
        known = {to_key(f.name): f for f in _fields(cls)}
        unknown = [k for k in values if k not in known and k not in SPEC_KEYS]
        if unknown and not allow_unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, [*known, *SPEC_KEYS], n=1)
                hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
            raise ConfigError(f"Unknown run-config key(s): {', '.join(hints)}")
        kwargs: dict[str, Any] = {}
        for key, fld in known.items():
            if key in values:
                kwargs[fld.name] = _coerce(key, values[key], str(fld.type), fld.default,
                                           fld.metadata["check"], fld.metadata["rule"],
                                           fld.metadata.get("fix", ""))
        options = _spec_defaults()
        for key, param in SPEC_KEYS.items():
            if key in values:
                options[key] = _coerce(key, values[key], param.run_type.__name__,
                                       param.run_default, param.allows_run, param.range)
        return cls(**kwargs, options=options)

    def to_mapping(self) -> dict[str, Any]:
        """Return the configuration as a kebab-case mapping (JSON-serialisable)."""
        return {**{to_key(f.name): getattr(self, f.name) for f in _fields(type(self))},
                **self.options}


def _fields(cls: type[RunConfig]) -> list[dataclasses.Field[Any]]:
    """The dataclass fields that are run-config keys (all but ``options``)."""
    return [f for f in dataclasses.fields(cls) if f.name != "options"]


def to_key(attribute: str) -> str:
    """Map an attribute name to its kebab-case run-config key."""
    return attribute.replace("_", "-")


def _coerce(key: str, value: Any, expected: str, default: Any,
            check: Callable[[Any], bool] | None, rule: str, fix: str = "") -> Any:
    """Type-check one value and apply its range check."""
    if expected == "float" and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    python_type = {"int": int, "float": float, "str": str, "bool": bool}[expected]
    if (isinstance(value, bool) and python_type is not bool) or not isinstance(
        value, python_type
    ):
        raise ConfigError(
            f"Run-config key '{key}' must be of type {expected}, "
            f"got {value!r} ({type(value).__name__})"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"Run-config key '{key}' must be a finite number{f' {rule}' if rule else ''}, "
            f"got {value!r}: give a number such as {default!r} (its default)")
    if check is not None and not check(value):
        raise ConfigError(
            f"Run-config key '{key}' must be {rule}, got {value!r}"
            + (f"; {fix}" if fix else "")
        )
    return value
