"""Strategies whose constructor parameters are declared in the class body.

:class:`Configured` turns each :func:`~fedgsp_flwr.strategies.params.setting` of a class
(and of its bases) into the class's :class:`~fedgsp_flwr.strategies.params.Spec`, a
keyword-only constructor that checks every value, and the ``Parameters`` section of its
docstring (:func:`documented`), so that ``help()``, mypy and an IDE show each parameter
with its default (``typing.dataclass_transform``).
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar, dataclass_transform

from .params import Param, Spec, setting


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


def class_specs(cls: type) -> list[Spec]:
    """The parameter specs of ``cls`` and its bases, bases first."""
    return [spec for klass in reversed(cls.__mro__)
            if isinstance(spec := vars(klass).get("spec"), Spec)]


def _constructor(cls: type[Configured]) -> Callable[..., None]:
    specs = class_specs(cls)
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
