"""Flower message-API strategies for non-IID federated learning.

Use them in any Flower ServerApp like Flower's own strategies::

    from fedgsp_flwr.strategies import FedGSP

    strategy = FedGSP()  # the paper's settings; any ClientApp with a train handler
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=10)
    result.arrays                 # the global model
    strategy.group_models()       # cluster / centre / edge / group models and members

A run that trains nothing stops with :class:`TrainingStalled`, naming the cause.

They need no torch: the client side is :mod:`fedgsp_flwr.clients`. The bundled app
builds them by name from its run config (:mod:`fedgsp_flwr.app.registry`).
"""

from __future__ import annotations

from .adaptive import FedAdagrad, FedAdam, FedYogi
from .aggregation import GroupModel
from .cfl import CFL
from .ditto import Ditto
from .fedavg import FedAvg
from .fedgsp import FedGSP
from .fedprox import FedProx
from .fesem import FeSEM
from .flhc import FLHC
from .hierfl import HierFL
from .ida import IDA
from .ifca import IFCA
from .metrics import aggregate_metrics
from .progress import TrainingStalled
from .replies import filter_replies, reply_problem
from .semifl import SemiFL
from .sequential import RelayStrategy
from .server_round import ServerSideRound
from .stocfl import StoCFL
from .twostream import FedFusion, FedMMD

__all__ = [
    "CFL",
    "FLHC",
    "IDA",
    "IFCA",
    "Ditto",
    "FeSEM",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedFusion",
    "FedGSP",
    "FedMMD",
    "FedProx",
    "FedYogi",
    "GroupModel",
    "HierFL",
    "RelayStrategy",
    "SemiFL",
    "ServerSideRound",
    "StoCFL",
    "TrainingStalled",
    "aggregate_metrics",
    "filter_replies",
    "reply_problem",
]
