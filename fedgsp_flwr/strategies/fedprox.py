"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term on the client."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..protocol import PROXIMAL_MU
from .fedavg import FedAvg
from .params import non_negative, setting


class FedProx(FedAvg):
    """FedProx (Li et al., 2020): FedAvg whose clients add ``proximal_mu``/2
    ||w - w_global||^2 to their loss.

    The weight goes to the clients as ``proximal-mu`` in every training config, as in
    :class:`flwr.serverapp.strategy.FedProx`.
    """

    proximal_mu: float = setting(
        default=0.0, help="proximal term weight (the constructor's 0.0, Flower's default, "
        "is FedAvg; the app's 0.01 makes FedProx differ)", check=non_negative,
        key="fedprox-mu", app_default=0.01)

    def summary(self) -> None:
        """Log the proximal weight, then FedAvg's settings."""
        log(INFO, "\t├──> FedProx: proximal-mu %g", self.proximal_mu)
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's messages, with ``proximal-mu`` in their config."""
        config[PROXIMAL_MU] = self.proximal_mu
        return super().configure_train(server_round, arrays, config, grid)


PARAMS = FedProx.spec
FEDPROX_PARAMS = PARAMS
