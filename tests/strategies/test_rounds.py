"""The round loop: Flower's start with explicit steps, usable from a loop of one's own."""

from __future__ import annotations

import pytest
from fakegrid import FakeGrid
from flwr.app import ArrayRecord, ConfigRecord
from helpers import logistic, node_app, vector_data

from fedgsp_flwr import strategies

NODES = 4


def grid() -> FakeGrid:
    return FakeGrid({n: node_app(lambda p: vector_data(seed=p), n, logistic(5, 3))
                     for n in range(1, NODES + 1)})


def initial() -> ArrayRecord:
    return ArrayRecord(logistic(5, 3)().state_dict())


@pytest.mark.parametrize("build", [
    lambda: strategies.FedGSP(), lambda: strategies.HierFL(), lambda: strategies.StoCFL(),
    lambda: strategies.CFL(), lambda: strategies.Ditto()],
    ids=["FedGSP", "HierFL", "StoCFL", "CFL", "Ditto"])
def test_a_strategy_that_drives_the_grid_refuses_flowers_pair(build: object) -> None:
    strategy = build()  # type: ignore[operator]
    name = type(strategy).__name__
    with pytest.raises(TypeError, match=rf"{name}.configure_train: .* call start\(\), or "
                                        r"train_round\(\)"):
        strategy.configure_train(1, initial(), ConfigRecord(), grid())
    with pytest.raises(TypeError, match=rf"{name}.aggregate_train"):
        strategy.aggregate_train(1, [])


def test_train_round_and_evaluate_round_make_a_round_in_a_loop_of_ones_own() -> None:
    kwargs = {"min_available_nodes": NODES, "min_train_nodes": 1, "min_evaluate_nodes": 1,
              "seed": 1, "num_edges": 2, "tau2": 1}
    looped, started = strategies.HierFL(**kwargs), strategies.HierFL(**kwargs)
    config = {"lr": 0.1, "batch-size": 8}
    expected = started.start(grid(), initial(), num_rounds=2, timeout=30,
                             train_config=ConfigRecord(config))
    arrays, own_grid = initial(), grid()
    with looped.running(own_grid, arrays, 30) as run_grid:
        for server_round in (1, 2):
            trained, _ = looped.train_round(server_round, arrays, ConfigRecord(config),
                                            run_grid, 30)
            assert trained is not None
            arrays = trained
            looped.evaluate_round(server_round, arrays, ConfigRecord(), run_grid, 30)
    assert {k: v.numpy().tobytes() for k, v in arrays.items()} == {
        k: v.numpy().tobytes() for k, v in expected.arrays.items()}


def test_should_stop_ends_the_run_with_the_rounds_done() -> None:
    asked = []

    def should_stop() -> bool:
        asked.append(True)
        return len(asked) > 2

    strategy = strategies.FedAvg(min_available_nodes=NODES, fraction_evaluate=0.0)
    result = strategy.start(grid(), initial(), num_rounds=5, timeout=30,
                            train_config=ConfigRecord({"lr": 0.1}), should_stop=should_stop)
    assert sorted(result.train_metrics_clientapp) == [1, 2] and len(asked) == 3
    assert sorted(strategy.history) == [1, 2]
