"""Our hooks on the nodes: learnt from at most two failed messages per type and run."""

from __future__ import annotations

import logging
import time

import pytest
from fakegrid import FakeGrid
from flwr.app import Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode

from fedgsp_flwr.strategies import exchange as exchange_module
from fedgsp_flwr.strategies import hook_support as hook_support_module
from fedgsp_flwr.strategies.exchange import PollBackoff, collect_reply_list
from fedgsp_flwr.strategies.hook_support import HookSupport, missing_handler
from fedgsp_flwr.strategies.node_registry import NodeRegistry


def node(*types: str):
    """A node answering the message types given, like a ClientApp without the others."""
    def handle(message: Message) -> Message:
        kind = message.metadata.message_type
        if kind not in types:
            category, _, action = kind.partition(".")
            raise ValueError(f"No {category} function registered with name '{action}'")
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=message)
    return handle


def messages(kind: str, nodes: range) -> list[Message]:
    return [Message(RecordDict(), dst_node_id=n, message_type=kind) for n in nodes]


def test_a_missing_hook_costs_two_messages_and_one_warning_per_run(
        caplog: pytest.LogCaptureFixture) -> None:
    grid = FakeGrid({n: node("train") for n in range(5)})
    hooks = HookSupport("Demo", {"query.x": "it does without"})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        replies = hooks.collect(grid, messages("query.x", range(5)), timeout=5)
        again = hooks.collect(grid, messages("query.x", range(5)), timeout=5)
    assert len(grid.pushed) == 2, "only the probe and its confirmation go out"
    assert all(missing_handler(r) for r in replies + again)
    assert [r.metadata.src_node_id for r in replies] == list(range(5))
    assert not hooks.has("query.x")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "no 'query.x' handler" in warnings[0]
    assert "it does without" in warnings[0] and "register_hooks(app" in warnings[0]


def test_a_present_hook_is_probed_once_then_sent_to_all() -> None:
    grid = FakeGrid({n: node("train", "query.x") for n in range(4)})
    hooks = HookSupport("Demo", {})
    mixed = messages("train", range(2)) + messages("query.x", range(4))
    replies = hooks.collect(grid, mixed, timeout=5)
    assert all(r is not None and not r.has_error() for r in replies)
    assert next(t for _, _, t, _ in grid.pushed) == "query.x", "the probe goes first"
    assert hooks.has("query.x") and "query.x" in hooks.present


def test_one_node_cannot_switch_a_hook_off_for_all() -> None:
    """The probe's node says the ClientApp has no handler (a lie, or a node of another
    app): a second node has it, so every node is asked and only the first is without."""
    grid = FakeGrid({0: node("train"), **{n: node("train", "query.x") for n in range(1, 4)}})
    hooks = HookSupport("Demo", {})
    replies = hooks.collect(grid, messages("query.x", range(4)), timeout=5)
    assert [missing_handler(r) for r in replies] == [True, False, False, False]
    assert hooks.has("query.x") and "query.x" in hooks.present
    assert [node for _, node, _, _ in grid.pushed] == [0, 1, 2, 3]


def crashing(message: Message) -> Message:
    raise RuntimeError("a handler that fails")


@pytest.mark.parametrize("second", ["silent", "crashing"])
def test_a_second_node_that_says_nothing_of_its_handler_switches_nothing_off(
        second: str) -> None:
    handlers = {n: node("train", "query.x") for n in range(4)}
    handlers[0] = node("train")  # says the ClientApp has no handler
    handlers[1] = (lambda _message: None) if second == "silent" else crashing
    hooks = HookSupport("Demo", {})
    replies = hooks.collect(FakeGrid(handlers), messages("query.x", range(4)), timeout=0.5)
    assert hooks.has("query.x")
    assert missing_handler(replies[0]) and not missing_handler(replies[1])
    assert all(r is not None and not r.has_error() for r in replies[2:])


def test_one_message_at_a_time_a_hook_is_missing_once_two_nodes_say_so() -> None:
    grid = FakeGrid({n: node("train") for n in range(3)})
    hooks = HookSupport("Demo", {})
    hooks.collect(grid, messages("query.x", range(1)), timeout=5)
    assert hooks.has("query.x"), "one node's word"
    hooks.collect(grid, messages("query.x", range(1)), timeout=5)
    assert hooks.has("query.x"), "the same node again"
    hooks.collect(grid, messages("query.x", range(1, 2)), timeout=5)
    assert not hooks.has("query.x")
    assert len(grid.pushed) == 3


def test_nodes_without_the_hook_among_nodes_with_it_are_answered_one_by_one() -> None:
    grid = FakeGrid({0: node("train", "query.x"), 1: node("train"), 2: node("train", "query.x")})
    hooks = HookSupport("Demo", {})
    replies = hooks.collect(grid, messages("query.x", range(3)), timeout=5)
    assert [missing_handler(r) for r in replies] == [False, True, False]
    assert hooks.has("query.x"), "the probe answered: the type is there"


def test_an_unreachable_error_never_says_a_hook_is_missing() -> None:
    message = messages("query.x", range(3, 4))[0]
    message.metadata.__dict__["_message_id"] = "m3"
    text = f"no {hook_support_module.MISSING_HANDLER_TEXT} 'query.x'"
    for code, missing in ((ErrorCode.NODE_UNAVAILABLE, False),
                          (ErrorCode.CLIENT_APP_RAISED_EXCEPTION, True)):
        reply = Message(Error(code=int(code), reason=text), reply_to=message)
        assert missing_handler(reply) is missing, code


def test_replies_stay_aligned_when_the_grid_refuses_a_push() -> None:
    class Refusing(FakeGrid):
        def push_messages(self, messages):
            kept = [m for m in messages if m.metadata.dst_node_id != 1]  # node 1 left
            return super().push_messages(kept)

    grid = Refusing({n: node("train", "query.x") for n in range(3)})
    replies = collect_reply_list(grid, messages("query.x", range(3)), timeout=1)
    assert replies[1] is None
    assert [r.metadata.src_node_id for r in (replies[0], replies[2])] == [0, 2]


def test_the_timeout_counts_from_the_end_of_the_push() -> None:
    """As Flower's ``send_and_receive``: a slow push (many large messages; here a grid
    that takes 0.4 s to take them) does not eat the nodes' time to answer."""
    class SlowPush(FakeGrid):
        def push_messages(self, messages):
            time.sleep(0.4)
            return super().push_messages(messages)

    grid = SlowPush({n: node("query.x") for n in range(3)})
    replies = collect_reply_list(grid, messages("query.x", range(3)), timeout=0.2)
    assert all(r is not None and not r.has_error() for r in replies)


def test_a_silent_probe_does_not_starve_the_other_nodes() -> None:
    handlers = {n: node("train", "query.x") for n in range(3)}
    handlers[0] = lambda _message: None  # never answers
    hooks = HookSupport("Demo", {})
    started = time.monotonic()
    replies = hooks.collect(FakeGrid(handlers), messages("query.x", range(3)), timeout=0.5)
    assert time.monotonic() - started < 1.5
    assert replies[0] is None and "query.x" not in hooks.present, "probed again next time"
    assert all(r is not None and not r.has_error() for r in replies[1:])


def test_a_partition_registry_asks_each_node_once_for_its_partition_id_and_nothing_else(
        caplog: pytest.LogCaptureFixture) -> None:
    awake = {"yes": False}

    def reporting(partition: int | None):
        def handle(message: Message) -> Message | None:
            assert message.metadata.message_type == "query.partition"
            if partition == 99 and not awake["yes"]:
                return None  # down: asked again on the next call
            values = {} if partition is None else {"partition-id": partition}
            return Message(RecordDict({"metrics": MetricRecord(values)}), reply_to=message)
        return handle

    # node ids 10..13 report partitions 3..0; node 14 has none in its node config
    handlers = {10 + i: reporting(3 - i) for i in range(4)}
    handlers |= {14: reporting(None), 15: reporting(99)}
    grid = FakeGrid(handlers)
    registry = NodeRegistry("Demo", timeout=0.5, fallback="ordered by node id",
                            asks="partition")
    with caplog.at_level(logging.WARNING, logger="flwr"):
        order = registry.reachable(grid, list(handlers))
    assert order == [13, 12, 11, 10, 14], "by partition id, the one without last, 15 out"
    assert registry.histograms == {} and registry.unreachable == {15}
    assert registry.partition_ids == {10: 3, 11: 2, 12: 1, 13: 0}
    assert "partition-id" in registry.without[14]
    assert any("ordered by node id" in r.getMessage() for r in caplog.records)
    awake["yes"] = True
    assert registry.reachable(grid, list(handlers)) == [13, 12, 11, 10, 15, 14]
    asked = [n for _, n, _, _ in grid.pushed]
    assert sorted(asked) == [10, 11, 12, 13, 14, 15, 15], "each asked once, 15 twice"
    restored = NodeRegistry("Demo", timeout=0.5, asks="partition")
    restored.restore_state(registry.checkpoint_state(), lambda n: n)
    assert restored.known_nodes() == registry.known_nodes()
    assert restored.order(list(handlers)) == [13, 12, 11, 10, 15, 14]


def test_a_registry_asks_only_histograms_or_partitions() -> None:
    with pytest.raises(ValueError, match="asks must be 'histogram' or 'partition'"):
        NodeRegistry("Demo", timeout=1, asks="sketch")


def test_polls_back_off_while_no_reply_comes_and_start_over_after_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(exchange_module.time, "sleep", slept.append)
    backoff = PollBackoff(0.02)
    for replied in (False, False, False, True, False, *[False] * 6):
        backoff.after(replied)
    assert slept == [0.02, 0.04, 0.08, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5]
    slow = PollBackoff(3.0)  # a first wait above the cap stays as it is
    slow.after(False)
    slow.after(False)
    assert slept[-2:] == [3.0, 3.0]
