"""Per-layer divergence between models (Semi-FL's RED and ACS)."""

from __future__ import annotations

import numpy as np
import pytest

from fedgsp_flwr.tools.divergence import (
    averaged_cosine_similarity,
    layer_divergence,
    relative_euclidean_distance,
)


def test_relative_euclidean_distance_by_hand() -> None:
    assert relative_euclidean_distance(np.array([3.0, 4.0]), np.array([0.0, 8.0])) == (
        pytest.approx(5.0 / 8.0))
    assert relative_euclidean_distance(np.zeros(2), np.zeros(2)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        relative_euclidean_distance(np.zeros(2), np.zeros(3))


def test_averaged_cosine_similarity_runs_along_the_last_axis() -> None:
    w1 = np.array([[1.0, 0.0], [1.0, 1.0]])
    w2 = np.array([[0.0, 1.0], [2.0, 2.0]])
    assert averaged_cosine_similarity(w1, w2) == pytest.approx((0.0 + 1.0) / 2)
    assert averaged_cosine_similarity(np.array([1.0, 0.0]), np.array([-1.0, 0.0])) == -1.0
    assert averaged_cosine_similarity(np.zeros(3), np.ones(3)) == 0.0  # eps, no NaN


def test_layer_divergence_of_a_model_with_itself() -> None:
    model = {"w": np.ones((2, 3)), "b": np.array([1.0, -1.0])}
    rows = layer_divergence(model, model)
    assert [r["layer"] for r in rows] == ["w", "b"]
    assert all(r["red"] == 0.0 and r["acs"] == pytest.approx(1.0) for r in rows)
    with pytest.raises(ValueError, match="differ in layers"):
        layer_divergence({"w": np.ones(2)}, model)
