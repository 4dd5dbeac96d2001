"""A strategy's parameters, declared once beside it.

A :class:`Spec` lists a strategy's own constructor parameters: each one's default,
range (a check and the rule it states, or its choices), help text and, where the run
config can set it, its run-config key. From that one declaration come the constructor's
checks (:meth:`Spec.check`), the app's run-config keys with their types, defaults and
ranges (:class:`~fedgsp_flwr.app.config.RunConfig`), the arguments the app's registry
passes (:meth:`Spec.arguments`) and the docs' parameter tables (the mkdocs hook
``docs/hooks/params.py``).
A strategy built on :class:`Configured` declares them in its class body instead
(``proximal_mu: float = setting(default=0.0, help=...)``): its constructor is generated
from them, keyword-only, with every inherited one, so ``help()``, mypy and an IDE show
each with its default (``typing.dataclass_transform``); its spec is ``cls.spec``. The
others still list their parameters explicitly; a test fails when a signature and its
spec disagree.
"""

from __future__ import annotations

import builtins
import inspect
import math
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar, cast, dataclass_transform

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
                and self.problem(self.app_default)):
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
        return self.parse is not None or self.allows(value)

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
                for p in self.keyed() if p.key is not None and p.key in options}


T = TypeVar("T")


def setting(*, default: T, help: str, check: Callable[[Any], bool] | None = None,
            rule: str = "", choices: tuple[str, ...] | None = None, key: str | None = None,
            app_default: bool | float | str | None = None, alias: str | None = None,
            parse: Callable[[Any], Any] | None = None) -> T:
    """A constructor parameter of a :class:`Configured` class, declared in its body
    (the attributes of :class:`Param`; its name is the attribute's)."""
    return cast(T, Param("", default, help, check, rule, choices, key, app_default, alias,
                         parse))


@dataclass_transform(kw_only_default=True, field_specifiers=(setting,))
class Configured:
    """A class whose constructor parameters are declared in its body with
    :func:`setting`, and inherited.

    The constructor takes each by keyword, checks every value against its declaration
    (the bases' first; ``ValueError("<class>: <name> <problem>")``), sets it as an
    attribute, then calls :meth:`__post_init__`, where a class builds what depends on
    its parameters (calling ``super().__post_init__()`` first). A class that defines
    ``__init__`` itself keeps it, and so do its subclasses. The constructor of a base
    that is not :class:`Configured` (Flower's ``FedOpt`` behind our ``FedAdam``) does
    not run: the class's :meth:`__post_init__` sets what it would.

    Attributes
    ----------
    spec : Spec
        The parameters the class declares itself.
    """

    spec: ClassVar[Spec] = Spec("Configured", ())

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = tuple(replace(value, name=name) for name, value in vars(cls).items()
                    if isinstance(value, Param))
        for param in own:
            setattr(cls, param.name, param.default)
        cls.spec = Spec(cls.__name__, own)
        cls.__doc__ = documented(cls)
        chain = [k for k in cls.__mro__[:cls.__mro__.index(Configured)]
                 if issubclass(k, Configured)]
        if all(getattr(vars(k).get("__init__"), "generated", "__init__" not in vars(k))
               for k in chain):
            cls.__init__ = _constructor(cls)  # type: ignore[method-assign]

    def __post_init__(self) -> None:
        """Build what depends on the parameters (subclasses; they are set by then)."""


def documented(cls: type[Configured]) -> str | None:
    """``cls``'s docstring with its numpy-style ``Parameters`` section generated from the
    declarations: each of its own parameters (type, default, help, range, run-config
    key) and a private base's, then the other inherited ones by the class that declares
    them. A docstring that has a ``Parameters`` section of its own keeps it.
    """
    doc = vars(cls).get("__doc__")
    if not doc or _SECTION.search(doc):
        return doc
    lines, seen = ["Parameters", "----------"], set[str]()
    for klass in cls.__mro__:
        spec = vars(klass).get("spec")
        if not isinstance(spec, Spec) or not issubclass(klass, Configured):
            continue
        params = [p for p in spec.params if p.keyword not in seen]
        seen.update(p.keyword for p in params)
        if klass is cls or klass.__name__.startswith("_"):
            for param in params:
                lines.extend(_entry(param, vars(klass).get("__annotations__", {})))
        elif params:
            lines.extend(textwrap.wrap(", ".join(p.keyword for p in params), 88))
            lines.append(f"    :class:`~{klass.__module__}.{klass.__qualname__}`'s.")
    head, attributes, tail = inspect.cleandoc(doc).partition("\nAttributes\n---")
    return "\n".join([head.rstrip(), "", *lines]) + (
        f"\n\nAttributes\n---{tail}" if attributes else "")


def _entry(param: Param, annotations: Mapping[str, Any]) -> list[str]:
    """One parameter's lines of a numpy-style ``Parameters`` section."""
    kind = annotations.get(param.name)
    kind = getattr(kind, "__name__", kind)
    default = (f'"{param.default}"' if isinstance(param.default, str) else
               getattr(param.default, "__name__", None) or repr(param.default))
    text = param.help[:1].upper() + param.help[1:].rstrip(".") + "."
    if param.choices is not None:
        text += " One of " + ", ".join(f"``{c}``" for c in param.choices) + "."
    elif param.rule:
        text += f" Must be {param.rule}."
    if param.key:
        text += f" Run config: ``{param.key}``"
        text += (f" (the app's default: {param.app_default!r})."
                 if param.app_default is not None else ".")
    return [f"{param.keyword} : {kind} (default: {default})" if kind else
            f"{param.keyword} (default: {default})",
            *textwrap.wrap(text, 84, initial_indent="    ", subsequent_indent="    ",
                           break_on_hyphens=False)]


_SECTION = re.compile(r"^\s*Parameters\n\s*-{3,}$", re.MULTILINE)


def _constructor(cls: type[Configured]) -> Callable[..., None]:
    specs: list[Spec] = [vars(k)["spec"] for k in reversed(cls.__mro__) if "spec" in vars(k)]
    params = {p.keyword: p for spec in specs for p in spec.params}

    def __init__(self: Configured, **values: Any) -> None:
        if unknown := sorted(set(values) - set(params)):
            raise TypeError(f"{type(self).__name__}() got unexpected keyword argument(s) "
                            f"{', '.join(unknown)}; it takes {', '.join(params)}")
        values = {keyword: values.get(keyword, p.default) for keyword, p in params.items()}
        for spec in specs:
            spec.check_as(type(self).__name__, values)
        for keyword, value in values.items():
            setattr(self, params[keyword].name, value)
        self.__post_init__()

    setattr(__init__, "generated", True)  # noqa: B010
    __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(keyword, inspect.Parameter.KEYWORD_ONLY, default=p.default)
           for keyword, p in params.items()])
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__doc__ = f"Take {cls.__name__}'s parameters (see the class)."
    return __init__


def positive(value: float) -> bool:
    """``> 0``."""
    return value > 0


def non_negative(value: float) -> bool:
    """``>= 0``."""
    return value >= 0


def unit(value: float) -> bool:
    """In [0, 1]."""
    return 0 <= value <= 1


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
