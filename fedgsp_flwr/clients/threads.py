"""The ClientApp side of :mod:`fedgsp_flwr.threads`: each message handled with the
threads the server's hint or the node's config gives.
"""

from __future__ import annotations

import os

from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable

from ..protocol import NUM_THREADS
from ..threads import thread_limit
from .handlers import message_config


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"'{NUM_THREADS}' in the {name} must be an integer >= 1, got "
                         f"{value!r}")
    return value


def message_threads(message: Message, context: Context) -> int | None:
    """Threads a ClientApp should use for ``message``.

    The node's own ``num-threads`` (node config) wins: it is the operator's setting for
    that machine. Otherwise the server's hint in the message's config, but never fewer
    than the process was started with (``OMP_NUM_THREADS``, which Ray sets to the
    actor's CPUs). ``None`` when neither says anything: keep the process's setting.

    Raises
    ------
    ValueError
        If either value is not an integer >= 1.
    """
    if NUM_THREADS in context.node_config:
        return _positive_int(context.node_config[NUM_THREADS], "node config")
    config = message_config(message) if message.has_content() else {}
    if NUM_THREADS not in config:
        return None
    hint = _positive_int(config[NUM_THREADS], "message config")
    try:
        started_with = int(os.environ.get("OMP_NUM_THREADS", "1"))
    except ValueError:
        started_with = 1
    return max(hint, started_with)


def threads_mod(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower mod: handle each message with the threads :func:`message_threads` gives.

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> app = ClientApp(mods=[threads_mod])
    """
    threads = message_threads(message, context)
    if threads is not None:
        import torch  # noqa: F401  # loaded before the handler, so that thread_limit sets it
    with thread_limit(threads):
        return call_next(message, context)


