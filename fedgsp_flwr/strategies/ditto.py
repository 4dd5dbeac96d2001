"""Ditto: a FedAvg global model and a personal model per client (Li, Hu, Beirami, Smith,
ICML 2021)."""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message
from flwr.common.logger import log

from ..protocol import (
    EVALUATE_DITTO,
    LAMBDA,
    LR,
    PERSONAL_EPOCHS,
    PERSONAL_MODEL,
    PERSONAL_STEPS,
    TRAIN_DITTO,
)
from .hooked import HookedTrain
from .metrics import reply_metrics
from .params import check_parameters, non_negative, setting

FALLBACKS = {
    TRAIN_DITTO: "plain 'train' and 'evaluate' messages: Ditto reduces to FedAvg (no "
                "personal models; 'personal-clients' is 0 and the evaluation scores the "
                "global model)",
    EVALUATE_DITTO: "plain 'evaluate' messages of the global model: the personal models "
                   "train but are not scored ('eval-personal-clients' is 0)",
}



class Ditto(HookedTrain):
    """Ditto (Li et al., 2021): FedAvg's global model w, and on every client a personal
    model v_k trained on its loss + lambda/2 ||v_k - w||^2 that never leaves it.

    The method, the paper's algorithm and every deliberate choice:
    docs/strategies/ditto.md.

    Training is FedAvg's: the same sampling (``fraction_train``), the same per-reply
    validation and the same aggregation, so the global model is FedAvg's bit for bit.
    The messages are ``train.ditto`` with w and, in the config, ``lambda`` and the
    personal training settings: each node trains its personal model (kept in its node
    state, started from the first w it trains) towards the w it received, trains w as
    ``train`` does and returns w only.

    Evaluation sends ``evaluate.ditto``: each evaluated node scores its personal model
    (the paper's metric: the app's metric names, ``eval-acc``) and w (``-global``
    appended: ``eval-acc-global``). A node that has not trained yet has no personal
    model and is scored with w. ``eval-personal-clients`` counts the nodes scored with
    a personal model.

    A ClientApp without the Ditto handlers (only ``train`` and ``evaluate``) still runs:
    the first ``train.ditto`` goes to one node; if its app has no handler, one WARNING
    says so and every node gets plain ``train`` and ``evaluate`` messages. Ditto is then
    FedAvg (no personal models; ``personal-clients`` 0; ``eval-acc`` and
    ``eval-acc-global`` both score w). An app with ``train.ditto`` but no
    ``evaluate.ditto`` trains the personal models; its evaluation scores w only (one
    WARNING). In a mixed federation, each node without the handler (after a successful
    probe) is logged once and takes the fallback alone.

    The server keeps FedAvg's state only: the personal models live on the clients, as
    long as their node state (the run in simulation; the SuperNode process in
    deployment). A resumed run or a restarted SuperNode starts them again from w, unless
    the nodes keep them in a state directory (``ClientHooks.state_dir``; the app's
    ``client-state-dir``), from which a resumed run goes on.

    Attributes
    ----------
    plain : dict[int, str]
        Nodes whose ClientApp has no ``train.ditto`` handler, with why (they train and
        are evaluated with plain messages).
    """

    owner, train_type, fallbacks = "Ditto", TRAIN_DITTO, FALLBACKS
    hooked_metric, evaluate_type = "personal-clients", EVALUATE_DITTO

    lambda_: float = setting(
        default=1.0, help="weight of the personal models' pull to the global model w (0 = local"
                          " training; large: v_k stays at w, FedAvg; the authors' run scripts: "
                          "1). The pull is an explicit SGD step: keep lr * lambda <= 1 (it "
                          "overshoots w beyond 1 and diverges beyond 2 without momentum; a "
                          "WARNING says so once)",
        check=non_negative, key="ditto-lambda")
    personal_epochs: int = setting(
        default=0, help="local epochs of the personal model (0 = as the global model's: "
        "the authors' code)", check=non_negative, key="ditto-personal-epochs")
    personal_steps: int = setting(
        default=0, help="mini-batch steps of the personal model instead of epochs (0 = "
        "not by steps; set at most one of the two)", check=non_negative, key="ditto-personal-steps")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_parameters("Ditto", [(not (self.personal_epochs and self.personal_steps),
                                    "set at most one of personal_epochs and personal_steps")])
        self.lambda_ = float(self.lambda_)
        self._personal_scored = 0
        self._step_checked = False

    def summary(self) -> None:
        """Log Ditto's settings, then FedAvg's."""
        personal = (f"{self.personal_steps} steps" if self.personal_steps else
                    f"{self.personal_epochs} epochs" if self.personal_epochs else "as w's")
        log(INFO, "\t├──> Ditto: lambda=%g, personal training %s", self.lambda_, personal)
        super().summary()

    # --- training ---------------------------------------------------------------------

    def hook_config(self, config: ConfigRecord) -> None:
        """``lambda`` and the personal training settings (and the lr check)."""
        config[LAMBDA] = self.lambda_
        self.check_step(config)
        config[PERSONAL_EPOCHS] = self.personal_epochs
        config[PERSONAL_STEPS] = self.personal_steps

    def check_step(self, config: ConfigRecord) -> None:
        """Warn once if the train config's ``lr`` times lambda exceeds 1."""
        lr = config.get(LR)
        if (not self._step_checked and isinstance(lr, (int, float))
                and not isinstance(lr, bool) and lr * self.lambda_ > 1):
            log(WARNING, "Ditto: lr * lambda = %g > 1: each personal step overshoots the "
                "global model (and diverges beyond 2 without momentum); lower lambda or "
                "lr", lr * self.lambda_)
        self._step_checked = True

    # --- evaluation -------------------------------------------------------------------

    def complete_eval_reply(self, reply: Message) -> None:
        """Give a plain ``evaluate`` reply (w's scores) the names of ``evaluate.ditto``'s
        global scores too (``<name>-global``) and ``personal-model`` 0, so that both kinds
        of replies aggregate alike. A reply without one MetricRecord is left as it is
        (and rejected).
        """
        if reply.has_error() or len(reply.content.metric_records) != 1:
            return
        metrics = reply_metrics(reply.content)
        for key, value in list(metrics.items()):
            if key not in (self.weighted_by_key, PERSONAL_MODEL) and not key.endswith("-global"):
                metrics[f"{key}-global"] = value
        metrics[PERSONAL_MODEL] = 0

    def evaluated(self, server_round: int, sound: Sequence[Message]) -> None:
        """Count the sound replies that scored a personal model."""
        self._personal_scored = sum(
            reply_metrics(m.content).get(PERSONAL_MODEL) == 1 for m in sound)

    def eval_counts(self) -> dict[str, int]:
        """``eval-personal-clients``: the round's sound replies that scored a personal
        model."""
        return {"eval-personal-clients": self._personal_scored}


PARAMS = Ditto.spec
