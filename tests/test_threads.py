"""Thread control: the server's hints per message, the client's mod, the pools' limits."""

from __future__ import annotations

import gc
import sys
import types
import weakref

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from threadpoolctl import threadpool_info

from fedgsp_flwr.clients import message_threads, threads_mod
from fedgsp_flwr.strategies import FedAvg
from fedgsp_flwr.strategies.relay import run_relay
from fedgsp_flwr.threads import (
    ThreadHintGrid,
    frozen_gc,
    is_simulation,
    server_threads,
    thread_limit,
)
from tests.fakegrid import FakeGrid


class InMemoryGrid(FakeGrid):
    """A fake grid that passes for the simulation engine's."""


def echo(message: Message) -> Message:
    arrays = message.content.array_records.get("arrays", ArrayRecord())
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})}),
                   reply_to=message)


def hinted(grid: FakeGrid, kind: str | None = None) -> list[int | None]:
    """The ``num-threads`` each pushed message (of type ``kind``) carried, in push order."""
    out = []
    for _, _, message_type, message in grid.pushed:
        if kind is not None and message_type != kind:
            continue
        config = message.content.config_records.get("config", ConfigRecord())
        out.append(config.get("num-threads"))
    return out


def train_message(node: int, content: RecordDict | None = None) -> Message:
    return Message(content if content is not None else RecordDict(), dst_node_id=node,
                   message_type="train")


def blas_threads() -> int:
    return next(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


def test_the_hint_divides_the_cores_by_the_messages_in_flight() -> None:
    inner = FakeGrid({n: echo for n in range(8)})
    grid = ThreadHintGrid(inner, cores=4)
    first = list(grid.push_messages([train_message(0)]))      # alone: all 4 cores
    grid.push_messages([train_message(1), train_message(2)])  # 3 in flight: 4 // 3
    grid.pull_messages(first)
    grid.push_messages([train_message(3)])                    # 3 in flight again
    list(grid.send_and_receive([train_message(n) for n in range(4, 8)], timeout=1))
    assert hinted(inner) == [4, 1, 1, 1, 1, 1, 1, 1]
    grid.pull_messages(list(grid.in_flight))
    assert grid.in_flight == set()
    grid.push_messages([train_message(0), train_message(1)])
    assert hinted(inner)[-2:] == [2, 2]


def test_a_shared_content_is_not_changed_and_an_explicit_count_is_kept() -> None:
    inner = FakeGrid({n: echo for n in range(3)})
    grid = ThreadHintGrid(inner, cores=2)
    shared = RecordDict({"config": ConfigRecord({"lr": 0.1})})
    grid.push_messages([train_message(0, shared)])
    grid.pull_messages(list(grid.in_flight))
    grid.push_messages([train_message(1, RecordDict(
        {"config": ConfigRecord({"num-threads": 7})}))])
    assert hinted(inner) == [2, 7]
    assert dict(shared["config"]) == {"lr": 0.1}, "the strategy's record is not touched"
    assert inner.pushed[0][3].content["config"]["lr"] == 0.1


def test_a_relay_chain_hop_is_told_to_use_every_core() -> None:
    inner = FakeGrid({n: echo for n in range(3)})
    initial = ArrayRecord({"w": Array(np.zeros(3, np.float32))})
    run_relay(ThreadHintGrid(inner, cores=2), [[0, 1, 2]], initial, ConfigRecord(),
              train_timeout=5)
    assert hinted(inner) == [2, 2, 2]
    inner = FakeGrid({n: echo for n in range(4)})
    run_relay(ThreadHintGrid(inner, cores=2), [[0, 1], [2, 3]], initial, ConfigRecord(),
              train_timeout=5)
    assert hinted(inner)[:2] == [1, 1], "two chains at once share the cores"


def test_strategies_hint_and_limit_only_in_simulation() -> None:
    initial = ArrayRecord({"w": Array(np.zeros(3, np.float32))})
    seen: list[int] = []

    def record_threads(message: Message) -> Message:
        seen.append(blas_threads())  # FakeGrid answers in the server's process
        return echo(message)

    simulated = InMemoryGrid({n: record_threads for n in range(2)})
    assert is_simulation(simulated) and not is_simulation(FakeGrid({}))
    before = blas_threads()
    FedAvg(fraction_evaluate=0.0).start(simulated, initial, num_rounds=1, timeout=5)
    # FedAvg asks the two nodes their partition ids first (see test_fedavg_sampling)
    assert hinted(simulated, "train") == [1, 1] and seen == [1] * 4  # 2 queries, 2 trains
    assert blas_threads() == before, "restored after the run"
    deployed = FakeGrid({n: echo for n in range(2)})
    FedAvg(fraction_evaluate=0.0, server_threads=None).start(deployed, initial, num_rounds=1,
                                                              timeout=5)
    assert set(hinted(deployed)) == {None}, "no hint leaves the simulation"
    assert server_threads(deployed) is None and server_threads(deployed, 3) == 3
    with pytest.raises(ValueError, match="server_threads"):
        FedAvg(server_threads=0)


def test_thread_limit_sets_blas_and_torch_and_restores_them() -> None:
    torch_before, blas_before = torch.get_num_threads(), blas_threads()
    with thread_limit(3):
        assert torch.get_num_threads() == 3 and blas_threads() == 3
    assert torch.get_num_threads() == torch_before and blas_threads() == blas_before
    with thread_limit(None):
        assert torch.get_num_threads() == torch_before


def test_the_pools_are_looked_up_once_not_per_block(monkeypatch) -> None:
    import threadpoolctl

    found = []
    real = threadpoolctl.ThreadpoolController
    monkeypatch.setattr(threadpoolctl, "ThreadpoolController",
                        lambda: found.append(1) or real())
    threadpoolctl.reset_cached_controller()
    for threads in (2, 3, 1):
        with thread_limit(threads):
            pass
    assert len(found) == 1, "a lookup per block costs 2 ms a message"


def context(node_config: dict | None = None) -> Context:
    return Context(run_id=1, node_id=1, node_config=node_config or {}, state=RecordDict(),
                   run_config={})


def with_config(config: dict) -> Message:
    return train_message(1, RecordDict({"config": ConfigRecord(config)}))


def test_the_client_takes_the_hint_its_node_config_or_nothing(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert message_threads(with_config({"num-threads": 2}), context()) == 2
    assert message_threads(with_config({"lr": 0.1}), context()) is None
    assert message_threads(train_message(1), context()) is None
    assert message_threads(with_config({"num-threads": 2}), context({"num-threads": 5})) == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # a Ray actor given 4 CPUs
    assert message_threads(with_config({"num-threads": 2}), context()) == 4
    for bad in (0, "2", True):
        with pytest.raises(ValueError, match="num-threads"):
            message_threads(with_config({"num-threads": bad}), context())


def test_the_mod_trains_with_the_hinted_threads(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    seen = []

    def handler(message: Message, ctx: Context) -> Message:
        seen.append(torch.get_num_threads())
        return echo(message)

    threads_mod(with_config({"num-threads": 3}), context(), handler)
    threads_mod(with_config({}), context(), handler)
    assert seen == [3, before] and torch.get_num_threads() == before


def test_a_torch_still_being_imported_elsewhere_is_left_alone(monkeypatch) -> None:
    # Flower's engine may import the ClientApp (and torch) in another thread meanwhile.
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    with thread_limit(1):
        assert blas_threads() == 1


def _collectable(obj: object) -> bool:
    """Whether ``obj`` is in a generation the cyclic GC walks (frozen ones are not)."""
    return any(tracked is obj for tracked in gc.get_objects())


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_frozen_gc_freezes_what_is_alive_and_the_outermost_block_unfreezes() -> None:
    # Identity checks, not freeze counts: frozen objects that die by reference count
    # (another thread's, pytest's) lower the count at any moment.
    alive = [0]
    with frozen_gc():
        assert gc.get_freeze_count() > 0
        assert not _collectable(alive)
        kept = [1]  # created inside: not frozen yet
        assert _collectable(kept)
        with frozen_gc():
            assert not _collectable(kept)
        assert not _collectable(kept), "an inner block keeps them frozen"
        cycle = weakref.ref(_Node())  # garbage made in the block is collected as usual
        gc.collect()
        assert cycle() is None
    assert gc.get_freeze_count() == 0
    assert _collectable(alive) and _collectable(kept)
