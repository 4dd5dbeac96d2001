"""A griffe extension: the constructor and the docstring of each class whose parameters
are declared with ``setting()`` (``fedgsp_flwr.strategies.configured.Configured``).

That constructor is generated when the class is created (as a dataclass's is), so
static analysis does not see it; this gives griffe the signature the class has at run
time, each parameter with its declared annotation and default, so the API reference
shows it and checks the class's ``Parameters`` section against it, and the docstring
the class has at run time, whose ``Parameters`` section is generated from the same
declarations (:func:`fedgsp_flwr.strategies.configured.documented`).
"""

from __future__ import annotations

import inspect
from typing import Any

import griffe


class SettingsConstructor(griffe.Extension):
    """Give a ``Configured`` class's griffe object its generated ``__init__``."""

    def on_class_members(self, *, node: Any, cls: griffe.Class, agent: Any,
                         **kwargs: Any) -> None:
        try:
            runtime = griffe.dynamic_import(cls.path)
        except ImportError:
            return
        if not getattr(getattr(runtime, "__init__", None), "generated", False):
            return
        annotations: dict[str, str] = {}
        for klass in reversed(runtime.__mro__):
            annotations.update({k: str(v) for k, v in vars(klass).get(
                "__annotations__", {}).items()})
        parameters = griffe.Parameters(
            griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword))
        for name, parameter in inspect.signature(runtime).parameters.items():
            default = parameter.default
            parameters.add(griffe.Parameter(
                name, kind=griffe.ParameterKind.keyword_only,
                annotation=annotations.get(name),
                default=getattr(default, "__name__", None) or repr(default)))
        if cls.docstring is not None and runtime.__doc__:  # its generated Parameters
            old = cls.docstring
            cls.docstring = griffe.Docstring(
                inspect.cleandoc(runtime.__doc__), lineno=old.lineno, endlineno=old.endlineno,
                parent=cls, parser=old.parser, parser_options=old.parser_options)
        cls.set_member("__init__", griffe.Function(
            "__init__", parameters=parameters, returns="None",
            docstring=griffe.Docstring(runtime.__init__.__doc__ or "")))
