"""The sequential-relay engine: order, parallel chains, skipped nodes, timeouts."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedgsp_flwr.strategies.relay import run_relay

START = ArrayRecord({"w": Array(np.zeros(3, np.float32))})


def adder(amount: float, examples: int = 10, log: list | None = None):
    """A node that adds ``amount`` to the model and reports ``examples``."""

    def handle(message: Message) -> Message:
        w = message.content["arrays"]["w"].numpy()
        if log is not None:
            log.append((message.metadata.dst_node_id, w.copy(),
                        dict(message.content["config"])))
        content = RecordDict({
            "arrays": ArrayRecord({"w": Array((w + amount).astype(np.float32))}),
            "metrics": MetricRecord({"num-examples": examples, "train-loss": amount}),
        })
        return Message(content, reply_to=message)

    return handle


def crash(message: Message) -> Message:
    raise RuntimeError("out of memory")


def nan_reply(message: Message) -> Message:
    content = RecordDict({
        "arrays": ArrayRecord({"w": Array(np.full(3, np.nan, np.float32))}),
        "metrics": MetricRecord({"num-examples": 5}),
    })
    return Message(content, reply_to=message)


def test_a_chain_trains_in_order_and_hands_each_model_on() -> None:
    seen: list = []
    grid = FakeGrid({1: adder(1, log=seen), 2: adder(10, log=seen), 3: adder(100, log=seen)})
    (result,) = run_relay(grid, [[2, 3, 1]], START, ConfigRecord({"lr": 0.1}), train_timeout=5)
    assert [node for node, _, _ in seen] == [2, 3, 1]
    np.testing.assert_array_equal([w[0] for _, w, _ in seen], [0, 10, 110])
    assert [(c["relay-group"], c["relay-hop"], c["lr"]) for _, _, c in seen] == [
        (0, 0, 0.1), (0, 1, 0.1), (0, 2, 0.1)]
    np.testing.assert_array_equal(result.arrays["w"].numpy(), [111, 111, 111])
    assert result.num_examples == 30 and result.trained and result.skipped == {}
    assert all(h.bytes_sent > 0 and h.bytes_received > 0 for h in result.hops)


def test_chains_run_in_parallel_not_one_after_another() -> None:
    handlers = {n: adder(1) for n in range(1, 7)}
    # margins of seconds, not milliseconds: a busy machine delays threads by tenths of one
    # (beside the e2e runs at niceness 19, five hops once took 2.2 s)
    slow = 4.0
    grid = FakeGrid(handlers, delays={1: slow, 2: 0.01, 3: 0.01, 4: 0.01, 5: 0.01, 6: 0.01})
    results = run_relay(grid, [[1], [2, 3, 4, 5, 6]], START, ConfigRecord(), train_timeout=10)
    pushes = {node: t for t, node, _, _ in grid.pushed}
    # the fast chain's last hop was sent before the slow node answered
    assert pushes[6] < pushes[1] + slow, "chains ran one after the other"
    assert [r.num_examples for r in results] == [10, 50]


def test_a_failing_node_is_skipped_and_its_model_goes_on() -> None:
    seen: list = []
    grid = FakeGrid({1: adder(1, log=seen), 2: crash, 3: adder(100, log=seen)})
    (result,) = run_relay(grid, [[1, 2, 3]], START, ConfigRecord(), train_timeout=5)
    assert seen[1][0] == 3 and seen[1][1][0] == 1, "node 3 did not get node 1's model"
    np.testing.assert_array_equal(result.arrays["w"].numpy(), [101] * 3)
    assert list(result.skipped) == [2] and result.num_examples == 20
    assert result.hops[1].status == "error" and "out of memory" in result.hops[1].reason


def test_an_unsound_reply_is_skipped_like_a_failure() -> None:
    grid = FakeGrid({1: adder(1), 2: nan_reply, 3: adder(1)})
    (result,) = run_relay(grid, [[1, 2, 3]], START, ConfigRecord(), train_timeout=5)
    assert result.hops[1].status == "rejected" and "NaN" in result.hops[1].reason
    np.testing.assert_array_equal(result.arrays["w"].numpy(), [2] * 3)


def test_a_silent_node_times_out_and_a_late_reply_is_ignored() -> None:
    grid = FakeGrid({1: adder(1), 2: adder(50), 3: adder(100)}, delays={2: 3.0})
    started = time.monotonic()
    (result,) = run_relay(grid, [[1, 2, 3]], START, ConfigRecord(), train_timeout=0.1)
    assert time.monotonic() - started < 2.0, "the relay waited for the late reply"
    assert result.hops[1].status == "timeout" and list(result.skipped) == [2]
    np.testing.assert_array_equal(result.arrays["w"].numpy(), [101] * 3)


def test_a_chain_whose_every_node_fails_keeps_the_start_model() -> None:
    grid = FakeGrid({1: crash, 2: crash})
    (result,) = run_relay(grid, [[1, 2]], START, ConfigRecord(), train_timeout=5)
    assert not result.trained and result.num_examples == 0
    np.testing.assert_array_equal(result.arrays["w"].numpy(), [0, 0, 0])


@pytest.mark.parametrize("message_type", ["train.hop", "train"])
def test_hops_use_the_configured_message_type(message_type: str) -> None:
    grid = FakeGrid({1: adder(1)})
    run_relay(grid, [[1]], START, ConfigRecord(), train_timeout=5, message_type=message_type)
    assert grid.pushed[0][2] == message_type


def test_a_node_without_the_hop_handler_gets_plain_train_from_then_on() -> None:
    def plain_only(message: Message) -> Message:
        if message.metadata.message_type != "train":
            raise ValueError("No train function registered with name 'hop'")
        return adder(10)(message)

    grid = FakeGrid({1: adder(1), 2: plain_only, 3: adder(100)})
    plain: set[int] = set()
    (result,) = run_relay(grid, [[1, 2, 3]], START, ConfigRecord(), train_timeout=5,
                          message_type="train.hop", plain_nodes=plain)
    assert result.skipped == {} and plain == {2}
    np.testing.assert_array_equal(result.arrays["w"].numpy(), [111] * 3)
    assert [(n, t) for _, n, t, _ in grid.pushed] == [
        (1, "train.hop"), (2, "train.hop"), (2, "train"), (3, "train.hop")]
    grid.pushed.clear()
    run_relay(grid, [[2, 1]], START, ConfigRecord(), train_timeout=5,
              message_type="train.hop", plain_nodes=plain)
    assert [(n, t) for _, n, t, _ in grid.pushed] == [(2, "train"), (1, "train.hop")]


def test_a_node_that_cannot_be_reached_is_skipped() -> None:
    class GoneGrid(FakeGrid):
        def push_messages(self, messages):
            messages = list(messages)
            if messages[0].metadata.dst_node_id == 2:
                raise ConnectionError("node 2 disconnected")
            return super().push_messages(messages)

    grid = GoneGrid({1: adder(1), 2: adder(50), 3: adder(100)})
    (result,) = run_relay(grid, [[1, 2, 3]], START, ConfigRecord(), train_timeout=5)
    assert list(result.skipped) == [2] and "disconnected" in result.hops[1].reason
    assert result.hops[1].status == "lost"
    np.testing.assert_array_equal(result.arrays["w"].numpy(), [101] * 3)


def test_a_node_the_superlink_reports_offline_is_lost_not_failed() -> None:
    """Flower's SuperLink answers for a node that went offline with NODE_UNAVAILABLE; a
    ClientApp's own error proves the node is alive. Strategies re-probe only lost nodes.
    """
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    def offline(message: Message) -> Message:
        return Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node offline"),
                       reply_to=message)

    grid = FakeGrid({1: adder(1), 2: offline, 3: crash, 4: adder(100)})
    (result,) = run_relay(grid, [[1, 2, 3, 4]], START, ConfigRecord(), train_timeout=5)
    assert [h.status for h in result.hops] == ["ok", "lost", "error", "ok"]
    np.testing.assert_array_equal(result.arrays["w"].numpy(), [101] * 3)


def test_the_relay_polls_and_never_waits_in_send_and_receive() -> None:
    """In deployment ``Grid.send_and_receive`` sleeps 3 s between polls; the relay pushes
    each hop and polls for its reply itself, forwarding it as soon as it is there.
    """
    class NoBlockingGrid(FakeGrid):
        def send_and_receive(self, messages, *, timeout=None):
            raise AssertionError("the relay must not block in send_and_receive")

    grid = NoBlockingGrid({n: adder(1) for n in range(1, 6)}, delays={n: 0.05 for n in range(1, 6)})
    started = time.monotonic()
    (result,) = run_relay(grid, [[1, 2, 3, 4, 5]], START, ConfigRecord(), train_timeout=5)
    assert result.skipped == {} and result.num_examples == 50
    # five hops of 0.05 s each, each forwarded within a poll (0.02 s) of its reply; the
    # bounds leave room for a busy machine and still fail a 3 s wait per hop
    assert time.monotonic() - started < 2.5
    assert all(h.latency < 0.5 for h in result.hops)
