"""Drop-in: every strategy, with its default arguments, in a plain Flower ClientApp shaped
like Flower's quickstart (only @app.train / @app.evaluate, its own metric names, ``lr``
only in the train config); and the same app after adding our hooks in a few lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import plain_clientapp
import pytest
from fakegrid import FakeGrid
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Strategy
from helpers import make_context, run_rounds

from fedgsp_flwr.clients import ClientHooks, register_hooks
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.strategies import (
    CFL,
    FLHC,
    IDA,
    IFCA,
    Ditto,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedFusion,
    FedGSP,
    FedMMD,
    FedProx,
    FedYogi,
    FeSEM,
    HierFL,
    SemiFL,
    StoCFL,
    TrainingStalled,
)

NODES = 6
LR = 0.5
DEFAULTS: dict[str, Callable[[], Any]] = {
    "fedavg": FedAvg, "fedprox": FedProx, "fedgsp": FedGSP, "semifl": SemiFL,
    "hierfl": HierFL, "stocfl": StoCFL, "fesem": FeSEM, "ifca": IFCA, "cfl": CFL,
    "ditto": Ditto, "flhc": FLHC,
}
# The hooks each strategy asks for, in order (none for FedAvg and FedProx).
QUERY = {"fedgsp": ("query.histogram",), "semifl": ("query.histogram",),
         "hierfl": ("query.histogram",), "fesem": ("query.partition",),
         "stocfl": ("query.partition", "query.sketch"),
         "ifca": ("query.partition", "train.ifca"), "cfl": ("query.partition",),
         "ditto": ("train.ditto",), "flhc": ("query.partition",)}
# Flower's sampling asks for partition ids (a probe and its confirmation); a plain app keeps Flower's own
# node-id order, which loses nothing, so an INFO line says so and no warning.
SAMPLING = ("fedavg", "fedprox", "ditto")


def hooks() -> ClientHooks:
    """What our handlers need from the plain app: its data and its model."""
    def load_data(context: Context) -> ClientData:
        x, y = plain_clientapp.load_partition(int(context.node_config["partition-id"]))
        return ClientData(x, y, x, y, plain_clientapp.CLASSES)

    return ClientHooks(load_data=load_data,
                       build_model=lambda _context, _data: plain_clientapp.Net())


def grid_of(app_factory: Callable[[], ClientApp]) -> FakeGrid:
    handlers = {}
    for node in range(NODES):
        app, context = app_factory(), make_context(node, NODES)
        handlers[node] = lambda message, a=app, c=context: a(message, c)
    return FakeGrid(handlers)


def with_our_handlers() -> ClientApp:
    # The few lines an existing project adds to its ClientApp:
    app = plain_clientapp.make_app()
    register_hooks(app, hooks())  # query.histogram, query.sketch, train.bilevel
    return app


def initial() -> ArrayRecord:
    return ArrayRecord(plain_clientapp.Net().state_dict())


def run(strategy: Strategy, grid: FakeGrid, rounds: int = 2) -> ArrayRecord:
    start = initial()
    result = run_rounds(strategy, grid, start, rounds, lr=LR)
    assert [(k, a.shape) for k, a in result.arrays.items()] == [
        (k, a.shape) for k, a in start.items()]
    moved = [not np.array_equal(result.arrays[k].numpy(), start[k].numpy()) for k in start]
    assert all(moved), "the model did not train"
    return result.arrays


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_every_strategy_with_defaults_trains_a_plain_quickstart_app(
        name: str, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    strategy = DEFAULTS[name]()
    grid = grid_of(lambda: plain_clientapp.make_app(seen))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run(strategy, grid)
    last = strategy.history[2]
    # Nothing rejected, nothing skipped, metrics under the app's own names.
    assert last.get("train-rejected", 0) == 0 and last.get("skipped-nodes", 0) == 0
    assert last.get("eval-rejected", 0) == 0 and last["eval_acc"] > 0.25
    assert "train_loss" in last and "eval_loss" in last
    if name == "stocfl":
        assert 0 < last["eval_acc-global"] <= 1 and len(strategy.sketches.plain) == NODES
    if name == "ditto":  # FedAvg without personal models
        assert last["personal-clients"] == 0 and last["plain-clients"] == NODES
        assert last["eval_acc-global"] == last["eval_acc"]
    # The train config reaches the app's handler unchanged: relay hops, edge rounds...
    trains = [config for kind, config in seen if kind == "train"]
    assert trains and all(config["lr"] == LR for config in trains)
    if name in ("fedgsp", "semifl"):
        assert all("relay-hop" in config for config in trains)
    if name == "hierfl":
        assert {config["edge-round"] for config in trains} == {0, 1}
    # A missing hook costs two messages (the probe, and a second node's to confirm it)
    # and one warning per run, not one per node.
    pushed = [kind for _, _, kind, _ in grid.pushed]
    missing = [r.getMessage() for r in caplog.records if "ClientApp has no '" in r.getMessage()]
    if name in QUERY:
        assert len(missing) == len(QUERY[name])
        for query, warning in zip(QUERY[name], missing, strict=True):
            assert pushed.count(query) == 2
            assert query in warning and "register_hooks(app" in warning
    else:
        assert not missing
    queries = [kind for kind in pushed if kind.startswith("query")]
    assert queries == [q for q in QUERY.get(name, ()) if q.startswith("query")
                       for _ in range(2)] + (["query.partition"] * 2 if name in SAMPLING else [])
    assert not any("no histogram from node" in r.getMessage() for r in caplog.records)
    # Cluster, centre, edge and group models, with their members, for saving.
    models = strategy.group_models()
    assert bool(models) == (name in ("fedgsp", "semifl", "hierfl", "fesem", "ifca", "cfl"))
    for group in models.values():
        assert list(group.arrays.keys()) == list(initial().keys())
        assert set(group.nodes) <= set(range(NODES))
    if name == "semifl":  # keyed by cluster id, each with its cluster's members
        assert all(sorted(g.nodes) == sorted(strategy.clusters[c]) for c, g in models.items())


BASELINES: dict[str, Callable[[], Any]] = {
    "fedadagrad": FedAdagrad, "fedadam": FedAdam, "fedyogi": FedYogi, "ida": IDA,
    "fedmmd": FedMMD, "fedfusion": FedFusion}


@pytest.mark.parametrize("name", list(DEFAULTS) + list(BASELINES))
def test_a_batchnorm_model_keeps_its_integer_buffer_through_every_strategy(
        name: str) -> None:
    # BatchNorm's num_batches_tracked is int64 in the app's state dict: an aggregate that
    # returned it as float64 would make every later int64 reply a "dtype" misfit.
    strategy = {**DEFAULTS, **BASELINES}[name]()
    grid = grid_of(lambda: plain_clientapp.make_app(net=plain_clientapp.BatchNormNet))
    start = ArrayRecord(plain_clientapp.BatchNormNet().state_dict())
    result = run_rounds(strategy, grid, start, 2, lr=LR)  # round 2's replies misfit
    assert all(strategy.history[r].get("train-rejected", 0) == 0 for r in (1, 2))
    assert [(k, a.dtype) for k, a in result.arrays.items()] == [
        (k, a.dtype) for k, a in start.items()]
    # each training step adds one batch; a mean of counts stays a whole count
    tracked = int(result.arrays["bn.num_batches_tracked"].numpy())
    assert 1 <= tracked <= 2 * NODES, tracked


def test_our_handlers_enable_histogram_grouping_and_sketch_clustering() -> None:
    gsp = FedGSP(num_groups=2, kappa=1.0, seed=0)
    grid = grid_of(with_our_handlers)
    run(gsp, grid)
    assert len(gsp.known.histograms) == NODES and not gsp.known.without
    assert gsp.history[2]["hops"] == NODES and "cpd-median" in gsp.history[2]
    assert {t for _, _, t, _ in grid.pushed} == {"query.histogram", "train", "evaluate"}

    stocfl = StoCFL(seed=0, tau=0.3)
    grid = grid_of(with_our_handlers)
    run(stocfl, grid)
    assert not stocfl.sketches.plain and stocfl.history[2]["clustered-clients"] == NODES
    assert {t for _, _, t, _ in grid.pushed} >= {"query.sketch", "train.bilevel"}
    assert "train-loss" in stocfl.history[2] and "global-train-loss" in stocfl.history[2]


def test_stocfl_without_a_bilevel_handler_trains_both_models_with_plain_messages(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def app() -> ClientApp:
        return register_hooks(plain_clientapp.make_app(seen), hooks(),
                              handlers=("histogram", "sketch"))

    strategy = StoCFL(seed=0, tau=0.3, lambda_=0.25)
    grid = grid_of(app)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run(strategy, grid)
    pushed = [kind for _, _, kind, _ in grid.pushed]
    assert pushed.count("train.bilevel") == 2, "two probes, then plain train messages"
    assert sum("has no 'train.bilevel'" in r.getMessage() for r in caplog.records) == 1
    trains = [config for kind, config in seen if kind == "train"]
    assert len(trains) == 2 * 2 * NODES  # two rounds, a cluster and a global training each
    assert all(c["lr"] == LR and c["lambda"] == 0.25 for c in trains)
    last = strategy.history[2]
    assert last["clusters-trained"] >= 1 and last.get("train-rejected", 0) == 0
    assert "train_loss" in last and "global-train_loss" in last
    start = initial()
    assert all(not np.array_equal(g.arrays["fc.weight"].numpy(), start["fc.weight"].numpy())
               for g in strategy.group_models().values())


def failing_train(error: str, rounds: set[int] | None = None) -> Callable[[Message], str | None]:
    """Fail every train message (of ``rounds``, if given) with ``error``."""
    def fail(msg: Message) -> str | None:
        config = msg.content["config"]
        return error if rounds is None or config.get("server-round") in rounds else None
    return fail


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_a_run_where_every_training_fails_stops_with_the_clientapps_error(name: str) -> None:
    error = "dataset 'mnist' not found: run apt-get install dataset-fashion-mnist"
    seen: list[tuple[str, dict[str, Any]]] = []
    grid = grid_of(lambda: plain_clientapp.make_app(seen, fail=failing_train(error)))
    strategy = DEFAULTS[name]()
    start = initial()
    with pytest.raises(TrainingStalled, match="not found: run apt-get install") as info:
        run_rounds(strategy, grid, start, 5, lr=LR)
    assert "no round trained in the last 3 (rounds 1-3)" in str(info.value)
    assert "Fix:" in str(info.value) and info.value.arrays is start
    rounds = {config["server-round"] for kind, config in seen if kind == "train"}
    assert rounds == {1, 2, 3}, "the run must stop after 3 rounds without training"


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_a_round_that_trains_nothing_keeps_the_previous_model(name: str) -> None:
    grid = grid_of(lambda: plain_clientapp.make_app(fail=failing_train("disk full", {2})))
    strategy = DEFAULTS[name]()
    models: dict[int, ArrayRecord] = {}

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        models[server_round] = arrays
        return MetricRecord({"seen": server_round})

    result = strategy.start(grid, initial(), num_rounds=2, timeout=30,
                            train_config=ConfigRecord({"lr": LR}), evaluate_fn=evaluate_fn)
    for key in models[1]:
        np.testing.assert_array_equal(models[2][key].numpy(), models[1][key].numpy())
        np.testing.assert_array_equal(result.arrays[key].numpy(), models[1][key].numpy())
    assert not np.array_equal(models[1]["fc.weight"].numpy(), models[0]["fc.weight"].numpy())


def test_a_run_shorter_than_the_limit_that_trains_nothing_does_not_complete() -> None:
    grid = grid_of(lambda: plain_clientapp.make_app(fail=failing_train("CUDA out of memory")))
    with pytest.raises(TrainingStalled, match="no round of the run's 2 trained.*CUDA"):
        run_rounds(FedAvg(), grid, initial(), 2, lr=LR)


def test_replies_with_other_metric_names_are_aggregated_not_rejected() -> None:
    def node(name: str, value: float, examples: int) -> Callable[[Message], Message]:
        def handle(msg: Message) -> Message:
            metrics = MetricRecord({name: value, "num-examples": examples})
            if msg.metadata.message_type == "train":
                return Message(RecordDict({"arrays": msg.content["arrays"],
                                           "metrics": metrics}), reply_to=msg)
            return Message(RecordDict({"metrics": metrics}), reply_to=msg)
        return handle

    grid = FakeGrid({0: node("acc", 0.2, 10), 1: node("acc", 0.5, 30),
                     2: node("accuracy", 0.9, 10)})
    strategy = FedAvg()
    result = run_rounds(strategy, grid, initial(), 1)
    last = strategy.history[1]
    assert last["train-rejected"] == 0 and last["eval-rejected"] == 0
    assert last["acc"] == pytest.approx((0.2 * 10 + 0.5 * 30) / 40)
    assert last["accuracy"] == pytest.approx(0.9)
    assert result.train_metrics_clientapp[1]["acc"] == pytest.approx(0.425)


def test_start_timeout_bounds_the_replies_a_strategy_waits_for() -> None:
    grid = grid_of(plain_clientapp.make_app)
    grid.delays = {0: 6.0}
    strategy = SemiFL()  # one chain through all six nodes, node 0 first
    # 3 s: the live hops train in time on a loaded machine too
    result = strategy.start(grid, initial(), num_rounds=1, timeout=3.0,
                            train_config=ConfigRecord({"lr": LR}))
    assert strategy.history[1]["skipped-nodes"] == 1
    assert strategy.last_chains[0].hops[0].reason == "no reply within 3s"
    assert list(result.arrays.keys()) == list(initial().keys())


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_flowers_metric_aggregation_functions_replace_ours(name: str) -> None:
    calls: dict[str, int] = {"train": 0, "evaluate": 0}

    def counting(stage: str) -> Callable[[list[RecordDict], str], MetricRecord]:
        def aggregate(records: list[RecordDict], weighted_by_key: str) -> MetricRecord:
            calls[stage] += 1
            assert weighted_by_key == "num-examples" and records
            return MetricRecord({f"my-{stage}-replies": len(records)})
        return aggregate

    strategy = DEFAULTS[name](train_metrics_aggr_fn=counting("train"),
                              evaluate_metrics_aggr_fn=counting("evaluate"))
    run(strategy, grid_of(plain_clientapp.make_app))
    last = strategy.history[2]
    assert calls["train"] >= 2 and calls["evaluate"] >= 2
    assert last["my-train-replies"] >= 1 and "train_loss" not in last
    assert any(key.startswith("eval-my-evaluate-replies") for key in last), sorted(last)


def test_a_resumed_run_stops_and_keeps_its_model_as_a_fresh_one_does() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    grid = grid_of(lambda: plain_clientapp.make_app(seen, fail=failing_train("disk full")))
    start = initial()
    with pytest.raises(TrainingStalled, match="rounds 3-5.*disk full") as info:
        strategy = FedGSP()
        strategy.resumed_after = 2
        strategy.start(grid, start, num_rounds=4, timeout=30, train_config=ConfigRecord({"lr": LR}))
    assert info.value.arrays is start


def test_nodes_that_take_plain_train_hops_survive_a_checkpoint() -> None:
    strategy = SemiFL(relay_message_type="train.hop")
    strategy.plain_nodes = {7, 9}
    resumed = SemiFL(relay_message_type="train.hop")
    resumed.restore_state(strategy.checkpoint_state(), lambda n: n + 100)
    assert resumed.plain_nodes == {107, 109}


def test_stocfl_asks_a_silent_plain_node_back_with_an_evaluation() -> None:
    dropped: set[int] = set()
    grid = grid_of(plain_clientapp.make_app)
    inner = grid.handlers[0]

    def silent_once(message: Message) -> Message | None:
        if message.metadata.message_type == "train" and 0 not in dropped:
            dropped.add(0)
            return None  # the node misses its first training round
        return inner(message)

    grid.handlers[0] = silent_once
    strategy = StoCFL(train_timeout=5.0)  # the live nodes train in time under load too
    run_rounds(strategy, grid, initial(), 2, lr=LR)
    to_node_0 = [kind for _, node, kind, _ in grid.pushed if node == 0]
    # Round 1: the partition and sketch probes (no handlers), the missed training, no
    # evaluation (a suspect); round 2: asked back with an evaluation, then trained and
    # evaluated.
    assert to_node_0 == ["query.partition", "query.sketch", "train", "evaluate", "train",
                         "evaluate", "evaluate"]
    assert 0 not in strategy.sketches.suspects and strategy.history[2].get("train-rejected", 0) == 0
