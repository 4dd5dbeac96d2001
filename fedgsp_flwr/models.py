"""Models of the papers: MLP (StoCFL), CNN (FedGSP, Semi-FL), logistic (Synthetic).

torch is imported lazily by the functions that need it, so that importing this module
(and the ClientApp that registers our handlers) stays cheap in deployment, where a new
ClientApp process starts for every message.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

MODELS = ("auto", "mlp", "mlp-dropout", "cnn", "cnn-leaf", "lenet5", "logistic")
DROPOUT = 0.2  # mlp-dropout's rate (HierFL's Appendix C names dropout, not its rate)


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
    if name.startswith(("cnn", "lenet")) and not is_image:
        raise ValueError(f"model '{name}' needs (C, H, W) images, got input shape "
                         f"{input_shape}")
    return name


def centre_seed(seed: int, k: int) -> int:
    """Seed of model ``k`` of a run seeded ``seed`` (IFCA's and FeSEM's ``seeds`` init).

    Model 0 is the run's own model (``seed``); model ``k >= 1`` gets a seed drawn from
    ``(seed, k)``, so that runs with consecutive seeds share no initial model (with
    ``seed + k``, the authors' FEMNIST code, seed 1's models 0-2 are seed 0's 1-3).

    Parameters
    ----------
    seed : int
        The run's seed, >= 0.
    k : int
        Model index, >= 0.

    Returns
    -------
    int
        The seed for ``build_model``.
    """
    if k == 0:
        return seed
    return int(np.random.SeedSequence([seed, k]).generate_state(1)[0])


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, seed: int = 0
) -> torch.nn.Module:
    """Build a freshly initialised model, deterministic given ``seed``.

    Parameters
    ----------
    name : str
        ``mlp`` (flatten -> 2048 -> ReLU -> classes, StoCFL's 784-2048-10),
        ``mlp-dropout`` (flatten -> 200 -> ReLU -> dropout 0.2 -> 200 -> ReLU -> dropout
        0.2 -> classes: McMahan et al.'s 2NN with dropout, HierFL's MNIST model), ``cnn``
        (two 5x5 conv + max-pool layers, then 512 -> classes, the FedAvg CNN),
        ``cnn-leaf`` (the same with 2048 hidden units: LEAF's FEMNIST CNN, FedGSP's
        model, 6.6M parameters = the paper's 25.2 MB with 62 classes), ``lenet5``
        (LeNet-5 with ReLU and max pooling: 6 and 16 channels of 5x5, then 120 -> 84 ->
        classes, 62K parameters on 28x28; the small CNN of HierFL's Fashion-MNIST
        experiment, whose widths the paper lost), ``logistic`` (one linear layer), or
        ``auto``.
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
        torch.default_generator.manual_seed(int(seed))  # the CPU's alone, as in train()
        if name == "mlp":
            return nn.Sequential(
                nn.Flatten(), nn.Linear(flat, 2048), nn.ReLU(), nn.Linear(2048, num_classes)
            )
        if name == "mlp-dropout":
            return nn.Sequential(
                nn.Flatten(), nn.Linear(flat, 200), nn.ReLU(), nn.Dropout(DROPOUT),
                nn.Linear(200, 200), nn.ReLU(), nn.Dropout(DROPOUT),
                nn.Linear(200, num_classes))
        if name == "logistic":
            return nn.Sequential(nn.Flatten(), nn.Linear(flat, num_classes))
        channels, height, width = input_shape
        if name == "lenet5":  # LeCun et al. 1998, ReLU and max pooling: 6, 16, 120, 84
            return nn.Sequential(
                nn.Conv2d(channels, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                nn.Linear(16 * ((height // 2 - 4) // 2) * ((width // 2 - 4) // 2), 120),
                nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_classes))
        conv_out = 64 * (height // 4) * (width // 4)
        hidden = 2048 if name == "cnn-leaf" else 512
        return nn.Sequential(
            nn.Conv2d(channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(conv_out, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )


def training_flops(model: torch.nn.Module, input_shape: tuple[int, ...]) -> float:
    """FLOPs to train on one example: 3x the forward pass's multiply-adds x 2.

    Counts the ``Linear`` and ``Conv2d`` layers (2 FLOPs per multiply-add; activations,
    pooling and biases are negligible beside them). The backward pass costs about twice
    the forward pass, hence 3x. For FedGSP's FEMNIST CNN (``cnn-leaf``, 62 classes) this
    gives 103M, where the paper states 96M (its N_calc, Eq. 15).

    Parameters
    ----------
    model : torch.nn.Module
        The model (its weights are not changed).
    input_shape : tuple[int, ...]
        Shape of one example.

    Returns
    -------
    float
        Training FLOPs per example.
    """
    import torch
    from torch import nn

    forward = [0.0]

    def count(module: nn.Module, _: tuple, output: torch.Tensor) -> None:
        if isinstance(module, nn.Linear):
            forward[0] += 2.0 * module.in_features * module.out_features
        elif isinstance(module, nn.Conv2d):
            per_output = module.in_channels // module.groups * math.prod(module.kernel_size)
            forward[0] += 2.0 * per_output * output[0].numel()

    hooks = [m.register_forward_hook(count) for m in model.modules()
             if isinstance(m, (nn.Linear, nn.Conv2d))]
    try:
        with torch.no_grad():
            model(torch.zeros((1, *input_shape)))
    finally:
        for hook in hooks:
            hook.remove()
    return 3.0 * forward[0]


def parameter_count(model: torch.nn.Module) -> int:
    """Number of trainable parameters: the FLOPs to add the model into an aggregate."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
