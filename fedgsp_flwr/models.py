"""Models of the papers: MLP (StoCFL), CNN (FedGSP, Semi-FL), logistic (Synthetic).

torch is imported lazily by the functions that need it, so that importing this module
(and the ClientApp that registers our handlers) stays cheap in deployment, where a new
ClientApp process starts for every message.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MODELS = ("auto", "mlp", "cnn", "logistic")


def resolve_model_name(name: str, input_shape: tuple[int, ...]) -> str:
    """Resolve ``auto`` to ``cnn`` for images and ``logistic`` for vectors.

    Raises
    ------
    ValueError
        On an unknown name, or ``cnn`` on non-image input.
    """
    if name not in MODELS:
        raise ValueError(f"Unknown model '{name}'. Choose one of {', '.join(MODELS)}.")
    is_image = len(input_shape) == 3
    if name == "auto":
        return "cnn" if is_image else "logistic"
    if name == "cnn" and not is_image:
        raise ValueError(f"model 'cnn' needs (C, H, W) images, got input shape {input_shape}")
    return name


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, seed: int = 0
) -> torch.nn.Module:
    """Build a freshly initialised model, deterministic given ``seed``.

    Parameters
    ----------
    name : str
        ``mlp`` (flatten -> 2048 -> ReLU -> classes, StoCFL's 784-2048-10), ``cnn``
        (two 5x5 conv + max-pool layers, then 512 -> classes, the FedAvg/FedGSP CNN),
        ``logistic`` (one linear layer), or ``auto``.
    input_shape : tuple[int, ...]
        Shape of one example: (C, H, W) for images, (D,) for vectors.
    num_classes : int
        Number of output classes.
    seed : int
        Initialisation seed.

    Returns
    -------
    torch.nn.Module
        The model, on the CPU.
    """
    import torch
    from torch import nn

    name = resolve_model_name(name, input_shape)
    flat = math.prod(input_shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "mlp":
            return nn.Sequential(
                nn.Flatten(), nn.Linear(flat, 2048), nn.ReLU(), nn.Linear(2048, num_classes)
            )
        if name == "logistic":
            return nn.Sequential(nn.Flatten(), nn.Linear(flat, num_classes))
        channels, height, width = input_shape
        conv_out = 64 * (height // 4) * (width // 4)
        return nn.Sequential(
            nn.Conv2d(channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(conv_out, 512), nn.ReLU(), nn.Linear(512, num_classes),
        )
