"""The FedAvg family samples partitions, not node ids: a seed draws the same clients in
every launch although the engine gives the nodes new ids each time."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import numpy as np
import pytest
from fakegrid import FakeGrid, partition_node
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from helpers import run_rounds

from fedgsp_flwr.strategies import IDA, FedAdam, FedAvg, FedProx
from fedgsp_flwr.strategies.state import StrategyState

PARTITIONS = 12
INITIAL = ArrayRecord({"w": Array(np.zeros(3, np.float32))})


def launch(node_ids: list[int], seen: list[tuple[str, int]],
           answers_partition: bool = True) -> FakeGrid:
    """A federation of partitions 0..11 whose nodes have ``node_ids`` (node i holds
    partition i); every training and evaluation message is noted as (type, partition).
    """
    def node(partition: int) -> Callable[[Message], Message]:
        def handle(message: Message) -> Message:
            kind = message.metadata.message_type
            seen.append((kind, partition))
            if kind == "query.partition":  # a plain app has no such handler
                raise ValueError("No query function registered with name 'partition'")
            metrics: dict[str, float] = {"num-examples": 10 + partition, "loss": 1.0}
            content = RecordDict({"metrics": MetricRecord(metrics)})
            if kind == "train":
                w = message.content["arrays"]["w"].numpy() + np.float32(partition)
                content["arrays"] = ArrayRecord({"w": Array(w)})
            return Message(content, reply_to=message)
        return partition_node(partition, handle) if answers_partition else handle

    # Listed by node id, as a SuperLink may list them: another order in each launch.
    return FakeGrid({n: node(p) for n, p in sorted((n, p) for p, n in enumerate(node_ids))})


def sampled(make: Callable[[], FedAvg], node_ids: list[int], seed: int = 3,
            answers_partition: bool = True) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    random.seed(seed)  # the ServerApp seeds Python's random, which Flower samples with
    run_rounds(make(), launch(node_ids, seen, answers_partition), INITIAL, 4)
    return [entry for entry in seen if entry[0] != "query.partition"]


FIRST = [1000 + 7 * p for p in range(PARTITIONS)]
# Another launch: other ids, in another order than the partitions'.
SECOND = [90_000 - 13 * p for p in range(PARTITIONS)]


@pytest.mark.parametrize("make", [
    lambda: FedAvg(fraction_train=0.25, fraction_evaluate=0.5),
    lambda: FedProx(proximal_mu=0.1, fraction_train=0.25, fraction_evaluate=0.5),
    lambda: FedAdam(fraction_train=0.25, fraction_evaluate=0.5),
    lambda: IDA(fraction_train=0.25, fraction_evaluate=0.5),
], ids=["fedavg", "fedprox", "fedadam", "ida"])
def test_a_seed_samples_the_same_partitions_whatever_the_node_ids(
        make: Callable[[], FedAvg]) -> None:
    first = sampled(make, FIRST)
    assert len([k for k, _ in first if k == "train"]) == 4 * 3  # 25% of 12, 4 rounds
    assert sampled(make, SECOND) == first
    assert sampled(make, SECOND, seed=4) != first  # the seed still matters


def test_each_node_is_asked_its_partition_once_per_run() -> None:
    grid = launch(FIRST, [])
    strategy = FedAvg(fraction_train=0.5)
    run_rounds(strategy, grid, INITIAL, 3)
    asked = sorted(n for _, n, kind, _ in grid.pushed if kind == "query.partition")
    assert asked == FIRST
    assert strategy.node_partitions() == {n: p for p, n in enumerate(FIRST)}


def test_a_plain_app_is_sampled_as_flower_does_after_two_probes_and_one_info_line(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, int]] = []
    random.seed(3)
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_rounds(FedAvg(fraction_train=0.25), launch(FIRST, seen, False), INITIAL, 2)
    assert [kind for kind, _ in seen].count("query.partition") == 2
    lines = [r for r in caplog.records if "no 'query.partition' handler" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "node-id order" in lines[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # Flower's order is the node ids' (here the partitions'): same draw as with answers.
    assert sampled(lambda: FedAvg(fraction_train=0.25), FIRST, answers_partition=False) == (
        sampled(lambda: FedAvg(fraction_train=0.25), FIRST))


def test_nodes_without_a_partition_id_are_sampled_by_node_id_with_an_info_line(
        caplog: pytest.LogCaptureFixture) -> None:
    def no_partition(message: Message) -> Message:  # our hooks, no partition-id config
        if message.metadata.message_type == "query.partition":
            return Message(RecordDict({"metrics": MetricRecord({})}), reply_to=message)
        content = RecordDict({"metrics": MetricRecord({"num-examples": 5})})
        if message.metadata.message_type == "train":
            content["arrays"] = message.content["arrays"]
        return Message(content, reply_to=message)

    grid = FakeGrid({n: no_partition for n in (30, 10, 20)})
    strategy = FedAvg(fraction_evaluate=0.0)
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_rounds(strategy, grid, INITIAL, 2)
    assert [kind for _, _, kind, _ in grid.pushed].count("query.partition") == 3
    lines = [r for r in caplog.records if "without a usable query.partition" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert strategy.known.order([30, 10, 20]) == [10, 20, 30]
    assert strategy.history[2]["train-replies"] == 3


def test_a_checkpoint_without_the_nodes_state_is_still_taken() -> None:
    strategy = FedAvg()
    strategy.restore_state(StrategyState(), lambda node: node)  # an older checkpoint
    assert strategy.node_partitions() == {}
    saved = FedAvg()
    saved.known.partition_ids = {5: 0, 6: 1}
    strategy.restore_state(saved.checkpoint_state(), {5: 50, 6: 60}.__getitem__)
    assert strategy.node_partitions() == {50: 0, 60: 1}
