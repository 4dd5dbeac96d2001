"""IDA's weights (Yeganeh et al. 2020) on hand-made models."""

from __future__ import annotations

import numpy as np
import pytest

from fedgsp_flwr.core.ida import inverse_distance_weights


def test_weights_are_inverse_distances_to_the_mean_normalised() -> None:
    models = [np.array([0.0, 0.0]), np.array([2.0, 0.0]), np.array([1.0, 2.0])]
    mean = np.mean(models, axis=0)
    inverse = 1 / np.linalg.norm(np.stack(models) - mean, axis=1)
    np.testing.assert_allclose(inverse_distance_weights(models), inverse / inverse.sum())
    far = inverse_distance_weights([np.zeros(3), np.zeros(3) + 0.1, np.full(3, 5.0)])
    assert far.argmin() == 2 and far.sum() == pytest.approx(1.0)


def test_three_points_with_known_weights() -> None:
    # mean (0, 0); distances 1, 1, 2 -> 1, 1, 1/2 -> 0.4, 0.4, 0.2
    models = [np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.array([-2.0, 0.0])]
    np.testing.assert_allclose(inverse_distance_weights(models), [0.4, 0.4, 0.2])


def test_examples_multiply_the_inverse_distances() -> None:
    models = [np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.array([-2.0, 0.0])]
    weights = inverse_distance_weights(models, examples=[10, 30, 40])
    raw = np.array([10 / 1, 30 / 1, 40 / 2])
    np.testing.assert_allclose(weights, raw / raw.sum())


def test_a_model_at_the_mean_takes_the_whole_weight_and_equal_models_share_it() -> None:
    models = [np.array([-1.0]), np.array([0.0]), np.array([1.0])]
    np.testing.assert_allclose(inverse_distance_weights(models), [0.0, 1.0, 0.0])
    same = [np.ones(4)] * 3
    np.testing.assert_allclose(inverse_distance_weights(same), [1 / 3] * 3)
    np.testing.assert_allclose(inverse_distance_weights(same, [1, 1, 2]), [0.25, 0.25, 0.5])


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="at least one model"):
        inverse_distance_weights([])
    with pytest.raises(ValueError, match="one length"):
        inverse_distance_weights([np.zeros(2), np.zeros(3)])
    with pytest.raises(ValueError, match="NaN"):
        inverse_distance_weights([np.zeros(2), np.array([np.nan, 0])])
    with pytest.raises(ValueError, match="positive counts"):
        inverse_distance_weights([np.zeros(2), np.ones(2)], examples=[1, 0])


def test_a_model_given_by_layers_weighs_as_its_flattened_vector() -> None:
    rng = np.random.default_rng(3)
    models = [[rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(4)]
              for _ in range(5)]
    flat = [np.concatenate([a.ravel().astype(np.float64) for a in m]) for m in models]
    np.testing.assert_allclose(inverse_distance_weights(models, [1, 2, 3, 4, 5]),
                               inverse_distance_weights(flat, [1, 2, 3, 4, 5]), rtol=1e-12)
    mean = np.mean(flat, axis=0)
    inverse = 1 / np.linalg.norm(np.stack(flat) - mean, axis=1)
    np.testing.assert_allclose(inverse_distance_weights(models), inverse / inverse.sum())
    models[2][1][0] = np.inf
    with pytest.raises(ValueError, match="NaN or infinite"):
        inverse_distance_weights(models)
    with pytest.raises(ValueError, match="one length"):
        inverse_distance_weights([[np.zeros(2), np.zeros(3)], [np.zeros(3), np.zeros(2)]])
