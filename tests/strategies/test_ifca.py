"""IFCA as a Flower strategy, on an in-process grid of nodes with planted groups."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import plain_clientapp
import pytest
from fakegrid import FakeGrid, partition_node
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from helpers import make_context, run_rounds, vector_data

from fedgsp_flwr.clients import ClientHooks, register_hooks
from fedgsp_flwr.clients.ifca import make_ifca_handler
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.strategies import TrainingStalled
from fedgsp_flwr.strategies.ifca import IFCA
from fedgsp_flwr.strategies.ifca_replies import choice_problem
from fedgsp_flwr.strategies.state import StrategyState

TARGETS = np.array([[0.0, 0.0, 0.0], [20.0, 0.0, 0.0], [0.0, 20.0, 0.0]])
MISSING = "No train function registered with name 'ifca'"  # Flower's ClientApp error


def node_handler(partition: int, groups: int = 3, plain: bool = False,
                 eval_metrics: Callable[[float, float], dict[str, Any]] | None = None,
                 hostile: Callable[[Message, Message], Message] | None = None,
                 ) -> Callable[[Message], Message]:
    """Node of group ``partition % groups``: the loss of a model on its training data is
    the squared distance of ``head`` to the group's target plus a small node offset;
    training moves ``head`` halfway to that point and ``body`` halfway to the partition
    id (a signal every node shares the form of). Evaluation: the distance to the group's
    target itself (eval-loss) and whether ``head`` is nearest it (eval-acc).

    ``plain``: no ``train.ifca`` handler. ``hostile`` rewrites the ``train.ifca`` reply.
    """
    group = partition % groups
    point = TARGETS[group] + np.random.default_rng(partition).normal(scale=0.1, size=3)

    def loss(record: ArrayRecord) -> float:
        return float(((record["head"].numpy() - point) ** 2).sum())

    def trained(record: ArrayRecord) -> ArrayRecord:
        head = 0.5 * record["head"].numpy() + 0.5 * point.astype(np.float32)
        body = 0.5 * record["body"].numpy() + 0.5 * np.float32(partition)
        return ArrayRecord({"head": Array(head.astype(np.float32)),
                            "body": Array(body.astype(np.float32))})

    def reply(message: Message, arrays: ArrayRecord, metrics: dict[str, Any]) -> Message:
        return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}),
                       reply_to=message)

    def handle(message: Message) -> Message:
        kind, content = message.metadata.message_type, message.content
        if kind == "evaluate":
            head = content["arrays"]["head"].numpy()
            distance = float(((head - TARGETS[group]) ** 2).sum())
            nearest = int(np.argmin(((TARGETS[:groups] - head) ** 2).sum(1)))
            metrics = (eval_metrics or (lambda d, a: {"eval-loss": d, "eval-acc": a}))(
                distance, float(nearest == group))
            return Message(RecordDict({"metrics": MetricRecord(
                {**metrics, "num-examples": 5})}), reply_to=message)
        if kind == "train":
            return reply(message, trained(content["arrays"]),
                         {"train_loss": loss(content["arrays"]), "num-examples": 10 + partition})
        if kind == "train.ifca" and not plain:
            models = [content[f"model-{j}"] for j in range(len(content.array_records))]
            losses = [loss(m) for m in models]
            choice = int(np.argmin(losses))
            answer = reply(message, trained(models[choice]), {
                "train-loss": losses[choice], "num-examples": 10 + partition,
                "ifca-choice": choice, "ifca-losses": losses})
            return hostile(message, answer) if hostile else answer
        raise ValueError(MISSING if kind == "train.ifca" else f"unexpected {kind}")

    return partition_node(partition, handle)


def node_id(partition: int, shift: int = 0) -> int:
    return 7000 + 13 * partition + shift


def grid_of(partitions: range | list[int], shift: int = 0, **options: Any) -> FakeGrid:
    return FakeGrid({node_id(p, shift): node_handler(p, **options) for p in partitions})


def initial() -> ArrayRecord:
    return ArrayRecord({"head": Array(np.array([3.0, -4.0, 8.0], dtype=np.float32)),
                        "body": Array(np.array([1.0, 2.0], dtype=np.float32))})


# Three models near one another, each nearest one target: the group of target j picks
# model j in the first round (checked by hand: 75 < 77 = 77, 237 < 275 < 317, ...).
HEADS = [[5.0, 5.0, 5.0], [6.0, 4.0, 5.0], [4.0, 6.0, 5.0]]


def factory(heads: list[list[float]] = HEADS) -> Callable[[int], ArrayRecord]:
    return lambda j: ArrayRecord({"head": Array(np.array(heads[j], dtype=np.float32)),
                                  "body": Array(np.full(2, float(j), dtype=np.float32))})


def start(strategy: IFCA, grid: FakeGrid, rounds: int) -> Any:
    return run_rounds(strategy, grid, initial(), rounds, lr=0.1)


def heads(strategy: IFCA) -> np.ndarray:
    return np.stack([m["head"].numpy() for m in strategy.models])


def truth(partitions: range, groups: int = 3) -> dict[int, int]:
    return {p: p % groups for p in partitions}


def test_planted_groups_are_recovered_and_each_model_fits_its_group() -> None:
    strategy = IFCA(k=3, init="seeds", model_factory=factory(), ground_truth=truth(range(12)),
                    fraction_train=1.0, fraction_evaluate=1.0, seed=0)
    start(strategy, grid_of(range(12)), rounds=4)
    first, last = strategy.history[1], strategy.history[4]
    assert first["ari"] == 1.0 and last["ari"] == 1.0
    assert first["choice-counts"] == [4, 4, 4] and first["new-choosers"] == 12
    assert last["choice-changes"] == 0 and last["cluster-sizes"] == [4, 4, 4]
    assert last["eval-acc"] == 1.0 and last["eval-inferred"] == 0
    assert {strategy.choice[node_id(p)] for p in range(12)} == {0, 1, 2}
    assert all(strategy.choice[node_id(p)] == p % 3 for p in range(12))
    gaps = np.sqrt(((heads(strategy) - TARGETS) ** 2).sum(1))
    assert gaps.max() < 1.5  # about 20 at the start, halved four times
    assert len(last["ifca-losses"]) == 3 and "train-loss" in last
    groups = strategy.group_models()
    assert [sorted(g.partition_ids.values()) for g in groups.values()] == [
        [0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]


def test_a_wrong_choice_rule_would_not_recover_the_groups() -> None:
    """The same run with every node forced to report the argmax breaks the groups: the
    strategy rejects the false choices instead of averaging them.
    """
    def argmax(_message: Message, answer: Message) -> Message:
        metrics = answer.content["metrics"]
        metrics["ifca-choice"] = int(np.argmax(metrics["ifca-losses"]))
        return answer

    strategy = IFCA(k=3, init="seeds", model_factory=factory(), fraction_train=1.0,
                    fraction_evaluate=0.0, max_untrained_rounds=1)
    with pytest.raises(TrainingStalled, match="above the minimum"):
        start(strategy, grid_of(range(6), hostile=argmax), rounds=1)


def test_each_model_is_the_weighted_mean_of_its_choosers_by_hand() -> None:
    strategy = IFCA(k=3, init="seeds", model_factory=factory(), fraction_train=1.0,
                    fraction_evaluate=0.0)
    start(strategy, grid_of(range(6)), rounds=1)
    for j in range(3):
        members = [p for p in range(6) if p % 3 == j]  # group j chose model j
        weights = np.array([10.0 + p for p in members])
        points = [TARGETS[j] + np.random.default_rng(p).normal(scale=0.1, size=3)
                  for p in members]
        fits = [0.5 * np.float32(HEADS[j]) + 0.5 * pt.astype(np.float32) for pt in points]
        expected = (weights[:, None] * np.array(fits)).sum(0) / weights.sum()
        np.testing.assert_allclose(strategy.models[j]["head"].numpy(), expected, rtol=1e-6)
        bodies = [0.5 * j + 0.5 * p for p in members]  # no shared layers: per choice
        np.testing.assert_allclose(strategy.models[j]["body"].numpy(),
                                   np.full(2, (weights * bodies).sum() / weights.sum()),
                                   rtol=1e-6)


def test_shared_layers_are_averaged_over_all_nodes_and_the_head_per_choice() -> None:
    strategy = IFCA(k=3, init="seeds", model_factory=factory(), head_layers=["head"],
                    fraction_train=1.0, fraction_evaluate=0.0)
    grid = grid_of(range(6))
    start(strategy, grid, rounds=1)
    sent = next(m for _, _, kind, m in grid.pushed if kind == "train.ifca")
    for j in range(3):  # one feature extractor from the start: model 0's
        assert sent.content[f"model-{j}"]["body"].numpy().tolist() == [0.0, 0.0]
        assert sent.content[f"model-{j}"]["head"].numpy().tolist() == HEADS[j]
    weights = np.array([10.0 + p for p in range(6)])
    shared = (weights * (0.5 * 0.0 + 0.5 * np.arange(6))).sum() / weights.sum()
    for j in range(3):
        np.testing.assert_allclose(strategy.models[j]["body"].numpy(), [shared] * 2,
                                   rtol=1e-6)
        members = [p for p in range(6) if p % 3 == j]
        w = np.array([10.0 + p for p in members])
        fits = [0.5 * np.float32(HEADS[j]) + 0.5 * (TARGETS[j] + np.random.default_rng(
            p).normal(scale=0.1, size=3)).astype(np.float32) for p in members]
        np.testing.assert_allclose(strategy.models[j]["head"].numpy(),
                                   (w[:, None] * np.array(fits)).sum(0) / w.sum(), rtol=1e-6)


def test_a_model_nobody_chooses_keeps_its_weights(caplog: pytest.LogCaptureFixture) -> None:
    far = [[2.0, 2.0, 2.0], [12.0, 2.0, 2.0], [500.0, 500.0, 500.0]]
    strategy = IFCA(k=3, init="seeds", model_factory=factory(far), fraction_train=1.0,
                    fraction_evaluate=0.0, ground_truth=truth(range(8), groups=2))
    before = [m["head"].numpy().tobytes() + m["body"].numpy().tobytes() for m in
              [factory(far)(j) for j in range(3)]]
    with caplog.at_level(logging.INFO, logger="flwr"):
        start(strategy, grid_of(range(8), groups=2), rounds=3)
    after = strategy.models[2]
    assert after["head"].numpy().tobytes() + after["body"].numpy().tobytes() == before[2]
    assert all(strategy.history[r]["unchosen-models"] == 1 for r in (1, 2, 3))
    assert strategy.history[3]["cluster-sizes"] == [4, 4, 0]
    assert strategy.history[3]["ari"] == 1.0
    assert sum("model 2 was chosen by no node" in r.getMessage() for r in caplog.records) == 3


def test_plain_nodes_choose_by_their_evaluate_loss_and_train_with_plain_messages(
        caplog: pytest.LogCaptureFixture) -> None:
    strategy = IFCA(k=3, init="seeds", model_factory=factory(), fraction_train=1.0,
                    fraction_evaluate=1.0, ground_truth=truth(range(9)))
    grid = grid_of(range(9), plain=True,
                   eval_metrics=lambda d, a: {"eval_loss": d, "eval_acc": a})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start(strategy, grid, rounds=1)
    # Round 1, by hand: each node's k evaluate losses, then one plain train of the argmin.
    for p in range(9):
        mine = [(kind, m) for _, n, kind, m in grid.pushed if n == node_id(p)]
        evaluated = [m for kind, m in mine if kind == "evaluate"][:3]
        losses = [((m.content["arrays"]["head"].numpy() - TARGETS[p % 3]) ** 2).sum()
                  for m in evaluated]
        trains = [m for kind, m in mine if kind == "train"]
        assert [m.content["arrays"]["head"].numpy().tolist() for m in evaluated] == HEADS
        assert len(trains) == 1
        assert trains[0].content["arrays"]["head"].numpy().tolist() == HEADS[int(
            np.argmin(losses))]
    start(strategy, grid, rounds=2)
    assert [kind for _, _, kind, _ in grid.pushed].count("train.ifca") == 2  # two probes
    missing = [r.getMessage() for r in caplog.records if "has no 'train.ifca'" in r.getMessage()]
    assert len(missing) == 1 and "plain 'evaluate'" in missing[0]
    last = strategy.history[2]
    assert len(strategy.plain) == 9 and last["plain-clients"] == 9
    assert last["ari"] == 1.0 and last["eval_acc"] == 1.0
    assert last["train-rejected"] == 0 and "train_loss" in last


def test_a_plain_reply_without_a_loss_is_rejected_with_one_reason_per_node(
        caplog: pytest.LogCaptureFixture) -> None:
    grid = grid_of(range(4), plain=True, eval_metrics=lambda d, a: {"distance": d, "acc": a})
    strategy = IFCA(k=2, fraction_train=1.0, fraction_evaluate=0.0, max_untrained_rounds=2)
    with caplog.at_level(logging.WARNING, logger="flwr"), pytest.raises(
            TrainingStalled, match="have no loss"):
        start(strategy, grid, rounds=3)
    rejected = [r.getMessage() for r in caplog.records if "rejected reply" in r.getMessage()]
    assert len(rejected) == 8  # 4 nodes, 2 rounds, one line each
    assert not any(kind == "train" for _, _, kind, _ in grid.pushed)
    # Naming the metric is enough.
    named = IFCA(k=2, fraction_train=1.0, fraction_evaluate=0.0, loss_key="distance")
    start(named, grid_of(range(4), plain=True,
                         eval_metrics=lambda d, a: {"distance": d, "acc": a}), rounds=1)
    assert named.history[1]["train-replies"] == 4


def hostile_rewrites() -> dict[int, Callable[[Message, Message], Message]]:
    def metric(key: str, value: Any) -> Callable[[Message, Message], Message]:
        def rewrite(_message: Message, answer: Message) -> Message:
            answer.content["metrics"][key] = value
            return answer
        return rewrite

    def drop_weight(_message: Message, answer: Message) -> Message:
        del answer.content["metrics"]["num-examples"]
        return answer

    def arrays(values: dict[str, np.ndarray]) -> Callable[[Message, Message], Message]:
        def rewrite(_message: Message, answer: Message) -> Message:
            answer.content["arrays"] = ArrayRecord({k: Array(v) for k, v in values.items()})
            return answer
        return rewrite

    head, body = np.full(3, 1e6, np.float32), np.full(2, 1e6, np.float32)
    return {
        100: metric("ifca-choice", 7),                     # out of range
        101: metric("ifca-losses", [0.0, 1.0]),            # k - 1 losses
        102: metric("ifca-choice", 2),                     # not its lowest loss
        103: drop_weight,                                  # no num-examples
        104: arrays({"head": np.full(4, 1e6, np.float32), "body": body}),  # wrong shape
        105: arrays({"head": np.array([np.nan, 1, 1], np.float32), "body": body}),  # NaN
        106: arrays({"head": head.astype(np.float64), "body": body}),     # wrong dtype
        107: metric("num-examples", float("nan")),        # NaN weight
    }


def test_hostile_replies_are_rejected_with_one_reason_and_never_reach_a_model(
        caplog: pytest.LogCaptureFixture) -> None:
    honest = IFCA(k=3, init="seeds", model_factory=factory(), fraction_train=1.0,
                  fraction_evaluate=0.0)
    start(honest, grid_of(range(9)), rounds=2)
    rewrites = hostile_rewrites()
    grid = grid_of(range(9))
    grid.handlers.update({node_id(p): node_handler(p, hostile=h) for p, h in rewrites.items()})
    strategy = IFCA(k=3, init="seeds", model_factory=factory(), fraction_train=1.0,
                    fraction_evaluate=0.0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start(strategy, grid, rounds=2)
    assert strategy.history[2]["train-rejected"] == len(rewrites)
    assert strategy.history[2]["train-replies"] == 9
    for ours, theirs in zip(strategy.models, honest.models, strict=True):
        for key in theirs:  # the 9 honest nodes alone, bit for bit
            assert ours[key].numpy().tobytes() == theirs[key].numpy().tobytes()
    lines = [r.getMessage() for r in caplog.records if "rejected reply" in r.getMessage()]
    assert len(lines) == 2 * len(rewrites)
    for partition, fragment in zip(rewrites, [
            "integer in [0, 3)", "must list 3 losses", "above the minimum",
            "'num-examples' is missing", "expected float32[3]", "NaN or inf",
            "expected float32[3]", "must be a number in"], strict=False):
        mine = [line for line in lines
                if f"node {node_id(partition)} (partition {partition}):" in line]
        assert len(mine) == 2 and fragment in mine[0], (partition, mine)
    assert not any(n in strategy.choice for n in (node_id(p) for p in rewrites))


def test_a_restored_checkpoint_runs_the_next_round_as_the_original() -> None:
    def make() -> IFCA:
        return IFCA(k=3, head_layers=["head"], fraction_train=0.5, fraction_evaluate=0.5,
                    ground_truth=truth(range(12)), seed=5)

    original = make()
    start(original, grid_of(range(12)), rounds=2)
    state = original.checkpoint_state()
    state = StrategyState(json.loads(json.dumps(state.meta)), dict(state.arrays))
    resumed = make()
    resumed.restore_state(state, lambda n: n + 1)  # node ids change on resume
    start(original, grid_of(range(12)), rounds=1)
    start(resumed, grid_of(range(12), shift=1), rounds=1)
    for ours, theirs in zip(resumed.models, original.models, strict=True):
        assert list(ours.keys()) == list(theirs.keys())
        for key in theirs:
            assert ours[key].numpy().tobytes() == theirs[key].numpy().tobytes()
    assert resumed.choice == {n + 1: c for n, c in original.choice.items()}
    timeless = {k: v for k, v in original.history[1].items() if not k.endswith("time")}
    assert {k: v for k, v in resumed.history[1].items() if not k.endswith("time")} == timeless


def test_the_default_init_redraws_models_from_the_initial_one() -> None:
    again = IFCA(k=3, seed=1)
    again.setup(initial())
    other = IFCA(k=3, seed=2)
    other.setup(initial())
    start_head = initial()["head"].numpy()
    assert again.models[0]["head"].numpy().tolist() == start_head.tolist()
    for j in (1, 2):
        head = again.models[j]["head"].numpy()
        assert head.dtype == np.float32 and not np.allclose(head, start_head)
        assert not np.allclose(head, other.models[j]["head"].numpy())
    assert not np.allclose(again.models[1]["head"].numpy(), again.models[2]["head"].numpy())
    shared = IFCA(k=3, head_layers=["head"], seed=1)
    shared.setup(initial())
    for model in shared.models:  # the feature extractor is the initial one in all
        assert model["body"].numpy().tolist() == [1.0, 2.0]
    assert shared.models[1]["head"].numpy().tolist() == again.models[1]["head"].numpy().tolist()


def test_warmup_rounds_train_a_random_group_each_with_plain_messages() -> None:
    strategy = IFCA(k=2, init="seeds", model_factory=factory(), warmup_rounds=2,
                    fraction_train=1.0, fraction_evaluate=0.0, seed=3)
    grid = grid_of(range(8))
    start(strategy, grid, rounds=3)
    kinds = [(node, kind, message) for _, node, kind, message in grid.pushed
             if kind.startswith("train")]
    assert [k for _, k, _ in kinds[:16]] == ["train"] * 16  # two warm-up rounds
    assert all(k == "train.ifca" for _, k, _ in kinds[16:]) and len(kinds) == 24
    assert sorted(set(strategy.warmup_group.values())) == [0, 1]
    assert strategy.history[1]["warmup"] == 1 and strategy.history[3]["warmup"] == 0
    assert strategy.history[2]["chosen-clients"] == 0
    assert strategy.history[3]["chosen-clients"] == 8
    counts = np.bincount([strategy.warmup_group[n] for n in strategy.warmup_group], minlength=2)
    assert strategy.history[1]["choice-counts"] == counts.tolist()


def test_evaluation_scores_own_models_and_infers_for_nodes_that_never_chose() -> None:
    strategy = IFCA(k=3, init="seeds", model_factory=factory(), fraction_train=0.5,
                    fraction_evaluate=1.0, seed=4)
    grid = grid_of(range(12))
    start(strategy, grid, rounds=1)
    chosen = dict(strategy.choice)
    assert len(chosen) == 6
    evaluations = [(n, m) for _, n, kind, m in grid.pushed if kind == "evaluate"]
    for p in range(12):
        mine = [m for n, m in evaluations if n == node_id(p)]
        if node_id(p) in chosen:
            assert len(mine) == 1 and mine[0].content["arrays"] is strategy.models[
                chosen[node_id(p)]]
        else:
            assert len(mine) == 3
    assert strategy.history[1]["eval-inferred"] == 6
    assert strategy.history[1]["eval-clients"] == 12
    assert strategy.history[1]["eval-acc"] == 1.0  # the inferred model is the group's
    assert strategy.choice == chosen  # evaluation chose nothing
    assert set(strategy.model_metrics) == {0, 1, 2}


def test_defaults_and_bad_parameters() -> None:
    strategy = IFCA()
    assert (strategy.k, strategy.init, strategy.head_layers, strategy.warmup_rounds,
            strategy.loss_key) == (4, "redraw", None, 0, None)
    for kwargs, fragment in [
            ({"k": 0}, "k must be > 0, got 0"),
            ({"k": 2.0}, "k must be of type int, got 2.0"),
            ({"init": "random"}, "init must be one of"),
            ({"init": "seeds"}, "init='seeds' needs a model_factory"),
            ({"head_layers": "fc"}, "head_layers must be None or a list"),
            ({"head_layers": []}, "head_layers must be None or a list"),
            ({"warmup_rounds": -1}, "warmup_rounds must be"),
            ({"loss_key": ""}, "loss_key must be"),
            ({"query_timeout": 0}, "query_timeout must be > 0")]:
        with pytest.raises(ValueError, match=f"IFCA: {fragment}"):
            IFCA(**kwargs)
    with pytest.raises(ValueError, match=r"\['fc'\] name no array"):
        start(IFCA(head_layers=["fc"], fraction_evaluate=0.0), grid_of(range(2)), rounds=1)
    bad = IFCA(init="seeds", model_factory=lambda j: ArrayRecord(
        {"head": Array(np.zeros(4, np.float32)), "body": Array(np.zeros(2, np.float32))}))
    with pytest.raises(ValueError, match=r"model_factory\(0\) does not fit"):
        start(bad, grid_of(range(2)), rounds=1)


def test_artifacts_name_partitions_and_save_the_models() -> None:
    strategy = IFCA(k=2, fraction_train=1.0, fraction_evaluate=0.0)
    start(strategy, grid_of(range(4)), rounds=1)
    files = strategy.artifacts(final=True)
    state = json.loads(str(files["ifca.json"]))
    assert set(state["choices"]) == {f"partition-{p}" for p in range(4)}
    assert sum(state["sizes"]) == 4 and isinstance(files["ifca-models.npz"], bytes)


# --- with our handlers and with a plain Flower app ------------------------------------

def shifted_data(partition: int) -> ClientData:
    """Group ``partition % 2``; group 1's labels are group 0's shifted by one class
    (concept shift: the same features, another labelling).
    """
    base = vector_data(n=60, dim=6, classes=3, seed=partition)
    shift = partition % 2
    return ClientData(base.x_train, (base.y_train + shift) % 3, base.x_test,
                      (base.y_test + shift) % 3, 3)


def hooked_node(partition: int) -> Callable[[Message], Message]:
    from fedgsp_flwr.models import build_model

    hooks = ClientHooks(load_data=lambda _c: shifted_data(partition),
                        build_model=lambda *_: build_model("logistic", (6,), 3, seed=0))
    app = register_hooks(ClientApp(), hooks, handlers=("train", "evaluate", "partition"))
    app.train("ifca")(make_ifca_handler(hooks))
    context: Context = make_context(partition, 8)
    return lambda message: app(message, context)


def test_our_handler_separates_two_concept_shifted_groups() -> None:
    from fedgsp_flwr.models import build_model

    grid = FakeGrid({node_id(p): hooked_node(p) for p in range(8)})
    strategy = IFCA(k=2, fraction_train=1.0, fraction_evaluate=1.0, seed=0,
                    ground_truth={p: p % 2 for p in range(8)})
    start_model = ArrayRecord(build_model("logistic", (6,), 3, seed=0).state_dict())
    run_rounds(strategy, grid, start_model, 6, lr=0.5, **{"local-epochs": 2})
    last = strategy.history[6]
    assert last["ari"] == 1.0 and sorted(last["cluster-sizes"]) == [4, 4]
    assert last["eval-acc"] > 0.8 and last["train-rejected"] == 0


def test_defaults_train_a_plain_quickstart_shaped_app() -> None:
    grid = plain_clientapp.plain_grid(6)
    strategy = IFCA()
    start_model = ArrayRecord(plain_clientapp.Net().state_dict())
    result = run_rounds(strategy, grid, start_model, 2, lr=0.5)
    last = strategy.history[2]
    assert last["train-rejected"] == 0 and last["eval-rejected"] == 0
    assert last["plain-clients"] == 6 and "train_loss" in last and "eval_acc" in last
    assert not all(np.array_equal(result.arrays[k].numpy(), start_model[k].numpy())
                   for k in start_model)
    pushed = [kind for _, _, kind, _ in grid.pushed]
    assert pushed.count("train.ifca") == 2 and pushed.count("query.partition") == 2


@pytest.mark.parametrize(("choice", "losses", "expected"), [
    (1, [0.5, 0.2, 0.3], None),
    (1.0, [0.5, 0.2, 0.3], None),
    (0, [0.2, 0.2, 0.3], None),  # a tie: either model is the minimum
    (1, [0.2, 0.2, 0.3], None),
    (3, [0.5, 0.2, 0.3], "integer in [0, 3)"),
    (-1, [0.5, 0.2, 0.3], "integer in [0, 3)"),
    (0.5, [0.5, 0.2, 0.3], "integer in [0, 3)"),
    (True, [0.5, 0.2, 0.3], "integer in [0, 3)"),
    (None, [0.5, 0.2, 0.3], "integer in [0, 3)"),
    (1, [0.5, 0.2], "must list 3 losses"),
    (1, 0.2, "must list 3 losses"),
    (1, None, "must list 3 losses"),
    (1, [0.5, 0.2, math.nan], "non-finite"),
    (0, [0.5, 0.2, 0.3], "above the minimum"),
])
def test_a_reported_choice_must_be_the_argmin_of_k_finite_losses(
        choice: object, losses: object, expected: str | None) -> None:
    problem = choice_problem(choice, losses, 3)
    assert problem is None if expected is None else expected in str(problem)
