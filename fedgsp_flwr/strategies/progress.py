"""Whether a run trains: the last model that trained, and a clear stop when none does.

A round whose training yields no usable reply must not replace the model (Flower's loop
keeps the previous one when ``aggregate_train`` returns ``None``); a run in which no
round trains for several rounds in a row stops with the reason the replies gave, so
that a misconfigured federation fails loudly instead of "completing" untrained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from logging import WARNING
from typing import Any

from flwr.app import ArrayRecord
from flwr.common.logger import log
from flwr.serverapp.strategy import Result

from .hook_support import MISSING_HANDLER_TEXT


class TrainingStalled(RuntimeError):
    """No round trained for ``max_untrained_rounds`` rounds in a row (or in a whole run).

    Attributes
    ----------
    arrays : ArrayRecord | None
        The last model that trained (the initial one if none did): nothing trained
        before the stall is lost.
    """

    def __init__(self, message: str, arrays: ArrayRecord | None) -> None:
        super().__init__(message)
        self.arrays = arrays


def fix_for(reason: str, weighted_by_key: str) -> str:
    """What to change, for the commonest reason a training reply was unusable."""
    if MISSING_HANDLER_TEXT in reason:
        return ("the nodes' ClientApp has no handler for the message type named above: "
                "register one (fedgsp_flwr.clients.register_hooks adds ours), or send a "
                "type it has (relay_message_type='train')")
    if f"'{weighted_by_key}' is missing" in reason:
        return (f"the ClientApp's train replies must report their number of examples as "
                f"'{weighted_by_key}' in their MetricRecord, or construct the strategy "
                f"with weighted_by_key='<the name your ClientApp uses>'")
    if "no reply" in reason or "did not answer" in reason:
        return ("no node answered in time: check that the SuperNodes are connected and "
                "raise the timeout (train_timeout, or start()'s timeout) if training "
                "takes longer")
    if "expected" in reason and "array" in reason.lower():
        return ("the ClientApp's model must have the keys, shapes and dtypes of the "
                "initial arrays given to start()")
    return "fix the ClientApp error quoted above (the SuperNodes' logs have its traceback)"


def describe(reasons: Counter[str]) -> str:
    """The commonest reasons, with their counts."""
    if not reasons:
        return "no training reply: no node was sampled or none answered"
    return "; ".join(f"{reason} (x{count})" for reason, count in reasons.most_common(3))


class TrainingProgress:
    """Counts rounds without a trained model and raises :class:`TrainingStalled`.

    Parameters
    ----------
    owner : str
        The strategy's name, for messages.
    limit : int
        Rounds in a row without training after which the run stops.
    weighted_by_key : str
        The strategy's weight metric (named in the fix for replies that lack it).
    """

    def __init__(self, owner: str, limit: int, weighted_by_key: str) -> None:
        self.owner, self.limit, self.weighted_by_key = owner, limit, weighted_by_key
        self.last_trained: ArrayRecord | None = None
        self.trained_rounds = 0
        self._untrained: list[int] = []
        self._reasons: Counter[str] = Counter()
        self.rounds_planned: int | None = None

    def reset(self, initial: ArrayRecord, rounds: int | None = None) -> None:
        """Start a run of ``rounds`` rounds (``None``: not known) from ``initial``."""
        self.last_trained, self.rounds_planned = initial, rounds
        self.trained_rounds = 0
        self._untrained, self._reasons = [], Counter()

    def record(self, server_round: int, arrays: ArrayRecord | None, used: int,
               reasons: Mapping[int, str], expected: int | None = None) -> None:
        """Note one round: ``used`` replies trained the model ``arrays``.

        Parameters
        ----------
        server_round : int
            The round.
        arrays : ArrayRecord | None
            The round's model (``None`` when nothing trained).
        used : int
            Training replies that entered the model.
        reasons : Mapping[int, str]
            Why each other node's reply was unusable, by node.
        expected : int | None
            Replies awaited; the ones missing from ``reasons`` did not come in time.

        Raises
        ------
        TrainingStalled
            On the ``limit``-th round in a row without training.
        """
        if used > 0 and arrays is not None:
            self.last_trained = arrays
            self.trained_rounds += 1
            self._untrained, self._reasons = [], Counter()
            return
        self._untrained.append(server_round)
        this_round: Counter[str] = Counter(reasons.values())
        silent = (expected or 0) - len(reasons)
        if silent > 0:
            this_round[f"{silent} node(s) sent no reply in time (no reply)"] += 1
        self._reasons.update(this_round)
        log(WARNING, "%s round %d: nothing trained (%s); the model is kept", self.owner,
            server_round, describe(this_round))
        if len(self._untrained) >= self.limit:
            raise self.stalled(f"no round trained in the last {len(self._untrained)} "
                               f"(rounds {self._untrained[0]}-{self._untrained[-1]})")

    def finish(self, result: Result, num_rounds: int) -> Result:
        """After a run's last round: ``result``, an empty ``result.arrays`` filled with
        the last model that trained.

        Raises
        ------
        TrainingStalled
            If no round of the run trained.
        """
        if num_rounds > 0 and self.trained_rounds == 0:
            raise self.stalled(f"no round of the run's {num_rounds} trained")
        if not result.arrays and self.last_trained is not None:
            result.arrays = self.last_trained  # Flower's Result starts empty
        return result

    def cause(self) -> str:
        """The commonest reasons of the untrained rounds, with their counts."""
        return describe(self._reasons)

    def stalled(self, what: str) -> TrainingStalled:
        """The error for a run that does not train."""
        top = self._reasons.most_common(1)
        fix = fix_for(top[0][0] if top else "no reply", self.weighted_by_key)
        return TrainingStalled(
            f"{self.owner}: {what}. The replies said: {self.cause()}. Fix: {fix}.",
            self.last_trained)


class SizeWarning:
    """One WARNING per strategy object that the federation is too small for its
    settings: what they imply, and the setting to change.

    Parameters
    ----------
    owner : str
        The strategy's name, for messages.
    """

    def __init__(self, owner: str) -> None:
        self.owner, self.given = owner, False

    def __call__(self, message: str, *args: Any) -> None:
        """Log ``message % args`` unless this object already warned."""
        if not self.given:
            self.given = True
            log(WARNING, message, *args)

    def unfilled(self, have: int, group: str, nodes: int, member: str, setting: str,
                 label: str = "") -> None:
        """Warn when ``have`` groups (singular ``group``, e.g. ``"centre"``; counted as
        ``label`` + ``have``: ``"k=5"``) outnumber the ``nodes`` members (singular
        ``member``) that could fill them."""
        if 0 < nodes < have:
            self("%s: %s%d %ss for %d %ss: at least %d %ss get no %s; set %s to at most %d",
                 self.owner, label, have, group, nodes, member, have - nodes, group, member,
                 setting, nodes)
