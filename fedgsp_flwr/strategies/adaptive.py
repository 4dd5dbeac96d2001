"""FedAdagrad, FedAdam and FedYogi (Reddi et al. 2021, "Adaptive Federated
Optimization"): Flower's own strategies with this package's reply validation.

Flower ships the three server optimizers (``flwr.serverapp.strategy``); their update
is not rewritten here. Each class puts Flower's optimizer in front of our
:class:`~fedgsp_flwr.strategies.fedavg.FedAvg` in the method resolution order::

    FedAdam -> _Validated -> flwr FedAdam -> flwr FedOpt -> our FedAvg -> flwr FedAvg

so Flower's ``aggregate_train`` computes its server step from what ``super()`` returns,
which is our FedAvg's average of the *validated* replies (a NaN, a wrong shape or a
missing weight is rejected with one logged reason first), and a round whose replies are
all unusable keeps the model (``max_untrained_rounds``). Flower's ``configure_train``
records the arrays it sends (the step's origin) and hands on to ours (history, bytes).
The optimizer's moments go into the checkpoint, so a resumed run continues the
uninterrupted one. The step's result keeps the dtypes of the model sent (Flower's comes
back as float64 for a float32 model, and every later reply would then be rejected);
integer arrays (batch counters) take the average, not the step.

``_Validated`` is there because Flower's constructors do not pass our
``max_untrained_rounds``, ``server_threads`` and ``query_timeout`` on, and the
optimizer's moments need saving. Defaults are Flower's (the FedGSP paper does not give
the values it used): server learning rate ``eta`` 0.1 (FedYogi 0.01), ``tau`` 1e-3,
``beta_1`` 0.9 and ``beta_2`` 0.99 (FedAdagrad has no momentum: ``beta_1 = beta_2 =
0``). ``eta_l``, the clients' learning rate, is only logged by Flower; the clients'
``lr`` sets it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAdagrad as FlowerFedAdagrad
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam
from flwr.serverapp.strategy import FedYogi as FlowerFedYogi

from ..core.arrays import as_dtype
from . import saved
from .decoding import values
from .fedavg import FedAvg, check_parameters
from .progress import TrainingProgress


class _Validated:
    """Our FedAvg's parameters and the optimizer's checkpoint, for a class whose bases
    are ``(_Validated, <Flower's optimizer>, FedAvg)``: Flower's constructors do not
    pass ``max_untrained_rounds``, ``server_threads`` and ``query_timeout`` on, so they
    are taken here.
    """

    # The optimizer's moment estimates (None before the first step), in checkpoints:
    m_t = saved.named_arrays("fedopt-m_t")
    v_t = saved.named_arrays("fedopt-v_t")
    current_arrays: dict[str, np.ndarray] | None
    progress: TrainingProgress
    eta: float
    tau: float
    beta_1: float
    beta_2: float
    weighted_by_key: str
    take_run_options: Callable[[int, int | None, float], None]  # FedAvg's

    def __init__(self, *, max_untrained_rounds: int = 3, server_threads: int | None = None,
                 query_timeout: float = 300.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        FedAvg.spec.check_as(type(self).__name__, {
            "max_untrained_rounds": max_untrained_rounds, "server_threads": server_threads,
            "query_timeout": query_timeout})
        check_parameters(type(self).__name__, [
            (self.eta > 0, f"eta must be > 0, got {self.eta!r}"),
            (self.tau > 0, f"tau must be > 0, got {self.tau!r}"),
            (0 <= self.beta_1 < 1 and 0 <= self.beta_2 < 1,
             f"beta_1 and beta_2 must be in [0, 1), got {self.beta_1!r}, {self.beta_2!r}"),
        ])
        # FedAvg's __init__ ran with Flower's arguments only: take ours again
        self.take_run_options(max_untrained_rounds, server_threads, query_timeout)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's server step from our validated average, cast back to the dtypes of
        the arrays sent: Flower's update returns float64 for float32 models, which the
        clients' float32 replies would then fail to match in every later round.

        Integer arrays (BatchNorm's ``num_batches_tracked``) take the average instead of
        the step: they are counters, not parameters, and a step of ``eta`` times a
        normalised update would round back to the value sent, round after round.
        """
        arrays, metrics = super().aggregate_train(server_round, replies)  # type: ignore[misc]
        sent = self.current_arrays
        if arrays is not None and sent is not None:
            average = self.progress.last_trained  # our FedAvg's, recorded in this call
            arrays = ArrayRecord({
                k: average[k] if sent[k].dtype.kind in "iub" and average is not None
                else Array(as_dtype(values(a), sent[k].dtype)) for k, a in arrays.items()})
            self.progress.last_trained = arrays  # the step's result, not the average
        return arrays, metrics


class FedAdagrad(_Validated, FlowerFedAdagrad, FedAvg):
    """Flower's FedAdagrad over our validated FedAvg average (see the module doc).

    Parameters
    ----------
    max_untrained_rounds : int (default: 3)
        As :class:`~fedgsp_flwr.strategies.fedavg.FedAvg`.
    server_threads : int | None (default: None)
        As :class:`~fedgsp_flwr.strategies.fedavg.FedAvg`.
    query_timeout : float (default: 300.0)
        As :class:`~fedgsp_flwr.strategies.fedavg.FedAvg`.
    **kwargs : Any
        :class:`flwr.serverapp.strategy.FedAdagrad`'s parameters (``eta`` 0.1, ``tau``
        1e-3, sampling fractions, ...).
    """


class FedAdam(_Validated, FlowerFedAdam, FedAvg):
    """Flower's FedAdam over our validated FedAvg average (see the module doc).

    Parameters
    ----------
    max_untrained_rounds : int (default: 3)
        As :class:`~fedgsp_flwr.strategies.fedavg.FedAvg`.
    server_threads : int | None (default: None)
        As :class:`~fedgsp_flwr.strategies.fedavg.FedAvg`.
    query_timeout : float (default: 300.0)
        As :class:`~fedgsp_flwr.strategies.fedavg.FedAvg`.
    **kwargs : Any
        :class:`flwr.serverapp.strategy.FedAdam`'s parameters (``eta`` 0.1, ``beta_1``
        0.9, ``beta_2`` 0.99, ``tau`` 1e-3, sampling fractions, ...).
    """


class FedYogi(_Validated, FlowerFedYogi, FedAvg):
    """Flower's FedYogi over our validated FedAvg average (see the module doc).

    Parameters
    ----------
    max_untrained_rounds : int (default: 3)
        As :class:`~fedgsp_flwr.strategies.fedavg.FedAvg`.
    server_threads : int | None (default: None)
        As :class:`~fedgsp_flwr.strategies.fedavg.FedAvg`.
    query_timeout : float (default: 300.0)
        As :class:`~fedgsp_flwr.strategies.fedavg.FedAvg`.
    **kwargs : Any
        :class:`flwr.serverapp.strategy.FedYogi`'s parameters (``eta`` 0.01, ``beta_1``
        0.9, ``beta_2`` 0.99, ``tau`` 1e-3, sampling fractions, ...).
    """
