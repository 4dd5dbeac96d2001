"""The ``train.ditto`` and ``evaluate.ditto`` handlers, called through a real Flower
ClientApp: the personal model in the node state, its pull to the received global model,
and a global path that is the plain ``train`` handler's bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from helpers import instruction, make_context, vector_data

from fedgsp_flwr.clients import ClientHooks, register_hooks
from fedgsp_flwr.clients.ditto import (
    PERSONAL_KEY,
    PersonalStore,
    make_ditto_evaluate_handler,
    make_ditto_train_handler,
)
from fedgsp_flwr.clients.handlers import local_seed
from fedgsp_flwr.models import build_model
from fedgsp_flwr.training import evaluate, train

DATA = vector_data(n=90, seed=0)
LR = 0.1
SETTINGS = {"lr": LR, "local-epochs": 2, "batch-size": 16}


def net(_context: object = None, _data: object = None) -> torch.nn.Module:
    return build_model("logistic", (5,), 3, seed=0)


HOOKS = ClientHooks(load_data=lambda _context: DATA, build_model=net)


def make_app(hooks: ClientHooks = HOOKS) -> ClientApp:
    app = register_hooks(ClientApp(), hooks, handlers=("train", "evaluate"))
    app.train("ditto")(make_ditto_train_handler(hooks))
    app.evaluate("ditto")(make_ditto_evaluate_handler(hooks))
    return app


@pytest.fixture(scope="module")
def app() -> ClientApp:
    return make_app()


def model_arrays(seed: int) -> ArrayRecord:
    """A global model the server could send: logistic weights of a seed."""
    return ArrayRecord(build_model("logistic", (5,), 3, seed=seed).state_dict())


def config(server_round: int, lam: float | None, **extra: Any) -> ConfigRecord:
    values: dict[str, Any] = {**SETTINGS, "server-round": server_round, **extra}
    if lam is not None:
        values["lambda"] = lam
    return ConfigRecord(values)


def send(app: ClientApp, context: Context, kind: str, arrays: ArrayRecord,
         cfg: ConfigRecord | None = None) -> Message:
    content = RecordDict({"arrays": arrays, **({"config": cfg} if cfg is not None else {})})
    return app(instruction(content, kind), context)


def loaded(record: ArrayRecord) -> torch.nn.Module:
    model = net()
    model.load_state_dict(record.to_torch_state_dict())
    return model


def by_hand(start: ArrayRecord, cfg: ConfigRecord, context: Context, mu: float,
            center: ArrayRecord | None, **overrides: Any) -> ArrayRecord:
    """``start`` trained as the handlers train, with proximal weight ``mu`` to ``center``."""
    model = loaded(start)
    options = {"epochs": 2, "lr": LR, "batch_size": 16, **overrides}
    train(model, DATA.x_train, DATA.y_train, seed=local_seed(context, cfg), proximal_mu=mu,
          proximal_center=None if center is None else loaded(center), **options)
    return ArrayRecord(model.state_dict())


def same(a: ArrayRecord, b: ArrayRecord) -> bool:
    return list(a.keys()) == list(b.keys()) and all(
        a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)


def distance(a: ArrayRecord, b: ArrayRecord) -> float:
    return float(np.sqrt(sum(((a[k].numpy() - b[k].numpy()) ** 2).sum() for k in a)))


def personal(context: Context) -> ArrayRecord:
    return context.state.array_records[PERSONAL_KEY]


@pytest.mark.parametrize("lam", [0.0, 0.5, 100.0])
def test_the_global_model_trains_bit_for_bit_as_a_plain_train_message(
        app: ClientApp, lam: float) -> None:
    context = make_context(3)
    for server_round, arrays in ((1, model_arrays(1)), (2, model_arrays(2))):
        cfg = config(server_round, lam)
        reply = send(app, context, "train.ditto", arrays, cfg)
        plain = send(app, make_context(3), "train", arrays, cfg)
        assert set(reply.content.array_records) == {"arrays"}  # w only, never v
        assert same(reply.content["arrays"], plain.content["arrays"])
        assert not same(reply.content["arrays"], arrays)  # it trained
        metrics = reply.content["metrics"]
        assert metrics["train-loss"] == plain.content["metrics"]["train-loss"]
        assert metrics["num-examples"] == 90 and "personal-train-loss" in metrics


def test_the_personal_model_starts_at_the_first_w_and_is_pulled_to_the_received_w(
        app: ClientApp) -> None:
    context, lam = make_context(3), 0.7
    w1, w2 = model_arrays(1), model_arrays(2)
    send(app, context, "train.ditto", w1, config(1, lam))
    v1 = by_hand(w1, config(1, lam), context, lam, w1)
    assert same(personal(context), v1)
    reply = send(app, context, "train.ditto", w2, config(2, lam))
    v2 = by_hand(v1, config(2, lam), context, lam, w2)  # from v1, towards the received w2
    assert same(personal(context), v2)
    # What a wrong centre would give: v's own start (FedProx), or the trained global.
    assert not same(v2, by_hand(v1, config(2, lam), context, lam, None))
    assert not same(v2, by_hand(v1, config(2, lam), context, lam, reply.content["arrays"]))
    assert reply.content["metrics"]["personal-train-loss"] != reply.content["metrics"][
        "train-loss"]


def test_lambda_zero_is_purely_local_training_over_the_rounds(app: ClientApp) -> None:
    rounds = 3
    contexts = [make_context(3), make_context(3)]
    for offset, context in enumerate(contexts):  # the second node receives other w's
        for server_round in range(1, rounds + 1):
            w = model_arrays(1 if server_round == 1 else 10 * server_round + offset)
            send(app, context, "train.ditto", w, config(server_round, 0.0))
    local = model_arrays(1)
    for server_round in range(1, rounds + 1):
        local = by_hand(local, config(server_round, 0.0), contexts[0], 0.0, None)
    assert same(personal(contexts[0]), local)
    assert same(personal(contexts[1]), local)  # whatever w the rounds after the first sent


def test_a_large_lambda_keeps_the_personal_model_at_the_received_w(app: ClientApp) -> None:
    context = make_context(3)
    for server_round in (1, 2):  # a personal model far from w: two local rounds
        send(app, context, "train.ditto", model_arrays(server_round), config(server_round, 0))
    w3 = model_arrays(3)
    far = distance(personal(context), w3)
    gaps = []
    lr = 0.01
    for lam in (0.0, 1.0, 10.0, 1 / lr):  # lr * lambda <= 1: the explicit step is stable
        trial = make_context(3)
        trial.state[PERSONAL_KEY] = personal(context)
        reply = send(app, trial, "train.ditto", w3, config(3, lam, lr=lr))
        gaps.append(distance(personal(trial), w3))
    assert gaps == sorted(gaps, reverse=True) and gaps[0] > 0.5 * far
    moved = distance(reply.content["arrays"], w3)  # w's own local move
    assert gaps[-1] < 0.2 * moved and gaps[-1] < 0.05 * far
    scores = send(app, trial, "evaluate.ditto", w3).content["metrics"]
    assert scores["eval-loss"] == pytest.approx(scores["eval-loss-global"], rel=0.02)


def test_evaluate_scores_the_stored_personal_model_and_the_received_w(app: ClientApp) -> None:
    context = make_context(3)
    w1, w2 = model_arrays(1), model_arrays(2)
    before = send(app, context, "evaluate.ditto", w1).content["metrics"]
    loss, acc = evaluate(loaded(w1), DATA.x_test, DATA.y_test)
    assert before["personal-model"] == 0 and PERSONAL_KEY not in context.state
    assert (before["eval-loss"], before["eval-acc"]) == (loss, acc)
    assert (before["eval-loss-global"], before["eval-acc-global"]) == (loss, acc)
    assert before["num-examples"] == len(DATA.y_test)
    send(app, context, "train.ditto", w1, config(1, 0.0, **{"local-epochs": 5}))
    stored = personal(context)
    for w in (w1, w2):
        after = send(app, context, "evaluate.ditto", w).content["metrics"]
        assert after["personal-model"] == 1
        assert (after["eval-loss"], after["eval-acc"]) == evaluate(
            loaded(stored), DATA.x_test, DATA.y_test)
        assert (after["eval-loss-global"], after["eval-acc-global"]) == evaluate(
            loaded(w), DATA.x_test, DATA.y_test)
        assert same(personal(context), stored)  # evaluation changes nothing
    assert after["eval-loss"] < after["eval-loss-global"]


def test_each_node_keeps_its_own_personal_model(app: ClientApp) -> None:
    first, second = make_context(3), make_context(4)
    send(app, first, "train.ditto", model_arrays(1), config(1, 0.0))
    assert PERSONAL_KEY not in second.state
    send(app, second, "train.ditto", model_arrays(1), config(1, 0.0))
    assert not same(personal(first), personal(second))  # seeded by the partition id


def test_personal_steps_and_epochs_replace_ws_own(app: ClientApp) -> None:
    w = model_arrays(1)
    one_step = make_context(3)
    cfg = config(1, 2.0, **{"personal-steps": 1})
    reply = send(app, one_step, "train.ditto", w, cfg)
    # From v = w the first step's pull is zero: one plain mini-batch step.
    assert same(personal(one_step), by_hand(w, cfg, one_step, 0.0, None, steps=1))
    assert not same(personal(one_step), reply.content["arrays"])
    epochs = make_context(3)
    cfg = config(1, 2.0, **{"personal-epochs": 3})
    send(app, epochs, "train.ditto", w, cfg)
    assert same(personal(epochs), by_hand(w, cfg, epochs, 2.0, w, epochs=3))


@pytest.mark.parametrize(("values", "fragment"), [
    ({}, "needs 'lambda'"),
    ({"lambda": -1.0}, "needs 'lambda'"),
    ({"lambda": True}, "needs 'lambda'"),
    ({"lambda": float("inf")}, "needs 'lambda'"),
    ({"lambda": 1.0, "personal-steps": -2}, "'personal-steps' must be an integer"),
    ({"lambda": 1.0, "personal-epochs": 1.5}, "'personal-epochs' must be an integer"),
    ({"lambda": 1.0, "personal-epochs": 1, "personal-steps": 2}, "set at most one"),
    ({"lambda": 1.0, "lr": -1.0}, "invalid training settings"),
])
def test_bad_ditto_settings_are_refused(app: ClientApp, values: dict[str, Any],
                                        fragment: str) -> None:
    context = make_context(3)
    with pytest.raises(ValueError, match=fragment):
        send(app, context, "train.ditto", model_arrays(1),
             ConfigRecord({**SETTINGS, **values}))
    assert PERSONAL_KEY not in context.state


def test_a_stored_personal_model_that_does_not_fit_is_refused(app: ClientApp) -> None:
    context = make_context(3)
    context.state[PERSONAL_KEY] = ArrayRecord({"weight": Array(np.zeros((2, 2), np.float32))})
    for kind, cfg in (("train.ditto", config(1, 1.0)), ("evaluate.ditto", None)):
        with pytest.raises(ValueError, match="personal model .* does not fit"):
            send(app, context, kind, model_arrays(1), cfg)


def test_a_message_without_a_model_is_refused(app: ClientApp) -> None:
    for kind in ("train.ditto", "evaluate.ditto"):
        with pytest.raises(ValueError, match="carries no ArrayRecord 'arrays'"):
            app(instruction(RecordDict({"config": config(1, 1.0)}), kind), make_context(3))


def test_the_personal_step_leaves_torchs_random_state_to_the_global_path() -> None:
    """With dropout, w trains as a plain ``train`` from the same torch random state."""
    def dropout_net(*_: object) -> torch.nn.Module:  # its initialisation draws too
        return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Dropout(0.5),
                                   torch.nn.Linear(8, 3))

    hooks = ClientHooks(load_data=lambda _context: DATA, build_model=dropout_net)
    app, w = make_app(hooks), ArrayRecord(dropout_net().state_dict())
    torch.manual_seed(123)
    reply = send(app, make_context(3), "train.ditto", w, config(1, 1.0))
    torch.manual_seed(123)
    plain = send(app, make_context(3), "train", w, config(1, 1.0))
    assert same(reply.content["arrays"], plain.content["arrays"])


def stored_hooks(directory: Path) -> ClientHooks:
    return ClientHooks(load_data=lambda _context: DATA, build_model=net,
                       state_dir=lambda _context: str(directory))


def test_with_a_state_directory_an_interrupted_round_trains_again_as_before(
        tmp_path: Path) -> None:
    """A resumed run (a new node state) retrains round 2 from round 1's personal model."""
    app, lam = make_app(stored_hooks(tmp_path / "state")), 0.7
    w1, w2, w3 = model_arrays(1), model_arrays(2), model_arrays(3)
    first = make_context(3)
    send(app, first, "train.ditto", w1, config(1, lam))
    send(app, first, "train.ditto", w2, config(2, lam))  # then the run is interrupted
    assert PERSONAL_KEY not in first.state  # the files hold it, not the node state
    store = PersonalStore.of(tmp_path / "state", first)
    v1 = by_hand(w1, config(1, lam), first, lam, w1)
    v2 = by_hand(v1, config(2, lam), first, lam, w2)
    assert same(ArrayRecord(store.load(before=2)), v1)
    assert same(ArrayRecord(store.load(before=3)), v2)
    resumed = make_context(3)  # the resumed run: a new Flower run, empty node state
    send(app, resumed, "train.ditto", w2, config(2, lam))
    assert same(ArrayRecord(store.load(before=3)), v2)  # round 2 again, from v1
    send(app, resumed, "train.ditto", w3, config(3, lam))
    assert sorted(store.versions()) == [2, 3]  # the round before is kept, older ones go
    assert same(ArrayRecord(store.load(before=4)), by_hand(v2, config(3, lam), first, lam, w3))


def test_with_a_state_directory_evaluation_scores_the_rounds_personal_model(
        tmp_path: Path) -> None:
    app = make_app(stored_hooks(tmp_path))
    context, w1 = make_context(3), model_arrays(1)
    assert send(app, context, "evaluate.ditto", w1,
                config(1, None)).content["metrics"]["personal-model"] == 0
    send(app, context, "train.ditto", w1, config(2, 0.0, **{"local-epochs": 5}))
    v = PersonalStore.of(tmp_path, context).load(before=3)
    before = send(app, context, "evaluate.ditto", w1, config(1, None)).content["metrics"]
    assert before["personal-model"] == 0  # round 1's evaluation: round 2's v is later
    after = send(app, make_context(3), "evaluate.ditto", w1, config(2, None))
    scores = after.content["metrics"]  # another node state: the file is what counts
    assert scores["personal-model"] == 1
    assert (scores["eval-loss"], scores["eval-acc"]) == evaluate(
        loaded(ArrayRecord(v)), DATA.x_test, DATA.y_test)
    with pytest.raises(ValueError, match="needs 'server-round'"):
        send(app, context, "evaluate.ditto", w1, ConfigRecord({}))
