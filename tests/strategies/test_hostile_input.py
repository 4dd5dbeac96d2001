"""Hostile and broken client input, property-based: whatever a node sends, a bad reply,
histogram or sketch is rejected with one logged reason naming the node, and every
aggregate equals the aggregate without it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from helpers import instruction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedgsp_flwr.strategies import FedAvg, FeSEM, StoCFL, filter_replies
from fedgsp_flwr.strategies.node_queries import histogram_problem, query_histograms
from fedgsp_flwr.strategies.relay import run_relay

SHAPES = {"w": (3, 2), "b": (2,)}
REFERENCE = ArrayRecord({k: Array(np.zeros(s, np.float32)) for k, s in SHAPES.items()})
BAD_NODE = 666
# Every kind of corruption is its own test case, each drawn a few times, reproducibly.
FEW = settings(max_examples=8, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture])
KINDS = ["non-finite", "shape", "dtype", "missing-key", "extra-key", "weight-missing",
         "weight-not-positive", "weight-not-finite", "weight-absurd", "weight-list",
         "metric", "no-arrays", "two-arrays", "no-metrics", "two-metrics", "error"]


@contextmanager
def flwr_warnings() -> Iterator[list[str]]:
    """Collect the WARNING lines Flower's logger emits."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                lines.append(record.getMessage())

    logger, handler = logging.getLogger("flwr"), Collect()
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def good_arrays(value: float, keys: dict[str, tuple[int, ...]] = SHAPES) -> ArrayRecord:
    return ArrayRecord({k: Array(np.full(s, value, np.float32)) for k, s in keys.items()})


def train_reply(request: Message, arrays: dict[str, ArrayRecord] | None,
                metrics: dict | None) -> Message:
    content = RecordDict()
    for name, record in (arrays or {}).items():
        content[name] = record
    if metrics is not None:
        content["metrics"] = MetricRecord(metrics)
    return Message(content, reply_to=request)


# --- corruptions of a training reply ---------------------------------------------------

FLOAT_SPECIALS = st.sampled_from([np.nan, np.inf, -np.inf])
# The metric names of the sound nodes' replies: a corrupted reply has the same names, so
# that it is refused for its corruption, not for odd metric names.
SOUND_METRICS = {"num-examples": 5, "train-loss": 0.1}


@st.composite
def corruption(draw: st.DrawFn, kind: str) -> Callable[[Message, ArrayRecord], Message]:
    """A function that turns a request into a reply with a corruption of ``kind``."""
    key = draw(st.sampled_from(sorted(SHAPES)))
    if kind == "non-finite":
        special = draw(FLOAT_SPECIALS)
        index = draw(st.integers(0, int(np.prod(SHAPES[key])) - 1))

        def make(request: Message, sent: ArrayRecord) -> Message:
            record = {k: v.numpy().copy() + 1 for k, v in sent.items()}
            record[key].reshape(-1)[index] = special
            return train_reply(request, {"arrays": ArrayRecord(
                {k: Array(v) for k, v in record.items()})}, dict(SOUND_METRICS))
        return make
    if kind == "shape":
        shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple).filter(
            lambda s: s != SHAPES[key]))
        broken = {**SHAPES, key: shape}
        return lambda request, _sent: train_reply(
            request, {"arrays": good_arrays(1.0, broken)}, dict(SOUND_METRICS))
    if kind == "dtype":
        dtype = draw(st.sampled_from([np.float64, np.float16, np.int32, np.int64, np.uint8]))
        record = {k: np.ones(s, np.float32) for k, s in SHAPES.items()}
        record[key] = record[key].astype(dtype)
        return lambda request, _sent: train_reply(request, {"arrays": ArrayRecord(
            {k: Array(v) for k, v in record.items()})}, dict(SOUND_METRICS))
    if kind == "missing-key":
        kept = {k: s for k, s in SHAPES.items() if k != key}
        return lambda request, _sent: train_reply(
            request, {"arrays": good_arrays(1.0, kept)}, dict(SOUND_METRICS))
    if kind == "extra-key":
        return lambda request, _sent: train_reply(
            request, {"arrays": good_arrays(1.0, {**SHAPES, "extra": (1,)})},
            dict(SOUND_METRICS))
    if kind.startswith("weight-"):
        weight = draw({
            "weight-missing": st.none(),
            "weight-not-positive": st.one_of(st.floats(max_value=0, allow_nan=False),
                                             st.integers(max_value=0)),
            "weight-not-finite": FLOAT_SPECIALS,
            "weight-absurd": st.one_of(st.floats(min_value=1e9, exclude_min=True,
                                                 allow_infinity=False),
                                       st.integers(min_value=10**9 + 1, max_value=2**62)),
            "weight-list": st.lists(st.integers(1, 10), min_size=1, max_size=3),
        }[kind])
        metrics = {"train-loss": 0.1} if weight is None else {**SOUND_METRICS,
                                                               "num-examples": weight}
        return lambda request, _sent: train_reply(
            request, {"arrays": good_arrays(1.0)}, metrics)
    if kind == "metric":
        value = draw(st.one_of(FLOAT_SPECIALS, st.lists(FLOAT_SPECIALS, min_size=1,
                                                          max_size=2)))
        return lambda request, _sent: train_reply(
            request, {"arrays": good_arrays(1.0)}, {**SOUND_METRICS, "train-loss": value})
    if kind == "no-arrays":
        return lambda request, _sent: train_reply(request, None, dict(SOUND_METRICS))
    if kind == "two-arrays":
        return lambda request, _sent: train_reply(
            request, {"arrays": good_arrays(1.0), "more": good_arrays(2.0)},
            dict(SOUND_METRICS))
    if kind == "no-metrics":
        return lambda request, _sent: train_reply(request, {"arrays": good_arrays(1.0)}, None)
    if kind == "two-metrics":
        def make_two(request: Message, _sent: ArrayRecord) -> Message:
            reply = train_reply(request, {"arrays": good_arrays(1.0)}, dict(SOUND_METRICS))
            reply.content["other"] = MetricRecord(dict(SOUND_METRICS))
            return reply
        return make_two
    assert kind == "error", kind
    reason = draw(st.text(min_size=1, max_size=20))
    return lambda request, _sent: Message(Error(code=2, reason=reason), reply_to=request)


def adder(amount: float, examples: int = 10) -> Callable[[Message], Message]:
    """A sound node: adds ``amount`` to every array it is sent."""
    def handle(message: Message) -> Message:
        sent = next(iter(message.content.array_records.values()))
        arrays = ArrayRecord({k: Array((v.numpy() + amount).astype(np.float32))
                              for k, v in sent.items()})
        return train_reply(message, {"arrays": arrays},
                           {"num-examples": examples, "train-loss": amount})
    return handle


def hostile(make: Callable[[Message, ArrayRecord], Message]) -> Callable[[Message], Message]:
    """A node that answers every message with ``make``'s corrupted reply."""
    return lambda message: make(message, next(iter(message.content.array_records.values())))


def assert_named_once(lines: list[str], node: int) -> None:
    named = [line for line in lines if f"node {node}" in line]
    assert len(named) == 1, lines


# --- the aggregation paths -------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@FEW
@given(data=st.data())
def test_filter_replies_rejects_every_corruption_and_keeps_the_rest(
        kind: str, data: st.DataObject) -> None:
    make = data.draw(corruption(kind))
    good = [adder(1.0)(instruction(RecordDict({"arrays": REFERENCE}), "train", dst=n))
            for n in (1, 2)]
    bad = make(instruction(RecordDict({"arrays": REFERENCE}), "train", dst=BAD_NODE),
               REFERENCE)
    with flwr_warnings() as lines:
        sound, rejected = filter_replies([good[0], bad, good[1]], reference=REFERENCE,
                                         weighted_by_key="num-examples", require_arrays=True,
                                         stage="train")
    assert [m.metadata.src_node_id for m in sound] == [1, 2]
    assert set(rejected) == {BAD_NODE} and rejected[BAD_NODE]
    assert_named_once(lines, BAD_NODE)


@pytest.mark.parametrize("kind", KINDS)
@FEW
@given(data=st.data())
def test_fedavg_aggregate_is_the_aggregate_without_the_bad_reply(
        kind: str, data: st.DataObject) -> None:
    make = data.draw(corruption(kind))
    def replies(with_bad: bool) -> list[Message]:
        out = [adder(a, e)(instruction(RecordDict({"arrays": REFERENCE}), "train", dst=n))
               for n, a, e in ((1, 1.0, 10), (2, 4.0, 30))]
        if with_bad:
            out.insert(1, make(instruction(RecordDict({"arrays": REFERENCE}), "train",
                                           dst=BAD_NODE), REFERENCE))
        return out

    results = []
    for with_bad in (False, True):
        strategy = FedAvg()
        strategy._sent_arrays = REFERENCE
        arrays, metrics = strategy.aggregate_train(1, replies(with_bad))
        results.append(({k: v.numpy() for k, v in arrays.items()}, dict(metrics)))
    (clean, clean_metrics), (dirty, dirty_metrics) = results
    for key in clean:
        np.testing.assert_array_equal(dirty[key], clean[key])
    assert dirty_metrics == clean_metrics


@pytest.mark.parametrize("kind", KINDS)
@FEW
@given(data=st.data())
def test_a_relay_skips_a_corrupted_hop_and_hands_the_model_on(
        kind: str, data: st.DataObject) -> None:
    make = data.draw(corruption(kind))
    def chain(nodes: dict) -> ArrayRecord:
        (result,) = run_relay(FakeGrid(nodes), [list(nodes)], REFERENCE, ConfigRecord(),
                              train_timeout=5)
        return result.arrays

    with flwr_warnings() as lines:
        dirty = chain({1: adder(1.0), BAD_NODE: hostile(make), 2: adder(10.0)})
    clean = chain({1: adder(1.0), 2: adder(10.0)})
    for key in SHAPES:
        np.testing.assert_array_equal(dirty[key].numpy(), clean[key].numpy())
    assert_named_once(lines, BAD_NODE)


def model_factory(value: float) -> ArrayRecord:
    return good_arrays(value)


def fesem_round(nodes: dict) -> np.ndarray:
    strategy = FeSEM(k=2, seed=0, fraction_evaluate=0.0, min_available_nodes=1,
                     train_timeout=5)
    strategy.start(FakeGrid(nodes), REFERENCE, num_rounds=1, timeout=5)
    assert strategy.centres is not None
    return strategy.centres


@pytest.mark.parametrize("kind", KINDS)
@FEW
@given(data=st.data())
def test_fesem_centres_are_the_centres_without_the_bad_reply(
        kind: str, data: st.DataObject) -> None:
    make = data.draw(corruption(kind))
    sound = {1: adder(1.0), 2: adder(1.5), 3: adder(9.0), 4: adder(9.5)}
    with flwr_warnings() as lines:
        dirty = fesem_round({**sound, BAD_NODE: hostile(make)})
    np.testing.assert_array_equal(dirty, fesem_round(sound))
    assert any(f"node {BAD_NODE}" in line for line in lines)


def bilevel_node(amount: float) -> Callable[[Message], Message]:
    """A sound StoCFL node: a fixed sketch, and w/theta each moved by ``amount``."""
    def handle(message: Message) -> Message:
        if message.metadata.message_type == "query.sketch":
            sketch = np.zeros(8, np.float32)  # the model's size: StoCFL's sketch-dim 0
            sketch[:2] = 1.0, amount
            content = RecordDict({"sketch": ArrayRecord({"sketch": Array(sketch)}),
                                  "metrics": MetricRecord({"num-examples": 10})})
            return Message(content, reply_to=message)
        moved = {name: ArrayRecord({k: Array((v.numpy() + amount).astype(np.float32))
                                    for k, v in message.content[name].items()})
                 for name in ("global", "cluster")}
        return train_reply(message, moved, {"num-examples": 10, "train-loss": 0.1})
    return handle


def sketch_then(make: Callable[[Message, ArrayRecord], Message]) -> Callable[[Message], Message]:
    """A node with a sound sketch whose bi-level training reply is corrupted (the
    corrupted model stands for both ``global`` and ``cluster``).
    """
    sound = bilevel_node(1.0)

    def handle(message: Message) -> Message:
        if message.metadata.message_type == "query.sketch":
            return sound(message)
        reply = make(message, message.content["global"])
        if reply.has_error() or set(reply.content.array_records) != {"arrays"}:
            return reply
        content = RecordDict({"global": reply.content["arrays"],
                              "cluster": reply.content["arrays"]})
        for name, record in reply.content.metric_records.items():
            content[name] = record
        return Message(content, reply_to=message)
    return handle


def stocfl_round(nodes: dict) -> tuple[dict, dict]:
    strategy = StoCFL(tau=0.9, seed=0, fraction_evaluate=0.0, min_available_nodes=1,
                      train_timeout=5, query_timeout=5)
    result = strategy.start(FakeGrid(nodes), REFERENCE, num_rounds=1, timeout=5)
    assert result.arrays is not None
    models = {c: {k: v.numpy() for k, v in m.items()} for c, m in strategy.models.items()
              if c in {strategy.clustering.cluster_of[n] for n in nodes if n != BAD_NODE}}
    return {k: v.numpy() for k, v in result.arrays.items()}, models


@pytest.mark.parametrize("kind", KINDS)
@FEW
@given(data=st.data())
def test_stocfl_models_are_the_models_without_the_bad_reply(kind: str, data: st.DataObject) -> None:
    make = data.draw(corruption(kind))
    sound = {1: bilevel_node(1.0), 2: bilevel_node(1.0), 3: bilevel_node(-1.0)}
    with flwr_warnings() as lines:
        dirty_global, dirty_clusters = stocfl_round({**sound, BAD_NODE: sketch_then(make)})
    clean_global, clean_clusters = stocfl_round(sound)
    for key in SHAPES:
        np.testing.assert_array_equal(dirty_global[key], clean_global[key])
    assert dirty_clusters.keys() == clean_clusters.keys()
    for cluster, arrays in clean_clusters.items():
        for key in SHAPES:
            np.testing.assert_array_equal(dirty_clusters[cluster][key], arrays[key])
    assert_named_once(lines, BAD_NODE)


# --- histograms and sketches ------------------------------------------------------------

HISTOGRAM_KINDS = ["negative", "length", "fraction", "huge", "non-finite", "2-d", "empty",
                   "zero"]


@st.composite
def bad_histogram(draw: st.DrawFn, kind: str) -> np.ndarray:
    """A histogram of 4 classes that must be refused."""
    counts = np.array(draw(st.lists(st.integers(0, 50), min_size=4, max_size=4)),
                      dtype=np.float64) + 1
    if kind == "negative":
        counts[draw(st.integers(0, 3))] = -draw(st.integers(1, 10**6))
    elif kind == "length":
        counts = np.resize(counts, draw(st.sampled_from([1, 2, 3, 5, 10])))
    elif kind == "fraction":
        counts[draw(st.integers(0, 3))] += draw(st.floats(0.01, 0.99))
    elif kind == "huge":
        counts[draw(st.integers(0, 3))] = draw(st.floats(1e9 + 1, 1e300))
    elif kind == "non-finite":
        counts[draw(st.integers(0, 3))] = draw(FLOAT_SPECIALS)
    elif kind == "2-d":
        counts = np.stack([counts, counts])
    elif kind == "empty":
        counts = np.zeros(0)
    else:
        counts = np.zeros(4)
    dtype = draw(st.sampled_from([np.float64, np.float32])) if kind in (
        "fraction", "non-finite") else draw(st.sampled_from([np.float64, np.int64]))
    with np.errstate(invalid="ignore", over="ignore"):
        return counts.astype(dtype)


def histogram_node(histogram: np.ndarray) -> Callable[[Message], Message]:
    def handle(message: Message) -> Message:
        content = RecordDict({"histogram": ArrayRecord({"histogram": Array(histogram)}),
                              "metrics": MetricRecord({"num-examples": 10})})
        return Message(content, reply_to=message)
    return handle


@pytest.mark.parametrize("kind", HISTOGRAM_KINDS)
@FEW
@given(data=st.data())
def test_a_bad_histogram_is_refused_and_logged(kind: str, data: st.DataObject) -> None:
    histogram = data.draw(bad_histogram(kind))
    good = np.array([3, 0, 5, 2], np.int64)
    grid = FakeGrid({1: histogram_node(good), BAD_NODE: histogram_node(histogram)})
    with flwr_warnings() as lines:
        replies = query_histograms(grid, [1, BAD_NODE], timeout=5, num_classes=4)
    assert list(replies.histograms) == [1] and BAD_NODE in replies.failed
    assert_named_once(lines, BAD_NODE)
    reply = Message(RecordDict({"histogram": ArrayRecord({"histogram": Array(histogram)})}),
                    reply_to=instruction(RecordDict(), "query.histogram"))
    assert histogram_problem(reply, 4) is not None


SKETCH_KINDS = ["non-finite", "zero", "length", "2-d", "empty"]


@st.composite
def bad_sketch(draw: st.DrawFn, kind: str) -> np.ndarray:
    """A sketch (of the model's 8 numbers) that must be refused."""
    sketch = np.array([1.0, 2.0, 0.5, 0, 0, 0, 0, 0], np.float32)
    if kind == "non-finite":
        sketch[draw(st.integers(0, 7))] = draw(FLOAT_SPECIALS)
    elif kind == "zero":
        sketch = np.zeros(8, draw(st.sampled_from([np.float32, np.float64])))
    elif kind == "length":
        sketch = np.ones(draw(st.sampled_from([1, 2, 7, 9])), np.float32)
    elif kind == "2-d":
        sketch = np.ones((8, 8), np.float32)
    else:
        sketch = np.zeros(0, np.float32)
    return sketch


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kind", SKETCH_KINDS)
@FEW
@given(data=st.data())
def test_a_bad_sketch_makes_the_node_plain_and_is_logged(kind: str,
                                                        data: st.DataObject) -> None:
    sketch = data.draw(bad_sketch(kind))
    def sketch_node(message: Message) -> Message:
        content = RecordDict({"sketch": ArrayRecord({"sketch": Array(sketch)}),
                              "metrics": MetricRecord({"num-examples": 10})})
        return Message(content, reply_to=message)

    strategy = StoCFL(seed=0, query_timeout=5)
    strategy.sketches.anchor = REFERENCE
    grid = FakeGrid({1: bilevel_node(1.0), BAD_NODE: sketch_node})
    with flwr_warnings() as lines:
        sketches = strategy.sketches.ask(grid, [1, BAD_NODE], strategy.clustering)
    assert list(sketches) == [1] and BAD_NODE in strategy.sketches.plain
    assert BAD_NODE not in strategy.clustering.cluster_of
    assert_named_once(lines, BAD_NODE)


EVAL_KINDS = ["weight-missing", "weight-not-positive", "weight-not-finite", "weight-absurd",
              "weight-list", "metric", "no-metrics", "two-metrics", "error"]


@pytest.mark.parametrize("kind", EVAL_KINDS)
@FEW
@given(data=st.data())
def test_federated_evaluation_is_the_mean_without_the_bad_reply(
        kind: str, data: st.DataObject) -> None:
    """Evaluation replies carry metrics only: the train corruptions of the metrics."""
    make = data.draw(corruption(kind))

    def evaluation(node: int, acc: float, n: int) -> Message:
        request = instruction(RecordDict({"arrays": REFERENCE}), "evaluate", dst=node)
        return Message(RecordDict({"metrics": MetricRecord(
            {"num-examples": n, "train-loss": 1 - acc})}), reply_to=request)

    def without_arrays(reply: Message) -> Message:
        if reply.has_error():
            return reply
        content = RecordDict()
        for name, record in reply.content.metric_records.items():
            content[name] = record
        return Message(content, reply_to=instruction(RecordDict(), "evaluate", dst=BAD_NODE))

    good = [evaluation(1, 0.5, 10), evaluation(2, 0.9, 30)]
    bad = without_arrays(make(instruction(RecordDict({"arrays": REFERENCE}), "evaluate",
                                          dst=BAD_NODE), REFERENCE))
    results = []
    with flwr_warnings() as lines:
        for replies in (good, [good[0], bad, good[1]]):
            strategy = FedAvg()
            results.append(dict(strategy.aggregate_evaluate(1, replies) or {}))
    assert results[1] == results[0] and results[0]["train-loss"] == pytest.approx(0.2)
    assert_named_once(lines, BAD_NODE)


def hierfl_node(amount: float) -> Callable[[Message], Message]:
    """A sound HierFL user: one class histogram, and training that adds ``amount``."""
    train = adder(amount)

    def handle(message: Message) -> Message:
        if message.metadata.message_type == "query.histogram":
            return histogram_node(np.array([4, 1, 0, 2], np.int64))(message)
        return train(message)
    return handle


def hierfl_round(bad: Callable[[Message], Message]) -> dict[str, np.ndarray]:
    from fedgsp_flwr.strategies import HierFL

    nodes = {1: hierfl_node(1.0), 2: hierfl_node(2.0), 3: hierfl_node(4.0),
             4: hierfl_node(8.0), BAD_NODE: bad}
    strategy = HierFL(num_edges=2, reach_per_user=2, policy="greedy", tau2=2, seed=0,
                      fraction_evaluate=0.0, min_available_nodes=1,
                      train_timeout=5, query_timeout=5)
    result = strategy.start(FakeGrid(nodes), REFERENCE, num_rounds=1, timeout=5)
    assert result.arrays is not None
    return {k: v.numpy() for k, v in result.arrays.items()}


@pytest.mark.parametrize("kind", KINDS)
@FEW
@given(data=st.data())
def test_hierfl_cloud_model_is_the_model_with_the_bad_reply_refused(
        kind: str, data: st.DataObject) -> None:
    """The corrupted user's edge averages its other users only, in both edge rounds;
    the cloud model equals the one where that user's replies are error replies.
    """
    make = data.draw(corruption(kind))
    sound = hierfl_node(1.0)

    def corrupted(message: Message) -> Message:
        if message.metadata.message_type == "query.histogram":
            return sound(message)
        return hostile(make)(message)

    def refused(message: Message) -> Message:
        if message.metadata.message_type == "query.histogram":
            return sound(message)
        return Message(Error(code=2, reason="refused"), reply_to=message)

    with flwr_warnings() as lines:
        dirty = hierfl_round(corrupted)
    clean = hierfl_round(refused)
    for key in SHAPES:
        np.testing.assert_array_equal(dirty[key], clean[key])
    assert len([line for line in lines if f"node {BAD_NODE}" in line]) == 2  # 2 edge rounds
