"""FedMMD and FedFusion as Flower strategies on an in-process grid: FedAvg's server with
their client steps, the fusion module carried and averaged with the model, plain
ClientApps run as FedAvg, a hostile reply never reaches the model."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import plain_clientapp
import pytest
import torch
from fakegrid import FakeGrid
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from helpers import make_context, run_rounds
from torch import nn

from fedgsp_flwr.clients import ClientHooks, register_hooks
from fedgsp_flwr.clients.fusion import load_model
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.strategies import FedAvg, FedFusion, FedMMD

NODES = 5
SETTINGS = {"lr": 0.1, "local-epochs": 1, "batch-size": 10}


def skewed(partition: int) -> ClientData:
    x, y = plain_clientapp.load_partition(partition)
    return ClientData(x[:30], y[:30], x[30:], y[30:], plain_clientapp.CLASSES)


def net(*_: object) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(plain_clientapp.FEATURES, 8), nn.ReLU(),
                         nn.Linear(8, plain_clientapp.CLASSES))


def initial() -> ArrayRecord:
    return ArrayRecord(net().state_dict())


def federation(hooked: bool = True, plain: tuple[int, ...] = ()) -> FakeGrid:
    handlers = {}
    for node in range(NODES):
        hooks = ClientHooks(load_data=lambda _c, p=node: skewed(p), build_model=net)
        names = ("train", "evaluate") + (("fedmmd", "fedfusion", "fedfusion-evaluate")
                                         if hooked and node not in plain else ())
        app = register_hooks(ClientApp(), hooks, handlers=names)
        context = make_context(node, NODES)
        handlers[node] = lambda message, a=app, c=context: a(message, c)
    return FakeGrid(handlers)


def plain_federation() -> FakeGrid:
    return plain_clientapp.plain_grid(NODES)


def same(a: ArrayRecord, b: ArrayRecord) -> bool:
    return list(a.keys()) == list(b.keys()) and all(
        a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)


def kinds(grid: FakeGrid) -> list[str]:
    return [k for _, _, k, _ in grid.pushed]


def pushed(grid: FakeGrid, kind: str) -> list[tuple[int, Message]]:
    return [(node, m) for _, node, k, m in grid.pushed if k == kind]


KWARGS: dict[str, Any] = {"fraction_train": 0.6, "fraction_evaluate": 1.0,
                          "min_train_nodes": 1}


# --- FedMMD ---------------------------------------------------------------------------


def test_fedmmd_with_weight_zero_is_fedavg_and_with_a_weight_its_own() -> None:
    random.seed(5)
    fedavg = run_rounds(FedAvg(**KWARGS), federation(), initial(), 3, **SETTINGS)
    random.seed(5)
    grid = federation()
    zero = FedMMD(mmd_weight=0.0, **KWARGS)
    assert same(run_rounds(zero, grid, initial(), 3, **SETTINGS).arrays, fedavg.arrays)
    assert set(kinds(grid)) == {"query.partition", "train.fedmmd", "evaluate"}
    random.seed(5)
    grid = federation()
    strategy = FedMMD(mmd_weight=0.5, **KWARGS)
    result = run_rounds(strategy, grid, initial(), 3, **SETTINGS)
    assert not same(result.arrays, fedavg.arrays)
    assert {m.content["config"]["mmd-weight"] for _, m in pushed(grid, "train.fedmmd")} == {0.5}
    for r in (1, 2, 3):
        assert strategy.history[r]["mmd-clients"] == 3 and strategy.history[r]["plain-clients"] == 0
        assert strategy.history[r]["train-rejected"] == 0


def test_fedmmd_on_a_plain_app_is_fedavg_after_two_probes_and_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    first = ArrayRecord(plain_clientapp.Net().state_dict())
    grid = plain_federation()
    strategy = FedMMD()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = run_rounds(strategy, grid, first, 2, lr=0.5)
    expected = run_rounds(FedAvg(), plain_federation(), first, 2, lr=0.5)
    assert same(result.arrays, expected.arrays)
    assert kinds(grid).count("train.fedmmd") == 2  # the probe and its confirmation
    warnings = [r.getMessage() for r in caplog.records if "FedMMD" in r.getMessage()]
    assert len(warnings) == 1 and "reduces to FedAvg" in warnings[0]
    assert strategy.history[2]["mmd-clients"] == 0
    assert strategy.history[2]["plain-clients"] == NODES


def test_a_nan_reply_is_rejected_and_never_reaches_the_model() -> None:
    grid = federation()
    honest = grid.handlers[2]

    def poisoned(message: Message) -> Message:
        reply = honest(message)
        if reply.has_content():
            arrays = reply.content["arrays"]
            key = next(iter(arrays.keys()))
            bad = arrays[key].numpy().copy()
            bad[0] = np.nan
            arrays[key] = type(arrays[key])(bad)
        return reply

    grid.handlers[2] = poisoned
    strategy = FedMMD(fraction_train=1.0, fraction_evaluate=0.0)
    result = run_rounds(strategy, grid, initial(), 2, **SETTINGS)
    assert all(np.isfinite(result.arrays[k].numpy()).all() for k in result.arrays)
    assert strategy.history[1]["train-rejected"] == 1
    assert strategy.history[1]["train-replies"] == NODES - 1


# --- FedFusion ------------------------------------------------------------------------


@pytest.mark.parametrize("operator", ["conv", "multi", "single"])
def test_fedfusion_carries_and_trains_the_module_with_the_model(operator: str) -> None:
    grid = federation()
    strategy = FedFusion(operator=operator, fraction_train=1.0, fraction_evaluate=1.0)
    result = run_rounds(strategy, grid, initial(), 2, **SETTINGS)
    sent = pushed(grid, "train.fedfusion")
    assert len(sent) == 2 * NODES
    first = sent[0][1].content["arrays"]
    fusion = [k for k in first if k.startswith("fusion.")]
    assert fusion and list(first.keys())[: len(initial())] == list(initial().keys())
    assert list(result.arrays.keys()) == list(first.keys())
    assert all(not np.array_equal(result.arrays[k].numpy(), first[k].numpy())
               for k in fusion)  # the module trained and was averaged
    # the global model is the example-weighted mean of the replies (FedAvg's)
    assert strategy.history[2]["fusion-clients"] == NODES
    assert strategy.history[2]["eval-replies"] == NODES
    evaluated = pushed(grid, "evaluate.fedfusion")  # the fused model is scored
    assert len(evaluated) == 2 * NODES and not pushed(grid, "evaluate")
    assert all(list(m.content["arrays"].keys()) == list(first.keys()) for _, m in evaluated)
    model = load_model(net(), result.arrays)  # what the app's central evaluation builds
    assert model(torch.zeros(2, plain_clientapp.FEATURES)).shape == (2, 4)


def test_fedfusion_on_a_plain_app_drops_the_module_and_is_fedavg(
        caplog: pytest.LogCaptureFixture) -> None:
    first = ArrayRecord(plain_clientapp.Net().state_dict())
    grid = plain_federation()
    strategy = FedFusion(operator="multi")
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = run_rounds(strategy, grid, first, 2, lr=0.5)
    expected = run_rounds(FedAvg(), plain_federation(), first, 2, lr=0.5)
    assert same(result.arrays, expected.arrays)
    for _, message in pushed(grid, "train") + pushed(grid, "evaluate"):
        assert list(message.content["arrays"].keys()) == list(first.keys())
    assert sum("FedFusion" in r.getMessage() for r in caplog.records) == 1


def test_a_model_fedfusion_cannot_cut_trains_as_fedavg(
        caplog: pytest.LogCaptureFixture) -> None:
    handlers = {}
    for node in range(NODES):  # our handlers registered, but the app's model is no Sequential
        hooks = ClientHooks(load_data=lambda _c, p=node: skewed(p),
                            build_model=lambda *_: plain_clientapp.Net())
        app = register_hooks(ClientApp(), hooks, handlers=("train", "evaluate", "fedfusion"))
        context = make_context(node, NODES)
        handlers[node] = lambda message, a=app, c=context: a(message, c)
    grid = FakeGrid(handlers)
    first = ArrayRecord(plain_clientapp.Net().state_dict())
    strategy = FedFusion()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = run_rounds(strategy, grid, first, 2, **SETTINGS)
    assert list(result.arrays.keys()) == list(first.keys())
    assert strategy.history[2]["train-replies"] == NODES
    assert strategy.history[2]["fusion-clients"] == 0
    assert kinds(grid).count("train.fedfusion") == 2  # the probes only
    warnings = [r.getMessage() for r in caplog.records if "FedFusion" in r.getMessage()]
    assert len(warnings) == 1 and "torch.nn.Sequential model; got Net" in warnings[0]


def test_an_app_with_its_own_evaluate_scores_the_model_it_can_load(
        caplog: pytest.LogCaptureFixture) -> None:
    # The app keeps its own @app.train/@app.evaluate (strict load_state_dict of its
    # Sequential) and adds only our train.fedfusion handler.
    handlers = {}
    for node in range(NODES):
        app = register_hooks(plain_clientapp.make_app(net=net),
                             ClientHooks(load_data=lambda _c, p=node: skewed(p),
                                         build_model=net), handlers=("fedfusion",))
        context = make_context(node, NODES)
        handlers[node] = lambda message, a=app, c=context: a(message, c)
    grid = FakeGrid(handlers)
    strategy = FedFusion(fraction_train=1.0, fraction_evaluate=1.0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = run_rounds(strategy, grid, initial(), 2, **SETTINGS)
    entry = strategy.history[2]
    assert entry["fusion-clients"] == NODES and entry["eval-rejected"] == 0
    assert entry["eval-replies"] == NODES and "eval_acc" in entry
    assert kinds(grid).count("evaluate.fedfusion") == 2  # the probes only
    assert all(not any(k.startswith("fusion.") for k in m.content["arrays"])
               for _, m in pushed(grid, "evaluate"))
    warnings = [r.getMessage() for r in caplog.records if "evaluate.fedfusion" in r.getMessage()]
    assert len(warnings) == 1 and "score the base model" in warnings[0]
    assert any(k.startswith("fusion.") for k in result.arrays)


def test_in_a_mixed_federation_plain_nodes_leave_the_module_as_sent() -> None:
    grid = federation(plain=(3,))
    strategy = FedFusion(operator="single", fraction_train=1.0, fraction_evaluate=1.0)
    run_rounds(strategy, grid, initial(), 2, **SETTINGS)
    entry = strategy.history[2]
    assert entry["fusion-clients"] == NODES - 1 and entry["plain-clients"] == 1
    assert entry["train-rejected"] == 0 and entry["eval-rejected"] == 0
    plain_messages = [m for node, m in pushed(grid, "train") + pushed(grid, "evaluate")
                      if node == 3]
    assert plain_messages and all(
        not any(k.startswith("fusion.") for k in m.content["arrays"])
        for m in plain_messages)


def test_a_plain_node_that_names_its_model_record_otherwise_is_completed_too() -> None:
    grid = federation(plain=(3,))
    inner = grid.handlers[3]

    def renamed(message: Message) -> Message:  # the app's own record names
        reply = inner(message)
        content = RecordDict({"model": reply.content["arrays"],
                              "train_metrics": reply.content["metrics"]})
        return Message(content, reply_to=message)

    grid.handlers[3] = renamed
    strategy = FedFusion(operator="single", fraction_train=1.0, fraction_evaluate=0.0)
    run_rounds(strategy, grid, initial(), 2, **SETTINGS)
    entry = strategy.history[2]
    assert entry["plain-clients"] == 1 and entry["train-rejected"] == 0


def test_a_hooked_round_averages_the_module_with_the_plain_nodes_unchanged_share() -> None:
    grid = federation(plain=(0,))
    replies: dict[int, Message] = {}
    for node, handler in list(grid.handlers.items()):
        grid.handlers[node] = lambda m, h=handler, n=node: replies.setdefault(n, h(m))
    strategy = FedFusion(operator="single", gamma_momentum=0.0, fraction_train=1.0,
                         fraction_evaluate=0.0)
    result = run_rounds(strategy, grid, initial(), 1, **SETTINGS)
    sent = next(m for _, m in pushed(grid, "train.fedfusion")).content["arrays"]
    gammas = [replies[n].content["arrays"]["fusion.gamma"].numpy()[0] for n in range(1, NODES)]
    # every node holds 30 training examples: node 0 counts with the gamma it was sent
    expected = (sum(gammas) + sent["fusion.gamma"].numpy()[0]) / NODES
    assert result.arrays["fusion.gamma"].numpy()[0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("operator", ["multi", "single"])
def test_gamma_moves_by_the_authors_shadow_update_and_the_rest_is_fedavg(
        operator: str) -> None:
    grid = federation()
    replies: dict[tuple[int, int], Message] = {}
    for node, handler in list(grid.handlers.items()):
        def record(m: Message, h: Any = handler, n: int = node) -> Message:
            reply = h(m)
            if m.metadata.message_type == "train.fedfusion":
                replies[(int(m.content["config"]["server-round"]), n)] = reply
            return reply
        grid.handlers[node] = record
    strategy = FedFusion(operator=operator, fraction_train=1.0, fraction_evaluate=0.0)
    assert strategy.gamma_momentum == 0.9  # the authors' default
    result = run_rounds(strategy, grid, initial(), 2, **SETTINGS)
    round_2 = [m.content["arrays"] for _, m in pushed(grid, "train.fedfusion")][NODES:]
    sent = round_2[0]["fusion.gamma"].numpy()  # round 1's global gamma

    def mean_of(key: str) -> np.ndarray:  # equal example counts: the plain mean
        return np.mean([replies[(2, n)].content["arrays"][key].numpy()
                        for n in range(NODES)], axis=0)

    gamma = result.arrays["fusion.gamma"].numpy()
    assert gamma.dtype == np.float32 and np.any(sent != 0)  # round 1 moved it too
    np.testing.assert_allclose(gamma, 0.9 * sent + 0.1 * mean_of("fusion.gamma"),
                               rtol=1e-5, atol=1e-8)
    assert not np.allclose(gamma, mean_of("fusion.gamma"))
    first_weight = next(iter(initial().keys()))
    np.testing.assert_allclose(result.arrays[first_weight].numpy(), mean_of(first_weight),
                               rtol=1e-5, atol=1e-7)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="operator must be one of"):
        FedFusion(operator="sum")
    for momentum, fragment in ((1.0, r"in \[0, 1\)"), (-0.1, r"in \[0, 1\)"),
                               (True, "of type float")):
        with pytest.raises(ValueError, match=f"FedFusion: gamma_momentum must be {fragment}"):
            FedFusion(operator="multi", gamma_momentum=momentum)
    with pytest.raises(ValueError, match="FedMMD: mmd_weight must be >= 0, got -1.0"):
        FedMMD(mmd_weight=-1.0)
    with pytest.raises(ValueError, match="mmd_weight"):
        FedMMD(mmd_weight=float("nan"))
    assert isinstance(make_context(0), Context)
