"""The ``train.fedfusion`` handler: FedFusion's client step (Yao, Huang, Wu, Zhang, Sun,
ICIP 2019).

``train.fedfusion``
    in: ``arrays`` (the global model with its fusion module, keys ``fusion.*``) and
    ``config`` (the training settings of ``train``). The node builds the fused model
    (:mod:`fedgsp_flwr.clients.fusion`): its own copy of the model (trained), the
    received model's feature layers (frozen, the reference) and the fusion module
    (trained); trains it as ``train`` does. out: ``arrays`` (the trained model and
    module, the keys received), ``metrics`` (``train-loss``, ``num-examples``).

Any ClientApp can register it; it fuses ``torch.nn.Sequential`` models (another model:
the node trains with plain ``train``, see :func:`make_fedfusion_handler`)::

    app.train("fedfusion")(make_fedfusion_handler(ClientHooks(load_data=...,
                                                              build_model=...)))
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Message

from ..core.fusion import PREFIX, split_fusion
from ..protocol import ARRAYS, UNSUPPORTED_HOOK_TEXT
from .fusion import UnfusableModel
from .handlers import ClientHooks, make_train_handler


def make_fedfusion_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``train.fedfusion`` (see the module docstring).

    The handler raises ``ValueError`` (the node's error reply) if the message's
    arrays have no fusion module, and one that starts with ``UNSUPPORTED_HOOK_TEXT`` if
    the app's model cannot be fused (not a ``Sequential`` with a place to cut): the
    strategy then trains the node as a plain one.
    """
    train = make_train_handler(hooks)

    def handle(message: Message, context: Context) -> Message:
        record = message.content.array_records.get(ARRAYS)
        if record is None or not split_fusion(list(record.keys()))[1]:
            raise ValueError(f"a '{message.metadata.message_type}' message needs the model "
                             f"with its fusion module (arrays '{PREFIX}*') in '{ARRAYS}'")
        try:
            return train(message, context)
        except UnfusableModel as err:
            raise ValueError(f"{UNSUPPORTED_HOOK_TEXT}: {err}") from err

    return handle
