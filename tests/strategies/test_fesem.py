"""FeSEM as a Flower strategy, on an in-process grid of nodes with known optima."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fakegrid import FakeGrid, partition_node
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from helpers import run_rounds

from fedgsp_flwr.strategies.fesem import FeSEM

TARGETS = np.array([[0.0, 0.0, 0.0], [20.0, 0.0, 0.0], [0.0, 20.0, 0.0]])


def node_handler(partition: int, groups: int = 3, nan: bool = False):
    """Node of group ``partition % groups``: local training moves ``head`` halfway to the
    group's target (plus a small node offset) and adds a node-specific ``noise`` array;
    evaluation scores 1 when ``head`` is nearest its own target.
    """
    group = partition % groups
    offset = np.random.default_rng(partition).normal(scale=0.1, size=3)

    def handle(message: Message) -> Message:
        kind = message.metadata.message_type
        head = message.content["arrays"]["head"].numpy()
        if kind == "evaluate":
            nearest = int(np.argmin(((TARGETS[:groups] - head) ** 2).sum(1)))
            metrics = MetricRecord({"num-examples": 5, "eval-acc": float(nearest == group),
                                    "eval-loss": float(((head - TARGETS[group]) ** 2).sum())})
            return Message(RecordDict({"metrics": metrics}), reply_to=message)
        trained = 0.5 * head + 0.5 * (TARGETS[group] + offset)
        if nan:
            trained[0] = np.nan
        noise = np.full(4, float(partition))  # differs per node, not per group
        arrays = ArrayRecord({"head": Array(trained), "noise": Array(noise)})
        metrics = MetricRecord({"num-examples": 10 + partition, "train-loss": 0.5})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=message)

    return partition_node(partition, handle)


def node_id(partition: int) -> int:
    return 5000 + 11 * partition


def grid_of(partitions: list[int], groups: int = 3, nan: set[int] = frozenset()) -> FakeGrid:
    return FakeGrid({node_id(p): node_handler(p, groups, p in nan) for p in partitions})


def initial() -> ArrayRecord:
    return ArrayRecord({"head": Array(np.full(3, 5.0)), "noise": Array(np.zeros(4))})


def start(strategy: FeSEM, grid: FakeGrid, rounds: int) -> object:
    return run_rounds(strategy, grid, initial(), rounds, lr=0.1)


def truth(partitions: range, groups: int = 3) -> dict[int, int]:
    return {p: p % groups for p in partitions}


@pytest.mark.parametrize("weighted", [False, True])
def test_kmeans_plus_plus_init_recovers_the_groups(weighted: bool) -> None:
    strategy = FeSEM(k=3, init="kmeans++", layers=["head"], ground_truth=truth(range(12)),
                     weighted=weighted, seed=0, fraction_train=1.0, fraction_evaluate=1.0)
    start(strategy, grid_of(list(range(12))), rounds=4)
    assert strategy.history[1]["ari"] == 1.0 and strategy.history[4]["ari"] == 1.0
    assert sorted(strategy.history[4]["cluster-sizes"]) == [4, 4, 4]
    assert strategy.history[4]["eval-acc"] == 1.0
    assert strategy.history[1]["new-clients"] == 12
    assert strategy.history[4]["assignment-changes"] == 0
    assert strategy.centres is not None
    heads = strategy.centres[:, :3]
    gaps = np.sqrt(((heads[:, None, :] - TARGETS[None]) ** 2).sum(-1))
    assert sorted(gaps.argmin(0).tolist()) == [0, 1, 2]  # one centre per target
    assert gaps.min(0).max() < 2.0  # a gap of about 18 at the start, halved 4 times
    # every local model is 0.5 centre + 0.5 (target + offset): after the M-step its
    # squared distance to its centre is 0.25 |offset - the group's mean offset|^2 (plain
    # means, the paper's, or weighted by the nodes' 10 + p examples)
    offsets = np.array([np.random.default_rng(p).normal(scale=0.1, size=3)
                        for p in range(12)])
    examples = 10 + np.arange(12) if weighted else np.ones(12)
    means = [np.average(offsets[g::3], axis=0, weights=examples[g::3]) for g in range(3)]
    spread = [0.25 * ((offsets[p] - means[p % 3]) ** 2).sum() for p in range(12)]
    # (float32 models and the Gram expansion: about 4 significant digits here)
    assert strategy.history[4]["multicenter-loss"] == pytest.approx(np.mean(spread), rel=1e-3)


def test_seeded_centres_come_from_the_factory_and_an_empty_one_keeps_its_weights() -> None:
    seeded = {0: [2.0, 2.0, 2.0], 1: [12.0, 2.0, 2.0],
              2: [500.0, 500.0, 500.0]}  # centre 2 is far from every local model

    def factory(k: int) -> ArrayRecord:
        return ArrayRecord({"head": Array(np.array(seeded[k])), "noise": Array(np.zeros(4))})

    strategy = FeSEM(k=3, init="seeds", centre_factory=factory, layers=["head"],
                     ground_truth=truth(range(8), groups=2), seed=0, fraction_train=1.0,
                     fraction_evaluate=0.0)
    start(strategy, grid_of(list(range(8)), groups=2), rounds=3)
    assert strategy.centres is not None
    assert strategy.centres[2].tolist() == [500.0] * 3 + [0.0] * 4
    assert all(strategy.history[r]["empty-centres"] == 1 for r in (1, 2, 3))
    assert strategy.history[3]["cluster-sizes"][2] == 0
    # round 1: local models trained from the initial model (5, 5, 5) land near (2.5, 2.5,
    # 2.5) and (12.5, 2.5, 2.5): the nearest seeded centres are 0 and 1 respectively
    assert strategy.history[1]["ari"] == 1.0


def test_seeds_init_needs_a_factory() -> None:
    with pytest.raises(ValueError, match="centre_factory"):
        FeSEM(k=2, init="seeds", fraction_evaluate=0.0)


@pytest.mark.parametrize("new_clients", ["probe", "initial"])
def test_nodes_receive_their_own_centre_and_new_nodes_probe_or_the_initial_model(
        new_clients: str) -> None:
    grid = grid_of(list(range(6)))
    strategy = FeSEM(k=3, layers=["head"], seed=1, fraction_train=1.0,
                     new_clients=new_clients, ground_truth=truth(range(12)),
                     fraction_evaluate=0.0)
    start(strategy, grid, rounds=1)
    assert strategy.centres is not None
    after_first = strategy.centres.copy()
    assigned = dict(strategy.assignment)
    assert len(assigned) == 6 and strategy.cluster_metrics()["ari"] == 1.0
    grid.handlers.update(grid_of(list(range(6, 12))).handlers)  # six nodes join
    grid.pushed.clear()
    start(strategy, grid, rounds=1)
    heads: dict[int, list[list[float]]] = {}
    for _, node, kind, message in grid.pushed:
        if kind == "train":
            heads.setdefault(node, []).append(message.content["arrays"]["head"].numpy().tolist())
    new = [n for n in heads if n not in assigned]
    assert len(new) == 6
    for node, sent in heads.items():
        if node in assigned:
            assert sent == [pytest.approx(after_first[assigned[node], :3].tolist())]
        elif new_clients == "probe":  # every centre, once
            assert np.allclose(sorted(sent), sorted(after_first[:, :3].tolist()))
        else:
            assert sent == [[5.0, 5.0, 5.0]]
    probes = 3 * len(new) - len(new) if new_clients == "probe" else 0
    assert strategy.history[1]["probe-fits"] == probes
    assert strategy.cluster_metrics()["ari"] == 1.0  # new nodes found their group's centre


def test_a_nan_reply_is_rejected_before_the_m_step() -> None:
    strategy = FeSEM(k=2, layers=["head"], seed=0, fraction_train=1.0,
                     fraction_evaluate=0.0)
    start(strategy, grid_of(list(range(6)), nan={3}), rounds=2)
    assert strategy.history[1]["train-rejected"] == 1
    assert strategy.centres is not None and np.isfinite(strategy.centres).all()
    assert node_id(3) not in strategy.assignment


def test_distances_over_all_layers_follow_the_node_noise() -> None:
    # 'noise' grows with the partition id and dwarfs the group signal in 'head': over
    # all layers the clusters follow partition ids, over 'head' the groups
    everything = FeSEM(k=3, seed=0, ground_truth=truth(range(12)), fraction_train=1.0,
                       fraction_evaluate=0.0)
    head_only = FeSEM(k=3, seed=0, layers=["head"], ground_truth=truth(range(12)),
                      fraction_train=1.0, fraction_evaluate=0.0)
    start(everything, grid_of([p * 10 for p in range(12)]), rounds=3)
    start(head_only, grid_of([p * 10 for p in range(12)]), rounds=3)
    gt = {p * 10: (p * 10) % 3 for p in range(12)}
    everything.ground_truth = head_only.ground_truth = gt
    assert head_only.cluster_metrics()["ari"] == 1.0
    assert everything.cluster_metrics()["ari"] < 0.5


def test_artifacts_name_partitions_and_save_the_centres() -> None:
    strategy = FeSEM(k=2, layers=["head"], seed=0, fraction_train=1.0,
                     fraction_evaluate=0.0)
    start(strategy, grid_of(list(range(4))), rounds=1)
    files = strategy.artifacts(final=True)
    state = json.loads(files["centres.json"])
    assert set(state["assignment"]) == {f"partition-{p}" for p in range(4)}
    assert sum(state["sizes"]) == 4 and isinstance(files["centres.npz"], bytes)


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="FeSEM: k must be"):
        FeSEM(k=0)
    with pytest.raises(ValueError, match="FeSEM: init must be one of"):
        FeSEM(init="random")
    strategy = FeSEM(k=2, layers=["fc"], fraction_evaluate=0.0)
    with pytest.raises(ValueError, match="unknown layers"):
        start(strategy, grid_of([0, 1]), rounds=1)


def test_a_silent_node_sits_out_until_it_answers_a_histogram_query_again() -> None:
    grid = grid_of(list(range(6)))
    silent = node_id(4)
    alive = {"yes": True}
    answer = grid.handlers[silent]
    grid.handlers[silent] = lambda message: answer(message) if alive["yes"] else None
    strategy = FeSEM(k=2, layers=["head"], seed=0, fraction_train=1.0,
                     fraction_evaluate=0.0, train_timeout=0.3, query_timeout=0.3)
    start(strategy, grid, 1)
    centre = strategy.assignment[silent]
    alive["yes"] = False
    start(strategy, grid, 2)
    assert strategy.history[1]["train-rejected"] == 1  # its training reply never came
    assert strategy.history[2]["sampled"] == 5 and strategy.history[2]["train-rejected"] == 0
    alive["yes"] = True
    start(strategy, grid, 1)
    assert strategy.history[1]["sampled"] == 6 and strategy.history[1]["train-replies"] == 6
    assert strategy.assignment[silent] == centre
    queries = [n for _, n, t, _ in grid.pushed if t == "query.partition"]
    assert queries.count(silent) == 3 and queries.count(node_id(0)) == 1


def test_defaults_are_the_papers_one_local_fit_for_a_new_node() -> None:
    strategy = FeSEM()
    assert (strategy.k, strategy.init, strategy.new_clients, strategy.weighted,
            strategy.layers) == (4, "kmeans++", "initial", False, None)
