"""FedFusion's fused model (Yao, Huang, Wu, Zhang, Sun, ICIP 2019): the model, a frozen
copy of its feature layers (the reference: the global model received) and the fusion
module. Where the model is cut and the operators: :mod:`fedgsp_flwr.core.fusion`; the
``train.fedfusion`` handler: :mod:`fedgsp_flwr.clients.fedfusion`.

Our ``train`` and ``evaluate`` handlers, and the app's central evaluation, load a model
with ``fusion.*`` arrays as a fused model whose reference is the model itself (what a
client holds before it trains): :func:`load_model`. An app's own ``evaluate_fn`` can do
the same: ``load_model(Net(), arrays)``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from flwr.app import ArrayRecord

from ..core.fusion import PREFIX, operator_of, split_fusion

if TYPE_CHECKING:
    import torch


class UnfusableModel(ValueError):
    """The model has no place FedFusion can cut (see :func:`cut_index`)."""


def cut_index(model: torch.nn.Module) -> int:
    """Where FedFusion cuts a ``torch.nn.Sequential``: at the ``Flatten`` after its last
    convolution (a top-level layer or inside a block of layers), else at its last
    linear layer. The layers before the cut must have parameters (a logistic
    regression, ``Flatten`` then ``Linear``, has no features to fuse).

    Raises
    ------
    UnfusableModel
        If the model is not a ``Sequential`` or has no such layer.
    """
    from torch import nn

    if not isinstance(model, nn.Sequential):
        raise UnfusableModel("FedFusion fuses the features of a torch.nn.Sequential model; got "
                         f"{type(model).__name__}")
    layers = list(model)
    convs = [i for i, m in enumerate(layers) if _last_conv(m) is not None]
    if convs:
        cut = next((i for i in range(convs[-1] + 1, len(layers))
                    if isinstance(layers[i], nn.Flatten)), None)
    else:
        cut = max((i for i, m in enumerate(layers) if isinstance(m, nn.Linear)), default=None)
    if not cut:
        raise UnfusableModel("FedFusion needs a Sequential with a Flatten after its last "
                         "convolution, or with a linear layer after others")
    if not any(True for layer in layers[:cut] for _ in layer.parameters()):
        raise UnfusableModel("FedFusion fuses learnt features: the layers before its cut "
                             f"({', '.join(type(m).__name__ for m in layers[:cut])}) have "
                             "no parameters, so the local and the received features are "
                             "the same")
    return cut


def _last_conv(module: torch.nn.Module) -> torch.nn.Conv2d | None:
    """The last ``Conv2d`` in ``module`` or its submodules (registration order)."""
    from torch import nn

    return next((m for m in reversed(list(module.modules())) if isinstance(m, nn.Conv2d)),
                None)


def _fusion_module(operator: str, channels: int) -> torch.nn.Module:
    """The fusion operator on (local, global) features of ``channels`` channels."""
    import torch
    from torch import nn

    class Fusion(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if operator == "conv":
                self.weight = nn.Parameter(torch.zeros(channels, 2 * channels, 1, 1))
                self.bias = nn.Parameter(torch.zeros(channels))
            else:
                shape = (1,) if operator == "single" else (1, channels, 1, 1)
                self.gamma = nn.Parameter(torch.zeros(shape))

        def forward(self, local: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
            shape = local.shape
            if local.dim() == 2:  # feature vectors: C channels of 1 x 1
                local, reference = local[:, :, None, None], reference[:, :, None, None]
            if operator == "conv":
                out = nn.functional.conv2d(torch.cat((local, reference), 1), self.weight,
                                           self.bias)
            else:
                out = self.gamma * reference + (1 - self.gamma) * local
            return out.reshape(shape)

    return Fusion()


def fused_model(base: torch.nn.Module, operator: str) -> torch.nn.Module:
    """A fused model around ``base`` (its layers shared, not copied): its state-dict
    keys are ``base``'s and ``fusion.*``. Call ``set_reference()`` after loading weights.

    Raises
    ------
    ValueError
        See :func:`cut_index`.
    """
    import torch
    from torch import nn

    cut = cut_index(base)  # base is a Sequential (cut_index checked)
    layers = list(cast("torch.nn.Sequential", base))
    last_conv = _last_conv(nn.Sequential(*layers[:cut]))
    channels = int(last_conv.out_channels if last_conv is not None  # type: ignore[arg-type]
                   else layers[cut].in_features)

    class Fused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for i, layer in enumerate(layers):
                self.add_module(str(i), layer)
            self.fusion = _fusion_module(operator, channels)
            self.set_reference()

        def set_reference(self) -> None:
            """Freeze a copy of the current feature layers as the reference."""
            reference = copy.deepcopy(nn.Sequential(*layers[:cut])).eval()
            for parameter in reference.parameters():
                parameter.requires_grad_(False)
            object.__setattr__(self, "reference", reference)  # not a submodule

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                reference = cast("torch.nn.Module", self.reference)(x)
            local = x
            for layer in layers[:cut]:
                local = layer(local)
            out = self.fusion(local, reference)
            for layer in layers[cut:]:
                out = layer(out)
            return out

    return Fused()


def load_model(base: torch.nn.Module, record: ArrayRecord) -> torch.nn.Module:
    """``base`` loaded with ``record``; with ``fusion.*`` arrays, the fused model around
    it, its reference the loaded feature layers.

    Raises
    ------
    ValueError
        If the fusion arrays are no operator's.
    UnfusableModel
        If the model cannot be fused, or where it is cut has other channels than the
        fusion module received (the server sizes it from the model's array shapes:
        :func:`fedgsp_flwr.core.fusion.fusion_channels`).
    """
    names = list(record.keys())
    fusion = split_fusion(names)[1]
    if not fusion:
        base.load_state_dict(record.to_torch_state_dict())
        return base
    received = {k[len(PREFIX):]: tuple(record[k].shape) for k in fusion}
    model = fused_model(base, operator_of(received))
    fusion_module = cast("torch.nn.Module", model.fusion)
    built = {k: tuple(v.shape) for k, v in fusion_module.state_dict().items()}
    if built != received:
        raise UnfusableModel(f"the fusion module received has shapes {received}; where "
                             f"FedFusion cuts this model it needs {built}")
    model.load_state_dict(record.to_torch_state_dict())
    cast(Callable[[], None], model.set_reference)()  # the fused model's own method
    return model
