"""FedFusion's module as arrays: where the model is cut, the operators' shapes and
initialisation, the operator read back from the arrays, and gamma's shadow update."""

from __future__ import annotations

import numpy as np
import pytest

from fedgsp_flwr.core.fusion import (
    OPERATORS,
    PREFIX,
    SHADOW_MOMENTUM,
    fusion_channels,
    init_fusion,
    operator_of,
    shadow_gamma,
    split_fusion,
)

CNN = [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 3136), (512,), (10, 512), (10,)]
MLP = [(2048, 784), (2048,), (10, 2048), (10,)]


def test_the_fused_channels_are_the_last_convolutions_or_the_classifiers_inputs() -> None:
    assert fusion_channels(CNN) == 64
    assert fusion_channels(MLP) == 2048
    with pytest.raises(ValueError, match="convolution or a linear layer"):
        fusion_channels([(10,)])


@pytest.mark.parametrize(("operator", "shapes"), [
    ("conv", {"weight": (64, 128, 1, 1), "bias": (64,)}),
    ("multi", {"gamma": (1, 64, 1, 1)}),
    ("single", {"gamma": (1,)}),
])
def test_each_operator_has_its_shapes_and_is_read_back(operator: str,
                                                       shapes: dict[str, tuple]) -> None:
    arrays = init_fusion(CNN, operator, seed=0)
    assert {k: v.shape for k, v in arrays.items()} == {PREFIX + k: s for k, s in shapes.items()}
    assert all(v.dtype == np.float32 for v in arrays.values())
    assert operator_of({k[len(PREFIX):]: v.shape for k, v in arrays.items()}) == operator
    if operator != "conv":
        assert not any(v.any() for v in arrays.values())  # gamma = 0: local features


def test_conv_starts_as_torch_initialises_a_conv_and_is_seeded() -> None:
    first, again, other = (init_fusion(CNN, "conv", seed=s) for s in (3, 3, 4))
    bound = 1 / np.sqrt(128)
    for key in first:
        assert np.array_equal(first[key], again[key])
        assert not np.array_equal(first[key], other[key])
        assert np.abs(first[key]).max() <= bound and np.abs(first[key]).max() > 0.8 * bound


def test_bad_operators_and_arrays_are_named() -> None:
    with pytest.raises(ValueError, match="Unknown fusion operator 'sum'"):
        init_fusion(CNN, "sum", seed=0)
    with pytest.raises(ValueError, match="no operator's"):
        operator_of({"weight": (4, 8, 1, 1)})
    assert OPERATORS == ("conv", "multi", "single")


def test_split_keeps_the_order_of_both_parts() -> None:
    names = ["0.weight", "0.bias", "fusion.weight", "3.weight", "fusion.bias"]
    assert split_fusion(names) == (["0.weight", "0.bias", "3.weight"],
                                   ["fusion.weight", "fusion.bias"])


def test_the_shadow_update_moves_gamma_a_tenth_of_the_way_in_its_dtype() -> None:
    sent = np.array([0.0, 0.5, -1.0], np.float32)
    mean = np.array([1.0, 0.5, 1.0], np.float32)
    moved = shadow_gamma(sent, mean, SHADOW_MOMENTUM)
    assert moved.dtype == np.float32
    np.testing.assert_allclose(moved, [0.1, 0.5, -0.8], rtol=1e-6)
    np.testing.assert_array_equal(shadow_gamma(sent, mean, 0.0), mean)
    with pytest.raises(ValueError, match="gamma's shape changed"):
        shadow_gamma(sent, mean[:2], 0.9)
