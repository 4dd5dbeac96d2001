"""CFL as a Flower strategy, on an in-process grid of nodes whose updates are known.

A node of latent group g holds the target t_i = t_g + a small node offset; local
training moves ``head`` half-way to it: dW_i = 0.5 (t_i - W). The federation's mean
update vanishes at the weighted mean of the targets while every node's update there
points to its own group: the stationary point CFL splits at. Four groups at
(+-4, +-1.5) (plus a shared shift) split first by the sign of x, then by the sign of y.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import operator
from collections.abc import Callable

import numpy as np
import pytest
from fakegrid import FakeGrid, partition_node
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from helpers import run_rounds

from fedgsp_flwr.strategies.cfl import CFL, ROOT
from fedgsp_flwr.strategies.state import StrategyState

STEP = 0.5
SHIFT = np.array([0.0, 0.0, 10.0])
CORNERS = {4: [(4.0, 1.5), (4.0, -1.5), (-4.0, 1.5), (-4.0, -1.5)],
           2: [(4.0, 0.0), (-4.0, 0.0)]}


def target(partition: int, groups: int = 4) -> np.ndarray:
    x, y = CORNERS[groups][partition % groups]
    offset = np.random.default_rng(partition).normal(scale=0.05, size=3)
    return SHIFT + np.array([x, y, 0.0]) + offset


def examples(partition: int) -> int:
    return 10 + partition


def node_handler(partition: int, groups: int = 4, metric: str = "train-loss",
                 bad: str | None = None) -> Callable[[Message], Message]:
    goal = target(partition, groups)

    def handle(message: Message) -> Message:
        kind = message.metadata.message_type
        head = message.content["arrays"]["head"].numpy().astype(np.float64)
        if kind == "evaluate":
            metrics = MetricRecord({"num-examples": 5,
                                    "eval-gap": float(np.linalg.norm(head - goal))})
            return Message(RecordDict({"metrics": metrics}), reply_to=message)
        if bad == "error":
            raise RuntimeError("disk full")
        trained = (head + STEP * (goal - head)).astype(np.float32)
        bias = message.content["arrays"]["bias"].numpy()
        if bad == "nan":
            trained[0] = np.nan
        if bad == "shape":
            trained = np.zeros(4, np.float32)
        arrays = ArrayRecord({"head": Array(trained), "bias": Array(bias.copy())})
        metrics: dict = {metric: 0.5, "num-examples": examples(partition)}
        if bad == "weight":
            del metrics["num-examples"]
        return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}),
                       reply_to=message)

    return partition_node(partition, handle)


def node_id(partition: int) -> int:
    return 7000 + 13 * partition


def grid_of(partitions: list[int], groups: int = 4) -> FakeGrid:
    return FakeGrid({node_id(p): node_handler(p, groups) for p in partitions})


def initial() -> ArrayRecord:
    return ArrayRecord({"head": Array(np.zeros(3, np.float32)),
                        "bias": Array(np.zeros(2, np.float32))})


def truth(partitions: list[int], groups: int = 4) -> dict[int, int]:
    return {p: p % groups for p in partitions}


def cfl(**kwargs: object) -> CFL:
    settings: dict = {"eps1": 0.1, "eps2": 0.5, "warmup_rounds": 0, "seed": 0,
                      "fraction_train": 1.0, "fraction_evaluate": 0.0}
    settings.update(kwargs)
    return CFL(**settings)


def start(strategy: CFL, grid: FakeGrid, rounds: int) -> object:
    return run_rounds(strategy, grid, initial(), rounds)


def simulate_root(partitions: list[int], rounds: int, groups: int = 4
                  ) -> list[tuple[float, float]]:
    """(mean norm, max norm) of one cluster of every node, round by round, in float64."""
    goals = np.stack([target(p, groups) for p in partitions])
    w = np.array([examples(p) for p in partitions], dtype=np.float64)
    w /= w.sum()
    model, out = np.zeros(3), []
    for _ in range(rounds):
        updates = STEP * (goals - model)
        out.append((float(np.linalg.norm(w @ updates)),
                    float(np.linalg.norm(updates, axis=1).max())))
        model = model + w @ updates
    return out


def head_of(strategy: CFL, leaf: int) -> np.ndarray:
    return strategy.leaves[leaf]["head"].astype(np.float64)


def sent_heads(grid: FakeGrid, kind: str = "train") -> dict[int, list[list[float]]]:
    out: dict[int, list[list[float]]] = {}
    for _, node, k, message in grid.pushed:
        if k == kind:
            out.setdefault(node, []).append(message.content["arrays"]["head"].numpy().tolist())
    return out


PARTITIONS = list(range(12))


@pytest.mark.parametrize("eps1, eps2, warmup, expected", [
    (0.1, 0.5, 0, 7),  # mean norm 5 / 2^(r-1) first below 0.1 in round 7
    (0.01, 0.5, 0, 10),  # ... below 0.01 in round 10
    (0.1, 3.0, 0, None),  # max norm about 2.1 never exceeds 3
    (0.1, 0.5, 8, 9),  # both hold from round 7; the warm-up ends after round 8
])
def test_a_cluster_splits_in_the_first_round_its_conditions_hold(
        eps1: float, eps2: float, warmup: int, expected: int | None) -> None:
    rounds = 11
    norms = simulate_root(PARTITIONS, rounds)
    holds = [r for r, (mean, max_) in enumerate(norms, 1)
             if mean < eps1 and max_ > eps2 and r > warmup]
    assert (holds[0] if holds else None) == expected  # the hand-worked rounds
    assert any(mean < eps1 for mean, _ in norms)  # stationary in every case
    strategy = cfl(eps1=eps1, eps2=eps2, warmup_rounds=warmup)
    start(strategy, grid_of(PARTITIONS), rounds)
    last = expected or rounds
    for r in range(1, last + 1):
        entry = strategy.history[r]
        assert entry["norm-clusters"] == [ROOT]
        assert entry["mean-norms"][0] == pytest.approx(norms[r - 1][0], rel=1e-3, abs=1e-6)
        assert entry["max-norms"][0] == pytest.approx(norms[r - 1][1], rel=1e-3)
        assert entry["splits"] == (1 if r == expected else 0)
        assert entry["clusters"] == (2 if r == expected else 1)
    if expected is not None:
        assert strategy.splits[ROOT].server_round == expected
        sides = [strategy.members(c) for c in strategy.splits[ROOT].children]
        assert sorted(sorted(p % 4 for p in (n for n in side)) for side in [
            [strategy.known.partition_ids[n] for n in s] for s in sides]) == [
            [0] * 3 + [1] * 3, [2] * 3 + [3] * 3]  # by the sign of x first
        assert len(strategy.history[expected]["split-alpha-cross"]) == 1
    else:
        assert not strategy.splits and strategy.history[rounds]["clusters"] == 1


def test_too_small_a_cluster_never_splits() -> None:
    strategy = cfl(min_split_size=13)  # 12 nodes
    start(strategy, grid_of(PARTITIONS), 9)
    assert strategy.history[9]["mean-norms"][0] < 0.1
    assert strategy.history[9]["max-norms"][0] > 0.5
    assert not strategy.splits and sum(strategy.history[r]["splits"] for r in range(1, 10)) == 0


@pytest.mark.parametrize("linkage", ["complete", "optimal"])
def test_recursive_splits_recover_four_planted_groups(linkage: str) -> None:
    strategy = cfl(linkage=linkage, ground_truth=truth(PARTITIONS), fraction_evaluate=1.0)
    grid = grid_of(PARTITIONS)
    start(strategy, grid, 16)
    splits = {r: strategy.history[r]["splits"] for r in range(1, 17) if
              strategy.history[r]["splits"]}
    assert splits[7] == 1 and sum(splits.values()) == 3 and min(splits) == 7
    assert max(splits) > 7  # the parts split again, in later rounds
    last = strategy.history[16]
    assert last["clusters"] == 4 and last["cluster-sizes"] == [3, 3, 3, 3]
    assert last["ari"] == 1.0 and last["nmi"] == pytest.approx(1.0)
    assert last["unplaced-clients"] == 0 and last["placed-clients"] == 12
    for leaf, group in strategy.group_models().items():
        partitions = sorted(group.partition_ids.values())
        assert len({p % 4 for p in partitions}) == 1
        goal = np.average([target(p) for p in partitions], axis=0,
                          weights=[examples(p) for p in partitions])
        assert np.linalg.norm(head_of(strategy, leaf) - goal) < 0.05
        assert group.metrics["eval-gap"] < 0.1
    # Evaluation: every node gets its own cluster's model.
    grid.pushed.clear()
    start(strategy, grid, 1)
    for node, heads in sent_heads(grid, "evaluate").items():
        leaf = strategy.position[node]
        assert heads == [pytest.approx(strategy.leaves[leaf]["head"].tolist())]
    assert strategy.history[1]["eval-unplaced"] == 0


def test_a_cluster_model_moves_by_the_weighted_mean_update_by_hand() -> None:
    partitions = [0, 1, 2]
    strategy = cfl(warmup_rounds=100)
    start(strategy, grid_of(partitions), 1)
    w = np.array([10.0, 11.0, 12.0])
    updates = np.stack([STEP * target(p) for p in partitions])  # from the zero model
    np.testing.assert_allclose(head_of(strategy, ROOT), (w @ updates) / w.sum(), rtol=1e-6)
    assert strategy.leaves[ROOT]["head"].dtype == np.float32
    assert strategy.leaves[ROOT]["bias"].tolist() == [0.0, 0.0]


def test_each_part_of_a_split_moves_by_its_own_members_mean_update() -> None:
    strategy = cfl()
    start(strategy, grid_of(PARTITIONS), 7)
    split = strategy.splits[ROOT]
    base = split.model["head"].astype(np.float64)
    for child, direction in zip(split.children, split.directions, strict=True):
        partitions = [strategy.known.partition_ids[n] for n in strategy.members(child)]
        w = np.array([examples(p) for p in partitions], dtype=np.float64)
        trained = np.stack([(base + STEP * (target(p) - base)).astype(np.float32)
                            for p in partitions]).astype(np.float64)
        mean = w @ (trained - base) / w.sum()
        np.testing.assert_allclose(head_of(strategy, child), base + mean, rtol=1e-6)
        np.testing.assert_allclose(direction[:3], mean, rtol=1e-5)


def test_bad_replies_reach_no_cluster_model_and_no_similarity() -> None:
    bad = {100: "nan", 101: "shape", 102: "weight", 103: "error"}
    grid = grid_of(PARTITIONS)
    for partition, kind in bad.items():
        grid.handlers[node_id(partition)] = node_handler(partition, bad=kind)
    # A node naming its metric differently is not rejected.
    grid.handlers[node_id(5)] = node_handler(5, metric="my_loss")
    clean = grid_of(PARTITIONS)
    clean.handlers[node_id(5)] = node_handler(5, metric="my_loss")
    noisy_run, clean_run = cfl(split_quorum=0.75), cfl(split_quorum=0.75)
    logger = logging.getLogger("flwr")
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING and "rejected reply" in record.getMessage():
                lines.append(record.getMessage())

    handler = Collect()
    logger.addHandler(handler)
    try:
        start(noisy_run, grid, 12)
    finally:
        logger.removeHandler(handler)
    start(clean_run, clean, 12)
    assert sorted(noisy_run.leaves) == sorted(clean_run.leaves) == [3, 4, 5, 6]
    for leaf in clean_run.leaves:
        for key in ("head", "bias"):
            np.testing.assert_array_equal(noisy_run.leaves[leaf][key],
                                          clean_run.leaves[leaf][key])
    for r in range(1, 13):
        assert noisy_run.history[r]["train-rejected"] == 4
        assert clean_run.history[r]["train-rejected"] == 0
        assert noisy_run.history[r]["splits"] == clean_run.history[r]["splits"]
    assert len(lines) == 4 * 12  # one line per rejected reply
    for p in bad:  # each names the node and its partition
        assert sum(f"node {node_id(p)} (partition {p}):" in line for line in lines) == 12
        node = node_id(p)
        assert node not in noisy_run.position or noisy_run.position[node] in noisy_run.splits
    assert any("has NaN" in line for line in lines)
    assert any("'num-examples' is missing" in line for line in lines)
    assert any("disk full" in line for line in lines)
    assert "my_loss" in noisy_run.history[12]


def serialised(state: StrategyState) -> StrategyState:
    """The state through JSON and npz, as a checkpoint file holds it."""
    buffer = io.BytesIO()
    np.savez(buffer, **state.arrays)  # type: ignore[arg-type]
    buffer.seek(0)
    with np.load(buffer) as arrays:
        return StrategyState(json.loads(json.dumps(state.meta)), dict(arrays))


DONE = 5


def test_a_checkpoint_round_trip_gives_the_same_next_rounds() -> None:
    grids = [grid_of(PARTITIONS), grid_of(PARTITIONS)]
    settings = {"ground_truth": truth(PARTITIONS), "fraction_train": 0.95,
                "split_quorum": 0.9, "eps1": 0.5}
    original = cfl(**settings)
    start(original, grids[0], DONE)
    assert original.splits and len(original.leaves) == 2  # the root split
    assert any(t in original.splits for t in original.position.values())  # one to place
    resumed = cfl(**settings)
    resumed.restore_state(serialised(original.checkpoint_state()), lambda n: n)
    assert resumed.position == original.position
    assert resumed.known.partition_ids == original.known.partition_ids
    for strategy, grid in zip((original, resumed), grids, strict=True):
        grid.pushed.clear()
        strategy.resumed_after = DONE
        strategy.start(grid, initial(), num_rounds=5, timeout=30, train_config=ConfigRecord({}))
    assert [(n, k) for _, n, k, _ in grids[0].pushed] == [
        (n, k) for _, n, k, _ in grids[1].pushed]
    assert sent_heads(grids[0]) == sent_heads(grids[1])
    assert original.position == resumed.position
    assert sorted(original.leaves) == sorted(resumed.leaves)
    for leaf, model in original.leaves.items():
        for key, value in model.items():
            np.testing.assert_array_equal(resumed.leaves[leaf][key], value)
    for r in range(DONE + 1, DONE + 6):
        assert original.history[r] | {"train-time": 0} == resumed.history[r] | {
            "train-time": 0}
    assert sum(original.history[r]["splits"] for r in range(DONE + 1, DONE + 6)) == 2
    assert original.history[DONE + 5]["ari"] == 1.0


def test_without_full_participation_a_cluster_is_not_split(
        caplog: pytest.LogCaptureFixture) -> None:
    strategy = cfl(fraction_train=0.5, eps1=2.0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start(strategy, grid_of(PARTITIONS), 12)
    warnings = [r.getMessage() for r in caplog.records if "CFL assumes" in r.getMessage()]
    assert len(warnings) == 1 and "fraction_train=0.5" in warnings[0]
    assert not strategy.splits
    assert any(h["mean-norms"][0] < 2.0 and h["max-norms"][0] > 0.5
               for h in strategy.history.values())  # the norms alone would split
    assert all(strategy.history[r]["quorum-missed"] == 1 for r in range(1, 13))
    assert all(strategy.history[r]["sampled"] == 6 for r in range(1, 13))


def test_with_a_quorum_sampled_clusters_split_and_missing_members_are_placed() -> None:
    strategy = cfl(fraction_train=0.95, split_quorum=0.9, eps1=0.5,
                   ground_truth=truth(PARTITIONS))
    start(strategy, grid_of(PARTITIONS), 20)
    history = [strategy.history[r] for r in range(1, 21)]
    assert all(h["sampled"] == 11 for h in history)
    assert sum(h["splits"] for h in history) == 3
    assert sum(h["placements"] for h in history) >= 1  # a member missed a split
    assert sum(h["placement-fits"] for h in history) >= 1
    assert history[-1]["ari"] == 1.0 and history[-1]["clusters"] == 4


def test_a_node_silent_in_the_split_round_is_placed_when_it_is_back() -> None:
    silent, away = node_id(2), {"off": False}
    grid = grid_of(PARTITIONS)
    answer = grid.handlers[silent]

    def gone_while(message: Message) -> Message | None:
        return None if away["off"] else answer(message)

    grid.handlers[silent] = gone_while
    strategy = cfl(train_timeout=0.2, query_timeout=0.2, ground_truth=truth(PARTITIONS))
    start(strategy, grid, 4)
    assert strategy.position[silent] == ROOT
    away["off"] = True
    start(strategy, grid, 5)  # rounds 1-5 of a second run: counts from 1 again
    # its reply is missing once, then it sits out (unreachable): the others split
    assert strategy.history[1]["train-rejected"] == 1
    assert sum(strategy.history[r]["splits"] for r in range(1, 6)) == 1
    assert strategy.position[silent] == ROOT and ROOT in strategy.splits
    split = strategy.splits[ROOT]
    before = {leaf: {k: v.copy() for k, v in model.items()}
              for leaf, model in strategy.leaves.items()}
    away["off"] = False
    grid.pushed.clear()
    start(strategy, grid, 1)
    to_silent = [(k, m) for _, n, k, m in grid.pushed if n == silent]
    assert [k for k, _ in to_silent] == ["query.partition", "train"]
    np.testing.assert_array_equal(to_silent[1][1].content["arrays"]["head"].numpy(),
                                  split.model["head"])
    assert strategy.history[1]["placements"] == 1
    assert strategy.history[1]["placement-fits"] == 1
    leaf = strategy.position[silent]
    assert leaf in split.children and leaf == strategy.position[node_id(6)]  # its group
    # its placement fit entered no cluster model: each moved with its members only
    for child in split.children:
        base = before[child]["head"].astype(np.float64)
        partitions = [strategy.known.partition_ids[n] for n in strategy.members(child)
                      if n != silent]
        w = np.array([examples(p) for p in partitions], dtype=np.float64)
        trained = np.stack([(base + STEP * (target(p) - base)).astype(np.float32)
                            for p in partitions]).astype(np.float64)
        np.testing.assert_allclose(head_of(strategy, child),
                                   base + w @ (trained - base) / w.sum(), rtol=1e-6)


def test_late_nodes_descend_the_tree_to_their_groups_cluster() -> None:
    early, late = PARTITIONS, [12, 13, 14, 15]
    grid, twin = grid_of(early), grid_of(early)
    strategy = cfl(ground_truth=truth(early + late), fraction_evaluate=1.0)
    alone = cfl(ground_truth=truth(early + late), fraction_evaluate=1.0)
    start(strategy, grid, 16)
    start(alone, twin, 16)
    assert len(strategy.splits) == 3 and len(strategy.leaves) == 4
    grid.handlers.update(grid_of(late).handlers)
    grid.pushed.clear()
    start(strategy, grid, 1)
    start(alone, twin, 1)
    trained = sent_heads(grid)
    cached = sorted(s.model["head"].tolist() for s in strategy.splits.values())
    for partition in late:
        np.testing.assert_allclose(sorted(trained[node_id(partition)]), cached)
        assert strategy.position[node_id(partition)] in strategy.leaves
    assert strategy.history[1]["placements"] == 4
    assert strategy.history[1]["placement-fits"] == 12
    assert strategy.history[1]["ari"] == 1.0
    # Evaluation follows training: they are scored with their new cluster's model.
    assert strategy.history[1]["eval-unplaced"] == 0
    evaluated = sent_heads(grid, "evaluate")
    for partition in late:
        leaf = strategy.position[node_id(partition)]
        assert evaluated[node_id(partition)] == [strategy.leaves[leaf]["head"].tolist()]
    for leaf, model in alone.leaves.items():  # their fits changed no cluster model
        np.testing.assert_array_equal(strategy.leaves[leaf]["head"], model["head"])
    grid.pushed.clear()
    start(strategy, grid, 1)
    assert all(len(h) == 1 for h in sent_heads(grid).values())  # one model each now
    assert strategy.history[1]["placement-fits"] == 0


def test_before_the_first_split_a_new_node_joins_the_one_cluster() -> None:
    grid = grid_of(PARTITIONS[:8])
    strategy = cfl()
    start(strategy, grid, 2)
    grid.handlers.update(grid_of(PARTITIONS[8:]).handlers)
    grid.pushed.clear()
    start(strategy, grid, 1)
    assert all(len(h) == 1 for h in sent_heads(grid).values()) and len(sent_heads(grid)) == 12
    assert strategy.history[1]["placement-fits"] == 0
    assert all(strategy.position[node_id(p)] == ROOT for p in PARTITIONS)


def test_artifacts_name_partitions_and_save_the_cluster_models() -> None:
    strategy = cfl()
    start(strategy, grid_of(PARTITIONS), 8)
    files = strategy.artifacts(final=True)
    state = json.loads(str(files["cfl-clusters.json"]))
    assert sorted(state["clusters"]) == ["1", "2"]
    assert sorted(functools.reduce(operator.iadd, state["clusters"].values(), [])) == sorted(
        f"partition-{p}" for p in PARTITIONS)
    assert state["splits"][0]["round"] == 7 and state["splits"][0]["sizes"] == [6, 6]
    with np.load(io.BytesIO(files["cfl-clusters.npz"])) as saved:
        assert sorted(saved.files) == ["1/bias", "1/head", "2/bias", "2/head"]


def test_bad_parameters_are_named() -> None:
    for kwargs, text in [({"eps1": 0}, "eps1 must be"), ({"eps2": -1}, "eps2 must be"),
                         ({"min_split_size": 1}, "min_split_size must be"),
                         ({"warmup_rounds": -1}, "warmup_rounds must be"),
                         ({"warmup_rounds": 1.5}, "warmup_rounds must be"),
                         ({"linkage": "single"}, "linkage must be one of"),
                         ({"split_quorum": 0.0}, "split_quorum must be"),
                         ({"split_quorum": 1.5}, "split_quorum must be"),
                         ({"eps1": float("nan")}, "eps1 must be"),
                         ({"query_timeout": 0}, "query_timeout must be")]:
        with pytest.raises(ValueError, match=f"CFL: {text}"):
            CFL(**kwargs)  # type: ignore[arg-type]


def test_defaults_are_the_authors_code() -> None:
    strategy = CFL()
    assert (strategy.rule.eps1, strategy.rule.eps2, strategy.rule.min_size,
            strategy.rule.warmup_rounds) == (0.4, 1.6, 3, 20)
    assert strategy.linkage == "complete" and strategy.split_quorum == 1.0
    assert strategy.fraction_train == 1.0


def test_defaults_train_a_plain_quickstart_app(caplog: pytest.LogCaptureFixture) -> None:
    import plain_clientapp

    grid = plain_clientapp.plain_grid(6)
    first = ArrayRecord(plain_clientapp.Net().state_dict())
    strategy = CFL()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = run_rounds(strategy, grid, first, 2, lr=0.5)
    last = strategy.history[2]
    assert last["train-rejected"] == 0 and last["eval-rejected"] == 0
    assert "train_loss" in last and last["eval_acc"] > 0.25 and last["clusters"] == 1
    assert not np.array_equal(result.arrays["fc.weight"].numpy(),  # type: ignore[attr-defined]
                              first["fc.weight"].numpy())
    missing = [r for r in caplog.records if "has no 'query.partition'" in r.getMessage()]
    assert len(missing) == 1
    assert [k for _, _, k, _ in grid.pushed].count("query.partition") == 2
    assert list(strategy.group_models()) == [ROOT]
