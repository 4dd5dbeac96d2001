"""Semi-FL as a Flower strategy, on an in-process grid of nodes with exact arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from helpers import run_rounds

from fedgsp_flwr.strategies.semifl import SemiFL, load_cluster_assignment

CLASSES = 3


def node_handler(partition: int, examples: int, cluster_id: int | None = None):
    """A node of class ``partition % 3``. Training maps w -> 10 w + (partition + 1), so a
    chain's result spells out the order its nodes trained in.
    """
    def handle(message: Message) -> Message:
        kind = message.metadata.message_type
        if kind == "query.histogram":
            hist = np.zeros(CLASSES, dtype=np.int64)
            hist[partition % CLASSES] = examples
            metrics = MetricRecord({"num-examples": examples, "partition-id": partition})
            if cluster_id is not None:
                metrics["cluster-id"] = cluster_id
            return Message(RecordDict({"histogram": ArrayRecord({"histogram": Array(hist)}),
                                       "metrics": metrics}), reply_to=message)
        w = message.content["arrays"]["w"].numpy()
        trained = ArrayRecord({"w": Array(w * 10 + (partition + 1))})
        metrics = MetricRecord({"num-examples": examples, "train-loss": 1.0})
        return Message(RecordDict({"arrays": trained, "metrics": metrics}), reply_to=message)

    return handle


def grid_of(partitions: list[int], examples: dict[int, int] | None = None,
            cluster_ids: dict[int, int] | None = None) -> FakeGrid:
    examples, cluster_ids = examples or {}, cluster_ids or {}
    # node ids are unrelated to partitions, as in Flower
    return FakeGrid({1000 + 37 * p: node_handler(p, examples.get(p, 10), cluster_ids.get(p))
                     for p in partitions})


def start(strategy: SemiFL, grid: FakeGrid, rounds: int = 1) -> ArrayRecord:
    return run_rounds(strategy, grid, ArrayRecord({"w": Array(np.zeros(1))}), rounds,
                      lr=0.1).arrays


def chains_of(grid: FakeGrid) -> dict[tuple[int, int], list[int]]:
    """(round, relay group) -> partitions of its hops, in the order they were sent."""
    out: dict[tuple[int, int], list[int]] = {}
    for _, node, kind, message in grid.pushed:
        if kind == "train":
            config = message.content["config"]
            out.setdefault((int(config["server-round"]), int(config["relay-group"])),
                           []).append((node - 1000) // 37)
    return out


def spelled(order: list[int]) -> float:
    """The model a chain of these partitions produces from w = 0."""
    w = 0.0
    for p in order:
        w = w * 10 + p + 1
    return w


def test_every_cluster_trains_in_sequence_and_uploads_one_model() -> None:
    grid = grid_of(list(range(6)))
    strategy = SemiFL(clusters="label-diverse", cluster_size=3, fraction_evaluate=0.0)
    result = start(strategy, grid)
    chains = list(chains_of(grid).values())
    assert sorted(p for c in chains for p in c) == list(range(6))
    assert all(sorted(p % CLASSES for p in c) == [0, 1, 2] for c in chains)  # diverse
    assert all(c == sorted(c) for c in chains)  # fixed order: by partition id
    # each hop starts from the previous hop's model: the chain's model spells its order
    assert result["w"].numpy()[0] == pytest.approx(np.mean([spelled(c) for c in chains]))
    round_1 = strategy.history[1]
    assert round_1["uploads"] == 2 and round_1["hops"] == 6
    assert round_1["label-coverage"] == 3 and round_1["cluster-sizes"] == [3, 3]
    hops = [m for _, _, kind, m in grid.pushed if kind == "train"]
    assert [int(m.content["config"]["relay-hop"]) for m in hops if
            int(m.content["config"]["relay-group"]) == 0] == [0, 1, 2]


def test_uniform_and_example_weighted_averages() -> None:
    examples = {0: 10, 1: 10, 2: 10, 3: 40, 4: 40, 5: 40}
    grids = [grid_of(list(range(6)), examples) for _ in range(2)]
    uniform = start(SemiFL(clusters="label-homogeneous", cluster_size=2, seed=0,
                           fraction_evaluate=0.0), grids[0])
    weighted = start(SemiFL(clusters="label-homogeneous", cluster_size=2, seed=0,
                            weighted_average=True, fraction_evaluate=0.0), grids[1])
    chains = list(chains_of(grids[0]).values())
    assert sorted(chains) == [[0, 3], [1, 4], [2, 5]]  # one class per cluster
    assert list(chains_of(grids[1]).values()) == chains
    models = np.array([spelled(c) for c in chains])
    assert uniform["w"].numpy()[0] == pytest.approx(models.mean())
    # every cluster holds 10 + 40 examples: example weights equal uniform weights here,
    # so make them differ: without partition 3, five nodes form clusters of 2, 2 and 1
    assert weighted["w"].numpy()[0] == pytest.approx(models.mean())
    uneven = grid_of(list(range(6)), examples)
    del uneven.handlers[1000 + 37 * 3]
    strategy = SemiFL(clusters="label-homogeneous", cluster_size=2, seed=0,
                      weighted_average=True, fraction_evaluate=0.0, train_timeout=0.5)
    result = start(strategy, uneven)
    chains = list(chains_of(uneven).values())
    weights = [sum(examples[p] for p in c) for c in chains]
    assert sorted(weights) == [10, 50, 50]
    expected = np.average([spelled(c) for c in chains], weights=weights)
    assert result["w"].numpy()[0] == pytest.approx(expected)


def test_fixed_order_stays_and_shuffled_order_changes_between_rounds() -> None:
    fixed_grid, shuffled_grid = grid_of(list(range(8))), grid_of(list(range(8)))
    start(SemiFL(clusters="random", cluster_size=8, seed=3, fraction_evaluate=0.0),
          fixed_grid, rounds=4)
    start(SemiFL(clusters="random", cluster_size=8, seed=3, shuffle_order=True,
                 fraction_evaluate=0.0), shuffled_grid, rounds=4)
    fixed = [chains_of(fixed_grid)[(r, 0)] for r in range(1, 5)]
    shuffled = [chains_of(shuffled_grid)[(r, 0)] for r in range(1, 5)]
    assert all(order == list(range(8)) for order in fixed)
    assert len({tuple(order) for order in shuffled}) > 1
    assert all(sorted(order) == list(range(8)) for order in shuffled)


def test_clusters_from_node_config_and_a_node_without_one() -> None:
    grid = grid_of(list(range(5)), cluster_ids={0: 7, 1: 2, 2: 7, 3: 2})
    strategy = SemiFL(clusters="node-config", fraction_evaluate=0.0)
    start(strategy, grid)
    # partition 4 states no cluster: it joins the smallest (a tie: the lower id, 2)
    assert sorted(chains_of(grid).values()) == [[0, 2], [1, 3, 4]]
    assert strategy.history[1]["uploads"] == 2


def test_clusters_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "clusters.csv"
    path.write_text("partition-id,cluster-id\n0,1\n1,0\n2,1\n3,0\n")
    strategy = SemiFL(clusters="file", assignment=load_cluster_assignment(path),
                      fraction_evaluate=0.0)
    grid = grid_of(list(range(4)))
    start(strategy, grid)
    assert sorted(chains_of(grid).values()) == [[0, 2], [1, 3]]
    json_path = tmp_path / "clusters.json"
    json_path.write_text(json.dumps({"0": 1, "1": 0}))
    assert load_cluster_assignment(json_path) == {0: 1, 1: 0}


def test_bad_cluster_files_and_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="cluster file .*header"):
        bad = Path("/tmp/semifl-bad.csv")
        bad.write_text("partition,cluster\n0,1\n")
        load_cluster_assignment(bad)
    with pytest.raises(ValueError, match="cluster file .*json or .csv"):
        load_cluster_assignment("/tmp/clusters.txt")
    with pytest.raises(ValueError, match="SemiFL: clusters must be one of"):
        SemiFL(clusters="by-size")
    with pytest.raises(ValueError, match="needs an assignment"):
        SemiFL(clusters="file")
    with pytest.raises(ValueError, match="cluster_size"):
        SemiFL(cluster_size=0)


def test_a_late_node_joins_the_smallest_cluster_and_gone_nodes_are_left_out() -> None:
    grid = grid_of(list(range(5)))
    strategy = SemiFL(clusters="label-diverse", cluster_size=3, fraction_evaluate=0.0)
    start(strategy, grid)
    first = sorted(chains_of(grid).values())
    assert sorted(len(c) for c in first) == [2, 3]
    late = 1000 + 37 * 5
    grid.handlers[late] = node_handler(5, 10)
    del grid.handlers[1000]  # partition 0 leaves
    grid.pushed.clear()
    start(strategy, grid)
    second = sorted(chains_of(grid).values())
    assert all(0 not in c for c in second) and any(5 in c for c in second)
    assert strategy.history[1]["cluster-sizes"] == [3, 3]


def test_nodes_without_histograms_fill_clusters_of_the_configured_size() -> None:
    def plain(partition: int):  # an existing ClientApp: no query.histogram handler
        inner = node_handler(partition, 10)

        def handle(message: Message) -> Message:
            if message.metadata.message_type == "query.histogram":
                raise RuntimeError("no handler for query.histogram")
            return inner(message)
        return handle

    grid = FakeGrid({1000 + 37 * p: plain(p) for p in range(7)})
    strategy = SemiFL(clusters="label-diverse", cluster_size=3, fraction_evaluate=0.0)
    start(strategy, grid)
    assert strategy.history[1]["cluster-sizes"] == [3, 3, 1]
    assert strategy.history[1]["uploads"] == 3


def test_defaults_are_the_papers_c3_clusters_of_ten_fixed_order_uniform_average() -> None:
    strategy = SemiFL()
    assert (strategy.source, strategy.cluster_size, strategy.shuffle_order) == ("c3", 10, False)
    assert strategy.weighted_average is False
