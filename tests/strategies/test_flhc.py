"""FL+HC as a Flower strategy, on an in-process grid of nodes whose updates are known.

A node of latent group g holds the target t_i = t_g + a small node offset; local
training moves ``head`` half-way to it: dW_i = 0.5 (t_i - W). Four groups at
(+-4, +-1.5): from any W the updates of one group lie within about 0.1 of each other
and 1.5 or more from the others', so a threshold of 1 finds the four groups.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from fakegrid import FakeGrid, partition_node
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from helpers import run_rounds

from fedgsp_flwr.strategies.flhc import FLHC

STEP = 0.5
CORNERS = [(4.0, 1.5), (4.0, -1.5), (-4.0, 1.5), (-4.0, -1.5)]
PARTITIONS = list(range(12))


def target(partition: int) -> np.ndarray:
    x, y = CORNERS[partition % 4]
    return np.array([x, y]) + np.random.default_rng(partition).normal(scale=0.05, size=2)


def examples(partition: int) -> int:
    return 10 + partition


def node_handler(partition: int):  # type: ignore[no-untyped-def]
    goal = target(partition)

    def handle(message: Message) -> Message:
        head = message.content["arrays"]["head"].numpy().astype(np.float64)
        if message.metadata.message_type == "evaluate":
            metrics = MetricRecord({"num-examples": 5,
                                    "eval-gap": float(np.linalg.norm(head - goal))})
            return Message(RecordDict({"metrics": metrics}), reply_to=message)
        trained = (head + STEP * (goal - head)).astype(np.float32)
        arrays = ArrayRecord({"head": Array(trained)})
        metrics = MetricRecord({"train-loss": 0.5, "num-examples": examples(partition)})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=message)

    return partition_node(partition, handle)


def node_id(partition: int) -> int:
    return 9000 + 7 * partition


def grid_of(partitions: list[int]) -> FakeGrid:
    return FakeGrid({node_id(p): node_handler(p) for p in partitions})


def initial() -> ArrayRecord:
    return ArrayRecord({"head": Array(np.zeros(2, np.float32))})


def flhc(**kwargs: object) -> FLHC:
    settings: dict = {"warmup_rounds": 2, "threshold": 1.0, "seed": 0, "fraction_train": 1.0,
                      "fraction_evaluate": 0.0,
                      "ground_truth": {p: p % 4 for p in PARTITIONS}}
    settings.update(kwargs)
    return FLHC(**settings)


def fedavg_rounds(partitions: list[int], rounds: int) -> np.ndarray:
    """The global model after ``rounds`` FedAvg rounds, in float64."""
    goals = np.stack([target(p) for p in partitions])
    w = np.array([examples(p) for p in partitions], dtype=np.float64)
    model = np.zeros(2)
    for _ in range(rounds):
        model = model + (w / w.sum()) @ (STEP * (goals - model))
    return model


def sent(grid: FakeGrid, kind: str = "train") -> dict[int, list[list[float]]]:
    """The heads pushed to each node, by node."""
    out: dict[int, list[list[float]]] = {}
    for _, node, k, message in grid.pushed:
        if k == kind:
            out.setdefault(node, []).append(message.content["arrays"]["head"].numpy().tolist())
    return out


def test_warm_up_rounds_are_fedavg_then_the_updates_cluster_into_the_planted_groups() -> None:
    strategy, grid = flhc(), grid_of(PARTITIONS)
    result = run_rounds(strategy, grid, initial(), 2)
    assert not strategy.models and strategy.history[2]["clusters"] == 1
    assert result.arrays["head"].numpy() == pytest.approx(fedavg_rounds(PARTITIONS, 2),
                                                           abs=1e-5)
    grid.pushed.clear()
    run_rounds(strategy, grid, result.arrays, 8)  # its round 1 is the run's third
    assert all(heads == [pytest.approx(fedavg_rounds(PARTITIONS, 2), abs=1e-5)]
               for heads in [h[:1] for h in sent(grid).values()])
    entry = strategy.history[1]
    assert entry["clusters"] == 4 and entry["clustered-at"] == 1
    assert entry["ari"] == 1.0 and entry["cluster-sizes"] == [3, 3, 3, 3]
    for group in strategy.group_models().values():
        partitions = sorted(group.partition_ids.values())
        assert len({p % 4 for p in partitions}) == 1 and len(partitions) == 3
        goal = np.average([target(p) for p in partitions], axis=0,
                          weights=[examples(p) for p in partitions])
        # each cluster is its own federation: half-way to its members' mean each round
        assert np.linalg.norm(group.arrays["head"].numpy() - goal) < 0.02


def test_each_cluster_trains_its_own_model_from_the_clustering_round() -> None:
    strategy, grid = flhc(warmup_rounds=0), grid_of(PARTITIONS)
    run_rounds(strategy, grid, initial(), 1)
    assert strategy.history[1]["clustered-at"] == 1
    grid.pushed.clear()
    run_rounds(strategy, grid, initial(), 1)
    heads = sent(grid)
    by_cluster: dict[int, list[int]] = {}
    for node, cluster in strategy.cluster_of.items():
        by_cluster.setdefault(cluster, []).append(node)
    for nodes in by_cluster.values():
        models = {tuple(heads[n][0]) for n in nodes}
        assert len(models) == 1  # every member trains its cluster's one model
        # ... which the clustering round made the members' weighted mean trained model
        parts = [strategy.known.partition_ids[n] for n in nodes]
        w = np.array([examples(p) for p in parts], dtype=np.float64)
        mean = (w / w.sum()) @ np.stack([STEP * target(p) for p in parts])
        assert np.array(next(iter(models))) == pytest.approx(mean, abs=1e-5)


@pytest.mark.parametrize("threshold, clusters, says", [(50.0, 1, "merged every update"),
                                                       (1e-4, 12, "merged no updates")])
def test_a_threshold_that_merges_all_or_nothing_warns_with_the_merge_heights(
        threshold: float, clusters: int, says: str, caplog: pytest.LogCaptureFixture) -> None:
    strategy = flhc(threshold=threshold, warmup_rounds=0)
    with caplog.at_level(logging.WARNING):
        run_rounds(strategy, grid_of(PARTITIONS), initial(), 1)
    assert strategy.history[1]["clusters"] == clusters
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "FL+HC" in r.getMessage()]
    assert len(warned) == 1 and says in warned[0] and "flhc-threshold" in warned[0]


def test_a_node_first_seen_after_the_clustering_joins_the_nearest_cluster() -> None:
    strategy = flhc(warmup_rounds=0)
    early = PARTITIONS[:8]  # groups 0-3 twice
    run_rounds(strategy, grid_of(early), initial(), 1)
    models = {c: m["head"].copy() for c, m in strategy.models.items()}
    late = grid_of(PARTITIONS)
    run_rounds(strategy, late, initial(), 1)
    entry = strategy.history[1]
    assert entry["placements"] == 4 and entry["unplaced-clients"] == 0
    assert entry["ari"] == 1.0
    anchor = strategy.anchor["head"].tolist()  # W of the clustering round
    for p in PARTITIONS[8:]:
        assert sent(late)[node_id(p)] == [pytest.approx(anchor)]
    for c, before in models.items():  # placement trainings enter no model
        members = [n for n, k in strategy.cluster_of.items() if k == c
                   and strategy.known.partition_ids[n] < 8]
        parts = [strategy.known.partition_ids[n] for n in members]
        w = np.array([examples(p) for p in parts], dtype=np.float64)
        expected = before + (w / w.sum()) @ np.stack([STEP * (target(p) - before)
                                                      for p in parts])
        assert strategy.models[c]["head"] == pytest.approx(expected, abs=1e-5)


def test_evaluation_scores_each_node_with_its_clusters_model() -> None:
    strategy, grid = flhc(warmup_rounds=1, fraction_evaluate=1.0), grid_of(PARTITIONS)
    run_rounds(strategy, grid, initial(), 3)
    assert strategy.history[3]["eval-unplaced"] == 0
    grid.pushed.clear()
    run_rounds(strategy, grid, initial(), 1)
    evaluated = sent(grid, "evaluate")
    assert len(evaluated) == 12
    for node, heads in evaluated.items():
        assert heads == [pytest.approx(strategy.models[strategy.cluster_of[node]]["head"])]
    for group in strategy.group_models().values():  # each cluster's own score
        head = group.arrays["head"].numpy().astype(np.float64)
        gaps = [np.linalg.norm(head - target(p)) for p in group.partition_ids.values()]
        assert group.metrics["eval-gap"] == pytest.approx(np.mean(gaps), rel=1e-5)


def test_a_run_that_ends_before_its_clustering_round_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    strategy = flhc(warmup_rounds=3)
    with caplog.at_level(logging.WARNING):
        run_rounds(strategy, grid_of(PARTITIONS), initial(), 2)
        run_rounds(strategy, grid_of(PARTITIONS), initial(), 2)  # rounds 3-4: it clusters
    warned = [r.getMessage() for r in caplog.records if "clustering round" in r.getMessage()]
    assert warned == [("FL+HC: 2 round(s) to run and 3 warm-up round(s): the run ends before "
                       "its clustering round, so it is FedAvg; set warmup_rounds (run config "
                       "flhc-warmup-rounds) below 2")]
    assert strategy.history[2]["clustered-at"] == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"metric": "cosine"}, "FLHC: linkage 'ward' needs metric 'euclidean'"),
    ({"threshold": 0.0}, "threshold"), ({"linkage": "median"}, "linkage")])
def test_bad_settings_name_the_parameter(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        flhc(**kwargs)
