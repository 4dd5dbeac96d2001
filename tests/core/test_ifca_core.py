"""IFCA's pure parts: the choice, per-choice averaging, the initialisation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedgsp_flwr.core.ifca import (
    NON_FINITE_LOSS,
    average_by_choice,
    find_loss_key,
    head_arrays,
    pick_model,
    redraw_like,
    reported_losses,
    share_arrays,
)


def test_the_choice_is_the_lowest_finite_loss_ties_to_the_lower_index() -> None:
    assert pick_model([0.9, 0.2, 0.5]) == 1
    assert pick_model([0.3, 0.1, 0.1]) == 1
    assert pick_model([math.nan, 0.4, math.inf, 0.7]) == 1
    assert pick_model([2.0]) == 0
    with pytest.raises(ValueError, match="no finite loss"):
        pick_model([math.nan, math.inf])
    with pytest.raises(ValueError, match="no finite loss"):
        pick_model([])
    assert reported_losses([0.5, math.nan, -math.inf]) == [0.5, NON_FINITE_LOSS,
                                                           NON_FINITE_LOSS]



@pytest.mark.parametrize(("metrics", "preferred", "key"), [
    ({"eval-loss": 0.1, "eval-acc": 0.9, "num-examples": 5}, None, "eval-loss"),
    ({"eval_loss": 0.1, "eval_acc": 0.9}, None, "eval_loss"),
    ({"loss": 0.1, "accuracy": 0.9}, None, "loss"),
    ({"val_loss": 0.1, "loss": 0.3}, None, "val_loss"),
    ({"myLoss": 0.1, "acc": 0.9}, None, "myLoss"),
    ({"ce_loss": 0.1, "kl_loss": 0.2}, None, None),  # ambiguous
    ({"accuracy": 0.9, "num-examples": 5}, None, None),
    ({"eval_loss": [0.1, 0.2]}, None, None),  # not one number
    ({"eval_loss": 0.1, "nll": 0.3}, "nll", "nll"),
    ({"eval_loss": 0.1}, "nll", None),
])
def test_the_loss_of_a_plain_evaluate_reply_is_found_by_its_name(
        metrics: dict[str, object], preferred: str | None, key: str | None) -> None:
    assert find_loss_key(metrics, preferred) == key


def test_head_layers_are_array_names_or_module_prefixes() -> None:
    names = ["conv.weight", "conv.bias", "fc1.weight", "fc1.bias", "fc10.weight"]
    assert head_arrays(names, None) is None
    assert head_arrays(names, ["fc1"]) == ["fc1.weight", "fc1.bias"]  # not fc10
    assert head_arrays(names, ["fc10.weight", "conv.bias"]) == ["conv.bias", "fc10.weight"]
    with pytest.raises(ValueError, match=r"\['fc2'\] name no array"):
        head_arrays(names, ["fc1", "fc2"])


def model(head: list[float], body: list[float]) -> dict[str, np.ndarray]:
    return {"body": np.array(body, dtype=np.float32), "head": np.array(head, dtype=np.float32),
            "steps": np.array([7], dtype=np.int64)}


MODELS = [model([0.0, 0.0], [1.0]), model([10.0, 10.0], [2.0]), model([-5.0, 5.0], [3.0])]
UPDATES = [
    (0, model([1.0, 2.0], [4.0]), 1.0),
    (1, model([12.0, 8.0], [6.0]), 3.0),
    (0, model([4.0, 5.0], [10.0]), 2.0),
]


def test_each_model_is_the_weighted_mean_of_its_choosers_and_an_unchosen_one_stays() -> None:
    step = average_by_choice(MODELS, UPDATES)
    # model 0: (1 * [1, 2] + 2 * [4, 5]) / 3 = [3, 4]; body (4 + 20) / 3 = 8
    np.testing.assert_allclose(step.models[0]["head"], [3.0, 4.0], rtol=1e-6)
    np.testing.assert_allclose(step.models[0]["body"], [8.0], rtol=1e-6)
    np.testing.assert_array_equal(step.models[1]["head"], [12.0, 8.0])  # its only chooser
    np.testing.assert_array_equal(step.models[1]["body"], [6.0])
    for key, value in MODELS[2].items():  # nobody chose model 2: bit for bit the same
        assert step.models[2][key].tobytes() == value.tobytes()
        assert step.models[2][key].dtype == value.dtype
    assert step.counts == [2, 1, 0] and step.empty == [2]
    assert all(m["head"].dtype == np.float32 for m in step.models)
    assert all(m["steps"].dtype == np.int64 for m in step.models)


def test_shared_layers_are_averaged_over_every_update_and_land_in_every_model() -> None:
    step = average_by_choice(MODELS, UPDATES, head=["head"])
    shared = (1 * 4.0 + 3 * 6.0 + 2 * 10.0) / 6  # all three updates, by weight
    for m in step.models:
        np.testing.assert_allclose(m["body"], [shared], rtol=1e-6)
    np.testing.assert_allclose(step.models[0]["head"], [3.0, 4.0], rtol=1e-6)
    np.testing.assert_array_equal(step.models[1]["head"], [12.0, 8.0])
    np.testing.assert_array_equal(step.models[2]["head"], MODELS[2]["head"])  # kept head
    nothing = average_by_choice(MODELS, [], head=["head"])
    for before, after in zip(MODELS, nothing.models, strict=True):
        assert all(np.array_equal(before[k], after[k]) for k in before)
    assert nothing.empty == [0, 1, 2]


def test_the_sums_follow_the_given_order_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    updates = [(0, {"w": rng.normal(size=50).astype(np.float32)}, float(w))
               for w in rng.integers(1, 100, 20)]
    one = average_by_choice([{"w": np.zeros(50, np.float32)}], updates).models[0]["w"]
    two = average_by_choice([{"w": np.zeros(50, np.float32)}], updates).models[0]["w"]
    assert one.tobytes() == two.tobytes()


def test_bad_choices_and_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="choices must be in"):
        average_by_choice(MODELS, [(3, MODELS[0], 1.0)])
    with pytest.raises(ValueError, match="weights > 0"):
        average_by_choice(MODELS, [(0, MODELS[0], 0.0)])


def test_redraw_keeps_each_arrays_mean_and_spread_and_what_the_architecture_fixes() -> None:
    rng = np.random.default_rng(1)
    initial = {
        "w": rng.uniform(-0.1, 0.1, (64, 32)).astype(np.float32),
        "b": np.zeros(32, np.float32),        # no spread: kept
        "gain": np.ones(32, np.float32),      # no spread: kept
        "scalar": np.array(0.3, np.float32),  # one value: kept
        "count": np.array(5, np.int64),       # not float: kept
    }
    one = redraw_like(initial, np.random.default_rng([0, 2, 1]))
    again = redraw_like(initial, np.random.default_rng([0, 2, 1]))
    other = redraw_like(initial, np.random.default_rng([0, 2, 2]))
    assert one["w"].dtype == np.float32 and one["w"].shape == (64, 32)
    assert one["w"].tobytes() == again["w"].tobytes()  # seeded
    assert not np.allclose(one["w"], initial["w"]) and not np.allclose(one["w"], other["w"])
    assert one["w"].std() == pytest.approx(initial["w"].std(), rel=0.05)
    assert abs(one["w"].mean() - initial["w"].mean()) < 0.01
    for key in ("b", "gain", "scalar", "count"):
        assert one[key].tobytes() == initial[key].tobytes() and one[key].dtype == initial[
            key].dtype
    only_b = redraw_like(initial, np.random.default_rng(0), names=["b", "gain"])
    assert only_b["w"].tobytes() == initial["w"].tobytes()  # not named: copied


def test_shared_arrays_come_from_model_zero() -> None:
    shared = share_arrays(MODELS, ["head"])
    assert all(np.array_equal(m["body"], MODELS[0]["body"]) for m in shared)
    assert [m["head"].tolist() for m in shared] == [m["head"].tolist() for m in MODELS]
    assert [m["body"].tolist() for m in share_arrays(MODELS, None)] == [[1.0], [2.0], [3.0]]
