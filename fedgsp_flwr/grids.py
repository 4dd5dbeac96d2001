"""A Grid that hands every call to another grid: the base of the views the strategies
put between Flower's code and the run's grid (thread hints, node order)."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid


class GridView(Grid):
    """Flower's ``Grid`` interface, every call passed on to ``grid``; subclasses change
    what they need.

    Parameters
    ----------
    grid : Grid
        The grid the calls go to.
    """

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    @property
    def run(self):  # type: ignore[no-untyped-def]  # Flower's Run
        return self.grid.run

    def set_run(self, run) -> None:  # type: ignore[no-untyped-def]  # Flower's Run
        self.grid.set_run(run)

    def create_message(self, *args, **kwargs) -> Message:  # type: ignore[no-untyped-def]
        return self.grid.create_message(*args, **kwargs)  # deprecated upstream

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return self.grid.send_and_receive(messages, timeout=timeout)
