"""mkdocs hook: parameter tables generated from the strategies' declarations.

A line ``<!-- params: fedgsp_flwr.strategies.stocfl.PARAMS -->`` in a page is replaced,
at build time, by a table of that :class:`~fedgsp_flwr.strategies.params.Spec`: each
parameter's constructor name, run-config key, default (the app's where it differs),
range and help. A marker that names no ``Spec`` fails the build with an error naming it
and the page.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from mkdocs.exceptions import PluginError

# A marker anywhere in a line, but not quoted in a code span (`<!-- params: ... -->`).
MARKER = re.compile(r"(?<!`)<!--\s*params:\s*(?P<target>[^\s>]*)\s*-->")


def load_spec(target: str) -> Any:
    """The ``Spec`` that ``target`` (``package.module.NAME``) names.

    Raises
    ------
    ValueError
        If the module or the name does not exist.
    TypeError
        If the object is no ``Spec``.
    """
    from fedgsp_flwr.strategies.params import Spec

    module_name, _, attribute = target.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"'{target}' is not of the form package.module.NAME")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"module '{module_name}' cannot be imported ({err})") from err
    if not hasattr(module, attribute):
        raise ValueError(f"module '{module_name}' has no attribute '{attribute}'")
    spec = getattr(module, attribute)
    if not isinstance(spec, Spec):
        raise TypeError(f"'{target}' is a {type(spec).__name__}, not a Spec")
    return spec


def literal(value: Any) -> str:
    """A default as the run config (TOML) writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def table(spec: Any) -> str:
    """The markdown table of one ``Spec``."""
    rows = [
        (f"Parameters of `{spec.owner}` (its own; inherited ones are on their class's "
         "page), generated from its declaration:"),
        "",
        "| parameter | run-config key | default | range | what it sets |",
        "|---|---|---|---|---|",
    ]
    for param in spec.params:
        key = f"`{param.key}`" if param.key else "(constructor only)"
        default = f"`{literal(param.default)}`"
        if param.app_default is not None:
            default += f" (the app: `{literal(param.app_default)}`)"
        rows.append(
            f"| `{param.keyword}` | {key} | {default} | {cell(param.range) or 'any'} "
            f"| {cell(param.help)} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace every params marker of the page by its table."""

    def replace(match: re.Match[str]) -> str:
        target = match.group("target")
        try:
            return table(load_spec(target))
        except (ValueError, TypeError) as err:
            raise PluginError(
                f"params hook: unknown marker '<!-- params: {target} -->' in "
                f"{page.file.src_path}: {err}") from err

    return MARKER.sub(replace, markdown)
