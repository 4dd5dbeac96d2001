"""Which of our handlers a ClientApp can register, and :func:`register_hooks`.

Kept apart from :mod:`fedgsp_flwr.clients.handlers` because it imports every handler
module (:mod:`fedgsp_flwr.clients.ifca` and :mod:`fedgsp_flwr.clients.ditto` build on
``handlers``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from ..protocol import (
    EVALUATE,
    EVALUATE_DITTO,
    EVALUATE_FEDFUSION,
    HISTOGRAM,
    PARTITION,
    QUERY_HISTOGRAM,
    QUERY_PARTITION,
    QUERY_SKETCH,
    SKETCH,
    TRAIN,
    TRAIN_BILEVEL,
    TRAIN_DITTO,
    TRAIN_FEDFUSION,
    TRAIN_FEDMMD,
    TRAIN_IFCA,
)
from .ditto import make_ditto_evaluate_handler, make_ditto_train_handler
from .fedfusion import make_fedfusion_handler
from .fedmmd import make_fedmmd_handler
from .handlers import (
    ClientHooks,
    make_bilevel_handler,
    make_evaluate_handler,
    make_histogram_handler,
    make_partition_handler,
    make_sketch_handler,
    make_train_handler,
)
from .ifca import make_ifca_handler

Handler = Callable[[Message, Context], Message]
# name -> (message type, handler factory)
_HANDLERS: dict[str, tuple[str, Callable[[ClientHooks], Handler]]] = {
    TRAIN: (TRAIN, make_train_handler),
    EVALUATE: (EVALUATE, make_evaluate_handler),
    HISTOGRAM: (QUERY_HISTOGRAM, make_histogram_handler),
    PARTITION: (QUERY_PARTITION, make_partition_handler),
    SKETCH: (QUERY_SKETCH, make_sketch_handler),
    "bilevel": (TRAIN_BILEVEL, make_bilevel_handler),
    "ifca": (TRAIN_IFCA, make_ifca_handler),
    "ditto": (TRAIN_DITTO, make_ditto_train_handler),
    "ditto-evaluate": (EVALUATE_DITTO, make_ditto_evaluate_handler),
    "fedmmd": (TRAIN_FEDMMD, make_fedmmd_handler),
    "fedfusion": (TRAIN_FEDFUSION, make_fedfusion_handler),
    # our evaluate handler scores a model with fusion arrays as the fused model
    "fedfusion-evaluate": (EVALUATE_FEDFUSION, make_evaluate_handler),
}
HANDLERS = tuple(_HANDLERS)
HOOK_HANDLERS = (HISTOGRAM, PARTITION, SKETCH, "bilevel", "ifca", "ditto",
                 "ditto-evaluate", "fedmmd", "fedfusion", "fedfusion-evaluate")


def register_hooks(
    app: ClientApp, hooks: ClientHooks, handlers: Iterable[str] = HOOK_HANDLERS
) -> ClientApp:
    """Register our message handlers on a Flower ClientApp.

    Parameters
    ----------
    app : ClientApp
        A ClientApp built with the decorator API (``ClientApp()``, no ``client_fn``).
    hooks : ClientHooks
        The app's data and model providers.
    handlers : Iterable[str] (default: :data:`HOOK_HANDLERS`)
        Which handlers to add, among :data:`HANDLERS`. The default adds the hooks our
        strategies use beside an app's own ``train`` and ``evaluate``:
        ``query.histogram``, ``query.partition``, ``query.sketch``, ``train.bilevel``,
        ``train.ifca``, ``train.ditto``, ``evaluate.ditto``, ``train.fedmmd``,
        ``train.fedfusion`` and ``evaluate.fedfusion``.

    Returns
    -------
    ClientApp
        The same app, for chaining.

    Raises
    ------
    ValueError
        On an unknown handler name, or one the app already registers.
    """
    for name in handlers:
        if name not in _HANDLERS:
            raise ValueError(f"Unknown handler '{name}'. Choose from {', '.join(HANDLERS)}.")
        message_type, factory = _HANDLERS[name]
        category, _, action = message_type.partition(".")
        decorator = getattr(app, category)(action) if action else getattr(app, category)()
        decorator(factory(hooks))
    return app
