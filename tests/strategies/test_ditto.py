"""Ditto as a Flower strategy on an in-process grid: the global model is FedAvg's bit for
bit, the personal models stay in the nodes' state and are what evaluation scores, plain
ClientApps run it as FedAvg, hostile replies never reach the model.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import plain_clientapp
import pytest
from fakegrid import FakeGrid
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from helpers import make_context, run_rounds

from fedgsp_flwr.clients import ClientHooks, register_hooks
from fedgsp_flwr.clients.ditto import (
    PERSONAL_KEY,
    make_ditto_evaluate_handler,
    make_ditto_train_handler,
)
from fedgsp_flwr.clients.handlers import local_seed
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.models import build_model
from fedgsp_flwr.strategies import FedAvg
from fedgsp_flwr.strategies.ditto import Ditto
from fedgsp_flwr.training import train

NODES = 6
LR = 0.1
SETTINGS = {"lr": LR, "local-epochs": 1, "batch-size": 10}


def skewed(partition: int) -> ClientData:
    """Node i holds mostly class i mod 4, in its training and its test split alike."""
    x, y = plain_clientapp.load_partition(partition)
    return ClientData(x[:30], y[:30], x[30:], y[30:], plain_clientapp.CLASSES)


def net(*_: object) -> Any:
    return build_model("logistic", (plain_clientapp.FEATURES,), plain_clientapp.CLASSES,
                       seed=0)


def initial() -> ArrayRecord:
    return ArrayRecord(net().state_dict())


class Federation:
    """Nodes running our handlers (``ditto``: also the Ditto ones), each with a Context
    kept across messages, as the simulation engine keeps it for a run.
    """

    def __init__(self, nodes: range | list[int] = range(NODES), ditto: bool = True,
                 plain: tuple[int, ...] = ()) -> None:
        self.contexts: dict[int, Context] = {}
        handlers = {}
        for node in nodes:
            hooks = ClientHooks(load_data=lambda _c, p=node: skewed(p), build_model=net)
            app = register_hooks(ClientApp(), hooks, handlers=("train", "evaluate"))
            if ditto and node not in plain:
                app.train("ditto")(make_ditto_train_handler(hooks))
                app.evaluate("ditto")(make_ditto_evaluate_handler(hooks))
            self.contexts[node] = make_context(node, NODES)
            handlers[node] = lambda message, a=app, c=self.contexts[node]: a(message, c)
        self.grid = FakeGrid(handlers)

    def personal(self, node: int) -> ArrayRecord | None:
        return self.contexts[node].state.array_records.get(PERSONAL_KEY)

    def pushed(self, kind: str) -> list[tuple[int, Message]]:
        return [(node, m) for _, node, k, m in self.grid.pushed if k == kind]


def start(strategy: Any, federation: Federation, rounds: int, **config: Any) -> Any:
    return run_rounds(strategy, federation.grid, initial(), rounds, **{**SETTINGS, **config})


def same(a: ArrayRecord, b: ArrayRecord) -> bool:
    return list(a.keys()) == list(b.keys()) and all(
        a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)


def distance(a: ArrayRecord, b: ArrayRecord) -> float:
    return float(np.sqrt(sum(((a[k].numpy() - b[k].numpy()) ** 2).sum() for k in a)))


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_the_global_model_is_fedavgs_bit_for_bit(fraction: float) -> None:
    kwargs = {"fraction_train": fraction, "fraction_evaluate": 1.0, "min_train_nodes": 1}
    random.seed(7)  # Flower's FedAvg samples with Python's random
    fedavg = FedAvg(**kwargs)
    ours = start(fedavg, Federation(), 3)
    random.seed(7)
    ditto = Ditto(lambda_=0.5, **kwargs)
    federation = Federation()
    theirs = start(ditto, federation, 3)
    assert same(theirs.arrays, ours.arrays)
    assert not same(theirs.arrays, initial())
    for r in (1, 2, 3):
        assert ditto.history[r]["train-loss"] == fedavg.history[r]["train-loss"]
        # w's scores are FedAvg's evaluation of the same model on the same nodes
        assert ditto.history[r]["eval-loss-global"] == fedavg.history[r]["eval-loss"]
        assert ditto.history[r]["eval-acc-global"] == fedavg.history[r]["eval-acc"]
        assert ditto.history[r]["train-replies"] == fedavg.history[r]["train-replies"]
    assert {k for _, _, k, _ in federation.grid.pushed} == {
        "query.partition", "train.ditto", "evaluate.ditto"}
    sent = federation.pushed("train.ditto")[0][1].content["config"]
    assert (sent["lambda"], sent["personal-epochs"], sent["personal-steps"]) == (0.5, 0, 0)


def test_with_lambda_zero_each_personal_model_is_local_training_from_the_first_w() -> None:
    federation = Federation()
    strategy = Ditto(lambda_=0.0, fraction_train=1.0, fraction_evaluate=1.0)
    start(strategy, federation, 3)
    for node in range(NODES):
        local = net()
        for server_round in (1, 2, 3):
            cfg = ConfigRecord({**SETTINGS, "server-round": server_round})
            data = skewed(node)
            train(local, data.x_train, data.y_train, epochs=1, lr=LR, batch_size=10,
                  seed=local_seed(federation.contexts[node], cfg))
        assert same(federation.personal(node), ArrayRecord(local.state_dict()))
    last = strategy.history[3]
    # Purely local models fit their own skewed data better than the shared one.
    assert last["eval-acc"] > last["eval-acc-global"] + 0.1
    assert last["eval-personal-clients"] == NODES and last["personal-clients"] == NODES


def test_with_a_large_lambda_the_personal_models_stay_at_the_global_one() -> None:
    lr = 0.01
    federation = Federation()
    strategy = Ditto(lambda_=1 / lr, fraction_train=1.0, fraction_evaluate=1.0)
    result = start(strategy, federation, 3, lr=lr, **{"local-epochs": 4})
    received = federation.pushed("train.ditto")[-1][1].content["arrays"]  # round 3's w
    moved = distance(result.arrays, received)  # w's move in the last round
    for node in range(NODES):
        assert distance(federation.personal(node), received) < 0.25 * moved
    # Each round's personal models score as the w they received: the previous round's.
    for r in (2, 3):
        now, before = strategy.history[r], strategy.history[r - 1]
        assert now["eval-loss"] == pytest.approx(before["eval-loss-global"], rel=0.03)
        assert abs(now["eval-acc"] - before["eval-acc-global"]) <= 0.1  # 60 examples


def test_evaluation_scores_the_personal_models_of_the_nodes_that_trained() -> None:
    federation = Federation()
    strategy = Ditto(lambda_=0.1, fraction_train=0.5, fraction_evaluate=1.0,
                     min_train_nodes=1)
    random.seed(3)
    start(strategy, federation, 2, **{"local-epochs": 3})
    trained = {node for node, _ in federation.pushed("train.ditto")}
    assert 0 < len(trained) < NODES
    assert {n for n in range(NODES) if federation.personal(n) is not None} == trained
    last = strategy.history[2]
    assert last["eval-personal-clients"] == len(trained)
    assert last["eval-replies"] == NODES and last["eval-rejected"] == 0
    # The mean personal-model flag is the evaluated examples' share of trained nodes.
    assert last["eval-personal-model"] == pytest.approx(len(trained) / NODES)


def test_a_plain_app_runs_fedavg_with_two_probes_and_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    def grid() -> FakeGrid:
        return plain_clientapp.plain_grid(NODES)

    plain, first = grid(), ArrayRecord(plain_clientapp.Net().state_dict())
    strategy = Ditto()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = run_rounds(strategy, plain, first, 3, lr=0.5)
    fedavg = FedAvg()
    expected = run_rounds(fedavg, grid(), first, 3, lr=0.5)
    assert same(result.arrays, expected.arrays)
    kinds = [k for _, _, k, _ in plain.pushed]
    assert kinds.count("train.ditto") == 2 and "evaluate.ditto" not in kinds
    assert kinds.count("query.partition") == 2  # FedAvg's sampling order: two probes
    assert kinds.count("train") == 3 * NODES and kinds.count("evaluate") == 3 * NODES
    warnings = [r.getMessage() for r in caplog.records if "Ditto" in r.getMessage()]
    assert len(warnings) == 1
    assert "no 'train.ditto' handler" in warnings[0] and "reduces to FedAvg" in warnings[0]
    assert "register_hooks(app" in warnings[0]
    for r in (1, 2, 3):
        entry = strategy.history[r]
        assert entry["personal-clients"] == 0 and entry["plain-clients"] == NODES
        assert entry["eval-personal-clients"] == 0 and entry["train-rejected"] == 0
        assert entry["eval_acc"] == entry["eval_acc-global"] == fedavg.history[r]["eval_acc"]
        assert entry["train_loss"] == fedavg.history[r]["train_loss"]
    assert strategy.history[1]["bytes-sent"] == 8 * first.count_bytes()  # 2 probes + 6


def test_in_a_mixed_federation_only_the_plain_nodes_take_the_fallback(
        caplog: pytest.LogCaptureFixture) -> None:
    seed = next(s for s in range(100) if random.seed(s) or random.sample(
        range(NODES), NODES)[0] != 5)  # the probe goes to a node with the handlers
    random.seed(seed)
    federation = Federation(plain=(5,))
    strategy = Ditto(fraction_train=1.0, fraction_evaluate=1.0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start(strategy, federation, 2)
    to_plain = [k for _, n, k, _ in federation.grid.pushed if n == 5]
    assert to_plain == ["train.ditto", "train", "evaluate", "train", "evaluate"]
    assert list(strategy.plain) == [5] and federation.personal(5) is None
    lines = [r.getMessage() for r in caplog.records if "node 5 has no" in r.getMessage()]
    assert len(lines) == 1
    last = strategy.history[2]
    assert last["personal-clients"] == NODES - 1 and last["plain-clients"] == 1
    assert last["eval-personal-clients"] == NODES - 1 and last["train-rejected"] == 0


def test_a_plain_evaluate_handler_alone_scores_w_and_warns_once(
        caplog: pytest.LogCaptureFixture) -> None:
    federation = Federation(ditto=False)
    for node in list(federation.grid.handlers):
        hooks = ClientHooks(load_data=lambda _c, p=node: skewed(p), build_model=net)
        app = register_hooks(ClientApp(), hooks, handlers=("train", "evaluate"))
        app.train("ditto")(make_ditto_train_handler(hooks))
        context = federation.contexts[node]
        federation.grid.handlers[node] = lambda m, a=app, c=context: a(m, c)
    strategy = Ditto(fraction_train=1.0, fraction_evaluate=1.0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start(strategy, federation, 2)
    kinds = [k for _, _, k, _ in federation.grid.pushed]
    assert kinds.count("evaluate.ditto") == 2 and kinds.count("train.ditto") == 2 * NODES
    assert all(federation.personal(n) is not None for n in range(NODES))
    assert sum("no 'evaluate.ditto'" in r.getMessage() for r in caplog.records) == 1
    last = strategy.history[2]
    assert last["eval-personal-clients"] == 0 and last["eval-acc"] == last["eval-acc-global"]


def hostile(kind: str, rewrite: Callable[[Message], None]) -> Callable[..., Any]:
    def wrap(inner: Callable[[Message], Message]) -> Callable[[Message], Message]:
        def handle(message: Message) -> Message:
            reply = inner(message)
            if message.metadata.message_type == kind:
                rewrite(reply)
            return reply
        return handle
    return wrap


def set_metric(key: str, value: Any) -> Callable[[Message], None]:
    def rewrite(reply: Message) -> None:
        reply.content["metrics"][key] = value
    return rewrite


def set_arrays(name: str, values: dict[str, np.ndarray]) -> Callable[[Message], None]:
    def rewrite(reply: Message) -> None:
        reply.content[name] = ArrayRecord({k: Array(v) for k, v in values.items()})
    return rewrite


def test_hostile_replies_are_rejected_with_one_reason_and_never_reach_the_model(
        caplog: pytest.LogCaptureFixture) -> None:
    shapes = {k: v.numpy() for k, v in initial().items()}
    wrong = {"1.weight": np.zeros((3, 3), np.float32), "1.bias": shapes["1.bias"]}
    nan = {**shapes, "1.bias": np.full_like(shapes["1.bias"], np.nan)}
    doubles = {k: v.astype(np.float64) for k, v in shapes.items()}
    rewrites = {
        6: (set_arrays("ditto-personal", shapes), "expected one ArrayRecord, got 2"),
        7: (set_arrays("arrays", wrong), "expected float32[4, 6]"),
        8: (set_arrays("arrays", nan), "NaN or inf"),
        9: (set_arrays("arrays", doubles), "expected float32[4, 6]"),
        10: (set_metric("num-examples", math.nan), "must be a number in"),
        11: (set_metric("train-loss", math.inf), "'train-loss' is not finite"),
    }
    federation = Federation(range(NODES + len(rewrites)))
    for node, (rewrite, _) in rewrites.items():
        federation.grid.handlers[node] = hostile("train.ditto", rewrite)(
            federation.grid.handlers[node])
    federation.grid.handlers[12] = hostile("evaluate.ditto", set_metric(
        "eval-acc", math.nan))(Federation([12]).grid.handlers[12])
    strategy = Ditto(fraction_train=1.0, fraction_evaluate=1.0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = start(strategy, federation, 2)
    lines = [r.getMessage() for r in caplog.records if "rejected reply" in r.getMessage()]
    for node, (_, fragment) in rewrites.items():
        mine = [line for line in lines if f"node {node}:" in line]
        assert len(mine) == 2 and all(fragment in line for line in mine), (node, mine)
    assert strategy.history[2]["train-rejected"] == len(rewrites)
    assert strategy.history[2]["eval-rejected"] == 1
    assert sum("node 12:" in line and "'eval-acc' is not finite" in line for line in lines) == 2
    # The honest nodes' replies alone, bit for bit (node 12 trains honestly).
    expected = start(Ditto(fraction_train=1.0, fraction_evaluate=1.0),
                     Federation([*range(NODES), 12]), 2)
    assert same(result.arrays, expected.arrays)


def test_defaults_and_bad_parameters() -> None:
    strategy = Ditto()
    assert (strategy.lambda_, strategy.personal_epochs, strategy.personal_steps) == (1.0, 0, 0)
    meta = strategy.checkpoint_state().meta  # beside FedAvg's, what it knows of handlers
    assert {k: v for k, v in meta.items() if k not in ("hooks", "plain", "plain-eval")
            } == FedAvg().checkpoint_state().meta
    for kwargs, fragment in [
            ({"lambda_": -0.1}, "lambda_ must be >= 0, got -0.1"),
            ({"lambda_": math.inf}, "lambda_ must be a finite number >= 0"),
            ({"lambda_": True}, "lambda_ must be of type float, got True"),
            ({"personal_epochs": -1}, "personal_epochs must be >= 0"),
            ({"personal_steps": 1.5}, "personal_steps must be of type int"),
            ({"personal_epochs": 1, "personal_steps": 2}, "set at most one"),
            ({"train_timeout": 0}, "train_timeout must be > 0")]:
        with pytest.raises(ValueError, match=f"Ditto: {fragment}"):
            Ditto(**kwargs)


def test_personal_settings_go_to_the_clients() -> None:
    federation = Federation()
    strategy = Ditto(lambda_=0.0, personal_steps=1, fraction_train=1.0, fraction_evaluate=0.0)
    start(strategy, federation, 1)
    for node in range(NODES):  # one step from the initial model
        data, model = skewed(node), net()
        cfg = ConfigRecord({**SETTINGS, "server-round": 1})
        train(model, data.x_train, data.y_train, epochs=1, lr=LR, batch_size=10, steps=1,
              seed=local_seed(federation.contexts[node], cfg))
        assert same(federation.personal(node), ArrayRecord(model.state_dict()))


def test_a_restarted_node_starts_its_personal_model_again_from_w() -> None:
    federation = Federation()
    strategy = Ditto(lambda_=0.0, fraction_train=1.0, fraction_evaluate=0.0)
    start(strategy, federation, 1)
    kept = federation.personal(1)
    federation.contexts[0].state = RecordDict()  # node 0's SuperNode restarted
    start(strategy, federation, 1)  # a resumed run: its rounds count from 1 again
    w = next(m for n, m in federation.pushed("train.ditto")[NODES:] if n == 0)
    cfg = ConfigRecord({**SETTINGS, "server-round": 1})

    def local_round(start_model: ArrayRecord, node: int) -> ArrayRecord:
        model, data = net(), skewed(node)
        model.load_state_dict(start_model.to_torch_state_dict())
        train(model, data.x_train, data.y_train, epochs=1, lr=LR, batch_size=10,
              seed=local_seed(federation.contexts[node], cfg))
        return ArrayRecord(model.state_dict())

    assert same(federation.personal(0), local_round(w.content["arrays"], 0))  # from w
    assert same(federation.personal(1), local_round(kept, 1))  # from its own model


def test_a_pull_step_that_overshoots_w_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    found = {}
    for lam in (30.0, 10.0):  # lr 0.1
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flwr"):
            start(Ditto(lambda_=lam, fraction_evaluate=0.0), Federation(range(2)), 2)
        found[lam] = [r.getMessage() for r in caplog.records if "overshoots" in r.getMessage()]
    assert len(found[30.0]) == 1 and "lr * lambda = 3 > 1" in found[30.0][0]
    assert found[10.0] == []
