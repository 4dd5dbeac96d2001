"""Waiting for ``min-available-nodes``: a simulation with fewer nodes fails at the start
naming both numbers; in deployment ``node-wait-timeout`` bounds every wait (the start,
and the strategies' node sampling in each round), then the run fails with the count
seen and the count needed. No engine is started: the simulation's grid is Flower's own
``InMemoryGrid`` over an in-memory LinkState whose nodes are registered as the
simulation engine registers them; deployment is a FakeGrid.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakegrid import FakeGrid, partition_node
from flwr.app import Context, Message, RecordDict
from flwr.serverapp.strategy import strategy_utils

from fedgsp_flwr.app import client_app, server_app
from fedgsp_flwr.app.config import ConfigError, RunConfig
from fedgsp_flwr.app.results import read_metrics
from fedgsp_flwr.grids import NodeWaitGrid, NodeWaitTimeoutError
from fedgsp_flwr.threads import is_simulation

BASE: dict[str, Any] = {
    "dataset": "synthetic", "partition": "natural", "batch-size": 16, "lr": 0.1,
    "train-timeout": 30.0, "query-timeout": 30.0, "seed": 3, "fraction-evaluate": 0.0,
    "train-examples": 300, "test-examples": 100}


def simulation_grid(num_supernodes: int) -> Any:
    """Flower's simulation grid with ``num_supernodes`` nodes, registered as
    ``flwr.server.superlink.fleet.vce.start_vce`` registers them (the engine's
    ``_main_loop`` pre-registers the run the same way).
    """
    try:
        from flwr.proto.task_pb2 import Task
        from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
        from flwr.server.superlink.linkstate import LinkStateFactory
        from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
        from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
        from flwr.supercore.object_store import ObjectStoreFactory
        from flwr.supercore.run import Run
        from flwr.superlink.federation import NoOpFederationManager
        from flwr.superlink.grid.inmemory_grid import InMemoryGrid
    except ImportError as err:  # Flower's internals move between releases
        pytest.skip(f"this Flower has no simulation internals where expected: {err}")
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(),
                               ObjectStoreFactory())
    run = Run.create_empty(run_id=7)
    run.primary_task_id, run.federation_id = 11, NOOP_FEDERATION_ID
    state: Any = factory.state()  # the in-memory LinkState, as the engine uses it
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[11] = Task(task_id=11, run_id=run.run_id)
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    _register_nodes(num_nodes=num_supernodes, state_factory=factory)
    return grid


def finishes_within(seconds: float, call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` in a thread; fail unless it returns or raises within ``seconds``
    (today's wait never ends); return what it raised.
    """
    raised: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            raised.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting for nodes after {seconds:g} s"
    return raised[0] if raised else None


class FakeClock:
    """Monotonic time that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_simulation_with_fewer_nodes_than_min_available_nodes_fails_at_the_start(
        caplog: pytest.LogCaptureFixture) -> None:
    grid = simulation_grid(3)
    assert is_simulation(grid) and len(list(grid.get_node_ids())) == 3
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                      run_config={**BASE, "min-available-nodes": 5})
    err = finishes_within(20, lambda: server_app.main(grid, context))
    assert isinstance(err, ConfigError), err
    message = str(err)
    assert "min-available-nodes=5" in message and "num-supernodes=3" in message
    assert "at most 3" in message and "num-supernodes=5" in message  # the two fixes


def test_simulated_nodes_registered_while_the_serverapp_looks_are_waited_for() -> None:
    """The engine registers its nodes one by one after the ServerApp thread started: a
    count still growing is not final."""
    grid = simulation_grid(4)
    listings = iter([[], [1], [1, 2], [1, 2, 3]])
    clock = FakeClock()

    class Registering(type(grid)):  # type: ignore[misc]  # still the simulation's grid
        def __init__(self) -> None:
            pass

        def get_node_ids(self) -> list[int]:
            return next(listings, [1, 2, 3, 4])

    assert server_app.wait_for_nodes(Registering(), 4, clock=clock, sleep=clock.sleep) == 4
    assert sum(clock.sleeps) < 1.0  # no settling needed: the count kept growing


def test_a_simulation_settles_before_it_fails() -> None:
    grid = simulation_grid(2)
    clock = FakeClock()
    with pytest.raises(ConfigError, match="min-available-nodes=3 is more than the 2 nodes"):
        server_app.wait_for_nodes(grid, 3, clock=clock, sleep=clock.sleep)
    assert 3.0 <= sum(clock.sleeps) < 3.5  # settle_seconds, polled every 0.1 s


def test_enough_simulated_nodes_start_at_once() -> None:
    clock = FakeClock()
    assert server_app.wait_for_nodes(simulation_grid(3), 3, clock=clock,
                                      sleep=clock.sleep) == 3
    assert clock.sleeps == []


def test_deployment_waits_node_wait_timeout_then_fails_with_both_counts() -> None:
    grid = FakeGrid({1: partition_node(0)})
    clock = FakeClock()
    with pytest.raises(NodeWaitTimeoutError) as caught:
        server_app.wait_for_nodes(grid, 3, timeout=30.0, clock=clock, sleep=clock.sleep)
    err = caught.value
    assert (err.connected, err.minimum) == (1, 3) and 30.0 <= err.waited < 31.0
    assert "1 node(s) connected" in str(err) and "min-available-nodes=3" in str(err)
    assert "node-wait-timeout=30" in str(err)
    assert clock.sleeps == [1.0] * 30  # one look a second, as before


def test_deployment_nodes_that_connect_within_the_timeout_start_the_run() -> None:
    nodes: dict[int, Any] = {1: partition_node(0)}
    grid = FakeGrid(nodes)
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now - 1000.0 >= 20:
            nodes[2] = partition_node(1)  # connects after 20 s

    assert server_app.wait_for_nodes(grid, 2, timeout=30.0, clock=clock, sleep=sleep) == 2


def test_the_run_config_bounds_the_start_of_a_deployment_run(tmp_path: Path) -> None:
    """Through the ServerApp's entry point, with real time: one node of two, a
    one-second node-wait-timeout."""
    context = Context(run_id=8, node_id=0, node_config={}, state=RecordDict(),
                      run_config={**BASE, "min-available-nodes": 2,
                                  "node-wait-timeout": 1.0, "results-dir": str(tmp_path)})
    err = finishes_within(20, lambda: server_app.main(FakeGrid({1: partition_node(0)}),
                                                      context))
    assert isinstance(err, NodeWaitTimeoutError), err
    assert "1 node(s) connected" in str(err) and "min-available-nodes=2" in str(err)


def test_node_wait_grid_bounds_flowers_node_sampling(monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    """Flower's ``sample_nodes`` (every strategy's) polls once a second without end."""
    clock = FakeClock()
    monkeypatch.setattr(strategy_utils, "sleep", clock.sleep)
    nodes: dict[int, Any] = {1: partition_node(0), 2: partition_node(1)}
    grid = NodeWaitGrid(FakeGrid(nodes), 2, 60.0, hint="start the missing SuperNodes",
                        clock=clock)
    assert sorted(strategy_utils.sample_nodes(grid, 2, 2)[0]) == [1, 2]
    del nodes[2]
    with pytest.raises(NodeWaitTimeoutError,
                       match=r"1 node\(s\) connected, 2 needed.*60 s.*start the missing"):
        strategy_utils.sample_nodes(grid, 2, 0)
    assert 60.0 <= sum(clock.sleeps) <= 61.0


def test_node_wait_grid_restarts_its_clock_when_enough_nodes_are_back() -> None:
    clock = FakeClock()
    nodes: dict[int, Any] = {1: partition_node(0)}
    grid = NodeWaitGrid(FakeGrid(nodes), 2, 10.0, clock=clock)
    grid.get_node_ids()  # short: the clock starts
    clock.sleep(9.0)
    nodes[2] = partition_node(1)
    assert len(list(grid.get_node_ids())) == 2  # enough: the clock stops
    del nodes[2]
    clock.sleep(100.0)
    grid.get_node_ids()  # short again: a new wait starts now
    clock.sleep(9.0)
    assert len(list(grid.get_node_ids())) == 1
    clock.sleep(1.0)
    with pytest.raises(NodeWaitTimeoutError):
        grid.get_node_ids()


RUN_IDS = itertools.count(5000)


class LosingGrid(FakeGrid):
    """Nodes of the app's ClientApp; after ``rounds`` training rounds the last one is
    gone for good (a SuperNode whose machine went down)."""

    def __init__(self, cfg: RunConfig, num_nodes: int, rounds: int) -> None:
        handlers, run_id = {}, next(RUN_IDS)
        for partition in range(num_nodes):
            context = Context(run_id=run_id, node_id=partition + 1, state=RecordDict(),
                              node_config={"partition-id": partition,
                                           "num-partitions": num_nodes},
                              run_config=cfg.to_mapping())

            def handle(message: Message, c: Context = context) -> Message:
                return client_app.app(message, c)
            handlers[partition + 1] = handle
        super().__init__(handlers)
        self.rounds = rounds

    def get_node_ids(self) -> list[int]:
        trained = sum(1 for _, _, kind, _ in self.pushed if kind == "train") // len(
            self.handlers)
        nodes = list(self.handlers)
        return nodes[:-1] if trained >= self.rounds else nodes


def test_a_node_lost_for_good_ends_a_deployment_run_after_node_wait_timeout(
        tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping({**BASE, "strategy": "fedavg", "num-server-rounds": 3,
                                  "min-available-nodes": 3, "node-wait-timeout": 1.5,
                                  "results-dir": str(tmp_path), "run-name": "lost",
                                  "data-dir": str(tmp_path / "data")})
    grid = LosingGrid(cfg, 3, rounds=1)
    err = finishes_within(60, lambda: server_app.run(grid, cfg))
    assert isinstance(err, NodeWaitTimeoutError), err
    assert (err.connected, err.minimum) == (2, 3)
    assert "node-wait-timeout=1.5" in str(err) and "resume-from" in str(err)
    metrics = read_metrics(tmp_path / "lost")
    assert metrics is not None and metrics["status"] == "failed"
    assert [r["round"] for r in metrics["rounds"]] == [0, 1]  # round 1 and its checkpoint
    assert "NodeWaitTimeoutError" in metrics["summary"]["error"]


def test_node_wait_timeout_is_a_finite_positive_run_config_key() -> None:
    assert RunConfig().node_wait_timeout == 600.0
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="'node-wait-timeout'"):
            RunConfig.from_mapping({"node-wait-timeout": bad})
