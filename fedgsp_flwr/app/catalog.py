"""The strategies the bundled app builds, by run-config name.

From this table come the run config's strategy names and the run-config keys each
strategy's class (and its bases) declares; :mod:`~fedgsp_flwr.app.registry` builds
them. Adding a strategy to the app is one line here, its keys' lines in pyproject.toml
and, for a strategy that needs more than its declared keys, an entry in the registry's
``FIXED``.
"""

from __future__ import annotations

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
from ..strategies.params import Spec

CATALOG: dict[str, type[FedAvg]] = {
    "fedavg": FedAvg, "fedprox": FedProx, "fedgsp": FedGSP, "naivegsp": FedGSP,
    "naivegsp-icg": FedGSP, "hierfl": HierFL, "stocfl": StoCFL, "fesem": FeSEM,
    "semifl": SemiFL, "ifca": IFCA, "cfl": CFL, "ditto": Ditto, "fedadagrad": FedAdagrad,
    "fedadam": FedAdam, "fedyogi": FedYogi, "ida": IDA, "fedmmd": FedMMD,
    "fedfusion": FedFusion,
}


def class_specs(cls: type) -> list[Spec]:
    """The parameter specs of ``cls`` and its bases, bases first."""
    return [spec for klass in reversed(cls.__mro__)
            if isinstance(spec := vars(klass).get("spec"), Spec)]


def keyed_specs() -> tuple[Spec, ...]:
    """The specs that declare run-config keys, each once, in :data:`CATALOG`'s order."""
    found: dict[int, Spec] = {}
    for cls in CATALOG.values():
        for spec in class_specs(cls):
            if spec.keyed():
                found.setdefault(id(spec), spec)
    return tuple(found.values())
