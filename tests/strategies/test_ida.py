"""IDA as a strategy: the server's weights over validated replies."""

from __future__ import annotations

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from helpers import run_rounds

from fedgsp_flwr.strategies.ida import IDA

KWARGS = {"fraction_evaluate": 0.0, "min_available_nodes": 3, "min_train_nodes": 3}


def node(value: float, examples: int):
    """A node that returns the constant model ``value`` (NaN allowed)."""
    def handle(message: Message) -> Message:
        arrays = message.content.array_records["arrays"]
        content = RecordDict({
            "arrays": ArrayRecord({k: Array(np.full_like(a.numpy(), value))
                                   for k, a in arrays.items()}),
            "metrics": MetricRecord({"num-examples": examples})})
        return Message(content=content, reply_to=message)
    return handle


def initial() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros((2, 2), np.float32)),
                        "b": Array(np.zeros(2, np.float32))})


def test_the_round_model_uses_inverse_distance_weights() -> None:
    # every array of the models is 1, 1 or -2: the mean is 0, distances 1, 1, 2 (times
    # sqrt(6)): weights 0.4, 0.4, 0.2 -> 0.4 + 0.4 - 0.4 = 0.4; FedAvg's would be -0.2
    grid = FakeGrid({1: node(1.0, 10), 2: node(1.0, 10), 3: node(-2.0, 10),
                     4: node(np.nan, 10)})
    strategy = IDA(**KWARGS)
    result = run_rounds(strategy, grid, initial(), 1).arrays
    np.testing.assert_allclose(result["w"].numpy(), 0.4, rtol=1e-6)
    assert result["w"].numpy().dtype == np.float32
    assert strategy.history[1]["train-rejected"] == 1  # the NaN model never reaches it
    assert strategy.history[1]["ida-weight-max"] == pytest.approx(0.4)


def test_the_combination_with_examples() -> None:
    grid = FakeGrid({1: node(1.0, 10), 2: node(1.0, 30), 3: node(-2.0, 40)})
    result = run_rounds(IDA(weighting="inverse-distance-examples", **KWARGS), grid,
                        initial(), 1).arrays
    raw = np.array([10.0, 30.0, 20.0])
    np.testing.assert_allclose(result["b"].numpy(), raw @ [1, 1, -2] / raw.sum(), rtol=1e-6)


def test_an_unknown_weighting_is_named() -> None:
    with pytest.raises(ValueError, match="IDA: weighting must be one of"):
        IDA(weighting="distance")


def test_integer_arrays_are_averaged_but_set_no_distance() -> None:
    # a batch counter that differs with the clients' data sizes must not move the weights
    def counted(value: float, steps: int):
        def handle(message: Message) -> Message:
            content = RecordDict({
                "arrays": ArrayRecord({"w": Array(np.full((2, 2), value, np.float32)),
                                       "steps": Array(np.array(steps, np.int64))}),
                "metrics": MetricRecord({"num-examples": 10})})
            return Message(content=content, reply_to=message)
        return handle

    grid = FakeGrid({1: counted(1.0, 60), 2: counted(1.0, 45), 3: counted(-2.0, 90)})
    start = ArrayRecord({"w": Array(np.zeros((2, 2), np.float32)),
                         "steps": Array(np.array(0, np.int64))})
    strategy = IDA(**KWARGS)
    result = run_rounds(strategy, grid, start, 1).arrays
    np.testing.assert_allclose(result["w"].numpy(), 0.4, rtol=1e-6)  # weights .4 .4 .2
    steps = result["steps"].numpy()
    assert steps.dtype == np.int64 and steps.shape == () and int(steps) == 60
