"""The app's ClientApp: our handlers over the run config's dataset and partition.

A node's data is its partition ``partition-id`` of ``num-partitions`` (node config,
set by the simulation engine, or by ``flower-supernode --node-config`` in deployment).
The run config is parsed once per run and process; training settings (``lr``,
``local-epochs``, ...) come with each message's config, from the server.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from flwr.app import Context
from flwr.clientapp import ClientApp

from ..clients import HANDLERS, ClientHooks, register_hooks, threads_mod
from ..data import ClientData
from ..models import build_model
from ..protocol import NUM_PARTITIONS, PARTITION_ID
from .config import RunConfig
from .datasets import load_client_data

if TYPE_CHECKING:
    import torch


def node_partition(context: Context) -> tuple[int, int]:
    """Return the node's (partition-id, num-partitions).

    Raises
    ------
    ValueError
        If the node config does not set both keys.
    """
    try:
        return int(context.node_config[PARTITION_ID]), int(
            context.node_config[NUM_PARTITIONS]
        )
    except KeyError as err:
        raise ValueError(
            f"node config lacks {err}: start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<n>\""
        ) from err


_PARSED: dict[int, RunConfig] = {}


def run_config(context: Context) -> RunConfig:
    """The run config of the context's run, parsed and validated once per run (keys of
    embedding apps are ignored).
    """
    if (cfg := _PARSED.get(context.run_id)) is None:
        cfg = _PARSED[context.run_id] = RunConfig.from_mapping(context.run_config,
                                                               allow_unknown=True)
    return cfg


# Bytes of node data one process keeps unless $FEDGSP_DATA_CACHE_MB says otherwise: a
# simulated ClientApp's process answers for many nodes (100 nodes over 2 workers: 50
# each a round), and building a node's arrays again cost 3.5 ms a message (median;
# benchmarks/client_data.py). MNIST's 60,000 training images are 188 MB as float32.
DATA_CACHE_BYTES = 256 * 2**20
DATA_CACHE_ENV = "FEDGSP_DATA_CACHE_MB"

_DataKey = tuple[RunConfig, int, int]
_data: OrderedDict[_DataKey, ClientData] = OrderedDict()
_data_bytes = 0
_data_lock = threading.Lock()


def _nbytes(data: ClientData) -> int:
    return sum(a.nbytes for a in (data.x_train, data.y_train, data.x_test, data.y_test))


def data_cache_bytes() -> int:
    """The bytes of node data a process keeps: ``$FEDGSP_DATA_CACHE_MB`` megabytes, else
    :data:`DATA_CACHE_BYTES` (each simulation worker keeps its own).

    Raises
    ------
    ValueError
        If ``FEDGSP_DATA_CACHE_MB`` is not a number >= 0.
    """
    raw = os.environ.get(DATA_CACHE_ENV)
    if raw is None:
        return DATA_CACHE_BYTES
    try:
        megabytes = float(raw)
    except ValueError:
        megabytes = -1.0
    if not megabytes >= 0:
        raise ValueError(f"{DATA_CACHE_ENV} must be a number of megabytes >= 0 (0 keeps "
                         f"one node's data), got {raw!r}")
    return int(megabytes * 2**20)


def load_data(context: Context) -> ClientData:
    """Load the node's partition of the run's dataset, once per process while the
    process's nodes fit in :func:`data_cache_bytes` (the least recently used go first;
    the newest is always kept)."""
    global _data_bytes
    key: _DataKey = (run_config(context), *node_partition(context))
    with _data_lock:
        if (data := _data.get(key)) is not None:
            _data.move_to_end(key)
            return data
    budget = data_cache_bytes()
    data = load_client_data(*key)
    with _data_lock:
        if key not in _data:
            _data[key] = data
            _data_bytes += _nbytes(data)
        while len(_data) > 1 and _data_bytes > budget:
            _data_bytes -= _nbytes(_data.popitem(last=False)[1])
    return data


def make_model(context: Context, data: ClientData) -> torch.nn.Module:
    """Build the run's model for the node's data."""
    cfg = run_config(context)
    return build_model(cfg.model, data.x_train.shape[1:], data.num_classes, cfg.seed)


def state_dir(context: Context) -> str | None:
    """The run config's ``client-state-dir`` (None when empty)."""
    return run_config(context).client_state_dir or None


HOOKS = ClientHooks(load_data=load_data, build_model=make_model, state_dir=state_dir)

app = register_hooks(ClientApp(mods=[threads_mod]), HOOKS, handlers=HANDLERS)
