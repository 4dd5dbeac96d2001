"""A strategy's per-round history: what each round recorded, and the round trip of the
messages a stage sent."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from flwr.app import Message

from ..protocol import TRAIN


class RoundHistory(dict[int, dict[str, Any]]):
    """Per-round metrics, by round (a dict), with the clock and the messages of each
    stage (``train``, ``evaluate``) between their sending and their aggregation.

    A round records the aggregated client metrics, the replies used and rejected, the
    model bytes sent and received in training (``bytes-sent``, ``bytes-received``), the
    models uploaded (``uploads``: replies with content) and the seconds from sending a
    stage's messages to aggregating their replies (``train-time``, ``eval-time``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._sent_at: dict[str, float] = {}
        self._messages_of: dict[str, list[Message]] = {}

    def sent(self, stage: str, messages: list[Message]) -> None:
        """The stage's messages leave now (none: no clock, since Flower then skips the
        aggregation and a clock started now would be stopped by a later round's)."""
        if messages:
            self._sent_at[stage] = time.monotonic()
            self._messages_of[stage] = messages  # the grid gives them their ids as it pushes
        else:
            self._sent_at.pop(stage, None)
            self._messages_of.pop(stage, None)

    def answered(self, stage: str, messages: list[Message]) -> None:
        """The messages a stage's coming replies answer (a strategy that sent them
        itself)."""
        self._messages_of[stage] = messages

    def take_messages(self, stage: str) -> list[Message] | None:
        """The messages the stage's replies answer (``None``: none noted)."""
        return self._messages_of.pop(stage, None)

    def stop_clock(self, server_round: int, stage: str) -> None:
        """Record the seconds since the stage's messages left (``train-time``,
        ``eval-time``)."""
        if (sent_at := self._sent_at.pop(stage, None)) is not None:
            key = "train-time" if stage == TRAIN else "eval-time"
            self.setdefault(server_round, {})[key] = time.monotonic() - sent_at

    def record(self, server_round: int, stage: str, metrics: Mapping[str, Any] | None,
               num_sound: int, rejected: Mapping[int, str]) -> None:
        """Record a stage's aggregated metrics and its counts of used and refused
        replies."""
        entry = self.setdefault(server_round, {})
        # Train metrics keep their names; evaluation ones are told apart by "eval".
        prefix = "" if stage == TRAIN else "eval"
        for key, value in (metrics or {}).items():
            entry[key if key.startswith(prefix) else f"{prefix}-{key}"] = value
        entry[f"{prefix or TRAIN}-replies"] = num_sound
        entry[f"{prefix or TRAIN}-rejected"] = len(rejected)
