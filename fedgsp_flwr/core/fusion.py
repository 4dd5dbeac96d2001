"""FedFusion's fusion module as arrays (Yao, Huang, Wu, Zhang, Sun, "Towards Faster and
Better Federated Learning: A Feature Fusion Approach", ICIP 2019): pure numpy, shared by
the strategy (which adds the module to the global model) and the client handler.

The model is cut where its feature maps end: after its last convolution (the input of
the ``Flatten`` that follows it), or for a model without convolutions at the input of
its last linear layer. There the features of the local model (x) and of the frozen
global model (y) are fused into C channels (feature vectors count as C channels of
1 x 1), as in the authors' code (thu-media/FedFusion, ``model/mnist_models.py``):

- ``conv``: a 1 x 1 convolution of [x, y] (2C -> C channels; ``fusion.weight`` and
  ``fusion.bias``), initialised as torch initialises a ``Conv2d``;
- ``multi``: gamma * y + (1 - gamma) * x with one gamma per channel (``fusion.gamma``,
  shape (1, C, 1, 1)), from 0;
- ``single``: the same with one gamma (shape (1,)), from 0.

The module's arrays travel with the model (keys :data:`PREFIX` + name) and are averaged
with it; gamma then moves by the authors' server-side shadow update
(:func:`shadow_gamma`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ._moved import moved

PREFIX = "fusion."
"""Key prefix of the fusion module's arrays in the model's ArrayRecord."""
OPERATORS = ("conv", "multi", "single")
GAMMA_KEY = PREFIX + "gamma"
"""The ``multi`` and ``single`` operators' array."""
SHADOW_MOMENTUM = 0.9
"""The authors' server-side momentum of gamma (``Agent.update_shadow``, mu = 0.9)."""


def fusion_channels(shapes: Sequence[tuple[int, ...]]) -> int:
    """The channels C fused: the out-channels of the last 4-D weight (a convolution),
    else the in-features of the last 2-D weight (the classifier).

    Parameters
    ----------
    shapes : Sequence[tuple[int, ...]]
        The model's array shapes in state-dict order (fusion arrays excluded).

    Raises
    ------
    ValueError
        If the model has neither.
    """
    for dims in (4, 2):
        found = [s for s in shapes if len(s) == dims]
        if found:
            return int(found[-1][0] if dims == 4 else found[-1][1])
    raise ValueError("FedFusion needs a model with a convolution or a linear layer; "
                     f"got array shapes {list(shapes)}")


def init_fusion(shapes: Sequence[tuple[int, ...]], operator: str, seed: int
                ) -> dict[str, np.ndarray]:
    """The fusion module's initial arrays (keys with :data:`PREFIX`), float32.

    ``conv`` draws weight and bias from U(-1/sqrt(2C), 1/sqrt(2C)) (torch's ``Conv2d``
    default, fan-in 2C) with ``seed``; ``multi`` and ``single`` start at gamma = 0
    (the local features only), as the authors' code.

    Raises
    ------
    ValueError
        On an unknown operator or a model without the layers of :func:`fusion_channels`.
    """
    if operator not in OPERATORS:
        raise ValueError(f"Unknown fusion operator '{operator}'. Choose one of "
                         f"{', '.join(OPERATORS)}.")
    channels = fusion_channels(shapes)
    if operator == "single":
        return {PREFIX + "gamma": np.zeros(1, np.float32)}
    if operator == "multi":
        return {PREFIX + "gamma": np.zeros((1, channels, 1, 1), np.float32)}
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(2 * channels)
    return {
        PREFIX + "weight": rng.uniform(-bound, bound, (channels, 2 * channels, 1, 1)
                                       ).astype(np.float32),
        PREFIX + "bias": rng.uniform(-bound, bound, channels).astype(np.float32),
    }


def operator_of(fusion: Mapping[str, tuple[int, ...]]) -> str:
    """The operator of a fusion module, from its arrays' names (:data:`PREFIX` removed)
    and shapes.

    Raises
    ------
    ValueError
        If they are no operator's.
    """
    names = set(fusion)
    if names == {"weight", "bias"}:
        return "conv"
    if names == {"gamma"}:
        return "single" if fusion["gamma"] == (1,) else "multi"
    raise ValueError(f"the fusion arrays {sorted(names)} are no operator's: expected "
                     "'weight' and 'bias' (conv) or 'gamma' (multi, single)")


def split_fusion(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The model's keys and the fusion module's keys (with :data:`PREFIX`), in order."""
    fusion = [n for n in names if n.startswith(PREFIX)]
    return [n for n in names if not n.startswith(PREFIX)], fusion


def shadow_gamma(sent: np.ndarray, mean: np.ndarray, momentum: float) -> np.ndarray:
    """The new global gamma of ``multi``/``single`` by the authors' shadow update
    (thu-media/FedFusion, ``Agent.update_shadow``): ``momentum`` x the gamma the round
    sent + (1 - ``momentum``) x the clients' mean, in ``sent``'s dtype. Momentum 0 is
    FedAvg's mean; the authors' 0.9 moves gamma a tenth of the way a round.
    """
    if sent.shape != mean.shape:
        raise ValueError(f"gamma's shape changed: sent {sent.shape}, mean {mean.shape}")
    return (momentum * sent.astype(np.float64) + (1.0 - momentum) * mean.astype(np.float64)
            ).astype(sent.dtype)


# Names that moved in 0.7.0; they warn until 0.8.0.
_MOVED = {
    "TRAIN_TYPE": "fedgsp_flwr.protocol:TRAIN_FEDFUSION",
    "EVALUATE_TYPE": "fedgsp_flwr.protocol:EVALUATE_FEDFUSION",
}
__getattr__ = moved(__name__, _MOVED)
