"""FedAdagrad, FedAdam and FedYogi (Reddi et al. 2021, "Adaptive Federated
Optimization"): Flower's own strategies with this package's reply validation.

Flower ships the three server optimizers (``flwr.serverapp.strategy``); their update
is not rewritten here. Each class puts Flower's optimizer in front of our
:class:`~fedgsp_flwr.strategies.fedavg.FedAvg` in the method resolution order::

    FedAdam -> _ServerOptimizer -> flwr FedAdam -> flwr FedOpt -> our FedAvg -> flwr FedAvg

so Flower's ``aggregate_train`` computes its server step from what ``super()`` returns,
which is our FedAvg's average of the *validated* replies (a NaN, a wrong shape or a
missing weight is rejected with one logged reason first), and a round whose replies are
all unusable keeps the model (``max_untrained_rounds``). Flower's ``configure_train``
records the arrays it sends (the step's origin) and hands on to ours (history, bytes).
The optimizer's moments go into the checkpoint, so a resumed run continues the
uninterrupted one. The step's result keeps the dtypes of the model sent (Flower's comes
back as float64 for a float32 model, and every later reply would then be rejected);
integer arrays (batch counters) take the average, not the step.

Flower's constructors are not called: ``_ServerOptimizer`` declares the optimizer's
parameters beside ours (one keyword-only constructor, checked), and sets what
Flower's ``FedOpt.__init__`` would (the arrays sent, no moments yet). Defaults are
Flower's (the FedGSP paper does not give the values it used): server learning rate
``eta`` 0.1 (FedYogi 0.01), ``tau`` 1e-3, ``beta_1`` 0.9 and ``beta_2`` 0.99
(FedAdagrad has no momentum: ``beta_1 = beta_2 = 0``). ``eta_l``, the clients'
learning rate, is only logged by Flower (0.1; FedYogi 0.0316); the clients' ``lr``
sets it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, cast

from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.common.typing import NDArray
from flwr.serverapp.strategy import FedAdagrad as FlowerFedAdagrad
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam
from flwr.serverapp.strategy import FedYogi as FlowerFedYogi

from ..core.arrays import as_dtype
from . import saved
from .configured import Configured
from .decoding import values
from .fedavg import FedAvg
from .params import positive, setting


def _eta(default: float) -> float:
    return setting(default=default, help="server learning rate (the app's 0: each "
                   "optimizer's own, 0.1, FedYogi 0.01)", check=positive,
                   key="fedopt-eta", app_default=0.0, unset=0.0)


def _eta_l(default: float) -> float:
    return setting(default=default,
                   help="the clients' learning rate, only logged (the clients' lr sets theirs)")


def _beta(default: float, moment: str) -> float:
    return setting(default=default, help=f"{moment}-moment decay",
                   check=lambda v: 0 <= v < 1, rule="in [0, 1)",
                   key=f"fedopt-beta-{1 if moment == 'first' else 2}")


class _ServerOptimizer(Configured):
    """The optimizer's parameters and checkpoint, for a class whose bases are
    ``(_ServerOptimizer, <Flower's optimizer>, FedAvg)``: the generated constructor
    takes them beside FedAvg's; Flower's constructors do not run, so
    :meth:`__post_init__` sets what ``FedOpt.__init__`` would.
    """

    # The optimizer's moment estimates (None before the first step), in checkpoints:
    m_t = saved.named_arrays("fedopt-m_t")
    v_t = saved.named_arrays("fedopt-v_t")

    eta: float = _eta(0.1)
    eta_l: float = _eta_l(0.1)
    tau: float = setting(default=1e-3, help="adaptivity (the denominator's floor)",
                         check=positive, key="fedopt-tau")
    beta_1: ClassVar[float] = 0.0  # FedAdagrad: no momentum
    beta_2: ClassVar[float] = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.current_arrays: dict[str, NDArray] | None = None  # FedOpt's: the arrays sent
        self.m_t = self.v_t = None

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
        progress = cast(FedAvg, self).progress  # the class is a FedAvg too (its bases)
        if arrays is not None and sent is not None:
            average = progress.last_trained  # our FedAvg's, recorded in this call
            arrays = ArrayRecord({
                k: average[k] if sent[k].dtype.kind in "iub" and average is not None
                else Array(as_dtype(values(a), sent[k].dtype)) for k, a in arrays.items()})
            progress.last_trained = arrays  # the step's result, not the average
        return arrays, metrics


class FedAdagrad(_ServerOptimizer, FlowerFedAdagrad, FedAvg):
    """Flower's FedAdagrad over our validated FedAvg average (see the module doc).
    """


class FedAdam(_ServerOptimizer, FlowerFedAdam, FedAvg):
    """Flower's FedAdam over our validated FedAvg average (see the module doc).
    """

    beta_1: float = _beta(0.9, "first")  # type: ignore[misc]
    beta_2: float = _beta(0.99, "second")  # type: ignore[misc]


class FedYogi(_ServerOptimizer, FlowerFedYogi, FedAvg):
    """Flower's FedYogi over our validated FedAvg average (see the module doc).
    """

    eta: float = _eta(0.01)
    eta_l: float = _eta_l(0.0316)
    beta_1: float = _beta(0.9, "first")  # type: ignore[misc]
    beta_2: float = _beta(0.99, "second")  # type: ignore[misc]
