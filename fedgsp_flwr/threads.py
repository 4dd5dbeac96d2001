"""Thread counts that fit the cores each side of a run was given.

BLAS (OpenBLAS under numpy and scipy) and OpenMP (torch) size their pools to the whole
machine by default. In Flower's simulation engine that is wrong on both sides:

- the ServerApp runs in a thread of the engine's process, which also runs Ray's
  driver. When any thread of a process forks (Ray starts its processes with
  ``subprocess.Popen(preexec_fn=...)``, a real ``fork()``), OpenBLAS's fork handler
  shuts its worker threads down; a multi-threaded BLAS call running at that moment in
  another thread has handed part of its work to a worker that is gone, and spins in
  ``exec_blas`` forever (benchmarks/engine_overhead.py, part d, reproduces it in a
  plain process; gdb showed exactly that in a hung ServerApp). With one BLAS thread a
  call never hands work over, so it cannot hang. The ClientApps own the cores anyway
  (``client-resources-num-cpus``), so the ServerApp runs with one thread there.
- the ClientApp actors are started by Ray with ``OMP_NUM_THREADS`` set to their CPUs,
  so a relay chain's single hop trains on one core while the others idle.

:func:`thread_limit` sets both pools (and torch's) for a block of work. On the server,
every strategy of this package runs its rounds with :func:`server_threads` threads
and, in simulation, through a :class:`ThreadHintGrid`, which tells each message's
ClientApp how many threads the machine has free for it: ``config["num-threads"]`` =
cores // messages in flight. On the client, :func:`fedgsp_flwr.clients.threads_mod`
(a Flower mod) applies that hint, or the node's own ``num-threads``
(``flower-supernode --node-config "num-threads=4"``).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from threadpoolctl import get_cached_controller

from .core._moved import moved
from .core.parallel import machine_cores
from .grids import GridView
from .protocol import CONFIG, NUM_THREADS

# Threads of the ServerApp in simulation, where the ClientApps own every core.
SIMULATION_SERVER_THREADS = 1


@contextmanager
def thread_limit(threads: int | None) -> Iterator[None]:
    """Run a block with ``threads`` threads in every BLAS and OpenMP pool of the process
    and in torch (when torch is loaded), restoring the previous counts after it.

    Parameters
    ----------
    threads : int | None
        Threads to use; ``None`` leaves every pool as it is.
    """
    if threads is None:
        yield
        return
    torch = sys.modules.get("torch")  # never imported here: the library runs without it
    if not hasattr(torch, "set_num_threads"):  # absent, or being imported by another thread
        torch = None
    before = torch.get_num_threads() if torch is not None else None
    # threadpoolctl's controller, found again only when a module was imported since:
    # finding the pools reads every loaded library, 2 ms a message in a ClientApp's
    # process (benchmarks/message_overhead.py).
    with get_cached_controller().limit(limits=threads):
        if torch is not None:
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(before)


_frozen_depth = 0


@contextmanager
def frozen_gc() -> Iterator[None]:
    """Run a block with the objects alive at its start frozen for Python's cyclic GC
    (``gc.freeze``): a nested block freezes what is alive at its own start, and the
    outermost one unfreezes everything when it ends.

    The engine's process tracks 150,000 to 340,000 objects (Flower, Ray, torch, the
    link state), and every full collection walks them all: allocation-heavy server work
    ran up to 9 times slower there than in a plain process (ICG at the paper's size:
    26 to 46 ms against 5 ms; 4.9 ms with those objects frozen). Objects created in the
    block are collected as usual.
    """
    global _frozen_depth
    gc.freeze()  # O(1); garbage frozen with the rest is collected after the block
    _frozen_depth += 1
    try:
        yield
    finally:
        _frozen_depth -= 1
        if _frozen_depth == 0:
            gc.unfreeze()


def is_simulation(grid: Grid) -> bool:
    """Whether ``grid`` is the simulation engine's (the ServerApp then shares the machine,
    and its process, with the ClientApps).
    """
    return any(cls.__name__ == "InMemoryGrid" for cls in type(grid).__mro__)


def server_threads(grid: Grid, requested: int | None = None) -> int | None:
    """Threads for a ServerApp's own work on ``grid``: ``requested`` if given, else
    :data:`SIMULATION_SERVER_THREADS` in simulation and ``None`` (the process's
    setting) in deployment.
    """
    if requested is not None:
        return requested
    return SIMULATION_SERVER_THREADS if is_simulation(grid) else None


@contextmanager
def server_work(grid: Grid, requested: int | None = None) -> Iterator[None]:
    """Run a ServerApp's own work on ``grid``: with :func:`server_threads` threads and the
    objects alive at the start frozen for the cyclic GC (:func:`frozen_gc`).
    """
    with thread_limit(server_threads(grid, requested)), frozen_gc():
        yield


class ThreadHintGrid(GridView):
    """A simulation grid that hints each message's thread count.

    Every pushed message gets ``config["num-threads"]`` = cores // messages in flight
    (at least 1), the cores the simulated clients can share at that moment: a relay
    chain's lone hop gets all of them, a round of many parallel clients one each. A
    message that already carries the key keeps it.

    Parameters
    ----------
    grid : Grid
        The simulation engine's grid.
    cores : int | None
        Cores of the machine (default: :func:`machine_cores`).
    """

    def __init__(self, grid: Grid, cores: int | None = None) -> None:
        super().__init__(grid)
        self.cores = cores or machine_cores()
        self.in_flight: set[str] = set()

    def hint(self, messages: list[Message], pending: int) -> None:
        """Give each message its thread count, ``pending`` messages being in flight."""
        threads = max(1, self.cores // max(1, pending))
        for message in messages:
            if not message.has_content():
                continue
            content = message.content
            config = content.config_records.get(CONFIG, ConfigRecord())
            if NUM_THREADS in config:
                continue
            # A fresh record and dict: Flower's strategies share one content object
            # between the messages of a round, and a relay pushes hops at other times.
            records = dict(content.items())
            records[CONFIG] = ConfigRecord({**dict(config), NUM_THREADS: threads})
            message.content = RecordDict(records)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self.hint(messages, len(self.in_flight) + len(messages))
        ids = list(self.grid.push_messages(messages))
        self.in_flight.update(ids)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(self.grid.pull_messages(message_ids))
        self.in_flight.difference_update(r.metadata.reply_to_message_id for r in replies)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        self.hint(messages, len(self.in_flight) + len(messages))
        return self.grid.send_and_receive(messages, timeout=timeout)


# Names that moved to fedgsp_flwr.protocol in 0.7.0; they warn until 0.8.0.
_MOVED = {
    "THREADS_KEY": "fedgsp_flwr.protocol:NUM_THREADS",
    "CONFIG_KEY": "fedgsp_flwr.protocol:CONFIG",
}
__getattr__ = moved(__name__, _MOVED)
