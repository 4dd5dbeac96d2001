"""A Grid that hands every call to another grid: the base of the views the strategies
put between Flower's code and the run's grid (thread hints, node order), and a view
that bounds how long a run waits for its nodes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

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


class NodeWaitTimeoutError(TimeoutError):
    """Fewer nodes than a run needs were connected for longer than it may wait.

    Attributes
    ----------
    connected : int
        Nodes connected at the last look.
    minimum : int
        Nodes needed.
    waited : float
        Seconds the count has been short.
    """

    def __init__(self, message: str, connected: int, minimum: int, waited: float) -> None:
        super().__init__(message)
        self.connected, self.minimum, self.waited = connected, minimum, waited


class NodeWaitGrid(GridView):
    """A view of ``grid`` whose ``get_node_ids()`` raises :class:`NodeWaitTimeoutError`
    once it has listed fewer than ``minimum`` nodes for ``timeout`` seconds in a row.

    Flower's ``sample_nodes`` (and so every strategy's node sampling) polls
    ``get_node_ids()`` once a second, without end, until ``minimum`` nodes are
    connected; through this view that wait ends after ``timeout`` seconds with the count
    seen and the count needed. A listing of ``minimum`` nodes or more restarts the clock.

    Parameters
    ----------
    grid : Grid
        The run's grid.
    minimum : int
        Nodes the run waits for (its ``min_available_nodes``).
    timeout : float
        Seconds the count may stay below ``minimum``.
    hint : str
        What to do, appended to the error message.
    clock : Callable[[], float]
        Monotonic seconds (tests pass a fake clock).
    """

    def __init__(self, grid: Grid, minimum: int, timeout: float, *, hint: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if minimum < 1 or not timeout > 0:
            raise ValueError(f"minimum must be >= 1 and timeout > 0, got {minimum}, "
                             f"{timeout}")
        super().__init__(grid)
        self.minimum, self.timeout, self.hint, self.clock = minimum, timeout, hint, clock
        self.short_since: float | None = None

    def get_node_ids(self) -> Iterable[int]:
        nodes = list(self.grid.get_node_ids())
        if len(nodes) >= self.minimum:
            self.short_since = None
            return nodes
        now = self.clock()
        if self.short_since is None:
            self.short_since = now
        elif (waited := now - self.short_since) >= self.timeout:
            raise NodeWaitTimeoutError(
                f"{len(nodes)} node(s) connected, {self.minimum} needed: the count has "
                f"been short for {waited:.0f} s (the limit is {self.timeout:g} s)"
                + (f"; {self.hint}" if self.hint else ""),
                len(nodes), self.minimum, waited)
        return nodes
