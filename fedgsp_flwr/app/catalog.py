"""The strategies the bundled app builds, by run-config name.

From this table come the run config's strategy names and the run-config keys each
strategy's class (and its bases) declares; :mod:`~fedgsp_flwr.app.registry` builds
them. Adding a strategy to the app is one line here, its keys' lines in pyproject.toml
and, for a strategy that needs more than its declared keys, an entry in the registry's
``FIXED``.
"""

from __future__ import annotations

from .. import strategies as s
from ..strategies.configured import class_specs
from ..strategies.params import Spec

CATALOG: dict[str, type[s.FedAvg]] = {
    "fedavg": s.FedAvg, "fedprox": s.FedProx, "fedgsp": s.FedGSP, "naivegsp": s.FedGSP,
    "naivegsp-icg": s.FedGSP, "hierfl": s.HierFL, "stocfl": s.StoCFL, "fesem": s.FeSEM,
    "semifl": s.SemiFL, "ifca": s.IFCA, "cfl": s.CFL, "flhc": s.FLHC, "ditto": s.Ditto,
    "fedadagrad": s.FedAdagrad, "fedadam": s.FedAdam, "fedyogi": s.FedYogi, "ida": s.IDA,
    "fedmmd": s.FedMMD, "fedfusion": s.FedFusion,
}


def keyed_specs() -> tuple[Spec, ...]:
    """The specs that declare run-config keys, each once, in :data:`CATALOG`'s order."""
    found: dict[int, Spec] = {}
    for cls in CATALOG.values():
        for spec in class_specs(cls):
            if spec.keyed():
                found.setdefault(id(spec), spec)
    return tuple(found.values())
