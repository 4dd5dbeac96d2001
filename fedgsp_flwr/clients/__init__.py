"""Client-side message handlers any Flower ClientApp can register.

Add our hooks to an existing ClientApp in a few lines::

    from flwr.clientapp import ClientApp
    from fedgsp_flwr.clients import ClientHooks, register_hooks

    app = ClientApp()          # your app, with its own @app.train() / @app.evaluate()
    register_hooks(app, ClientHooks(load_data=my_data, build_model=my_model))
    # adds query.histogram, query.partition, query.sketch, train.bilevel, train.ifca,
    # train.ditto, evaluate.ditto, train.fedmmd and train.fedfusion

``ClientApp(mods=[threads_mod])`` lets each message train with the threads the server
hints in simulation (all free cores for a relay chain's lone hop), or with the node's
``num-threads`` node config (see :mod:`fedgsp_flwr.threads`).
"""

from .ditto import make_ditto_evaluate_handler, make_ditto_train_handler
from .fedfusion import make_fedfusion_handler
from .fedmmd import make_fedmmd_handler
from .handlers import (
    ClientHooks,
    TrainSettings,
    make_bilevel_handler,
    make_evaluate_handler,
    make_histogram_handler,
    make_partition_handler,
    make_sketch_handler,
    make_train_handler,
)
from .ifca import make_ifca_handler
from .registration import HANDLERS, HOOK_HANDLERS, register_hooks
from .threads import message_threads, threads_mod

__all__ = [
    "HANDLERS",
    "HOOK_HANDLERS",
    "ClientHooks",
    "TrainSettings",
    "make_bilevel_handler",
    "make_ditto_evaluate_handler",
    "make_ditto_train_handler",
    "make_evaluate_handler",
    "make_fedfusion_handler",
    "make_fedmmd_handler",
    "make_histogram_handler",
    "make_ifca_handler",
    "make_partition_handler",
    "make_sketch_handler",
    "make_train_handler",
    "message_threads",
    "register_hooks",
    "threads_mod",
]
