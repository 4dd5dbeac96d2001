"""A strategy's state for checkpoints: what it saves after a round and takes back on
resume.

Node ids change from run to run (the simulation engine draws them; a restarted
SuperNode gets a new one), so a state keys nodes by id and translates them on resume
through a :data:`NodeMap` built from the nodes' reported ``partition-id``. The files
themselves are written by :mod:`fedgsp_flwr.app.checkpoint`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from .decoding import record_values

NodeMap = Callable[[int], int]
"""Maps a node id of the checkpointed run to the node id of the resumed run."""


@dataclass
class StrategyState:
    """A strategy's state: JSON-able values and numpy arrays.

    Attributes
    ----------
    meta : dict[str, Any]
        JSON-able values (node-keyed maps as ``[[node, value], ...]`` lists).
    arrays : dict[str, np.ndarray]
        Arrays by name.
    """

    meta: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def merge(self, prefix: str, other: StrategyState) -> None:
        """Add ``other`` under ``prefix`` (``prefix/name``)."""
        self.meta[prefix] = other.meta
        self.arrays.update(prefixed(other.arrays, prefix))

    def part(self, prefix: str) -> StrategyState:
        """The state added with :meth:`merge` under ``prefix``."""
        return StrategyState(dict(self.meta.get(prefix, {})), under(self.arrays, prefix))


def generator_state(rng: np.random.Generator) -> dict[str, Any]:
    """A numpy Generator's state, JSON-able."""
    return dict(rng.bit_generator.state)


def set_generator_state(rng: np.random.Generator, state: Mapping[str, Any]) -> None:
    """Set a numpy Generator to a state of :func:`generator_state`."""
    rng.bit_generator.state = dict(state)


# --- node-keyed values ----------------------------------------------------------------

def pairs(mapping: Mapping[int, Any]) -> list[list[Any]]:
    """A node-keyed map as JSON-able ``[[node, value], ...]`` (JSON keys are strings)."""
    return [[int(k), v] for k, v in mapping.items()]


def from_pairs(items: Iterable[list[Any]], nodes: NodeMap = int) -> dict[int, Any]:
    """The map of :func:`pairs`, keys translated by ``nodes``."""
    return {nodes(int(k)): v for k, v in items}


def stack_rows(mapping: Mapping[int, np.ndarray]) -> tuple[list[int], np.ndarray]:
    """Node-keyed vectors of one length as (nodes, matrix)."""
    nodes = list(mapping)
    return nodes, (np.stack([mapping[n] for n in nodes]) if nodes else np.zeros((0, 0)))


def prefixed(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """``arrays`` renamed ``<prefix>/<name>``, to be stored beside others."""
    return {f"{prefix}/{k}": v for k, v in arrays.items()}


def under(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays stored with :func:`prefixed` under ``prefix``, by their own names."""
    cut = len(prefix) + 1
    return {k[cut:]: v for k, v in arrays.items() if k.startswith(prefix + "/")}


def record_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord's arrays as numpy, in order."""
    return record_values(record)


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord of numpy arrays, in order (C-contiguous, shapes kept: a 0-d array
    stays 0-d, which ``np.ascontiguousarray`` would make 1-d)."""
    return ArrayRecord({k: Array(np.asarray(v, order="C")) for k, v in arrays.items()})
