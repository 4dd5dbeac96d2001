"""Our hooks on the nodes: learnt from at most one failed message per type and run."""

from __future__ import annotations

import logging
import time

import pytest
from flwr.app import Message, MetricRecord, RecordDict

from fakegrid import FakeGrid
from fedgsp_flwr.strategies.nodes import HookSupport, collect_reply_list, missing_handler


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


def test_a_missing_hook_costs_one_message_and_one_warning_per_run(
        caplog: pytest.LogCaptureFixture) -> None:
    grid = FakeGrid({n: node("train") for n in range(5)})
    hooks = HookSupport("Demo", {"query.x": "it does without"})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        replies = hooks.collect(grid, messages("query.x", range(5)), timeout=5)
        again = hooks.collect(grid, messages("query.x", range(5)), timeout=5)
    assert len(grid.pushed) == 1, "only the probe goes out"
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
    assert [t for _, _, t, _ in grid.pushed][0] == "query.x", "the probe goes first"
    assert hooks.has("query.x") and "query.x" in hooks.present


def test_nodes_without_the_hook_among_nodes_with_it_are_answered_one_by_one() -> None:
    grid = FakeGrid({0: node("train", "query.x"), 1: node("train"), 2: node("train", "query.x")})
    hooks = HookSupport("Demo", {})
    replies = hooks.collect(grid, messages("query.x", range(3)), timeout=5)
    assert [missing_handler(r) for r in replies] == [False, True, False]
    assert hooks.has("query.x"), "the probe answered: the type is there"


def test_replies_stay_aligned_when_the_grid_refuses_a_push() -> None:
    class Refusing(FakeGrid):
        def push_messages(self, messages):  # noqa: ANN001, ANN201 - Grid interface
            kept = [m for m in messages if m.metadata.dst_node_id != 1]  # node 1 left
            return super().push_messages(kept)

    grid = Refusing({n: node("train", "query.x") for n in range(3)})
    replies = collect_reply_list(grid, messages("query.x", range(3)), timeout=1)
    assert replies[1] is None
    assert [r.metadata.src_node_id for r in (replies[0], replies[2])] == [0, 2]


def test_a_silent_probe_does_not_starve_the_other_nodes() -> None:
    handlers = {n: node("train", "query.x") for n in range(3)}
    handlers[0] = lambda _message: None  # never answers
    hooks = HookSupport("Demo", {})
    started = time.monotonic()
    replies = hooks.collect(FakeGrid(handlers), messages("query.x", range(3)), timeout=0.5)
    assert time.monotonic() - started < 1.5
    assert replies[0] is None and "query.x" not in hooks.present, "probed again next time"
    assert all(r is not None and not r.has_error() for r in replies[1:])
