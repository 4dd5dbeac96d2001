"""FedAdagrad, FedAdam, FedYogi: Flower's server optimizers over our validated average."""

from __future__ import annotations

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import strategy as flower
from helpers import run_rounds

from fedgsp_flwr.strategies.adaptive import FedAdagrad, FedAdam, FedYogi

PAIRS = [(FedAdagrad, flower.FedAdagrad), (FedAdam, flower.FedAdam),
         (FedYogi, flower.FedYogi)]


def node(shift: float, nan: bool = False):
    """A node that moves every array by ``shift`` (NaN everywhere if ``nan``)."""
    def handle(message: Message) -> Message:
        arrays = message.content.array_records["arrays"]
        moved = {k: np.full_like(a.numpy(), np.nan) if nan else a.numpy() + shift
                 for k, a in arrays.items()}
        content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in moved.items()}),
                              "metrics": MetricRecord({"num-examples": 10 + int(shift * 10),
                                                       "train-loss": 1.0})})
        return Message(content=content, reply_to=message)
    return handle


def grid(nan: bool = False) -> FakeGrid:
    nodes = {1: node(0.1), 2: node(-0.3), 3: node(0.5)}
    if nan:
        nodes[4] = node(0.0, nan=True)
    return FakeGrid(nodes)


def initial() -> ArrayRecord:
    rng = np.random.default_rng(0)
    return ArrayRecord({"w": Array(rng.normal(size=(3, 4)).astype(np.float32)),
                        "b": Array(np.zeros(4, dtype=np.float32))})


def kwargs() -> dict:
    return {"fraction_evaluate": 0.0, "min_available_nodes": 3, "min_train_nodes": 3}


def numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: a.numpy() for k, a in record.items()}


@pytest.mark.parametrize(("ours", "theirs"), PAIRS)
def test_valid_replies_give_flowers_own_steps(ours: type, theirs: type) -> None:
    mine = run_rounds(ours(**kwargs()), grid(), initial(), 3).arrays
    flowers = run_rounds(theirs(**kwargs()), grid(), initial(), 3).arrays
    start = numpy(initial())
    for key, value in numpy(flowers).items():
        np.testing.assert_allclose(numpy(mine)[key], value, rtol=1e-5, atol=1e-6)
        assert not np.allclose(value, start[key])  # the optimizer moved the model


@pytest.mark.parametrize(("ours", "theirs"), PAIRS)
def test_a_nan_reply_is_rejected_where_flower_would_aggregate_it(ours: type,
                                                                 theirs: type) -> None:
    flowers = run_rounds(theirs(**kwargs()), grid(nan=True), initial(), 1).arrays
    assert np.isnan(numpy(flowers)["w"]).all()
    strategy = ours(**kwargs())
    mine = run_rounds(strategy, grid(nan=True), initial(), 1).arrays
    clean = run_rounds(ours(**kwargs()), grid(), initial(), 1).arrays
    for key, value in numpy(clean).items():
        np.testing.assert_allclose(numpy(mine)[key], value, rtol=1e-6)
    assert strategy.history[1]["train-rejected"] == 1
    assert strategy.history[1]["train-replies"] == 3


@pytest.mark.parametrize("ours", [FedAdagrad, FedAdam, FedYogi])
def test_a_resumed_run_continues_the_optimizer(ours: type) -> None:
    straight = run_rounds(ours(**kwargs()), grid(), initial(), 3).arrays
    first = ours(**kwargs())
    after_two = run_rounds(first, grid(), initial(), 2).arrays
    state = first.checkpoint_state()
    assert {"fedopt-m_t/w", "fedopt-v_t/w"} <= set(state.arrays)
    resumed = ours(**kwargs())
    resumed.restore_state(state, lambda n: n)
    resumed.resumed_after = 2
    again = run_rounds(resumed, grid(), after_two, 1).arrays
    for key, value in numpy(straight).items():
        np.testing.assert_allclose(numpy(again)[key], value, rtol=1e-5, atol=1e-7)
    # without the moments the third step differs (the check above is not vacuous)
    fresh = ours(**kwargs())
    fresh.resumed_after = 2
    fresh = run_rounds(fresh, grid(), after_two, 1).arrays
    assert not np.allclose(numpy(fresh)["w"], numpy(straight)["w"])


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="FedAdam: tau must be > 0"):
        FedAdam(tau=0.0)
    with pytest.raises(ValueError, match=r"FedYogi: beta_2 must be in \[0, 1\)"):
        FedYogi(beta_2=1.0)
    with pytest.raises(ValueError, match="FedAdagrad: max_untrained_rounds"):
        FedAdagrad(max_untrained_rounds=0)


@pytest.mark.parametrize("ours", [FedAdagrad, FedAdam, FedYogi])
def test_the_model_keeps_its_dtype_so_float32_clients_train_every_round(ours: type) -> None:
    def float32_node(message: Message) -> Message:  # as a torch ClientApp replies
        reply = node(0.2)(message)
        arrays = reply.content.array_records["arrays"]
        reply.content.array_records["arrays"] = ArrayRecord(
            {k: Array(a.numpy().astype(np.float32)) for k, a in arrays.items()})
        return reply

    strategy = ours(**kwargs())
    result = run_rounds(strategy, FakeGrid({1: float32_node, 2: float32_node,
                                            3: float32_node}), initial(), 3).arrays
    assert [strategy.history[r]["train-replies"] for r in (1, 2, 3)] == [3, 3, 3]
    assert {a.numpy().dtype for a in result.values()} == {np.dtype(np.float32)}
