"""FedMMD's and FedFusion's client steps: the MMD term (zero for identical outputs, the
kernel two-sample formula, its gradient), its pull on training; the fused model (shapes,
gradient flow, each operator's rule) and the ``train.fedfusion`` handler."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from helpers import instruction, make_context, vector_data
from torch import nn

from fedgsp_flwr.clients import ClientHooks, register_hooks
from fedgsp_flwr.clients.fedfusion import make_fedfusion_handler
from fedgsp_flwr.clients.fedmmd import make_fedmmd_handler, mmd2
from fedgsp_flwr.clients.fusion import UnfusableModel, fused_model, load_model
from fedgsp_flwr.clients.handlers import local_seed
from fedgsp_flwr.core.fedmmd import SIGMAS
from fedgsp_flwr.core.fusion import init_fusion
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.protocol import UNSUPPORTED_HOOK_TEXT
from fedgsp_flwr.training import train

DATA = vector_data(n=90, seed=0)
SETTINGS = {"lr": 0.1, "local-epochs": 2, "batch-size": 16, "server-round": 1}


def mlp(_context: object = None, _data: object = None) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def blocks_cnn() -> nn.Sequential:
    """A CNN built from blocks: its convolutions are not top-level layers."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Flatten(), nn.Linear(6 * 2 * 2, 3))


def with_fusion(model: nn.Module, operator: str, seed: int = 0) -> ArrayRecord:
    state = ArrayRecord(model.state_dict())
    added = init_fusion([tuple(state[k].shape) for k in state], operator, seed)
    return ArrayRecord({**{k: state[k] for k in state},
                        **{k: Array(v) for k, v in added.items()}})


def app_with(*handlers: str) -> ClientApp:
    hooks = ClientHooks(load_data=lambda _c: DATA, build_model=mlp)
    app = register_hooks(ClientApp(), hooks, handlers=("train", "evaluate"))
    if "fedmmd" in handlers:
        app.train("fedmmd")(make_fedmmd_handler(hooks))
    if "fedfusion" in handlers:
        app.train("fedfusion")(make_fedfusion_handler(hooks))
    return app


def send(app: ClientApp, kind: str, arrays: ArrayRecord, context: Context | None = None,
         **config: object) -> Message:
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({**SETTINGS, **config})})
    return app(instruction(content, kind), context or make_context(2))


# --- FedMMD ---------------------------------------------------------------------------


def reference_mmd2(x: np.ndarray, y: np.ndarray) -> float:
    """The biased estimate written out with loops, for comparison."""
    def k(a: np.ndarray, b: np.ndarray) -> float:
        return sum(math.exp(-float(((a - b) ** 2).sum()) / (2 * s)) for s in SIGMAS)

    mean = lambda p, q: np.mean([[k(a, b) for b in q] for a in p])
    return max(0.0, mean(x, x) + mean(y, y) - 2 * mean(x, y))


def test_mmd_is_zero_for_identical_outputs_and_the_two_sample_formula_otherwise() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 3)), rng.normal(size=(5, 3)) + 0.5
    assert mmd2(torch.tensor(x), torch.tensor(x)).item() == 0.0
    value = mmd2(torch.tensor(x), torch.tensor(y)).item()
    assert value > 0.1 and value == pytest.approx(reference_mmd2(x, y), rel=1e-12)
    assert mmd2(torch.tensor(y), torch.tensor(x)).item() == pytest.approx(value, rel=1e-12)
    # images count by their flattened values
    images = torch.tensor(rng.normal(size=(4, 1, 2, 2)))
    assert mmd2(images, images + 1).item() == pytest.approx(
        mmd2(images.flatten(1), images.flatten(1) + 1).item(), rel=1e-12)


def test_the_mmd_gradient_is_the_analytic_one_and_zero_at_identical_outputs() -> None:
    rng = np.random.default_rng(1)
    x = torch.tensor(rng.normal(size=(4, 3)), requires_grad=True)
    y = torch.tensor(rng.normal(size=(3, 3)) + 0.3, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: mmd2(a, b, sigmas=(0.5, 2.0)), (x, y))
    same = torch.tensor(rng.normal(size=(4, 3)), requires_grad=True)
    mmd2(same, same.detach()).backward()
    assert same.grad is not None and same.grad.abs().max().item() < 1e-12


def test_fedmmds_first_step_is_plain_training_and_the_term_pulls_the_outputs() -> None:
    app, start = app_with("fedmmd"), ArrayRecord(mlp().state_dict())
    one = {"local-steps": 1}
    step = send(app, "train.fedmmd", start, **one, **{"mmd-weight": 5.0})
    plain = send(app, "train", start, **one)
    for key in start:  # the MMD gradient is zero where both models agree
        np.testing.assert_allclose(step.content["arrays"][key].numpy(),
                                   plain.content["arrays"][key].numpy(), atol=1e-6)
    long = {"local-epochs": 5}
    pulled = send(app, "train.fedmmd", start, **long, **{"mmd-weight": 1.0})
    free = send(app, "train.fedmmd", start, **long, **{"mmd-weight": 0.0})
    assert pulled.content["metrics"]["num-examples"] == 90
    x = torch.from_numpy(DATA.x_train)

    def gap(reply: Message) -> float:
        model = load_model(mlp(), reply.content["arrays"])
        with torch.no_grad():
            return mmd2(model(x), load_model(mlp(), start)(x)).item()

    assert gap(pulled) < 0.5 * gap(free)
    # weight 0 trains exactly as a plain train message
    plain_long = send(app, "train", start, **long)
    assert all(np.array_equal(free.content["arrays"][k].numpy(),
                              plain_long.content["arrays"][k].numpy()) for k in start)


def test_a_fedmmd_message_without_its_weight_is_refused() -> None:
    handler = make_fedmmd_handler(ClientHooks(load_data=lambda _c: DATA, build_model=mlp))
    content = RecordDict({"arrays": ArrayRecord(mlp().state_dict()),
                          "config": ConfigRecord(SETTINGS)})
    with pytest.raises(ValueError, match="needs 'mmd-weight'"):
        handler(instruction(content, "train.fedmmd"), make_context(0))


# --- FedFusion ------------------------------------------------------------------------


@pytest.mark.parametrize("operator", ["conv", "multi", "single"])
@pytest.mark.parametrize(("build", "shape", "channels"), [(cnn, (1, 8, 8), 4),
                                                          (blocks_cnn, (1, 8, 8), 6),
                                                          (mlp, (5,), 8)])
def test_each_operator_fuses_at_the_features_and_gradients_flow(
        operator: str, build: object, shape: tuple, channels: int) -> None:
    base = build()
    record = with_fusion(base, operator)
    model = load_model(build(), record)
    assert list(model.state_dict()) == list(record.keys())  # the keys travel unchanged
    fusion = {k: tuple(v.shape) for k, v in model.state_dict().items() if "fusion" in k}
    expected = {"conv": {"fusion.weight": (channels, 2 * channels, 1, 1),
                         "fusion.bias": (channels,)},
                "multi": {"fusion.gamma": (1, channels, 1, 1)},
                "single": {"fusion.gamma": (1,)}}[operator]
    assert fusion == expected
    with torch.no_grad():  # local features apart from the reference's (gamma's gradient)
        next(model.get_submodule("0").parameters()).mul_(0.5)
        if operator != "conv":
            model.fusion.gamma.fill_(0.5)
    x = torch.randn(6, *shape)
    out = model(x)
    assert out.shape == (6, 3)
    out.sum().backward()
    named = dict(model.named_parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in named.values())
    assert not any(p.requires_grad for p in model.reference.parameters())
    assert all("reference" not in k for k in model.state_dict())


def test_gamma_zero_is_the_local_model_and_gamma_one_the_received_features() -> None:
    base = mlp()
    model = load_model(mlp(), with_fusion(base, "multi"))
    x = torch.randn(7, 5)
    with torch.no_grad():
        assert torch.equal(model(x), base(x))
        model.fusion.gamma.fill_(1.0)
        model.get_submodule("0").weight.add_(1.0)  # local features move, not the reference
        assert torch.allclose(model(x), base(x), atol=1e-6)
        model.fusion.gamma.fill_(0.0)
        assert not torch.allclose(model(x), base(x), atol=1e-3)


def test_conv_fusion_is_a_one_by_one_convolution_of_both_feature_maps() -> None:
    base = cnn()
    model = load_model(cnn(), with_fusion(base, "conv", seed=5))
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        model.get_submodule("0").weight.mul_(0.5)  # local != reference
        layers = [model.get_submodule(str(i)) for i in range(5)]
        local, ref = nn.Sequential(*layers[:3])(x), model.reference(x)
        weight = model.fusion.weight[:, :, 0, 0]
        fused = (torch.einsum("oc,bchw->bohw", weight[:, :4], local)
                 + torch.einsum("oc,bchw->bohw", weight[:, 4:], ref)
                 + model.fusion.bias[None, :, None, None])
        assert torch.allclose(model(x), nn.Sequential(*layers[3:])(fused), atol=1e-5)


def test_the_fedfusion_handler_trains_model_and_module_and_keeps_the_keys() -> None:
    app, start = app_with("fedfusion"), with_fusion(mlp(), "multi")
    reply = send(app, "train.fedfusion", start)
    arrays = reply.content["arrays"]
    assert list(arrays.keys()) == list(start.keys())
    assert all(not np.array_equal(arrays[k].numpy(), start[k].numpy()) for k in start)
    # the same as training the fused model by hand
    context = make_context(2)
    model = load_model(mlp(), start)
    train(model, DATA.x_train, DATA.y_train, epochs=2, lr=0.1, batch_size=16,
          seed=local_seed(context, ConfigRecord(SETTINGS)))
    assert all(np.array_equal(arrays[k].numpy(), v.numpy())
               for k, v in model.state_dict().items())
    # our plain evaluate handler scores the fused model
    content = RecordDict({"arrays": arrays})
    scored = app(instruction(content, "evaluate"), make_context(2))
    assert 0.0 <= scored.content["metrics"]["eval-acc"] <= 1.0


def test_a_fedfusion_message_without_the_module_is_refused() -> None:
    handler = make_fedfusion_handler(ClientHooks(load_data=lambda _c: DATA, build_model=mlp))
    content = RecordDict({"arrays": ArrayRecord(mlp().state_dict()),
                          "config": ConfigRecord(SETTINGS)})
    with pytest.raises(ValueError, match="with its fusion module"):
        handler(instruction(content, "train.fedfusion"), make_context(0))
    with pytest.raises(ValueError, match="torch.nn.Sequential"):
        fused_model(nn.Linear(3, 2), "conv")


def test_a_model_cut_where_the_servers_module_does_not_fit_falls_back_to_plain_training(
        ) -> None:
    # The server sizes the module from the last 2-D weight (6 inputs, inside the last
    # block); this model is cut at its last top-level linear layer (8 inputs).
    def odd(_context: object = None, _data: object = None) -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6),
                             nn.Sequential(nn.ReLU(), nn.Linear(6, 3)))

    with pytest.raises(UnfusableModel, match="needs"):
        load_model(odd(), with_fusion(odd(), "multi"))
    logistic = nn.Sequential(nn.Flatten(), nn.Linear(5, 3))  # no features to fuse
    with pytest.raises(UnfusableModel, match=r"\(Flatten\) have no parameters"):
        load_model(logistic, with_fusion(logistic, "conv"))
    handler = make_fedfusion_handler(ClientHooks(load_data=lambda _c: DATA, build_model=odd))
    content = RecordDict({"arrays": with_fusion(odd(), "conv"),
                          "config": ConfigRecord(SETTINGS)})
    with pytest.raises(ValueError, match=UNSUPPORTED_HOOK_TEXT):
        handler(instruction(content, "train.fedfusion"), make_context(0))


def test_a_model_without_fusion_arrays_loads_as_it_is() -> None:
    base = mlp()
    loaded = load_model(copy.deepcopy(base), ArrayRecord(base.state_dict()))
    assert isinstance(loaded, nn.Sequential)
    assert ClientData is not None
