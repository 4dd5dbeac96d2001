"""Client handlers, called through a real Flower ClientApp."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.clientapp import ClientApp
from helpers import arrays_of, instruction, make_context, vector_data

from fedgsp_flwr.clients import HANDLERS, ClientHooks, register_hooks
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.models import build_model

DATA = {0: vector_data(seed=0), 1: vector_data(n=80, seed=1)}


def model_for(_context: object, data: ClientData) -> object:
    return build_model("logistic", data.x_train.shape[1:], data.num_classes, seed=0)


HOOKS = ClientHooks(
    load_data=lambda context: DATA[int(context.node_config["partition-id"])],
    build_model=model_for,
)


@pytest.fixture
def app() -> ClientApp:
    return register_hooks(ClientApp(), HOOKS, handlers=HANDLERS)


def global_arrays() -> ArrayRecord:
    return arrays_of(model_for(None, DATA[0]))


def test_histogram_equals_the_partitions_label_counts(app: ClientApp) -> None:
    for pid, data in DATA.items():
        reply = app(instruction(RecordDict(), "query.histogram"), make_context(pid))
        hist = reply.content.array_records["histogram"]["histogram"].numpy()
        np.testing.assert_array_equal(hist, np.bincount(data.y_train, minlength=3))
        assert reply.content["metrics"]["num-examples"] == len(data.y_train)
        assert reply.content["metrics"]["partition-id"] == pid


def test_sketch_is_a_unit_vector_and_repeatable(app: ClientApp) -> None:
    def sketch(pid: int) -> np.ndarray:
        msg = instruction(RecordDict({"arrays": global_arrays()}), "query.sketch")
        return app(msg, make_context(pid)).content["sketch"]["sketch"].numpy()

    first = sketch(0)
    assert first.shape == (5 * 3 + 3,)
    assert np.linalg.norm(first) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_array_equal(first, sketch(0))
    assert not np.allclose(first, sketch(1)), "different data gave the same sketch"


def test_sketch_is_the_normalised_full_batch_gradient(app: ClientApp) -> None:
    import torch

    model = model_for(None, DATA[0])
    loss = torch.nn.functional.cross_entropy(
        model(torch.from_numpy(DATA[0].x_train)), torch.from_numpy(DATA[0].y_train))
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
    msg = instruction(RecordDict({"arrays": global_arrays()}), "query.sketch")
    got = app(msg, make_context(0)).content["sketch"]["sketch"].numpy()
    np.testing.assert_allclose(got, grad / np.linalg.norm(grad), atol=1e-5)


def test_train_returns_a_trained_model_with_its_weight(app: ClientApp) -> None:
    content = RecordDict({"arrays": global_arrays(),
                          "config": ConfigRecord({"lr": 0.5, "local-epochs": 3})})
    reply = app(instruction(content, "train"), make_context(1))
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == 80
    trained = reply.content["arrays"]
    assert list(trained.keys()) == list(global_arrays().keys())
    assert not np.allclose(trained["1.weight"].numpy(), global_arrays()["1.weight"].numpy())
    # the trained model is better on the node's data than the one it received
    from fedgsp_flwr.training import evaluate

    before, after = model_for(None, DATA[1]), model_for(None, DATA[1])
    after.load_state_dict(trained.to_torch_state_dict())
    assert evaluate(after, DATA[1].x_train, DATA[1].y_train)[0] < evaluate(
        before, DATA[1].x_train, DATA[1].y_train)[0]


def test_train_by_local_steps_is_one_full_batch_gradient_step(app: ClientApp) -> None:
    import torch

    content = RecordDict({"arrays": global_arrays(), "config": ConfigRecord(
        {"lr": 0.5, "local-steps": 1, "batch-size": 10**6})})
    trained = app(instruction(content, "train"), make_context(0)).content["arrays"]
    model = model_for(None, DATA[0])
    loss = torch.nn.functional.cross_entropy(
        model(torch.from_numpy(DATA[0].x_train)), torch.from_numpy(DATA[0].y_train))
    loss.backward()
    expected = {k: (p - 0.5 * p.grad).detach().numpy()
                for k, p in model.named_parameters()}
    for key, value in expected.items():
        np.testing.assert_allclose(trained[key].numpy(), value, atol=1e-6)


def test_a_relay_hop_is_a_train_message_seeded_by_its_position(app: ClientApp) -> None:
    def hop(position: int) -> RecordDict:
        config = ConfigRecord({"relay-group": 4, "relay-hop": position, "server-round": 3,
                               "batch-size": 4})
        msg = instruction(RecordDict({"arrays": global_arrays(), "config": config}), "train")
        return app(msg, make_context(0, seed=7)).content

    first, again, other = hop(2), hop(2), hop(3)
    assert set(first["metrics"].keys()) == {"train-loss", "num-examples"}
    np.testing.assert_array_equal(first["arrays"]["1.weight"].numpy(),
                                  again["arrays"]["1.weight"].numpy())
    assert not np.array_equal(first["arrays"]["1.weight"].numpy(),
                              other["arrays"]["1.weight"].numpy())


def test_evaluate_reports_loss_accuracy_and_test_size(app: ClientApp) -> None:
    reply = app(instruction(RecordDict({"arrays": global_arrays()}), "evaluate"),
                make_context(0))
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == len(DATA[0].y_test)
    assert 0.0 <= metrics["eval-acc"] <= 1.0 and metrics["eval-loss"] > 0


def test_a_message_without_a_model_is_refused(app: ClientApp) -> None:
    with pytest.raises(ValueError, match="carries no ArrayRecord 'arrays'"):
        app(instruction(RecordDict(), "train"), make_context(0))


def test_arrays_of_another_model_are_refused(app: ClientApp) -> None:
    wrong = arrays_of(build_model("logistic", (7,), 3, seed=0))
    with pytest.raises(RuntimeError, match="size mismatch"):
        app(instruction(RecordDict({"arrays": wrong}), "train"), make_context(0))


def test_hooks_join_an_existing_app_without_touching_its_handlers() -> None:
    app = ClientApp()

    @app.train()
    def own_train(message, context):
        raise AssertionError("not called here")

    register_hooks(app, HOOKS)
    reply = app(instruction(RecordDict(), "query.histogram"), make_context(0))
    assert reply.content.array_records["histogram"]["histogram"].numpy().sum() == 60
    with pytest.raises(ValueError, match="already registered"):
        register_hooks(app, HOOKS, handlers=["train"])
    with pytest.raises(ValueError, match="Unknown handler 'gradient'"):
        register_hooks(ClientApp(), HOOKS, handlers=["gradient"])


@pytest.mark.parametrize(
    ("config", "fragment"),
    [({"lr": "fast"}, "'lr' must be a number"), ({"local-epochs": 0}, "invalid training"),
     ({"batch-size": [4]}, "'batch-size' must be a number"), ({"momentum": 1.5}, "invalid"),
     ({"local-steps": -1}, "invalid training")],
)
def test_bad_training_settings_in_a_message_are_refused(app: ClientApp, config: dict,
                                                        fragment: str) -> None:
    content = RecordDict({"arrays": global_arrays(), "config": ConfigRecord(config)})
    with pytest.raises(ValueError, match=fragment):
        app(instruction(content, "train"), make_context(0))


def test_histogram_reply_carries_the_edges_of_the_node_config(app: ClientApp) -> None:
    context = make_context(0)
    context.node_config["edges"] = "3, 0"
    reply = app(instruction(RecordDict(), "query.histogram"), context)
    assert reply.content["metrics"]["edges"] == [0, 3]
    context.node_config["edges"] = "north"
    with pytest.raises(ValueError, match="node config 'edges' must list edge indices"):
        app(instruction(RecordDict(), "query.histogram"), context)


def test_histogram_reply_carries_the_semifl_cluster_of_the_node_config(app: ClientApp) -> None:
    context = make_context(0)
    reply = app(instruction(RecordDict(), "query.histogram"), context)
    assert "cluster-id" not in reply.content["metrics"]
    context.node_config["cluster-id"] = 4
    reply = app(instruction(RecordDict(), "query.histogram"), context)
    assert reply.content["metrics"]["cluster-id"] == 4
    context.node_config["cluster-id"] = "-1"
    with pytest.raises(ValueError, match="node config 'cluster-id' must be an integer"):
        app(instruction(RecordDict(), "query.histogram"), context)


class DictBatches(torch.utils.data.Dataset):
    """A dataset of dict examples, as flwr-datasets' transforms give (``img``, ``label``)."""

    def __init__(self, data: ClientData) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data.y_train)

    def __getitem__(self, i: int) -> dict:
        return {"img": torch.from_numpy(self.data.x_train[i]),
                "label": int(self.data.y_train[i])}


@pytest.mark.parametrize("form", ["arrays", "float64-int32", "tensors", "four-arrays",
                                  "loader", "loaders"])
def test_hooks_take_the_apps_own_arrays_or_dataloaders(form: str) -> None:
    data = DATA[1]
    tensors = torch.utils.data.TensorDataset(torch.from_numpy(data.x_train),
                                             torch.from_numpy(data.y_train))
    sources = {
        "arrays": (data.x_train, data.y_train),
        "float64-int32": (data.x_train.astype(np.float64), data.y_train.astype(np.int32)),
        "tensors": (torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
        "four-arrays": (data.x_train, data.y_train, data.x_test, data.y_test),
        "loader": torch.utils.data.DataLoader(tensors, batch_size=7),
        "loaders": (torch.utils.data.DataLoader(DictBatches(data), batch_size=16),
                    torch.utils.data.DataLoader(tensors, batch_size=16)),
    }
    # The app's own model, which predicts 3 classes: the histogram takes its width.
    hooks = ClientHooks(load_data=lambda _c: sources[form],
                        build_model=lambda _c, _d: model_for(None, DATA[0]))
    app = register_hooks(ClientApp(), hooks)
    reply = app(instruction(RecordDict(), "query.histogram"), make_context(1))
    hist = reply.content.array_records["histogram"]["histogram"].numpy()
    np.testing.assert_array_equal(hist, np.bincount(data.y_train, minlength=3))
    sketch = app(instruction(RecordDict({"arrays": global_arrays()}), "query.sketch"),
                 make_context(1)).content.array_records["sketch"]["sketch"].numpy()
    expected = register_hooks(ClientApp(), ClientHooks(
        load_data=lambda _c: data, build_model=model_for))(
        instruction(RecordDict({"arrays": global_arrays()}), "query.sketch"),
        make_context(1)).content.array_records["sketch"]["sketch"].numpy()
    np.testing.assert_allclose(sketch, expected, atol=1e-5)
    # Our evaluate handler scores the training data where the app gives no test split.
    app = register_hooks(ClientApp(), hooks, handlers=("evaluate",))
    metrics = app(instruction(RecordDict({"arrays": global_arrays()}), "evaluate"),
                  make_context(1)).content["metrics"]
    assert metrics["num-examples"] == (len(data.y_test) if form == "four-arrays"
                                       else len(data.y_train))


def test_hooks_need_num_classes_when_the_model_reads_it_from_the_data() -> None:
    hooks = ClientHooks(load_data=lambda _c: (DATA[0].x_train, DATA[0].y_train),
                        build_model=model_for)  # builds data.num_classes outputs
    with pytest.raises(ValueError, match="pass ClientHooks\\(num_classes=...\\)"):
        hooks.client_data(make_context(0))
    hooks = ClientHooks(load_data=hooks.load_data, build_model=model_for, num_classes=3)
    assert hooks.client_data(make_context(0)).histogram().sum() == len(DATA[0].y_train)


def test_hooks_say_what_load_data_may_return() -> None:
    hooks = ClientHooks(load_data=lambda _c: {"x": 1}, build_model=model_for)
    with pytest.raises(ValueError, match="return ClientData, \\(x, y\\) arrays"):
        hooks.client_data(make_context(0))
    batches = [{"a": torch.zeros(2, 6), "b": torch.zeros(2, 6), "label": torch.zeros(2)}]
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    with pytest.raises(ValueError, match="need one label key"):
        ClientHooks(load_data=lambda _c: loader, build_model=model_for).client_data(
            make_context(0))
