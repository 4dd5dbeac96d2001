"""HierFL as a Flower strategy, driven through an in-process grid of real handlers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fakegrid import FakeGrid
from flwr.app import ArrayRecord
from helpers import logistic, node_app, run_rounds

from fedgsp_flwr.core.edge_assignment import POLICIES
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.strategies.hierfl import HierFL

CLASSES = 4


def node_data(node: int) -> ClientData:
    """Node i holds mostly class i mod 4, 20 + 5 * (i mod 3) examples."""
    rng = np.random.default_rng(node)
    n = 20 + 5 * (node % 3)
    y = np.where(rng.random(n) < 0.8, node % CLASSES, rng.integers(0, CLASSES, n))
    x = (rng.normal(size=(n, 6)) + np.eye(CLASSES, 6)[y] * 2).astype(np.float32)
    return ClientData(x, y, x[:5], y[:5], CLASSES)


model = logistic(6, CLASSES)


def app_for(node: int, edges: str | None = None) -> object:
    return node_app(node_data, node, model,
                    node_config=None if edges is None else {"edges": edges})


def start(strategy: HierFL, grid: FakeGrid, rounds: int, **config: object) -> object:
    return run_rounds(strategy, grid, ArrayRecord(model().state_dict()), rounds,
                      **{"lr": 0.5, **config})


def pooled_gradient_descent(nodes: list[int], steps: int, lr: float) -> torch.nn.Module:
    """The model after ``steps`` full-batch gradient steps on the nodes' pooled data."""
    reference = model()
    x = torch.from_numpy(np.concatenate([node_data(n).x_train for n in nodes]))
    y = torch.from_numpy(np.concatenate([node_data(n).y_train for n in nodes]))
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    return reference


@pytest.mark.parametrize("tau2", [1, 2])
def test_edge_rounds_of_one_full_batch_step_are_pooled_gradient_descent(tau2: int) -> None:
    # The paper's Lemma 1: tau1 = 1 full-batch step per user, weighting by examples
    # and full participation: an edge round is one full-batch step on the pooled data
    # (users hold 20, 25 or 30 examples, so uniform weights would differ).
    nodes = list(range(6))
    grid = FakeGrid({n: app_for(n) for n in nodes})
    strategy = HierFL(num_edges=1, reach_per_user=1, tau1=1, tau2=tau2,
                      fraction_evaluate=0.0, min_available_nodes=6)
    result = start(strategy, grid, 1, **{"batch-size": 10**6})
    expected = pooled_gradient_descent(nodes, tau2, lr=0.5).state_dict()
    for name, value in result.arrays.to_torch_state_dict().items():
        np.testing.assert_allclose(value.numpy(), expected[name].numpy(), atol=1e-5)
    assert strategy.history[1]["user-edge-messages"] == 6 * tau2
    assert strategy.history[1]["edge-rounds"] == tau2


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_trains_and_respects_reachability(policy: str) -> None:
    nodes = list(range(12))
    grid = FakeGrid({n: app_for(n) for n in nodes})
    strategy = HierFL(policy=policy, num_edges=3, reach_per_user=2, tau2=2, time_limit=5,
                      fraction_evaluate=0.0, min_available_nodes=12)
    start(strategy, grid, 1)
    problem, _ = strategy.problem_for(strategy.users)
    x = np.array([strategy.edge_of[u] for u in strategy.users])
    assert problem.reach[x, np.arange(12)].all()
    entry = strategy.history[1]
    assert entry["edges-trained"] >= 1 and entry["train-replies"] == 24
    assert entry["assignment-objective"] <= entry["original-objective"] + 1e-12 or (
        policy == "random")


def test_a_node_that_leaves_is_reassigned_and_one_that_returns_is_asked_again() -> None:
    nodes = list(range(9))
    grid = FakeGrid({n: app_for(n) for n in nodes})
    strategy = HierFL(num_edges=3, reach_per_user=3, fraction_evaluate=0.0,
                      min_available_nodes=8)
    start(strategy, grid, 1)
    assert set(strategy.edge_of) == set(nodes)
    gone = grid.handlers.pop(4)
    start(strategy, grid, 1)
    assert set(strategy.edge_of) == set(nodes) - {4} and 4 not in strategy.known.histograms
    grid.handlers[4] = gone
    before = sum(1 for _, node, kind, _ in grid.pushed if node == 4 and kind == "query.histogram")
    start(strategy, grid, 1)
    after = sum(1 for _, node, kind, _ in grid.pushed if node == 4 and kind == "query.histogram")
    assert after == before + 1 and 4 in strategy.edge_of


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        HierFL(policy="best")
    with pytest.raises(ValueError, match="reach_per_user"):
        HierFL(num_edges=2, reach_per_user=3)
    with pytest.raises(ValueError, match="HierFL: tau2 must be > 0"):
        HierFL(tau2=0)


def test_edges_stated_in_the_node_config_are_the_nodes_reach() -> None:
    stated = {n: ("0" if n % 2 else "1,2") for n in range(8)}
    grid = FakeGrid({n: app_for(n, stated[n]) for n in range(8)})
    strategy = HierFL(num_edges=3, reach_per_user=3, fraction_evaluate=0.0,
                      min_available_nodes=8)
    start(strategy, grid, 1)
    assert strategy.known.edges == {n: ([0] if n % 2 else [1, 2]) for n in range(8)}
    for node, edge in strategy.edge_of.items():
        assert edge == 0 if node % 2 else edge in (1, 2)


def test_a_silent_user_is_left_out_and_reassigned_when_it_answers_again() -> None:
    nodes = list(range(8))
    grid = FakeGrid({n: app_for(n) for n in nodes})
    alive = {"yes": True}
    answer = grid.handlers[5]
    grid.handlers[5] = lambda message: answer(message) if alive["yes"] else None
    strategy = HierFL(policy="greedy", num_edges=2, reach_per_user=2, tau2=1, seed=0,
                      fraction_evaluate=0.0, train_timeout=2.0, query_timeout=0.5)
    start(strategy, grid, 1)
    alive["yes"] = False
    start(strategy, grid, 2)
    assert strategy.history[1]["train-replies"] == 7  # its reply never came
    assert 5 not in strategy.edge_of and strategy.history[2]["user-edge-messages"] == 7
    alive["yes"] = True
    start(strategy, grid, 1)
    assert 5 in strategy.edge_of and strategy.history[1]["train-replies"] == 8
    queries = [n for _, n, t, _ in grid.pushed if t == "query.histogram"]
    assert queries.count(5) == 3 and queries.count(0) == 1


def test_defaults_are_the_papers_algorithm_1_fedsgd_users() -> None:
    strategy = HierFL()
    assert (strategy.policy, strategy.tau1) == ("heuristic", 1)


def test_runs_are_bit_identical_whatever_the_node_ids() -> None:
    def run(ids: list[int]) -> tuple[dict, dict]:
        grid = FakeGrid({node: node_app(node_data, node, model, partition=p)
                         for p, node in enumerate(ids)})
        strategy = HierFL(num_edges=2, reach_per_user=2, tau2=2, seed=3, fraction_train=0.8,
                          fraction_evaluate=0.0, min_available_nodes=len(ids))
        result = start(strategy, grid, 2)
        arrays = {k: v.numpy() for k, v in result.arrays.to_torch_state_dict().items()}
        return arrays, {r: strategy.history[r]["train-loss"] for r in (1, 2)}

    rng = np.random.default_rng(0)
    first, losses = run(list(range(20)))
    second, other_losses = run([int(x) for x in rng.choice(2**62, 20, replace=False)])
    assert losses == other_losses
    for name, value in first.items():
        assert np.array_equal(value, second[name]), name


def test_the_cloud_weighs_each_edge_by_the_examples_of_all_its_edge_rounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fedgsp_flwr.strategies import hierfl

    calls: list[list[float]] = []

    def recording(records: list, weights: list[float]) -> object:
        calls.append(list(weights))
        return average(records, weights)

    average = hierfl.average_arrays
    monkeypatch.setattr(hierfl, "average_arrays", recording)
    grid = FakeGrid({n: app_for(n) for n in range(8)})
    strategy = HierFL(num_edges=2, reach_per_user=1, tau2=3, seed=1, fraction_train=0.5,
                      fraction_evaluate=0.0, min_available_nodes=8)
    start(strategy, grid, 1)
    *edge_calls, cloud = calls
    assert len(edge_calls) == 2 * 3  # two edges, three edge rounds
    per_edge = [sum(sum(w) for w in edge_calls[e::2]) for e in (0, 1)]
    assert cloud == per_edge and per_edge != [sum(edge_calls[-2]), sum(edge_calls[-1])]
