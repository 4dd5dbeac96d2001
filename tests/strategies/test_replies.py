"""A bad client reply is rejected with a reason and never reaches an aggregate."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from fakegrid import FakeGrid, partition_node
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from helpers import instruction

from fedgsp_flwr.strategies import FedAvg, FedProx, aggregate_metrics, filter_replies

REFERENCE = ArrayRecord({"w": Array(np.zeros((2, 2), np.float32)),
                         "b": Array(np.zeros(2, np.float32))})


def reply(node: int, w: float | np.ndarray = 1.0, n: object = 10, *,
          arrays: ArrayRecord | None = None, extra: dict | None = None) -> Message:
    request = instruction(RecordDict({"arrays": REFERENCE}), "train", dst=node)
    if arrays is None:
        weight = np.full((2, 2), w, np.float32) if np.isscalar(w) else w
        arrays = ArrayRecord({"w": Array(weight), "b": Array(np.ones(2, np.float32))})
    metrics = {"train-loss": 0.5, **(extra or {})}
    if n is not None:
        metrics["num-examples"] = n
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)})
    out = Message(content, reply_to=request)
    return out


def error_reply(node: int) -> Message:
    request = instruction(RecordDict({"arrays": REFERENCE}), "train", dst=node)
    return Message(Error(code=0, reason="ClientApp crashed"), reply_to=request)


BAD = {
    "error": (error_reply(2), "ClientApp crashed"),
    "nan": (reply(2, np.array([[np.nan, 0], [0, 0]], np.float32)), "NaN or inf"),
    "inf": (reply(2, np.array([[np.inf, 0], [0, 0]], np.float32)), "NaN or inf"),
    "shape": (reply(2, arrays=ArrayRecord({"w": Array(np.zeros((3, 2), np.float32)),
                                           "b": Array(np.ones(2, np.float32))})),
              "expected float32[2, 2]"),
    "dtype": (reply(2, arrays=ArrayRecord({"w": Array(np.zeros((2, 2), np.float64)),
                                           "b": Array(np.ones(2, np.float32))})),
              "expected float32[2, 2]"),
    "keys": (reply(2, arrays=ArrayRecord({"v": Array(np.zeros((2, 2), np.float32))})),
             "array keys"),
    "no-arrays": (Message(RecordDict({"metrics": MetricRecord({"num-examples": 3})}),
                          reply_to=instruction(RecordDict(), "train", dst=2)),
                  "expected one ArrayRecord"),
    "no-weight": (reply(2, n=None), "'num-examples' is missing"),
    "negative-weight": (reply(2, n=-5), "must be a number in (0, 1e+09]"),
    "zero-weight": (reply(2, n=0), "must be a number in (0, 1e+09]"),
    "nan-metric": (reply(2, extra={"train-acc": float("nan")}), "'train-acc' is not finite"),
    # finite, but weighted sums of them overflow (inf in the round's metrics)
    "huge-metric": (reply(2, extra={"train-loss": 1e308}), "'train-loss' is beyond"),
    # finite, but squares of them overflow float32 (FedYogi's model turns NaN)
    "huge-values": (reply(2, 1e38), "array 'w' has values beyond"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_reply_is_rejected_with_its_reason(case: str) -> None:
    bad, reason = BAD[case]
    sound, rejected = filter_replies(
        [reply(1), bad], reference=REFERENCE, weighted_by_key="num-examples",
        require_arrays=True, stage="aggregate_train",
    )
    assert [m.metadata.src_node_id for m in sound] == [1]
    assert reason in rejected[2]


@pytest.mark.parametrize("case", sorted(BAD))
def test_fedavg_aggregates_the_sound_replies_only(case: str) -> None:
    strategy = FedAvg()
    strategy._sent_arrays = REFERENCE
    bad, _ = BAD[case]
    arrays, metrics = strategy.aggregate_train(1, [reply(1, 1.0, 10), bad, reply(3, 4.0, 30)])
    # example-weighted mean of the two sound replies: (1*10 + 4*30) / 40
    np.testing.assert_allclose(arrays["w"].numpy(), np.full((2, 2), 3.25))
    assert metrics["train-loss"] == pytest.approx(0.5)
    assert strategy.history[1]["train-replies"] == 2
    assert strategy.history[1]["train-rejected"] == 1


def test_rejection_is_logged_naming_the_node(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="flwr")
    logger = logging.getLogger("flwr")
    logger.addHandler(caplog.handler)
    try:
        filter_replies([BAD["nan"][0]], reference=REFERENCE, weighted_by_key="num-examples",
                       require_arrays=True, stage="aggregate_train")
    finally:
        logger.removeHandler(caplog.handler)
    assert "rejected reply from node 2" in caplog.text and "NaN" in caplog.text


def test_a_reply_is_never_rejected_for_its_metric_names() -> None:
    odd = reply(4, extra={"other": 1.0})
    sound, rejected = filter_replies(
        [reply(1), reply(3), odd], reference=REFERENCE, weighted_by_key="num-examples",
        require_arrays=True, stage="aggregate_train",
    )
    assert len(sound) == 3 and not rejected


def test_metrics_are_averaged_per_name_over_the_replies_that_report_them() -> None:
    def content(examples: int, **metrics: float | list[float]) -> RecordDict:
        return RecordDict({"metrics": MetricRecord({**metrics, "n": examples})})

    out = aggregate_metrics([content(10, loss=1.0, acc=[0.0, 1.0]),
                             content(30, loss=3.0, acc=[1.0, 1.0]),
                             content(20, f1=0.5, acc=[1.0, 0.0, 1.0])], "n")
    assert set(out.keys()) == {"loss", "f1"}, "lists of unequal length are left out"
    assert out["loss"] == pytest.approx(2.5) and out["f1"] == pytest.approx(0.5)
    same = aggregate_metrics([content(10, acc=[0.0, 1.0]), content(30, acc=[1.0, 1.0])], "n")
    assert same["acc"] == pytest.approx([0.75, 1.0])
    assert aggregate_metrics([RecordDict({"metrics": MetricRecord({"x": 2.0})})],
                             "n")["x"] == 2.0, "a reply without the weight weighs 1"


def test_all_replies_bad_leaves_the_model_unchanged() -> None:
    strategy = FedProx(proximal_mu=0.1)
    strategy._sent_arrays = REFERENCE
    arrays, metrics = strategy.aggregate_train(2, [BAD["nan"][0], BAD["error"][0]])
    assert arrays is None and metrics is None
    assert strategy.history[2]["train-replies"] == 0


def test_evaluate_replies_need_no_arrays_but_a_weight() -> None:
    strategy = FedAvg()
    good = Message(RecordDict({"metrics": MetricRecord({"eval-acc": 0.5, "num-examples": 10})}),
                   reply_to=instruction(RecordDict(), "evaluate", dst=1))
    bad = Message(RecordDict({"metrics": MetricRecord({"eval-acc": 0.9})}),
                  reply_to=instruction(RecordDict(), "evaluate", dst=2))
    metrics = strategy.aggregate_evaluate(1, [good, bad])
    assert metrics["eval-acc"] == pytest.approx(0.5)
    assert strategy.history[1]["eval-rejected"] == 1


def test_configure_train_remembers_the_model_sent() -> None:
    grid = FakeGrid({5: partition_node(0), 6: partition_node(1)})
    strategy = FedAvg(min_available_nodes=1)
    messages = list(strategy.configure_train(1, REFERENCE, ConfigRecord(), grid))
    assert {m.metadata.dst_node_id for m in messages} == {5, 6}
    assert strategy._sent_arrays is REFERENCE
    assert strategy.history[1]["bytes-sent"] == 2 * REFERENCE.count_bytes()


def test_fedavg_counts_the_bytes_of_every_reply_received() -> None:
    strategy = FedAvg()
    strategy._sent_arrays = REFERENCE
    strategy.aggregate_train(1, iter([reply(1), reply(2), error_reply(3)]))
    one = reply(1).content.array_records["arrays"].count_bytes()
    assert one > 6 * 4  # at least the 6 float32 values
    assert strategy.history[1]["bytes-received"] == 2 * one
    assert strategy.history[1]["train-replies"] == 2


def test_aggregation_does_not_depend_on_reply_order() -> None:
    rng = np.random.default_rng(0)
    replies = [reply(n, rng.normal(size=(2, 2)).astype(np.float32), n=int(rng.integers(1, 99)))
               for n in range(1, 8)]
    results = []
    for order in (replies, replies[::-1], replies[3:] + replies[:3]):
        strategy = FedAvg()
        strategy._sent_arrays = REFERENCE
        results.append(strategy.aggregate_train(1, list(order))[0]["w"].numpy())
    assert all(np.array_equal(results[0], other) for other in results[1:])


def test_round_trips_are_timed_from_sending_to_aggregating() -> None:
    grid = FakeGrid({1: partition_node(0), 2: partition_node(1)})
    strategy = FedAvg(min_available_nodes=1)
    list(strategy.configure_train(1, REFERENCE, ConfigRecord(), grid))
    list(strategy.configure_evaluate(1, REFERENCE, ConfigRecord(), grid))
    time.sleep(0.05)
    strategy.aggregate_train(1, [reply(1), reply(2)])
    assert 0.05 <= strategy.history[1]["train-time"] < 5
    assert "eval-time" not in strategy.history[1]
    # Round 1's evaluation is sent but never aggregated, round 2 sends nothing: round
    # 1's clock must not leak into round 2.
    strategy.fraction_evaluate = 0.0
    assert list(strategy.configure_evaluate(2, REFERENCE, ConfigRecord(), grid)) == []
    strategy.aggregate_evaluate(2, [])
    assert "eval-time" not in strategy.history.get(2, {})
