"""The machinery of a strategy's declared state: the :class:`Saved` descriptor, and
saving and taking back every attribute a class and its bases declare
(:func:`save_declared`, :func:`load_declared`). The kinds of values are in
:mod:`~fedgsp_flwr.strategies.saved`.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from .state import NodeMap, StrategyState

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


def checkpoint(obj: object, parts: Mapping[str, Any]) -> StrategyState:
    """``obj``'s state: each of ``parts``'s ``checkpoint_state()`` under its name, then
    every attribute ``obj`` declares :class:`Saved`."""
    state = StrategyState()
    for name, part in parts.items():
        state.merge(name, part.checkpoint_state())
    save_declared(obj, state)
    return state


def restore(obj: object, parts: Mapping[str, Any], state: StrategyState,
            nodes: NodeMap) -> None:
    """Take back :func:`checkpoint`, node ids translated by ``nodes``; a part the state
    lacks (a checkpoint of an older version) is left as it is.

    Raises
    ------
    ValueError
        If ``state`` lacks a declared attribute of ``obj`` or of a part it holds
        (another strategy's state): nothing is taken back then.
    """
    held = {name: state.part(name) for name in parts}
    refuse_missing(type(obj).__name__, missing_declared(obj, state) + [
        f"{name}/{key}" for name, part in held.items() if part.meta
        for key in missing_declared(parts[name], part)])
    load_declared(obj, state, nodes)
    for name, part in held.items():
        if part.meta:
            parts[name].restore_state(part, nodes)


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
            if saved.initial is not must_set:
                values[saved.name] = saved.initial()
        elif saved.initial is must_set:
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


def put_meta(value: Any, state: StrategyState, key: str) -> None:
    """Save ``value`` (JSON) under ``key`` in the state's metadata."""
    state.meta[key] = value


class Unset(Exception):
    """Raised by the initial value of an attribute ``__init__`` must set."""


def must_set() -> Any:
    """The initial value of an attribute ``__init__`` must set: raises :class:`Unset`."""
    raise Unset


class Learnt(Protocol):
    """What a strategy learns of the nodes' ClientApp (``HookSupport``)."""

    def state(self) -> dict[str, Any]: ...
    def restore(self, state: Mapping[str, Any]) -> None: ...


L = TypeVar("L", bound=Learnt)
