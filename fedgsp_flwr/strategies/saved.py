"""A strategy's checkpointed state, declared once in its class body.

``assignment: saved.Saved[dict[int, int]] = saved.node_map("assignment")`` makes
``self.assignment`` a plain attribute that :meth:`FedAvg.checkpoint_state
<fedgsp_flwr.strategies.fedavg.FedAvg.checkpoint_state>` saves under ``"assignment"``
and ``restore_state`` takes back, its node ids translated: a new attribute is one line,
not four places (``__init__``, save, restore, the node-id mapping). The constructors
below give each kind of value its form in the state (:mod:`~fedgsp_flwr.strategies.state`),
the one its checkpoints have always had, so that older checkpoints load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from .declared import L, Saved, T, must_set, put_meta
from .declared import declared as declared  # noqa: PLC0414
from .declared import load_declared as load_declared  # noqa: PLC0414
from .declared import save_declared as save_declared  # noqa: PLC0414
from .state import (
    NodeMap,
    StrategyState,
    from_pairs,
    generator_state,
    pairs,
    prefixed,
    record_arrays,
    set_generator_state,
    stack_rows,
    to_record,
    under,
)


def learnt(key: str, kind: type[L]) -> Saved[L]:
    """An object of ``kind`` set in ``__init__`` that saves itself as JSON
    (``state()``) and takes it back in place (``restore()``); older checkpoints may
    lack it."""
    def load(state: StrategyState, key: str, _: NodeMap, current: L) -> L:
        current.restore(state.meta[key])
        return current
    return Saved(key, must_set, lambda obj, state, key: put_meta(obj.state(), state, key), load,
                 optional=True)


def generator(key: str) -> Saved[np.random.Generator]:
    """A numpy Generator (set in ``__init__`` from the seed; its state is saved)."""
    return Saved(key, must_set,
                 lambda rng, state, key: put_meta(generator_state(rng), state, key),
                 lambda state, key, _, rng: _set_state(rng, state.meta[key]))


def _set_state(rng: np.random.Generator, state: Mapping[str, Any]) -> np.random.Generator:
    set_generator_state(rng, state)
    return rng


def node_map(key: str, optional: bool = False) -> Saved[dict[int, Any]]:
    """A node-keyed map of JSON-able values (``[[node, value], ...]``)."""
    return Saved(key, dict, lambda m, state, key: put_meta(pairs(m), state, key),
                 lambda state, key, nodes, _: from_pairs(state.meta[key], nodes),
                 optional=optional)


def node_set(key: str, optional: bool = False) -> Saved[set[int]]:
    """A set of nodes (a sorted list)."""
    return Saved(key, set, lambda s, state, key: put_meta(sorted(s), state, key),
                 lambda state, key, nodes, _: {nodes(int(n)) for n in state.meta[key]},
                 optional=optional)


def value(key: str, initial: Callable[[], T], load: Callable[[Any], T] = lambda v: v,
          optional: bool = False) -> Saved[T]:
    """A JSON-able value without node ids (``load`` rebuilds it from its JSON)."""
    return Saved(key, initial, put_meta, lambda state, key, _, __: load(state.meta[key]),
                 optional=optional)


def int_keyed(key: str, optional: bool = False) -> Saved[dict[int, Any]]:
    """A map keyed by integers that are not node ids (rounds, clusters), of JSON-able
    values (``[[k, value], ...]``)."""
    return Saved(key, dict, lambda m, state, key: put_meta([[k, v] for k, v in m.items()],
                                                        state, key),
                 lambda state, key, _, __: from_pairs(state.meta[key]), optional=optional)


def node_rows(key: str, array_key: str, dtype: type) -> Saved[dict[int, np.ndarray]]:
    """Node-keyed vectors of one length: the nodes in metadata ``key``, the vectors
    as the rows of array ``array_key`` (read back as ``dtype``)."""
    def save(rows: dict[int, np.ndarray], state: StrategyState, key: str) -> None:
        state.meta[key], state.arrays[array_key] = stack_rows(rows)
    return Saved(key, dict, save, lambda state, key, nodes, _: {
        nodes(n): row.astype(dtype)
        for n, row in zip(state.meta[key], state.arrays[array_key], strict=True)})


def part(key: str, dump: Callable[[T], tuple[dict[str, Any], dict[str, np.ndarray]]],
         load: Callable[[Mapping[str, Any], Mapping[str, np.ndarray], NodeMap], T]
         ) -> Saved[T]:
    """An object set in ``__init__`` that saves as a state of its own, ``dump(obj)`` =
    (metadata, arrays), under ``key``; ``load(metadata, arrays, nodes)`` rebuilds it."""
    def save(obj: T, state: StrategyState, key: str) -> None:
        state.merge(key, StrategyState(*dump(obj)))

    def restore(state: StrategyState, key: str, nodes: NodeMap, _: T) -> T:
        own = state.part(key)
        return load(own.meta, own.arrays, nodes)
    return Saved(key, must_set, save, restore)


def node_vectors(key: str, prefix: str) -> Saved[dict[int, np.ndarray]]:
    """Node-keyed vectors of any lengths: the nodes in metadata ``key``, vector i as
    array ``<prefix>/<i>``; older checkpoints may lack them."""
    def save(vectors: dict[int, np.ndarray], state: StrategyState, key: str) -> None:
        state.meta[key] = list(vectors)
        state.arrays.update(prefixed({str(i): v for i, v in enumerate(vectors.values())},
                                     prefix))

    def load(state: StrategyState, key: str, nodes: NodeMap, _: Any) -> dict[int, np.ndarray]:
        rows = under(state.arrays, prefix)
        return {nodes(n): rows[str(i)] for i, n in enumerate(state.meta[key])}
    return Saved(key, dict, save, load, optional=True)


def node_list(key: str) -> Saved[list[int]]:
    """A list of nodes, in its order."""
    return Saved(key, list, lambda nodes, state, key: put_meta(list(nodes), state, key),
                 lambda state, key, nodes, _: [nodes(n) for n in state.meta[key]])


def node_lists(key: str) -> Saved[list[list[int]] | None]:
    """Lists of nodes (groups in order), or ``None`` (not saved)."""
    def save(lists: list[list[int]] | None, state: StrategyState, key: str) -> None:
        if lists is not None:
            state.meta[key] = lists
    return Saved(key, lambda: None, save, lambda state, key, nodes, _: [
        [nodes(n) for n in group] for group in state.meta[key]], optional=True)


def node_lists_by_id(key: str) -> Saved[dict[int, list[int]]]:
    """Lists of nodes by an integer id (clusters and their members)."""
    return Saved(key, dict, lambda m, state, key: put_meta([[c, list(v)] for c, v in m.items()],
                                                        state, key),
                 lambda state, key, nodes, _: {int(c): [nodes(n) for n in members]
                                               for c, members in state.meta[key]})


def record(key: str) -> Saved[ArrayRecord | None]:
    """An ArrayRecord or ``None``, as arrays ``<key>/<name>`` (none for ``None``)."""
    def save(rec: ArrayRecord | None, state: StrategyState, key: str) -> None:
        if rec is not None:
            state.arrays.update(prefixed(record_arrays(rec), key))
    return Saved(key, lambda: None, save,
                 lambda state, key, _, __: to_record(under(state.arrays, key)),
                 present=lambda state, key: bool(under(state.arrays, key)), optional=True)


def array(key: str, dtype: type) -> Saved[np.ndarray | None]:
    """A numpy array or ``None``, as array ``<key>`` (read back as ``dtype``)."""
    def save(values: np.ndarray | None, state: StrategyState, key: str) -> None:
        if values is not None:
            state.arrays[key] = values
    return Saved(key, lambda: None, save,
                 lambda state, key, _, __: state.arrays[key].astype(dtype),
                 present=lambda state, key: key in state.arrays, optional=True)


def named_arrays(key: str) -> Saved[dict[str, np.ndarray] | None]:
    """Named numpy arrays, or ``None`` (not saved), as arrays ``<key>/<name>``."""
    def save(arrays: dict[str, np.ndarray] | None, state: StrategyState, key: str) -> None:
        if arrays:
            state.merge(key, StrategyState({}, dict(arrays)))
    return Saved(key, lambda: None, save, lambda state, key, _, __: {
        k: np.asarray(v) for k, v in under(state.arrays, key).items()} or None, optional=True)


def arrays_by_id(key: str, prefix: str) -> Saved[dict[int, dict[str, np.ndarray]]]:
    """Named numpy arrays (models) by id (not node ids): their ids in metadata ``key``,
    their arrays as ``<prefix>-<id>/<name>`` (read back as copies)."""
    def save(models: dict[int, dict[str, np.ndarray]], state: StrategyState, key: str) -> None:
        state.meta[key] = sorted(models)
        for i, model in models.items():
            state.arrays.update(prefixed(model, f"{prefix}-{i}"))
    return Saved(key, dict, save, lambda state, key, _, __: {
        int(i): {k: np.array(v) for k, v in under(state.arrays, f"{prefix}-{i}").items()}
        for i in state.meta[key]})


def records(key: str, prefix: str) -> Saved[dict[int, ArrayRecord]]:
    """ArrayRecords by id (not node ids): their ids in metadata ``key``, their arrays
    as ``<prefix>-<id>/<name>``."""
    def save(recs: dict[int, ArrayRecord], state: StrategyState, key: str) -> None:
        state.meta[key] = sorted(recs)
        for i, rec in recs.items():
            state.arrays.update(prefixed(record_arrays(rec), f"{prefix}-{i}"))
    return Saved(key, dict, save, lambda state, key, _, __: {
        int(i): to_record(under(state.arrays, f"{prefix}-{i}")) for i in state.meta[key]})


def record_list(key: str, name: Callable[[int], str]) -> Saved[list[ArrayRecord]]:
    """ArrayRecords with the same array names, in order: their count in metadata
    ``key``, the names in ``model-keys``, record ``i``'s arrays as ``<name(i)>/<name>``."""
    def save(recs: list[ArrayRecord], state: StrategyState, key: str) -> None:
        state.meta.update({key: len(recs), "model-keys": list(recs[0].keys()) if recs else []})
        for index, rec in enumerate(recs):
            state.arrays.update(prefixed(record_arrays(rec), name(index)))

    def load(state: StrategyState, key: str, _: NodeMap, __: object) -> list[ArrayRecord]:
        names = list(state.meta["model-keys"])
        return [to_record({n: arrays[n] for n in names})
                for arrays in (under(state.arrays, name(index))
                               for index in range(int(state.meta[key])))]
    return Saved(key, list, save, load)
