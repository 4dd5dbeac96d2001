"""Lying nodes, property-based, over every strategy ``fedgsp_flwr.strategies`` exports.

A lying node sends arrays whose *declared* dtype and shape are the model's while their
bytes are not (garbage, another shape's or dtype's values, non-finite values, another
stype, megabytes of trailing data); it claims partition ids it does not hold; it
answers twice; other nodes' replies are forged. test_hostile_input.py lies through the
declared metadata; here the declaration is right and the bytes lie.

Whatever it does, ``start()`` completes; each refused reply is logged once, naming the
node; and the run's result (the final model, and the cluster / centre / edge / group
models where the strategy keeps them) is bit for bit the result of the same run in
which that node answered the same messages with an error reply. Forged replies and
replies from nodes that were not asked are ignored: the result is the run without them.

Every strategy runs on a :class:`fakegrid.FakeGrid` of four numpy nodes (no torch) that
answer every message type our strategies send (``query.partition``,
``query.histogram``, ``query.sketch``, ``train`` and its hook types ``train.ifca``,
``train.bilevel``, ``train.ditto``, ``train.fedmmd``, ``train.fedfusion``, ``evaluate``
and ``evaluate.ditto`` / ``evaluate.fedfusion``); node 666 (partition 1) is the liar.
"""

from __future__ import annotations

import functools
import io
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fakegrid import FakeGrid, MultiReplyGrid, forged, request_of, twice, with_forgery
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from test_hostile_input import FEW, flwr_warnings

import fedgsp_flwr.strategies as exported
from fedgsp_flwr.core.edge_assignment import Topology
from fedgsp_flwr.strategies.exchange import Exchange
from fedgsp_flwr.strategies.node_queries import query_histograms, query_partitions
from fedgsp_flwr.strategies.node_registry import NodeRegistry
from fedgsp_flwr.strategies.relay import run_relay
from fedgsp_flwr.strategies.state import StrategyState

# FEW's reproducible draws, fewer of them (each kind of lie is its own case, each
# example a whole federation), and no shrinking: on code that fails, a shrink would
# rerun federations many times over.
LIES = settings(FEW, max_examples=1, phases=[Phase.explicit, Phase.generate])
MORE_LIES = settings(LIES, max_examples=3)  # where an example is cheap

SHAPES = {"w": (3, 2), "b": (2,)}
INITIAL = ArrayRecord({"w": Array((np.arange(6, dtype=np.float32).reshape(3, 2) - 2) / 4),
                       "b": Array(np.array([0.5, -0.25], np.float32))})
PARAMETERS = sum(int(np.prod(s)) for s in SHAPES.values())
CLASSES = 4
BAD = 666
# node id -> partition id; the liar is partition 1, so that a relay in partition order
# hands its model on to a sound node.
PARTITIONS = {1001: 0, BAD: 1, 1003: 2, 1004: 3}
TIMEOUT = 5.0
ROUNDS = 2
REFUSED = Error(code=int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION), reason="ValueError: refused")


# --- sound nodes ------------------------------------------------------------------------

def target(partition: int) -> np.float32:
    """The value node ``partition`` trains towards: two latent groups, apart."""
    return np.float32((3.0 if partition % 2 else -3.0) + partition / 8)


def moved(record: ArrayRecord, partition: int, shift: float = 0.0) -> ArrayRecord:
    """One deterministic local fit: each array halfway to the node's target."""
    goal = target(partition) + np.float32(shift)
    return ArrayRecord({k: Array((np.float32(0.5) * a.numpy() + np.float32(0.5) * goal)
                                 .astype(a.numpy().dtype)) for k, a in record.items()})


def loss(record: ArrayRecord, partition: int) -> float:
    values = np.concatenate([a.numpy().reshape(-1).astype(np.float64)
                             for a in record.values()])
    return float(np.mean((values - target(partition)) ** 2))


def histogram(partition: int) -> np.ndarray:
    """Label counts: each latent group holds mostly two of the four classes."""
    counts = np.array([8, 8, 1, 1] if partition % 2 == 0 else [1, 1, 8, 8], np.int64)
    counts[partition % CLASSES] += partition + 1
    return counts


def sketch(partition: int, dim: int) -> np.ndarray:
    """A group direction plus a little of the node's own."""
    group = np.random.default_rng([7, partition % 2]).normal(size=dim)
    own = np.random.default_rng([8, partition]).normal(size=dim)
    return (group + 0.05 * own).astype(np.float32)


def metrics_reply(message: Message, metrics: dict[str, Any],
                  **records: ArrayRecord) -> Message:
    content = RecordDict(dict(records))
    content["metrics"] = MetricRecord(metrics)
    return Message(content, reply_to=message)


def sound_node(partition: int, shift: float = 0.0) -> Callable[[Message], Message]:
    """A node that answers every message type our strategies send, in numpy.

    ``shift`` moves its training target (another node's answer to the same message).
    """
    examples = 10 + 3 * partition

    def handle(message: Message) -> Message:
        kind, content = message.metadata.message_type, message.content
        config = content.config_records.get("config", ConfigRecord())
        if kind == "query.partition":
            return metrics_reply(message, {"partition-id": partition})
        if kind == "query.histogram":
            counts = histogram(partition)
            return metrics_reply(message, {"num-examples": int(counts.sum()),
                                           "partition-id": partition},
                                 histogram=ArrayRecord({"histogram": Array(counts)}))
        if kind == "query.sketch":
            dim = int(config.get("sketch-dim", 0)) or sum(
                int(np.prod(a.shape)) for a in content["arrays"].values())
            return metrics_reply(message, {"num-examples": examples, "partition-id": partition},
                                 sketch=ArrayRecord({"sketch": Array(sketch(partition, dim))}))
        train = {"num-examples": examples}
        if kind == "train.ifca":
            models = [content[f"model-{j}"] for j in range(len(content.array_records))]
            losses = [loss(m, partition) for m in models]
            choice = int(np.argmin(losses))
            return metrics_reply(message, {**train, "train-loss": losses[choice],
                                           "ifca-choice": choice, "ifca-losses": losses},
                                 arrays=moved(models[choice], partition, shift))
        if kind == "train.bilevel":
            return metrics_reply(message, {**train, "train-loss": loss(content["global"],
                                                                       partition)},
                                 **{"global": moved(content["global"], partition, shift),
                                    "cluster": moved(content["cluster"], partition,
                                                     shift + 0.5)})
        if kind.startswith("train"):
            return metrics_reply(message, {**train, "train-loss": loss(content["arrays"],
                                                                       partition)},
                                 arrays=moved(content["arrays"], partition, shift))
        if kind.startswith("evaluate"):
            value = loss(content["arrays"], partition)
            metrics = {"num-examples": 5, "eval-loss": value, "eval-acc": 1 / (1 + value)}
            if kind == "evaluate.ditto":
                metrics.update({"eval-loss-global": value, "eval-acc-global": 1 / (1 + value),
                                "personal-model": 0})
            return metrics_reply(message, metrics)
        raise ValueError(f"No {kind} function registered with name 'x'")

    return handle


def sound_nodes() -> dict[int, Callable[[Message], Message]]:
    return {node: sound_node(p) for node, p in PARTITIONS.items()}


# --- the lies ---------------------------------------------------------------------------

LIE_KINDS = ["garbage", "one-element", "transposed", "float64-bytes", "int8-bytes",
             "non-finite", "beyond-range", "torch-stype", "trailing-bytes", "huge-array"]
MB = 2**20


@functools.cache
def big_data() -> tuple[bytes, bytes]:
    """16 MB of junk, and an 8 MB array's npy bytes: made once for the module."""
    junk = np.random.default_rng(0).bytes(16 * MB)
    return junk, npy(np.zeros(2 * MB, np.float32))


def npy(values: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, values, allow_pickle=False)
    return buffer.getvalue()


def declared(like: Array, data: bytes, stype: str = "numpy.ndarray") -> Array:
    """An Array that declares ``like``'s dtype and shape over ``data``."""
    return Array(dtype=like.dtype, shape=tuple(like.shape), stype=stype, data=data)


Lie = Callable[[Array], Array]


@st.composite
def lies(draw: st.DrawFn, kind: str) -> Lie:
    """A function from a sound array to a lie about it of ``kind``: the declared dtype
    and shape are the sound array's (but for ``non-finite`` of an integer array, which
    cannot hold NaN: there the declaration is the float values' own).
    """
    if kind == "garbage":
        data = draw(st.binary(min_size=1, max_size=256))
        return lambda like: declared(like, data)
    if kind == "one-element":
        value = draw(st.floats(-10, 10, allow_nan=False, width=32))
        return lambda like: declared(like, npy(np.full((1,), value).astype(like.numpy().dtype)))
    if kind == "transposed":
        def transposed(like: Array) -> Array:
            values = like.numpy()
            shape = values.shape[::-1] if values.shape[::-1] != values.shape else (
                1, *values.shape)
            return declared(like, npy(np.ascontiguousarray(values.T).reshape(shape)))
        return transposed
    if kind in ("float64-bytes", "int8-bytes"):
        wanted = np.dtype(np.float64 if kind == "float64-bytes" else np.int8)

        def retyped(like: Array) -> Array:
            values = like.numpy()
            other = wanted if values.dtype != wanted else np.dtype(np.int16)
            with np.errstate(invalid="ignore", over="ignore"):
                return declared(like, npy(values.astype(other)))
        return retyped
    if kind == "non-finite":
        special = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        where = draw(st.integers(0, 10**6))

        def non_finite(like: Array) -> Array:
            values = like.numpy().astype(np.float32 if like.numpy().dtype.kind != "f"
                                         else like.numpy().dtype)
            values.reshape(-1)[where % values.size] = special
            return Array(values)  # declaration and bytes agree
        return non_finite
    if kind == "beyond-range":  # finite, but its square or float32 cast overflows
        sign = draw(st.sampled_from([1.0, -1.0]))
        where = draw(st.integers(0, 10**6))

        def beyond_range(like: Array) -> Array:
            values = like.numpy().astype(np.float32 if like.numpy().dtype.kind != "f"
                                         else like.numpy().dtype)
            values.reshape(-1)[where % values.size] = sign * np.finfo(values.dtype).max / 2
            return Array(values)
        return beyond_range
    if kind == "torch-stype":
        return lambda like: declared(like, npy(like.numpy()), stype="torch.Tensor")
    if kind == "trailing-bytes":
        junk, _ = big_data()
        return lambda like: declared(like, npy(like.numpy()) + junk)
    assert kind == "huge-array", kind
    _, huge = big_data()
    return lambda like: declared(like, huge)


@st.composite
def lying_reply(draw: st.DrawFn, kind: str) -> Callable[[Message], Message]:
    """Turns a sound reply into the same reply with one of its arrays a lie."""
    lie = draw(lies(kind))
    pick = draw(st.integers(0, 10**6))

    def rewrite(reply: Message) -> Message:
        records = reply.content.array_records
        slots = [(name, key) for name, record in records.items() for key in record]
        name, key = slots[pick % len(slots)]
        content = RecordDict()
        for record_name, record in reply.content.items():
            if record_name == name:
                record = ArrayRecord({k: lie(a) if k == key else a for k, a in record.items()})
            content[record_name] = record
        return Message(content, reply_to=request_of(reply))
    return rewrite


# --- which replies lie ------------------------------------------------------------------

STAGES: dict[str, Callable[[str], bool]] = {
    "train": lambda kind: kind.startswith("train"),
    "evaluate": lambda kind: kind.startswith("evaluate"),
    "histogram": lambda kind: kind == "query.histogram",
    "sketch": lambda kind: kind == "query.sketch",
    "partition": lambda kind: kind == "query.partition",
}


def liar(stage: str, rewrite: Callable[[Message], Message] | None,
         partition: int = PARTITIONS[BAD], claim: int | None = None
         ) -> Callable[[Message], Message]:
    """A sound node (of ``partition``'s data) whose replies of ``stage`` are rewritten
    (``None``: error replies instead); with a ``claim``, every reply that reports a
    partition id reports that one.
    """
    sound = sound_node(partition)

    def handle(message: Message) -> Message:
        if not STAGES[stage](message.metadata.message_type):
            reply = sound(message)
        elif rewrite is None:
            return Message(Error(code=REFUSED.code, reason=REFUSED.reason), reply_to=message)
        else:
            reply = rewrite(sound(message))
        if claim is not None and reply.has_content() and "metrics" in reply.content and (
                "partition-id" in reply.content["metrics"]):
            reply.content["metrics"]["partition-id"] = claim
        return reply
    return handle


# --- the strategies ---------------------------------------------------------------------

class OneChain(exported.RelayStrategy):
    """RelayStrategy is abstract (its chains come from ``make_chains``): the smallest
    concrete one, every reachable node in one chain in partition order.
    """

    def make_chains(self, server_round: int, grid: Grid) -> tuple[list[list[int]], dict]:
        return [self.known.reachable(grid, list(grid.get_node_ids()))], {}


QUICK = {"min_available_nodes": len(PARTITIONS)}
SERVER_SIDE = {**QUICK, "train_timeout": TIMEOUT, "query_timeout": TIMEOUT}
# Each exported strategy at its defaults, plus what a four-node run of a few seconds
# needs (node count, timeouts, a seed) and what makes the liar take part in it.
BUILD: dict[str, Callable[[], Strategy]] = {
    "FedAvg": lambda: exported.FedAvg(**QUICK, query_timeout=TIMEOUT),
    "FedProx": lambda: exported.FedProx(**QUICK, query_timeout=TIMEOUT),
    "FedAdagrad": lambda: exported.FedAdagrad(**QUICK, query_timeout=TIMEOUT),
    "FedAdam": lambda: exported.FedAdam(**QUICK, query_timeout=TIMEOUT),
    "FedYogi": lambda: exported.FedYogi(**QUICK, query_timeout=TIMEOUT),
    "IDA": lambda: exported.IDA(**QUICK, query_timeout=TIMEOUT),
    "FedMMD": lambda: exported.FedMMD(**SERVER_SIDE),
    "FedFusion": lambda: exported.FedFusion(**SERVER_SIDE),
    "Ditto": lambda: exported.Ditto(**SERVER_SIDE),
    # kappa=1 and two groups: at the defaults 1 of 4 one-node groups trains a round
    # and the liar could sit the run out; two groups of two give relay hand-ons.
    "FedGSP": lambda: exported.FedGSP(**SERVER_SIDE, seed=0, kappa=1.0, num_groups=2),
    "SemiFL": lambda: exported.SemiFL(**SERVER_SIDE, seed=0),
    "RelayStrategy": lambda: OneChain(**SERVER_SIDE, seed=0),
    "HierFL": lambda: exported.HierFL(**SERVER_SIDE, seed=0),
    "IFCA": lambda: exported.IFCA(**SERVER_SIDE, seed=0),
    "CFL": lambda: exported.CFL(**SERVER_SIDE, seed=0),
    "FeSEM": lambda: exported.FeSEM(**SERVER_SIDE, seed=0),
    "FLHC": lambda: exported.FLHC(**SERVER_SIDE, seed=0, warmup_rounds=1),
    "StoCFL": lambda: exported.StoCFL(**SERVER_SIDE, seed=0),
}
# Exported, but not run here, and why.
NOT_RUN = {
    # No round of its own: its train_round is its subclasses' to write (alone it
    # raises NotImplementedError). Every subclass of it (FedMMD,
    # FedFusion, Ditto, FedGSP, SemiFL, RelayStrategy, HierFL, IFCA, CFL, FeSEM,
    # FLHC, StoCFL) runs here.
    "ServerSideRound",
}
NAMES = list(BUILD)
HISTOGRAM_STRATEGIES = ["FedGSP", "SemiFL", "RelayStrategy", "HierFL"]
SKETCH_STRATEGIES = ["StoCFL"]


def exported_strategies() -> set[str]:
    return {name for name in exported.__all__
            if isinstance(obj := getattr(exported, name), type) and issubclass(obj, Strategy)}


def test_every_exported_strategy_is_driven_or_said_why_not() -> None:
    assert exported_strategies() == set(BUILD) | NOT_RUN


# --- a run and its result ---------------------------------------------------------------

@dataclass
class Outcome:
    """What a run produced, as bytes, and what it logged."""

    arrays: dict[str, tuple[str, tuple[int, ...], bytes]]
    groups: dict[int, tuple[list[int], dict[str, tuple[str, tuple[int, ...], bytes]], dict]]
    warnings: list[str]
    pushed: list[tuple[int, str]]
    strategy: Any


def snapshot(record: ArrayRecord) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every array decoded, with its dtype and shape (the decoded ones: they must be the
    declared ones) and its bytes."""
    out = {}
    for key, array in record.items():
        values = array.numpy()
        assert values.dtype == np.dtype(array.dtype) and values.shape == tuple(array.shape), (
            f"array {key!r} declares {array.dtype}{list(array.shape)} over "
            f"{values.dtype}{list(values.shape)}")
        out[key] = (str(values.dtype), values.shape, values.tobytes())
    return out


def run(name: str, handlers: dict[int, Callable[[Message], Message]] | None = None, *,
        grid: FakeGrid | None = None,
        setup: Callable[[Strategy], None] | None = None) -> Outcome:
    """``name`` built by :data:`BUILD` (then ``setup``), run for :data:`ROUNDS` rounds on
    ``grid`` (default: a FakeGrid of ``handlers``).
    """
    strategy = BUILD[name]()
    if setup is not None:
        setup(strategy)
    grid = grid if grid is not None else FakeGrid(handlers or {})
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)  # Flower's INFO summaries cost more than a run
    try:
        with flwr_warnings() as lines:
            result = strategy.start(grid, INITIAL, num_rounds=ROUNDS, timeout=TIMEOUT,
                                    train_config=ConfigRecord({"lr": 0.1}),
                                    evaluate_config=ConfigRecord())
    finally:
        flwr_logger.setLevel(level)
    groups = {g: (list(model.nodes), snapshot(model.arrays), dict(model.metrics))
              for g, model in strategy.group_models().items()}
    return Outcome(snapshot(result.arrays), groups, list(lines),
                   [(node, kind) for _, node, kind, _ in grid.pushed], strategy)


@functools.cache
def refused_run(name: str, stage: str) -> Outcome:
    """The run where the liar answers its ``stage`` messages with error replies (made
    once per strategy and stage: it does not depend on the lie).
    """
    return run(name, {**sound_nodes(), BAD: liar(stage, None)})


@functools.cache
def clean_run(name: str) -> Outcome:
    """The run where every node is sound."""
    return run(name, sound_nodes())


def naming(lines: Sequence[str], node: int) -> list[str]:
    return [line for line in lines if re.search(rf"\bnode {node}\b", line)]


def assert_same_result(got: Outcome, expected: Outcome) -> None:
    assert got.arrays.keys() == expected.arrays.keys()
    for key, value in expected.arrays.items():
        assert got.arrays[key] == value, f"final array {key!r} differs from the expected run's"
    assert got.groups.keys() == expected.groups.keys(), "other group models"
    for group, (nodes, arrays, metrics) in expected.groups.items():
        assert got.groups[group][0] == nodes, f"group {group}: other members"
        assert got.groups[group][1] == arrays, f"group {group}: other model"
        assert got.groups[group][2] == metrics, f"group {group}: other metrics"


def assert_model_shaped_and_finite(got: Outcome) -> None:
    for key, shape in SHAPES.items():
        dtype, got_shape, data = got.arrays[key]
        assert got_shape == shape and dtype == "float32", (key, dtype, got_shape)
        assert np.isfinite(np.frombuffer(data, np.float32)).all(), key
    for _, arrays, _ in got.groups.values():
        for key, (dtype, _, data) in arrays.items():
            assert np.isfinite(np.frombuffer(data, dtype)).all(), key


def refused_exchanges(outcome: Outcome, stage: str) -> int:
    """Messages of ``stage`` pushed to the liar (each one refused exchange)."""
    return sum(node == BAD and STAGES[stage](kind) for node, kind in outcome.pushed)


def assert_refused_like_an_error(name: str, stage: str, got: Outcome) -> None:
    """The run's result is the error-reply run's, the liar named once per exchange."""
    expected = refused_run(name, stage)
    exchanges = refused_exchanges(expected, stage)
    assert exchanges >= 1, f"{name}: the liar got no {stage} message"
    assert len(naming(expected.warnings, BAD)) == exchanges, (
        "an error reply is not named once per exchange", naming(expected.warnings, BAD))
    assert_same_result(got, expected)
    assert len(naming(got.warnings, BAD)) == exchanges, (
        f"warnings naming node {BAD}: {naming(got.warnings, BAD)}, expected one for each "
        f"of {exchanges} refused exchanges")
    for node in PARTITIONS:  # a sound node is never blamed for the lie (a relay's next)
        if node != BAD:
            assert naming(got.warnings, node) == naming(expected.warnings, node), node
    assert_model_shaped_and_finite(got)


# --- issue 46, build 1 and 9: lying arrays in replies, histograms, sketches -----------

Test = Callable[..., None]


def each_lie(budget: settings, names: Sequence[str] | None = None) -> Callable[[Test], Test]:
    """A test of every kind of lie in :data:`LIE_KINDS` (and, with ``names``, of every
    strategy named), its ``data`` drawn under ``budget``; the RuntimeWarnings that lying
    values raise are ignored.
    """
    def decorate(test: Test) -> Test:
        test = budget(given(data=st.data())(test))
        if names is not None:
            test = pytest.mark.parametrize("name", names)(test)
        return pytest.mark.filterwarnings("ignore::RuntimeWarning")(
            pytest.mark.parametrize("kind", LIE_KINDS)(test))
    return decorate


def assert_a_lie_refused(name: str, stage: str, kind: str, data: st.DataObject) -> None:
    """``name``'s run where the liar's replies of ``stage`` carry a lie of ``kind`` (drawn
    from ``data``) has the error-reply run's result."""
    rewrite = data.draw(lying_reply(kind))
    got = run(name, {**sound_nodes(), BAD: liar(stage, rewrite)})
    assert_refused_like_an_error(name, stage, got)


@each_lie(LIES, NAMES)
def test_a_lying_train_reply_is_refused_like_an_error_reply(
        name: str, kind: str, data: st.DataObject) -> None:
    assert_a_lie_refused(name, "train", kind, data)


@each_lie(LIES, HISTOGRAM_STRATEGIES)
def test_a_lying_histogram_is_refused_like_an_error_reply(
        name: str, kind: str, data: st.DataObject) -> None:
    assert_a_lie_refused(name, "histogram", kind, data)


@each_lie(MORE_LIES, SKETCH_STRATEGIES)
def test_a_lying_sketch_is_refused_like_an_error_reply(
        name: str, kind: str, data: st.DataObject) -> None:
    assert_a_lie_refused(name, "sketch", kind, data)


def test_a_sketch_that_is_zero_as_float32_is_refused_like_an_error_reply() -> None:
    """StoCFL clusters float32 sketches: a float64 one of tiny values is zero there."""
    def tiny(reply: Message) -> Message:
        sketch = reply.content.array_records["sketch"]["sketch"].numpy()
        content = RecordDict(dict(reply.content.items()))
        content["sketch"] = ArrayRecord({"sketch": Array(np.full(sketch.shape, 1e-50))})
        return Message(content, reply_to=request_of(reply))
    got = run("StoCFL", {**sound_nodes(), BAD: liar("sketch", tiny)})
    assert_refused_like_an_error("StoCFL", "sketch", got)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", NAMES)
@LIES
@given(data=st.data())
def test_a_lying_array_beside_an_evaluation_changes_no_model(
        name: str, data: st.DataObject) -> None:
    """Evaluation replies carry metrics only, in every strategy here: none has arrays to
    refuse. A liar that adds a lying ArrayRecord to its evaluation replies changes no
    model, and the evaluation is either the sound run's (the arrays ignored) or the run
    where those replies are error replies (refused).
    """
    lie = data.draw(lies(LIE_KINDS[NAMES.index(name) % len(LIE_KINDS)]))  # a kind each
    sent: dict[str, Array] = {}

    def with_arrays(reply: Message) -> Message:
        request_arrays = sent.get(reply.metadata.reply_to_message_id)
        content = RecordDict(dict(reply.content.items()))
        content["arrays"] = ArrayRecord({k: lie(a) for k, a in (request_arrays or {}).items()}
                                        or {"w": lie(INITIAL["w"])})
        return Message(content, reply_to=request_of(reply))

    sound = liar("evaluate", with_arrays)

    def node(message: Message) -> Message:
        if STAGES["evaluate"](message.metadata.message_type):
            sent[message.metadata.message_id] = message.content["arrays"]
        return sound(message)

    got = run(name, {**sound_nodes(), BAD: node})
    clean, refused = clean_run(name), refused_run(name, "evaluate")
    assert got.arrays == clean.arrays
    assert {g: v[:2] for g, v in got.groups.items()} == {
        g: v[:2] for g, v in clean.groups.items()}
    metrics = {g: v[2] for g, v in got.groups.items()}
    assert metrics in ({g: v[2] for g, v in clean.groups.items()},
                       {g: v[2] for g, v in refused.groups.items()})
    assert_model_shaped_and_finite(got)


@pytest.mark.parametrize("name", NAMES)
def test_a_list_where_the_others_send_a_number_crashes_no_evaluation(name: str) -> None:
    """Replies are ordered by their metrics before they are aggregated (so a seed gives
    the same bits in any arrival order): a node whose ``eval-acc`` is a list, where the
    others send a number, must be ordered too, and the run must train as the sound one.
    """
    def listed(reply: Message) -> Message:
        reply.content["metrics"]["eval-acc"] = [0.5, 0.5]
        return reply

    got = run(name, {**sound_nodes(), BAD: liar("evaluate", listed)})
    assert got.arrays == clean_run(name).arrays


# --- RelayStrategy's engine without a strategy ------------------------------------------

@each_lie(MORE_LIES)
def test_a_relay_never_hands_a_lie_on_and_blames_the_liar(kind: str,
                                                          data: st.DataObject) -> None:
    rewrite = data.draw(lying_reply(kind))
    order = [1001, BAD, 1003, 1004]

    def chain(bad: Callable[[Message], Message]) -> tuple[Any, list[str]]:
        with flwr_warnings() as lines:
            (result,) = run_relay(FakeGrid({**sound_nodes(), BAD: bad}), [order], INITIAL,
                                  ConfigRecord(), train_timeout=TIMEOUT)
        return result, list(lines)

    got, lines = chain(liar("train", rewrite))
    expected, _ = chain(liar("train", None))
    assert snapshot(got.arrays) == snapshot(expected.arrays)
    assert [(h.node_id, h.status == "ok") for h in got.hops] == [
        (h.node_id, h.status == "ok") for h in expected.hops]
    assert len(naming(lines, BAD)) == 1 and not any(
        naming(lines, n) for n in order if n != BAD), lines


# --- issue 46, build 2: expected lengths come from the server's side --------------------

def liar_first(bad: Callable[[Message], Message]) -> dict[int, Callable[[Message], Message]]:
    """The nodes with the liar first: its reply is the first one read."""
    return {BAD: bad, **{n: h for n, h in sound_nodes().items() if n != BAD}}


def wrong_length(field: str, length: int) -> Callable[[Message], Message]:
    """A consistent, finite vector ``field`` of the wrong length (a lie of content)."""
    def rewrite(reply: Message) -> Message:
        content = RecordDict(dict(reply.content.items()))
        content[field] = ArrayRecord({field: Array(np.arange(1, length + 1).astype(
            reply.content[field][field].numpy().dtype))})
        return Message(content, reply_to=request_of(reply))
    return rewrite


@pytest.mark.parametrize("num_classes", [None, CLASSES])
def test_a_first_histogram_of_the_wrong_length_gets_only_itself_refused(
        num_classes: int | None) -> None:
    grid = FakeGrid(liar_first(liar("histogram", wrong_length("histogram", 6))))
    with flwr_warnings() as lines:
        replies = query_histograms(grid, list(grid.handlers), TIMEOUT, num_classes)
    assert sorted(replies.histograms) == sorted(n for n in PARTITIONS if n != BAD)
    assert set(replies.failed) == {BAD}
    assert len(naming(lines, BAD)) == 1 and all(
        not naming(lines, n) for n in PARTITIONS if n != BAD), lines


@pytest.mark.parametrize("name", HISTOGRAM_STRATEGIES)
def test_a_strategy_keeps_the_sound_histograms_after_a_first_wrong_one(name: str) -> None:
    got = run(name, liar_first(liar("histogram", wrong_length("histogram", 6))))
    expected = run(name, liar_first(liar("histogram", None)))
    assert sorted(got.strategy.known.histograms) == sorted(n for n in PARTITIONS if n != BAD)
    assert_same_result(got, expected)
    assert len([line for line in naming(got.warnings, BAD) if "histogram" in line]) == 1


def test_the_registry_takes_the_histogram_length_the_caller_gives() -> None:
    """``num_classes`` given: the majority of replies cannot override it."""
    handlers = {n: liar("histogram", wrong_length("histogram", 6), p)
                for n, p in PARTITIONS.items() if n != 1004}
    handlers[1004] = sound_node(3)
    registry = NodeRegistry("test", TIMEOUT)
    registry.num_classes = CLASSES  # what the app knows from its dataset
    with flwr_warnings() as lines:
        registry.refresh(FakeGrid(handlers), list(handlers))
    assert list(registry.histograms) == [1004]
    assert all(len(naming(lines, n)) == 1 for n in handlers if n != 1004), lines


def stocfl_sketches(sketch_dim: int, handlers: dict[int, Callable[[Message], Message]]
                    ) -> tuple[exported.StoCFL, list[str]]:
    strategy = exported.StoCFL(min_available_nodes=len(handlers), train_timeout=TIMEOUT,
                               query_timeout=TIMEOUT, seed=0, sketch_dim=sketch_dim,
                               fraction_evaluate=0.0)
    with flwr_warnings() as lines:
        strategy.start(FakeGrid(handlers), INITIAL, num_rounds=1, timeout=TIMEOUT)
    return strategy, list(lines)


@pytest.mark.parametrize("sketch_dim, lie_dim", [(0, 3), (0, PARAMETERS + 1), (4, PARAMETERS)])
@pytest.mark.parametrize("sound", [1, 3])
@pytest.mark.parametrize("claim", [-1, None], ids=["claims-minus-1", "no-claim"])
def test_a_sketch_of_the_wrong_dimension_is_refused_whatever_comes_first(
        sketch_dim: int, lie_dim: int, sound: int, claim: int | None) -> None:
    """The expected length is ``sketch_dim``, or the model's parameter count when it is
    0 (this model has no buffers: every array element is a parameter). A liar that
    claims partition -1 (first in partition order, if believed), or that simply comes
    first (partition 1 before 2 and 3), with a sketch of another length is refused,
    and the sound nodes are clustered; also with one sound node, where no majority can
    tell.
    """
    sound_ids = [1004] if sound == 1 else [1001, 1003, 1004]
    handlers = {BAD: liar("sketch", wrong_length("sketch", lie_dim), claim=claim),
                **{n: sound_node(PARTITIONS[n]) for n in sound_ids}}
    strategy, lines = stocfl_sketches(sketch_dim, handlers)
    assert BAD in strategy.sketches.plain and BAD not in strategy.clustering.cluster_of
    assert sorted(strategy.clustering.cluster_of) == sorted(sound_ids)
    assert strategy.clustering.dim == (sketch_dim or PARAMETERS)
    assert len([line for line in naming(lines, BAD) if "sketch" in line]) == 1, lines
    assert not any(naming(lines, n) for n in sound_ids), lines


# --- issue 46, build 2: partition ids ---------------------------------------------------

PARTITION_STRATEGIES = [n for n in NAMES if BUILD[n]().known.asks == "partition"
                        and n != "StoCFL"]  # StoCFL keeps its own partition ids


def claiming(partition: int, error: bool = False) -> Callable[[Message], Message]:
    """The liar, claiming ``partition`` wherever it reports one (``error``: its
    ``query.partition`` gets an error reply instead)."""
    return liar("partition", None if error else (lambda reply: reply), claim=partition)


def federation_of(size: int) -> Callable[[Strategy], None]:
    """Tell the strategy's registry the federation's size (the app knows it: the number
    of partitions it made)."""
    def setup(strategy: Strategy) -> None:
        strategy.known.num_partitions = size  # type: ignore[attr-defined]
    return setup


@functools.cache
def partition_refused_run(name: str) -> Outcome:
    """The run where the liar answers ``query.partition`` with an error reply."""
    return run(name, {**sound_nodes(), BAD: claiming(-1, error=True)},
               setup=federation_of(len(PARTITIONS)))


@pytest.mark.parametrize("claim", [-1, len(PARTITIONS), 99])
@pytest.mark.parametrize("name", PARTITION_STRATEGIES)
def test_a_partition_id_out_of_range_is_refused(name: str, claim: int) -> None:
    got = run(name, {**sound_nodes(), BAD: claiming(claim)},
              setup=federation_of(len(PARTITIONS)))
    expected = partition_refused_run(name)
    assert BAD not in got.strategy.known.partition_ids
    assert got.strategy.known.partition_ids == {n: p for n, p in PARTITIONS.items() if n != BAD}
    assert len(naming(got.warnings, BAD)) == 1, got.warnings
    assert_same_result(got, expected)


def both_named(lines: Sequence[str], a: int, b: int) -> bool:
    def names(line: str, node: int) -> bool:
        return bool(re.search(rf"\bnodes? (?:[\d, ]+and )?(?:[\d, ]+)?\b{node}\b", line))
    return any(names(line, a) and names(line, b) for line in lines)


@pytest.mark.parametrize("name", PARTITION_STRATEGIES)
def test_a_duplicate_partition_claim_is_refused_for_both_nodes(name: str) -> None:
    """The liar claims partition 0, node 1001's: neither claim is believed."""
    holder = 1001
    got = run(name, {**sound_nodes(), BAD: claiming(0)})
    both_errors = {**sound_nodes(), BAD: claiming(0, error=True),
                   holder: liar("partition", None, 0)}
    expected = run(name, both_errors)
    known = got.strategy.known.partition_ids
    assert BAD not in known and holder not in known, known
    assert both_named(got.warnings, BAD, holder), got.warnings
    assert_same_result(got, expected)


@pytest.mark.parametrize("name", [*HISTOGRAM_STRATEGIES, "StoCFL"])
def test_a_duplicate_partition_claim_in_a_histogram_or_sketch_is_refused(name: str) -> None:
    """Strategies that learn partition ids with histograms or sketches (StoCFL keeps
    its own): neither claim is believed, both nodes are named, the run completes."""
    holder = 1001
    got = run(name, {**sound_nodes(), BAD: claiming(0)})
    partitions = got.strategy.node_partitions()
    assert partitions.get(BAD) != 0 and partitions.get(holder) != 0, partitions
    assert both_named(got.warnings, BAD, holder), got.warnings
    assert_model_shaped_and_finite(got)


def registry_holding(asks: str) -> NodeRegistry:
    """A registry restored from a checkpoint in which nodes 1001 and 1003 hold
    partitions 0 and 2."""
    before = NodeRegistry("test", TIMEOUT, asks=asks)
    grid = FakeGrid({n: sound_node(PARTITIONS[n]) for n in (1001, 1003)})
    before.refresh(grid, [1001, 1003])
    state = StrategyState()
    state.merge("known", before.checkpoint_state())
    after = NodeRegistry("test", TIMEOUT, asks=asks)
    after.restore_state(state.part("known"), lambda node: node)
    return after


@pytest.mark.parametrize("asks", ["partition", "histogram"])
def test_on_resume_a_node_cannot_take_over_a_partition_another_holds(asks: str) -> None:
    """No strategy-level API restores a registry alone: this is NodeRegistry's
    checkpoint state, restored, then asked about a new node claiming partition 0."""
    registry = registry_holding(asks)
    assert registry.partition_ids == {1001: 0, 1003: 2}
    grid = FakeGrid({**{n: sound_node(PARTITIONS[n]) for n in (1001, 1003)},
                     BAD: claiming(0)})
    with flwr_warnings() as lines:
        registry.refresh(grid, [1001, 1003, BAD])
    assert registry.partition_ids == {1001: 0, 1003: 2}
    assert len(naming(lines, BAD)) == 1, lines


def test_on_resume_two_claims_of_one_partition_map_no_old_node_to_either() -> None:
    """The app's resume finds the interrupted run's nodes by the partition ids the
    connected nodes report (query.partition, then checkpoint.node_map): a second node
    claiming a partition must not take over the state of the node that held it.
    """
    from fedgsp_flwr.app.checkpoint import node_map

    grid = FakeGrid({**sound_nodes(), BAD: claiming(0)})
    asked = [1001, 1003, 1004, BAD]  # the claimant answers last
    with flwr_warnings() as lines:
        current = query_partitions(grid, asked, TIMEOUT).partition_ids
    translate = node_map({42: 0, 43: 2}, current)
    assert translate(42) != BAD
    assert translate(43) == 1003
    assert both_named(lines, BAD, 1001), lines


def test_a_partition_id_out_of_range_is_refused_by_the_query() -> None:
    grid = FakeGrid({**sound_nodes(), BAD: claiming(len(PARTITIONS))})
    with flwr_warnings() as lines:
        replies = query_partitions(grid, list(grid.handlers), TIMEOUT,
                                   num_partitions=len(PARTITIONS))
    assert replies.partition_ids == {n: p for n, p in PARTITIONS.items() if n != BAD}
    assert BAD in replies.failed and len(naming(lines, BAD)) == 1, lines


# --- issue 46, build 3: replies twice, and replies from nodes not asked ----------------

@pytest.mark.parametrize("second_first", [False, True], ids=["own-first", "second-first"])
@pytest.mark.parametrize("name", NAMES)
def test_a_node_that_replies_twice_has_both_replies_refused(name: str,
                                                            second_first: bool) -> None:
    """The liar answers each training message twice (its own reply and another sound
    looking one): the result is that of the run where it sent an error reply, and it
    is named once per exchange.
    """
    grid = MultiReplyGrid(sound_nodes(), twice(
        BAD, sound_node(PARTITIONS[BAD], shift=7.0), types=STAGES["train"],
        second_first=second_first))
    got = run(name, grid=grid)
    assert sum(r.metadata.src_node_id == BAD and STAGES["train"](r.metadata.message_type)
               for r in grid.delivered) == 2 * refused_exchanges(got, "train")
    assert_refused_like_an_error(name, "train", got)


def gone(message: Message) -> Message:
    """The error reply a deployment's SuperLink makes for a message to a node whose
    heartbeat lapsed (here from the node itself; the SuperLink's comes from node 1)."""
    return Message(Error(code=int(ErrorCode.NODE_UNAVAILABLE),
                         reason="Error: Node Unavailable"), reply_to=message)


@pytest.mark.parametrize("name", NAMES)
def test_the_superlinks_reply_for_a_node_gone_offline_is_that_nodes_answer(name: str) -> None:
    """Flower's SuperLink answers a message to a node gone offline itself, from
    SUPERLINK_NODE_ID: the run is the one where the node said so, without waiting out
    the timeout or calling the SuperLink's reply a forgery."""
    handlers = {**sound_nodes(), BAD: gone}
    expected = run(name, handlers)
    grid = MultiReplyGrid(handlers, lambda message, reply: [] if reply is None else [
        forged(reply, SUPERLINK_NODE_ID) if message.metadata.dst_node_id == BAD else reply])
    got = run(name, grid=grid)
    assert any(r.metadata.src_node_id == SUPERLINK_NODE_ID for r in grid.delivered)
    assert not [line for line in got.warnings if "ignored a reply" in line], got.warnings
    assert_same_result(got, expected)
    assert naming(got.warnings, BAD) == naming(expected.warnings, BAD)


def test_without_the_messages_the_superlinks_replies_are_no_duplicates() -> None:
    """A caller that drives the aggregation itself: every node gone gets its own reply
    from SUPERLINK_NODE_ID, none refused as a second answer of node 1."""
    exchange = Exchange(None, "aggregate_train")
    for node in (1001, 1003):
        message = Message(RecordDict(), dst_node_id=node, message_type="train")
        message.metadata.__dict__["_message_id"] = f"m{node}"
        exchange.take(forged(gone(message), SUPERLINK_NODE_ID))
    assert [r.metadata.reply_to_message_id for r in exchange.result()] == ["m1001", "m1003"]


FORGER = 777  # a node that is not in the federation: it is never asked anything
VICTIM = 1003


@pytest.mark.parametrize("fresh_id, forgery_first", [(False, True), (False, False),
                                                     (True, True)],
                         ids=["to-its-message-first", "to-its-message-after",
                              "to-no-message"])
@pytest.mark.parametrize("name", NAMES)
def test_a_reply_from_a_node_not_asked_is_ignored(name: str, fresh_id: bool,
                                                  forgery_first: bool) -> None:
    """Beside each of node 1003's replies comes a forged one from node 777, which no
    message went to (to 1003's message, or to no message at all): the result is the
    run without forgeries.
    """
    grid = MultiReplyGrid(sound_nodes(), with_forgery(
        VICTIM, FORGER, sound_node(0, shift=50.0), fresh_id=fresh_id,
        forgery_first=forgery_first))
    got = run(name, grid=grid)
    assert any(r.metadata.src_node_id == FORGER for r in grid.delivered)
    assert_same_result(got, clean_run(name))
    assert_model_shaped_and_finite(got)


# --- lies that are sound bytes: what the strategy then computes must not fail ----------

def with_metric(key: str, value: float) -> Callable[[Message], Message]:
    """Rewrites a reply's ``key`` metric to ``value``."""
    def rewrite(reply: Message) -> Message:
        reply.content["metrics"][key] = value
        return reply
    return rewrite


@pytest.mark.parametrize("name", ["FedGSP", "RelayStrategy"])
def test_a_fractional_example_count_in_a_relay_is_refused_like_an_error_reply(
        name: str) -> None:
    """A hop's weight is its whole number of examples (int(0.5) is 0, and a one-node
    group's chain of weight 0 made the round's average fail)."""
    got = run(name, {**sound_nodes(), BAD: liar("train", with_metric("num-examples", 0.5))})
    assert_refused_like_an_error(name, "train", got)


@pytest.mark.parametrize("name", PARTITION_STRATEGIES)
def test_a_partition_reply_without_an_integer_id_is_refused_naming_the_node(
        name: str) -> None:
    got = run(name, {**sound_nodes(), BAD: liar("partition", with_metric("partition-id", 1.5))},
              setup=federation_of(len(PARTITIONS)))
    assert BAD not in got.strategy.known.partition_ids
    assert len(naming(got.warnings, BAD)) == 1, got.warnings
    assert_same_result(got, partition_refused_run(name))


def test_flhc_refuses_a_zero_update_where_cosine_distances_are_taken() -> None:
    """The liar returns the model it was sent: under the cosine metric its update has no
    distance, so its clustering reply is refused (it crashed the round) and the others
    cluster."""
    sound = sound_node(PARTITIONS[BAD])

    def unchanged(message: Message) -> Message:
        if not STAGES["train"](message.metadata.message_type):
            return sound(message)
        sent = message.content["arrays"]
        return metrics_reply(message, {"num-examples": 10}, arrays=ArrayRecord(
            {k: Array(a.numpy().copy()) for k, a in sent.items()}))

    def cosine(strategy: Strategy) -> None:
        strategy.metric, strategy.linkage = "cosine", "average"  # type: ignore[attr-defined]
    got = run("FLHC", {**sound_nodes(), BAD: unchanged}, setup=cosine)
    assert len([line for line in naming(got.warnings, BAD) if "zero norm" in line]) == 1, (
        got.warnings)
    assert BAD not in got.strategy.cluster_of  # type: ignore[attr-defined]
    assert len(got.strategy.cluster_of) == len(PARTITIONS) - 1  # type: ignore[attr-defined]
    assert_model_shaped_and_finite(got)


def test_hierfl_with_a_topology_file_leaves_out_a_node_it_cannot_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A topology file places users by partition id: the liar, whose histogram reply is
    refused or holds no partition id, has none; it sits out (the round crashed), named
    once."""
    topology = Topology(reach=np.ones((2, len(PARTITIONS)), dtype=bool))
    monkeypatch.setitem(BUILD, "HierFL-topology", lambda: exported.HierFL(
        **SERVER_SIDE, seed=0, num_edges=2, topology=topology))
    def no_id(reply: Message) -> Message:
        del reply.content["metrics"]["partition-id"]
        return reply

    for bad in (liar("histogram", None), liar("histogram", no_id)):
        got = run("HierFL-topology", {**sound_nodes(), BAD: bad})
        assert BAD not in got.strategy.edge_of  # type: ignore[attr-defined]
        assert len(got.strategy.edge_of) == len(PARTITIONS) - 1  # type: ignore[attr-defined]
        assert len(naming(got.warnings, BAD)) == 1, got.warnings
        assert_model_shaped_and_finite(got)
    with pytest.raises(ValueError, match="none of the 4 did"):  # a setting to fix, no lie
        run("HierFL-topology", {n: liar("histogram", no_id, p) for n, p in PARTITIONS.items()})


@pytest.mark.parametrize("name", NAMES)
def test_one_node_cannot_switch_a_hook_off_for_the_federation(name: str) -> None:
    """The first node asked says its ClientApp has none of our handlers (the error
    Flower's ClientApp gives): a second node has them, so no strategy falls back for
    every node, and the liar is named."""
    sound = sound_node(PARTITIONS[BAD])

    def forged_missing(message: Message) -> Message:
        kind = message.metadata.message_type
        if kind in ("train", "evaluate"):
            return sound(message)
        category, _, action = kind.partition(".")
        return Message(Error(code=REFUSED.code, reason=f"ValueError: No {category} "
                             f"function registered with name '{action}'"), reply_to=message)
    first = {BAD: forged_missing, **{n: h for n, h in sound_nodes().items() if n != BAD}}
    got = run(name, first)
    assert not [line for line in got.warnings if "the nodes' ClientApp has no" in line], (
        got.warnings)
    assert naming(got.warnings, BAD), got.warnings
    assert_model_shaped_and_finite(got)
