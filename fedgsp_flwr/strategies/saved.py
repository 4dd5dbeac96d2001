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

import copy
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast, overload

import numpy as np
from flwr.app import ArrayRecord

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

T = TypeVar("T")
Save = Callable[[T, StrategyState, str], None]
Load = Callable[[StrategyState, str, NodeMap, T], T]


class Saved(Generic[T]):
    """A strategy attribute that is part of its checkpoint, declared in the class body
    (``assignment: Saved[dict[int, int]] = node_map("assignment")``).

    It reads and writes as a plain attribute; a value never set is ``initial()``.
    :func:`save_declared` and :func:`load_declared` save and take back every one a
    class and its bases declare, under ``key`` in the state (the name its checkpoints
    have always used), node ids translated on the way back.

    Parameters
    ----------
    key : str
        Its name in the state's metadata (or the prefix of its arrays).
    initial : Callable[[], T]
        The value before it is first set (the state of a new run).
    save, load : Callable
        ``save(value, state, key)`` writes it into a state; ``load(state, key, nodes,
        current)`` returns it from a state (``current``: the value now, e.g. a
        generator whose state is set in place).
    present : Callable[[StrategyState, str], bool]
        Whether a state holds it (default: ``key`` in its metadata).
    optional : bool
        Whether a state may lack it (a field that older checkpoints did not have:
        the value stays ``initial()``); otherwise its absence refuses the state.
    """

    def __init__(self, key: str, initial: Callable[[], T], save: Save[T], load: Load[T], *,
                 present: Callable[[StrategyState, str], bool] | None = None,
                 optional: bool = False) -> None:
        if not key:
            raise ValueError("Saved: key must name the attribute in the state, got ''")
        self.key, self.initial, self.save, self.load = key, initial, save, load
        self.present = present or (lambda state, key: key in state.meta)
        self.optional = optional
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.owner = owner.__name__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Saved[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> T | Saved[T]:
        if obj is None:
            return self
        values = obj.__dict__
        if self.name not in values:
            try:
                values[self.name] = self.initial()
            except Unset:
                raise AttributeError(f"{self.owner}.{self.name} is read before its "
                                     "__init__ set it") from None
        return cast(T, values[self.name])

    def __set__(self, obj: object, value: T) -> None:
        obj.__dict__[self.name] = value


def declared(cls: type) -> list[Saved[Any]]:
    """The :class:`Saved` attributes of ``cls`` and its bases, bases first (a name a
    subclass redefines as something else is not saved).

    Raises
    ------
    TypeError
        If two attributes save under one key.
    """
    out: dict[str, Saved[Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, attribute in vars(klass).items():
            if isinstance(attribute, Saved):
                out[name] = attribute
            else:
                out.pop(name, None)
    keys = Counter(s.key for s in out.values())
    if twice := sorted(k for k, n in keys.items() if n > 1):
        raise TypeError(f"{cls.__name__}: two saved attributes share the state key(s) "
                        f"{', '.join(map(repr, twice))}: give each its own key")
    return list(out.values())


def save_declared(obj: object, state: StrategyState) -> None:
    """Write every declared attribute of ``obj`` into ``state``."""
    for saved in declared(type(obj)):
        saved.save(getattr(obj, saved.name), state, saved.key)


def missing_declared(obj: object, state: StrategyState) -> list[str]:
    """The keys of ``obj``'s declared attributes that are not optional and that
    ``state`` lacks."""
    return [s.key for s in declared(type(obj)) if not s.optional and not s.present(state, s.key)]


def refuse_missing(owner: str, missing: Sequence[str]) -> None:
    """Raise the ``ValueError`` of a state that lacks ``missing`` (nothing is taken
    back then)."""
    if missing:
        raise ValueError(
            f"{owner}: the checkpoint's strategy state lacks "
            f"{', '.join(repr(k) for k in missing)}: it was written by another strategy or "
            "is damaged; resume with the strategy that wrote it, or start a new run")


def load_declared(obj: object, state: StrategyState, nodes: NodeMap) -> None:
    """Take back every declared attribute of ``obj`` from ``state``; an optional one
    the state lacks goes back to its initial value.

    Every value is read before any is set (generators and learnt objects, set in place,
    last), so a state that cannot be read changes nothing.

    Raises
    ------
    ValueError
        If ``state`` lacks an attribute that is not optional, or one cannot be read:
        it was written by another strategy, or is damaged.
    """
    owner = type(obj).__name__
    refuse_missing(owner, missing_declared(obj, state))
    values: dict[str, Any] = {}
    in_place: list[Saved[Any]] = []
    for saved in declared(type(obj)):
        if not saved.present(state, saved.key):
            if saved.initial is not _unset:
                values[saved.name] = saved.initial()
        elif saved.initial is _unset:
            in_place.append(saved)
        else:
            values[saved.name] = read(owner, saved, state, nodes, None)
    for saved in in_place:  # tried on a copy first
        read(owner, saved, state, nodes, copy.deepcopy(getattr(obj, saved.name)))
    for name, value in values.items():
        setattr(obj, name, value)
    for saved in in_place:
        setattr(obj, saved.name, read(owner, saved, state, nodes, getattr(obj, saved.name)))


def read(owner: str, saved: Saved[T], state: StrategyState, nodes: NodeMap,
         current: T | None) -> T:
    """``saved``'s value in ``state``; a ``ValueError`` naming it if it cannot be read."""
    try:
        return saved.load(state, saved.key, nodes, cast(T, current))
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise ValueError(f"{owner}: the checkpoint's {saved.key!r} cannot be read "
                         f"({type(error).__name__}: {error}): the state is damaged or "
                         "another strategy's; start a new run") from error


def _meta(value: Any, state: StrategyState, key: str) -> None:
    state.meta[key] = value


class Unset(Exception):
    """Raised by the initial value of an attribute ``__init__`` must set."""


def _unset() -> Any:
    raise Unset


class Learnt(Protocol):
    """What a strategy learns of the nodes' ClientApp (``HookSupport``)."""

    def state(self) -> dict[str, Any]: ...
    def restore(self, state: Mapping[str, Any]) -> None: ...


L = TypeVar("L", bound=Learnt)


def learnt(key: str, kind: type[L]) -> Saved[L]:
    """An object of ``kind`` set in ``__init__`` that saves itself as JSON
    (``state()``) and takes it back in place (``restore()``); older checkpoints may
    lack it."""
    def load(state: StrategyState, key: str, _: NodeMap, current: L) -> L:
        current.restore(state.meta[key])
        return current
    return Saved(key, _unset, lambda obj, state, key: _meta(obj.state(), state, key), load,
                 optional=True)


def generator(key: str) -> Saved[np.random.Generator]:
    """A numpy Generator (set in ``__init__`` from the seed; its state is saved)."""
    return Saved(key, _unset,
                 lambda rng, state, key: _meta(generator_state(rng), state, key),
                 lambda state, key, _, rng: _set_state(rng, state.meta[key]))


def _set_state(rng: np.random.Generator, state: Mapping[str, Any]) -> np.random.Generator:
    set_generator_state(rng, state)
    return rng


def node_map(key: str, optional: bool = False) -> Saved[dict[int, Any]]:
    """A node-keyed map of JSON-able values (``[[node, value], ...]``)."""
    return Saved(key, dict, lambda m, state, key: _meta(pairs(m), state, key),
                 lambda state, key, nodes, _: from_pairs(state.meta[key], nodes),
                 optional=optional)


def node_set(key: str, optional: bool = False) -> Saved[set[int]]:
    """A set of nodes (a sorted list)."""
    return Saved(key, set, lambda s, state, key: _meta(sorted(s), state, key),
                 lambda state, key, nodes, _: {nodes(int(n)) for n in state.meta[key]},
                 optional=optional)


def value(key: str, initial: Callable[[], T], load: Callable[[Any], T] = lambda v: v,
          optional: bool = False) -> Saved[T]:
    """A JSON-able value without node ids (``load`` rebuilds it from its JSON)."""
    return Saved(key, initial, _meta, lambda state, key, _, __: load(state.meta[key]),
                 optional=optional)


def int_keyed(key: str, optional: bool = False) -> Saved[dict[int, Any]]:
    """A map keyed by integers that are not node ids (rounds, clusters), of JSON-able
    values (``[[k, value], ...]``)."""
    return Saved(key, dict, lambda m, state, key: _meta([[k, v] for k, v in m.items()],
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
    return Saved(key, _unset, save, restore)


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
    return Saved(key, list, lambda nodes, state, key: _meta(list(nodes), state, key),
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
    return Saved(key, dict, lambda m, state, key: _meta([[c, list(v)] for c, v in m.items()],
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
