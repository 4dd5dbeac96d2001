"""A strategy's parameters, declared once beside it.

A :class:`Spec` lists a strategy's own constructor parameters: each one's default,
range (a check and the rule it states, or its choices), help text and, where the run
config can set it, its run-config key. From that one declaration come the constructor's
checks (:meth:`Spec.check`), the app's run-config keys with their types, defaults and
ranges (:class:`~fedgsp_flwr.app.config.RunConfig`), the arguments the app's registry
passes (:meth:`Spec.arguments`) and the docs' parameter tables (the mkdocs hook
``docs/hooks/params.py``).
A strategy declares them in its class body with :func:`setting`
(``proximal_mu: float = setting(default=0.0, help=...)``), and
:class:`~fedgsp_flwr.strategies.configured.Configured` makes its spec (``cls.spec``), its
keyword-only constructor and its docstring's ``Parameters`` section from them.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

BASIC_TYPES = (bool, int, float, str)


@dataclass(frozen=True)
class Param:
    """One constructor parameter of a strategy.

    Attributes
    ----------
    name : str
        The attribute, and the constructor's keyword unless ``alias`` is set.
    default : Any
        Its default (a bool, int, float or str), the run config's too unless
        ``app_default`` is set.
    help : str
        What it sets, in a line (the run config's help and the docs' table).
    check : Callable[[Any], bool] | None
        True for a value in range (``None``: any value of the default's type).
    rule : str
        The range ``check`` tests, as an error message states it (``"> 0"``).
    choices : tuple[str, ...] | None
        The values allowed (instead of ``check`` and ``rule``).
    key : str | None
        Its run-config key (``None``: the constructor's only).
    app_default : bool | int | float | str | None
        The bundled app's default for the key, where it differs from the constructor's
        (``None``: the same); ``help`` says why.
    alias : str | None
        The constructor's keyword where it differs from the attribute ``name`` (a
        declared class: a name its state already uses).
    parse : Callable[[Any], Any] | None
        Turns the run config's value (of ``app_default``'s type) into the
        constructor's, for a parameter that takes an object (a list of names, a loaded
        file): then ``app_default`` is required and the value is checked when the
        strategy is built, not when the run config is read.
    unset : bool | int | float | str | None
        The run-config value that passes nothing, so that the class built keeps its own
        default (``fedopt-eta`` 0: FedAdam's 0.1, FedYogi's 0.01); ``None``: none does.
    """

    name: str
    default: Any
    help: str
    check: Callable[[Any], bool] | None = None
    rule: str = ""
    choices: tuple[str, ...] | None = None
    key: str | None = None
    app_default: bool | int | float | str | None = None
    alias: str | None = None
    parse: Callable[[Any], Any] | None = None
    unset: bool | int | float | str | None = None

    @property
    def keyword(self) -> str:
        """The constructor's keyword for it."""
        return self.alias or self.name

    def __post_init__(self) -> None:
        if self.key is not None and type(self.run_default) not in BASIC_TYPES:
            raise TypeError(f"parameter {self.name}: default {self.default!r} is not a "
                            "bool, int, float or str (a run-config key needs one, or an "
                            "app_default and a parse)")
        if (self.parse is None) != (type(self.default) in BASIC_TYPES or self.key is None):
            raise TypeError(f"parameter {self.name}: a parse is for a run-config key whose "
                            f"constructor value is an object, not {self.default!r}")
        if (self.app_default is not None and self.parse is None
                and self.app_default != self.unset and self.problem(self.app_default)):
            raise ValueError(f"parameter {self.name}: app_default {self.app_default!r} "
                             f"{self.problem(self.app_default)}")
        if self.choices is not None and self.default not in self.choices:
            raise ValueError(f"parameter {self.name}: default {self.default!r} is not "
                             f"one of {self.choices}")

    @property
    def run_default(self) -> Any:
        """The run config's default: ``app_default``, or else ``default``."""
        return self.default if self.app_default is None else self.app_default

    @property
    def run_side(self) -> tuple[Any, ...]:
        """What the run config reads of it: keyword, key, run default, range, help and
        unset value (two declarations of one key must agree on it)."""
        return (self.keyword, self.key, self.run_default, self.range, self.help, self.unset)

    @property
    def type(self) -> type:
        """The parameter's type: its default's."""
        return type(self.default)

    @property
    def run_type(self) -> builtins.type:
        """The run config's type for it: its run default's."""
        return type(self.run_default)

    def allows_run(self, value: Any) -> bool:
        """Whether a run-config value (of :attr:`run_type`) is in range; a parsed one is
        checked when the strategy is built."""
        return self.parse is not None or self.is_unset(value) or self.allows(value)

    def is_unset(self, value: Any) -> bool:
        """Whether a run-config value is :attr:`unset` (the class keeps its default)."""
        return self.unset is not None and value == self.unset and type(value) is type(
            self.unset)

    @property
    def range(self) -> str:
        """The values allowed, in words (``""``: any of its type)."""
        return "one of " + ", ".join(self.choices) if self.choices is not None else self.rule

    def allows(self, value: Any) -> bool:
        """Whether ``value`` is in range (its type checked apart)."""
        return self.choices is not None and value in self.choices or (
            self.choices is None and (self.check is None or bool(self.check(value))))

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed (``None``: it is): of the wrong type (an int is
        a float), not finite, or out of range."""
        expected = self.type
        if expected not in BASIC_TYPES:  # an object (a callable, a mapping): its check
            return None if self.allows(value) else f"must be {self.rule}, got {value!r}"
        if isinstance(value, bool) != (expected is bool) or not isinstance(
                value, (int, float) if expected is float else expected):
            return f"must be of type {expected.__name__}, got {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number{' ' + self.range if self.range else ''}, " \
                   f"got {value!r}"
        return None if self.allows(value) else f"must be {self.range}, got {value!r}"


@dataclass(frozen=True)
class Spec:
    """The parameters a strategy declares itself (not those it inherits).

    Attributes
    ----------
    owner : str
        The strategy's name, which starts its error messages.
    params : tuple[Param, ...]
        Its parameters, in its signature's order.
    """

    owner: str
    params: tuple[Param, ...]

    def __post_init__(self) -> None:
        names = [p.keyword for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.owner}: a parameter is declared twice in {names}")

    def check(self, **values: Any) -> None:
        """Raise ``ValueError("<owner>: <name> <problem>")`` for the first value out of
        range, in declaration order.

        Raises
        ------
        ValueError
            Naming the strategy, the parameter, its range and the value.
        """
        self.check_as(self.owner, values)

    def check_as(self, owner: str, values: Mapping[str, Any]) -> None:
        """:meth:`check`, the message naming ``owner`` (a subclass) instead."""
        for param in self.params:
            if param.keyword in values and (problem := param.problem(values[param.keyword])):
                raise ValueError(f"{owner}: {param.keyword} {problem}")

    def keyed(self) -> tuple[Param, ...]:
        """The parameters the run config can set."""
        return tuple(p for p in self.params if p.key is not None)

    def arguments(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Constructor arguments from run-config values (by key; missing keys keep
        their defaults)."""
        return {p.keyword: p.parse(options[p.key]) if p.parse else options[p.key]
                for p in self.keyed() if p.key is not None and p.key in options
                and not p.is_unset(options[p.key])}


T = TypeVar("T")


def setting(*, default: T, help: str, check: Callable[[Any], bool] | None = None,
            rule: str = "", choices: tuple[str, ...] | None = None, key: str | None = None,
            app_default: bool | float | str | None = None, alias: str | None = None,
            parse: Callable[[Any], Any] | None = None,
            unset: bool | float | str | None = None) -> T:
    """A constructor parameter of a :class:`Configured` class, declared in its body
    (the attributes of :class:`Param`; its name is the attribute's). ``rule`` may be
    left out for a check of :data:`RULES`."""
    return cast(T, Param("", default, help, check, rule or rule_of(check), choices, key,
                         app_default, alias, parse, unset))


def positive(value: float) -> bool:
    """``> 0``."""
    return value > 0


def non_negative(value: float) -> bool:
    """``>= 0``."""
    return value >= 0


def unit(value: float) -> bool:
    """In [0, 1]."""
    return 0 <= value <= 1


RULES: dict[Callable[[Any], bool], str] = {positive: "> 0", non_negative: ">= 0",
                                          unit: "in [0, 1]"}
"""The rule each shared check states, so that a declaration names only the check."""


def rule_of(check: Callable[[Any], bool] | None) -> str:
    """The rule of a check of :data:`RULES` (``""`` for any other)."""
    return RULES.get(check, "") if check is not None else ""


def check_parameters(owner: str, checks: Iterable[tuple[bool, str]]) -> None:
    """Raise ``ValueError("<owner>: <message>")`` for the first failed (ok, message).

    Raises
    ------
    ValueError
        Naming the strategy and the parameter.
    """
    for ok, message in checks:
        if not ok:
            raise ValueError(f"{owner}: {message}")


def array_names(text: str) -> list[str] | None:
    """A run config's comma-separated list of array names (``None``: it names none)."""
    return [n.strip() for n in text.split(",") if n.strip()] or None


def none_if_empty(text: str) -> str | None:
    """A run config's string, ``None`` for ``""``."""
    return text or None
