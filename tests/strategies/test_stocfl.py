"""StoCFL as a Flower strategy, and its client handlers (sketches, bi-level training)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fakegrid import FakeGrid
from fedgsp_flwr.clients import HANDLERS
from fedgsp_flwr.clients.sketches import compute_sketch, project
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.models import build_model
from fedgsp_flwr.strategies import FedAvg, StoCFL
from fedgsp_flwr.training import normalized_gradient, train
from helpers import logistic, node_app, run_rounds

CLASSES = 4


def node_data(node: int) -> ClientData:
    """Latent group node % 2: group 1 has its labels shifted by one (y -> y + 1)."""
    rng = np.random.default_rng(node)
    n = 24 + 4 * (node % 3)
    y = rng.integers(0, CLASSES, n)
    x = (rng.normal(size=(n, 6)) + np.eye(CLASSES, 6)[y] * 3).astype(np.float32)
    y = (y + node % 2) % CLASSES
    return ClientData(x, y, x[:8], y[:8], CLASSES, latent_group=node % 2)


model = logistic(6, CLASSES)


def app_for(node: int, handlers: tuple[str, ...] = HANDLERS) -> object:
    return node_app(node_data, node, model, handlers=handlers)


def start(strategy: object, grid: FakeGrid, rounds: int) -> object:
    return run_rounds(strategy, grid, ArrayRecord(model().state_dict()), rounds,
                      **{"lr": 0.3, "batch-size": 8})


def test_latent_groups_become_clusters_and_are_scored() -> None:
    nodes = list(range(12))
    strategy = StoCFL(tau=0.5, lambda_=0.05, fraction_train=0.5, fraction_evaluate=1.0,
                      min_available_nodes=12, ground_truth={n: n % 2 for n in nodes}, seed=1)
    grid = FakeGrid({n: app_for(n) for n in nodes})
    start(strategy, grid, 4)
    groups = {strategy.clustering.cluster_of[n] for n in nodes if n % 2 == 0}, {
        strategy.clustering.cluster_of[n] for n in nodes if n % 2 == 1}
    assert len(groups[0]) == len(groups[1]) == 1 and groups[0] != groups[1]
    last = strategy.history[4]
    assert last["num-clusters"] == 2 and last["ari"] == 1.0 and last["nmi"] == 1.0
    assert last["clustered-clients"] == 12
    # Evaluation scores each node on its cluster's model and on the global model.
    assert last["eval-clients"] == 12 and 0 <= last["eval-acc-global"] <= 1
    # Label shifts conflict: one global model cannot fit both groups, cluster models can.
    assert last["eval-acc"] > last["eval-acc-global"] + 0.2
    # Per cluster: its model, its members and their evaluation on it.
    models = strategy.group_models()
    assert sorted(sorted(g.nodes) for g in models.values()) == [
        [n for n in nodes if n % 2 == 0], [n for n in nodes if n % 2 == 1]]
    assert all(g.metrics["eval-acc"] > last["eval-acc-global"] for g in models.values())
    assert all(models[c].arrays is strategy.models[c] for c in models)
    # Sketches are asked once per node, with the anchor (initial) model.
    sketch_queries = [p for p in grid.pushed if p[2] == "query.sketch"]
    assert sorted(p[1] for p in sketch_queries) == nodes
    anchor = model().state_dict()
    for _, _, _, message in sketch_queries:
        sent = message.content.array_records["arrays"].to_torch_state_dict()
        assert all(torch.equal(sent[k], anchor[k]) for k in anchor)


def test_lambda_zero_and_tau_minus_one_is_fedavg() -> None:
    nodes = list(range(6))
    stocfl = StoCFL(tau=-1.0, lambda_=0.0, fraction_train=1.0, fraction_evaluate=0.0,
                    min_available_nodes=6)
    fedavg = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=6)
    ours = start(stocfl, FakeGrid({n: app_for(n) for n in nodes}), 3)
    theirs = start(fedavg, FakeGrid({n: app_for(n) for n in nodes}), 3)
    assert stocfl.clustering.num_clusters == 1
    (cluster_model,) = stocfl.models.values()
    for key, value in theirs.arrays.items():  # type: ignore[attr-defined]
        np.testing.assert_allclose(ours.arrays[key].numpy(), value.numpy(), atol=1e-6)  # type: ignore[attr-defined]
        np.testing.assert_allclose(cluster_model[key].numpy(), value.numpy(), atol=1e-6)


def test_a_client_without_sketch_handler_trains_the_global_model(
        caplog: pytest.LogCaptureFixture) -> None:
    nodes = list(range(6))
    apps = {n: app_for(n) for n in nodes}
    apps[3] = app_for(3, handlers=("train", "evaluate"))  # a plain Flower ClientApp
    strategy = StoCFL(tau=0.5, fraction_train=1.0, fraction_evaluate=1.0,
                      min_available_nodes=6)
    grid = FakeGrid(apps)
    with caplog.at_level(logging.WARNING):
        result = start(strategy, grid, 2)
    assert 3 in strategy.plain and 3 not in strategy.clustering.cluster_of
    assert "node 3 has no sketch" in caplog.text
    assert strategy.history[2]["plain-clients"] == 1
    assert strategy.history[2]["train-replies"] == 6  # its plain train reply counted
    assert [p[2] for p in grid.pushed if p[1] == 3].count("train") == 2
    assert [p[2] for p in grid.pushed if p[1] == 3].count("query.sketch") == 1  # asked once
    assert result.arrays is not None  # type: ignore[attr-defined]


def test_a_bad_reply_never_reaches_an_aggregate(caplog: pytest.LogCaptureFixture) -> None:
    nodes = list(range(4))
    apps = {n: app_for(n) for n in nodes}
    honest = apps[2]

    def poisoned(message: Message) -> Message:
        reply = honest(message)  # type: ignore[operator]
        if message.metadata.message_type == "train.bilevel":
            record = reply.content.array_records["cluster"]
            key = next(iter(record))
            record[key] = Array(np.full(record[key].shape, np.nan, dtype=np.float32))
        return reply

    apps[2] = poisoned
    strategy = StoCFL(tau=-1.0, fraction_train=1.0, fraction_evaluate=0.0,
                      min_available_nodes=4)
    with caplog.at_level(logging.WARNING):
        result = start(strategy, FakeGrid(apps), 1)
    assert "rejected reply from node 2" in caplog.text and "NaN" in caplog.text
    assert strategy.history[1]["train-rejected"] == 1
    for record in (result.arrays, *strategy.models.values()):  # type: ignore[attr-defined]
        assert all(np.isfinite(v.numpy()).all() for v in record.values())


def test_held_out_clients_are_placed_by_inference() -> None:
    nodes = list(range(12))
    strategy = StoCFL(tau=0.5, fraction_train=1.0, fraction_evaluate=1.0,
                      holdout_fraction=0.25, min_available_nodes=12, seed=3)
    grid = FakeGrid({n: app_for(n) for n in nodes})
    start(strategy, grid, 2)
    assert len(strategy.held_out) == 3
    trained = [p[1] for p in grid.pushed if p[2].startswith("train")]
    assert not strategy.held_out & set(trained)
    for node in strategy.held_out:  # joined the cluster of its latent group
        peers = [n for n in nodes if n % 2 == node % 2 and n not in strategy.held_out]
        assert strategy.clustering.cluster_of[node] == strategy.clustering.cluster_of[peers[0]]
    assert strategy.history[1]["eval-placed"] == 3
    assert strategy.history[2]["eval-new-clients"] == 3
    assert strategy.history[2]["eval-trained-clients"] == 9


@pytest.mark.parametrize("merge_model", ["larger", "weighted"])
def test_merged_cluster_model(merge_model: str) -> None:
    vectors = {0: [1.0, 0.0], 1: [1.0, 0.05], 2: [1.0, 0.1]}

    def sketch_node(node: int) -> object:
        def handle(message: Message) -> Message:
            content = RecordDict({"sketch": ArrayRecord({"sketch": Array(
                np.array(vectors[node], dtype=np.float32))}),
                "metrics": MetricRecord({"num-examples": 1})})
            return Message(content=content, reply_to=message)
        return handle

    grid = FakeGrid({n: sketch_node(n) for n in vectors})
    anchor = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    trained = ArrayRecord({"w": Array(np.full(2, 3.0, dtype=np.float32))})
    strategy = StoCFL(tau=0.9, merge_model=merge_model)
    strategy.anchor = anchor
    strategy.cluster_new(grid, [0])
    strategy.models[0] = trained  # cluster 0 trained since
    merges = strategy.cluster_new(grid, [1, 2])
    assert [(m.kept, m.absorbed) for m in merges] == [(1, 2), (1, 0)]
    (model_,) = strategy.models.values()
    # larger: {1, 2} (size 2, the initial model) wins over {0}; weighted: (2*0 + 1*3)/3.
    expected = 0.0 if merge_model == "larger" else 1.0
    np.testing.assert_allclose(model_["w"].numpy(), expected, atol=1e-6)


def test_parameters_are_validated() -> None:
    for bad in ({"tau": 2.0}, {"lambda_": -1.0}, {"sketch": "hash"},
                {"merge_model": "first"}, {"holdout_fraction": 1.0}):
        with pytest.raises(ValueError, match="StoCFL"):
            StoCFL(**bad)  # type: ignore[arg-type]


# --- client handlers ------------------------------------------------------------------


def handler_reply(node: int, message_type: str, content: RecordDict) -> Message:
    app = app_for(node)
    return app(Message(content=content, dst_node_id=100, message_type=message_type))  # type: ignore[operator]


def bilevel(node: int, w: torch.nn.Module, theta: torch.nn.Module, **config: object
            ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    reply = handler_reply(node, "train.bilevel", RecordDict({
        "global": ArrayRecord(w.state_dict()), "cluster": ArrayRecord(theta.state_dict()),
        "config": ConfigRecord({"server-round": 1, **config})}))
    records = reply.content.array_records
    return records["global"].to_torch_state_dict(), records["cluster"].to_torch_state_dict()


def test_bilevel_with_lambda_zero_is_two_independent_trainings() -> None:
    w, theta = model(), build_model("logistic", (6,), CLASSES, seed=5)
    config = {"lambda": 0.0, "lr": 0.2, "batch-size": 8, "local-epochs": 2}
    new_w, new_theta = bilevel(1, w, theta, **config)
    for start_model, got in ((w, new_w), (theta, new_theta)):
        reply = handler_reply(1, "train", RecordDict({
            "arrays": ArrayRecord(start_model.state_dict()),
            "config": ConfigRecord({"server-round": 1, **config})}))
        alone = reply.content.array_records["arrays"].to_torch_state_dict()
        for key, value in alone.items():
            torch.testing.assert_close(got[key], value)


def test_bilevel_proximal_term_gradient() -> None:
    # One full-batch step: theta' = theta - lr (grad f(theta) + lambda (theta - w)).
    w, theta = model(), build_model("logistic", (6,), CLASSES, seed=5)
    lr, lam = 0.1, 2.0
    _, got = bilevel(0, w, theta, **{"lambda": lam, "lr": lr, "batch-size": 10**6})
    data = node_data(0)
    theta.zero_grad()
    torch.nn.functional.cross_entropy(theta(torch.from_numpy(data.x_train)),
                                      torch.from_numpy(data.y_train)).backward()
    w_params = dict(w.named_parameters())
    for name, p in theta.named_parameters():
        expected = p.detach() - lr * (p.grad + lam * (p.detach() - w_params[name].detach()))
        torch.testing.assert_close(got[name], expected, atol=1e-6, rtol=1e-5)


def test_sketch_modes_and_projection() -> None:
    anchor = model()
    data = node_data(0)

    def sketch(**config: object) -> np.ndarray:
        reply = handler_reply(0, "query.sketch", RecordDict({
            "arrays": ArrayRecord(anchor.state_dict()), "config": ConfigRecord(config)}))
        return reply.content.array_records["sketch"]["sketch"].numpy()

    np.testing.assert_allclose(sketch(), normalized_gradient(anchor, data.x_train,
                                                             data.y_train), atol=1e-6)
    update = sketch(**{"sketch-mode": "update", "sketch-epochs": 2, "lr": 0.1,
                       "batch-size": 10**6})
    trained = model()
    train(trained, data.x_train, data.y_train, epochs=2, lr=0.1, batch_size=10**6, seed=0)
    delta = torch.cat([(a - b).reshape(-1) for a, b in zip(
        anchor.parameters(), trained.parameters(), strict=True)]).detach().double().numpy()
    np.testing.assert_allclose(update, delta / np.linalg.norm(delta), atol=1e-5)
    projected = sketch(**{"sketch-dim": 8, "sketch-seed": 7})
    raw = sketch()
    expected = project(raw, 8, 7)
    np.testing.assert_allclose(projected, expected / np.linalg.norm(expected), atol=1e-5)
    assert projected.shape == (8,) and np.linalg.norm(projected) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="sketch mode"):
        compute_sketch(anchor, data.x_train, data.y_train, mode="hash")


def test_projection_preserves_cosines() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=(6, 50_000))
    mixed = base + rng.normal(size=(6, 50_000)) * np.linspace(0.2, 3, 6)[:, None]
    raw = np.stack([base[0], *mixed])
    proj = np.stack([project(v, 2048, seed=3) for v in raw]).astype(np.float64)
    cos = lambda m: (m / np.linalg.norm(m, axis=1, keepdims=True)) @ (  # noqa: E731
        m / np.linalg.norm(m, axis=1, keepdims=True)).T
    assert np.abs(cos(raw) - cos(proj)).max() < 0.06
    assert not np.allclose(project(raw[0], 2048, seed=3), project(raw[0], 2048, seed=4))


def test_a_silent_node_sits_out_until_its_sketch_query_is_answered() -> None:
    """A node that does not answer its training message is left out of the next rounds
    while it does not answer a new sketch query; then it trains in its cluster again.
    """
    nodes = list(range(6))
    grid = FakeGrid({n: app_for(n) for n in nodes})
    alive = {"node 4": True}
    answer = grid.handlers[4]
    grid.handlers[4] = lambda message: answer(message) if alive["node 4"] else None
    strategy = StoCFL(tau=0.5, fraction_train=1.0, fraction_evaluate=0.0,
                      min_available_nodes=6, train_timeout=0.5, query_timeout=0.3, seed=1)
    start(strategy, grid, 1)
    cluster = strategy.clustering.cluster_of[4]
    alive["node 4"] = False
    start(strategy, grid, 2)
    assert strategy.history[1]["train-rejected"] == 1 and strategy.history[1]["train-replies"] == 5
    assert strategy.history[2]["sampled"] == 5 and strategy.history[2]["train-rejected"] == 0
    assert strategy.suspects == {4}
    alive["node 4"] = True
    start(strategy, grid, 1)
    assert strategy.history[1]["train-replies"] == 6 and strategy.suspects == set()
    assert strategy.clustering.cluster_of[4] == cluster, "it keeps its cluster"
    sketches = [n for _, n, t, _ in grid.pushed if t == "query.sketch"]
    assert sketches.count(4) == 3, "asked at first, while silent, and on its return"
    assert sketches.count(0) == 1
