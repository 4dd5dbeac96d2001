"""The ``train.ifca`` handler, called through a real Flower ClientApp."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from helpers import instruction, make_context, vector_data

from fedgsp_flwr.clients import ClientHooks, register_hooks
from fedgsp_flwr.clients.ifca import make_ifca_handler
from fedgsp_flwr.core.ifca import NON_FINITE_LOSS
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.models import build_model
from fedgsp_flwr.training import evaluate, train

BASE = vector_data(n=90, seed=0)
# The test split's labels are the training labels shifted by one class: the model that
# fits the training data best fits the test data worst, so a handler that chose by its
# test data would pick the other model.
DATA = ClientData(BASE.x_train, BASE.y_train, BASE.x_train, (BASE.y_train + 1) % 3, 3)
CONFIG = ConfigRecord({"lr": 0.1, "local-epochs": 2, "batch-size": 16, "server-round": 4})


def net(_context: object = None, _data: object = None) -> torch.nn.Module:
    return build_model("logistic", (5,), 3, seed=0)


HOOKS = ClientHooks(load_data=lambda _context: DATA, build_model=net)


@pytest.fixture(scope="module")
def app() -> ClientApp:
    app = register_hooks(ClientApp(), HOOKS, handlers=("train", "evaluate"))
    app.train("ifca")(make_ifca_handler(HOOKS))
    return app


def fitted(labels: np.ndarray) -> ArrayRecord:
    """The logistic model fitted to the training features with ``labels``."""
    model = net()
    train(model, DATA.x_train, labels, epochs=40, lr=0.5, batch_size=90, seed=0)
    return ArrayRecord(model.state_dict())


GOOD = fitted(DATA.y_train)      # low loss on the training split
SHIFTED = fitted(DATA.y_test)    # low loss on the test split
RANDOM = ArrayRecord(net().state_dict())


def ifca(app: ClientApp, models: list[ArrayRecord], config: ConfigRecord = CONFIG) -> Message:
    content = RecordDict({**{f"model-{i}": m for i, m in enumerate(models)},
                          "config": config})
    return app(instruction(content, "train.ifca"), make_context(3))


def training_loss(record: ArrayRecord) -> float:
    model = net()
    model.load_state_dict(record.to_torch_state_dict())
    return evaluate(model, DATA.x_train, DATA.y_train)[0]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
def test_the_node_trains_the_model_of_lowest_loss_on_its_training_data(
        app: ClientApp, order: tuple[int, ...]) -> None:
    pool = [SHIFTED, GOOD, RANDOM]
    models = [pool[i] for i in order]
    reply = ifca(app, models)
    metrics = reply.content["metrics"]
    assert metrics["ifca-choice"] == order.index(1)  # wherever GOOD is
    losses = [training_loss(m) for m in models]
    assert metrics["ifca-losses"] == pytest.approx(losses, rel=1e-6)
    assert metrics["num-examples"] == 90
    # the choice by the test split would differ: the handler used the training split
    test_losses = []
    for record in models:
        model = net()
        model.load_state_dict(record.to_torch_state_dict())
        test_losses.append(evaluate(model, DATA.x_test, DATA.y_test)[0])
    assert int(np.argmin(test_losses)) != metrics["ifca-choice"]


def test_the_chosen_model_trains_exactly_as_a_plain_train_message(app: ClientApp) -> None:
    reply = ifca(app, [SHIFTED, GOOD, RANDOM])
    plain = app(instruction(RecordDict({"arrays": GOOD, "config": CONFIG}), "train"),
                make_context(3))
    got, want = reply.content["arrays"], plain.content["arrays"]
    assert list(got.keys()) == list(want.keys())
    for key in want:
        assert got[key].numpy().tobytes() == want[key].numpy().tobytes()
        assert not np.array_equal(got[key].numpy(), GOOD[key].numpy())  # it trained
    assert reply.content["metrics"]["train-loss"] == plain.content["metrics"]["train-loss"]


def test_one_model_is_a_plain_training(app: ClientApp) -> None:
    reply = ifca(app, [RANDOM])
    plain = app(instruction(RecordDict({"arrays": RANDOM, "config": CONFIG}), "train"),
                make_context(3))
    assert reply.content["metrics"]["ifca-choice"] == 0
    assert len(reply.content["metrics"]["ifca-losses"]) == 1
    for key in RANDOM:
        assert (reply.content["arrays"][key].numpy().tobytes()
                == plain.content["arrays"][key].numpy().tobytes())


def test_a_diverged_model_is_reported_with_the_largest_float_and_never_chosen(
        app: ClientApp) -> None:
    broken = ArrayRecord({k: Array(np.full_like(v.numpy(), np.nan)) for k, v in RANDOM.items()})
    metrics = ifca(app, [broken, RANDOM]).content["metrics"]
    assert metrics["ifca-choice"] == 1
    assert metrics["ifca-losses"][0] == NON_FINITE_LOSS
    assert np.isfinite(metrics["ifca-losses"][1])


def test_models_must_be_numbered_from_zero_without_gaps(app: ClientApp) -> None:
    with pytest.raises(ValueError, match="must carry ArrayRecords model-0"):
        app(instruction(RecordDict({"model-0": GOOD, "model-2": RANDOM, "config": CONFIG}),
                        "train.ifca"), make_context(3))
    with pytest.raises(ValueError, match="must carry ArrayRecords model-0"):
        app(instruction(RecordDict({"arrays": GOOD, "config": CONFIG}), "train.ifca"),
            make_context(3))


def test_bad_training_settings_are_refused(app: ClientApp) -> None:
    with pytest.raises(ValueError, match="invalid training settings"):
        ifca(app, [GOOD], ConfigRecord({"lr": -1.0}))
