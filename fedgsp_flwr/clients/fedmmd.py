"""The ``train.fedmmd`` handler: FedMMD's client step (Yao, Huang, Sun, "Two-Stream
Federated Learning", VCIP 2018).

``train.fedmmd``
    in: ``arrays`` (the global model) and ``config`` (the training settings of
    ``train`` and ``mmd-weight`` >= 0, required). The node trains a copy of the
    received model as ``train`` does, adding ``mmd-weight`` x MMD^2 between its outputs
    and the frozen received model's outputs on each mini-batch. out: ``arrays`` (the
    trained model), ``metrics`` (``train-loss`` without the MMD term, ``num-examples``).

Any ClientApp can register it next to its own handlers::

    app.train("fedmmd")(make_fedmmd_handler(ClientHooks(load_data=..., build_model=...)))
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from ..core.fedmmd import SIGMAS
from ..protocol import ARRAYS, METRICS, MMD_WEIGHT, NUM_EXAMPLES, TRAIN_FEDMMD, TRAIN_LOSS
from .handlers import (
    ClientHooks,
    TrainSettings,
    local_seed,
    message_config,
    model_from_message,
    train_with_settings,
)

if TYPE_CHECKING:
    import torch


def mmd2(x: torch.Tensor, y: torch.Tensor, sigmas: Sequence[float] = SIGMAS
         ) -> torch.Tensor:
    """Biased MMD^2 of two samples (rows, flattened) under a sum of Gaussian kernels
    exp(-||a - b||^2 / (2 s)), clipped at 0 (as the authors' ``maximum_mean_discrepancy``).

    Parameters
    ----------
    x, y : torch.Tensor
        Samples, one per row (any trailing shape; flattened).
    sigmas : Sequence[float]
        Kernel widths s (> 0).

    Returns
    -------
    torch.Tensor
        A scalar, differentiable in ``x`` and ``y``.
    """
    import torch

    x, y = x.flatten(1), y.flatten(1)
    scale = 1.0 / (2.0 * torch.tensor(sigmas, dtype=x.dtype)).reshape(-1, 1, 1)

    def kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # Distances by differences (the Gram expansion loses the zeros to rounding), pair
        # by pair: broadcasting a - b would hold a B x B x D tensor (GBs for images).
        distances = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").pow(2)
        return torch.exp(-scale * distances).sum(0)

    cost = kernel(x, x).mean() + kernel(y, y).mean() - 2 * kernel(x, y).mean()
    return cost.clamp_min(0)


def mmd_weight(config: ConfigRecord) -> float:
    """The message config's ``mmd-weight``.

    Raises
    ------
    ValueError
        If it is missing or not a finite number >= 0.
    """
    value = config.get(MMD_WEIGHT)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise ValueError(f"a '{TRAIN_FEDMMD}' message config needs '{MMD_WEIGHT}', a finite "
                         f"number >= 0, got {value!r}")
    return float(value)


def mmd_penalty(reference: torch.nn.Module, weight: float
                ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training penalty ``weight`` x MMD^2(outputs, reference(inputs)); the
    reference model is frozen (evaluation mode, no gradients).
    """
    import torch

    reference.eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)

    def penalty(inputs: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = reference(inputs)
        return weight * mmd2(outputs, target)

    return penalty


def make_fedmmd_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``train.fedmmd`` (see the module docstring)."""

    def handle(message: Message, context: Context) -> Message:
        config = message_config(message)
        weight = mmd_weight(config)
        data = hooks.client_data(context)
        settings = TrainSettings.from_config(config, hooks.defaults(context))
        model = model_from_message(message, hooks, context, data)
        penalty = mmd_penalty(copy.deepcopy(model), weight) if weight > 0 else None
        result = train_with_settings(model, data, settings, local_seed(context, config),
                                     penalty=penalty)
        content = RecordDict({
            ARRAYS: ArrayRecord(model.state_dict()),
            METRICS: MetricRecord({TRAIN_LOSS: result.loss,
                                       NUM_EXAMPLES: result.num_examples}),
        })
        return Message(content=content, reply_to=message)

    return handle
