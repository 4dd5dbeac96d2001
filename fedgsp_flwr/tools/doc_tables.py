"""The documentation's tables, generated from the results files under ``docs/results``.

    python -m fedgsp_flwr.tools.doc_tables            # rewrite every generated table
    python -m fedgsp_flwr.tools.doc_tables --check    # list the stale ones, exit 1

A generated table is a template in an HTML comment (invisible on the rendered page,
on GitHub and on the site alike), followed by its rendering::

    <!-- table: fedgsp-mnist-pathological.csv
    | strategy | final accuracy |
    |---|---|
    | FedAvg | {{fedavg.final-acc-mean * 100:.2f}}% ± {{fedavg.final-acc-std * 100:.2f}} |
    -->

    | strategy | final accuracy |
    |---|---|
    | FedAvg | 82.42% ± 0.86 |

    <!-- /table -->

The opening line names the default source, a file relative to ``docs/results``. Each
``{{...}}`` is a value of the results files: ``term [* or / term ...][:spec]``, where a
term is a number or ``[file#]path``.

- ``file#``: another file under ``docs/results`` (``raw/...`` too) instead of the
  default source.
- ``path``: keys joined by dots. In a CSV, or a JSON list of rows, the first key is the
  row (the value of the first column, or ``column=value,...`` where that is not
  unique; a value may hold dots) and the next the column; in a JSON object each key
  is an entry (keys may hold dots: the longest key that matches is taken); in a list, an
  index.
- `` + ``, `` - ``, `` * `` and `` / `` (spaces around them): arithmetic, strictly left
  to right (no precedence) within parentheses, which open before a term and close after
  one (a weighted mean: ``{{(a.x * a.n) + (b.x * b.n) / (a.n + b.n)}}``), e.g. ``{{fedavg.final-acc-mean * 100:.2f}}``,
  a ratio of two results,
  ``{{fedgsp.cost-time-to-reference / fedavg.cost-time-to-reference:.2f}}``, a mean of
  three seeds, ``{{a.red + b.red + c.red / 3:.3f}}``, or a relative gain,
  ``{{x.acc / y.acc - 1 * 100:+.1f}}%``.
- ``:spec``: a Python format spec (``.2f``, ``,.0f``, ``.1%``); without one, the value as
  the file writes it. An empty CSV cell, or a JSON null, renders as an en dash.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path("docs") / "results"
OPEN = re.compile(r"^<!-- table:\s*(?P<source>\S+)\s*$")
CLOSE_TEMPLATE = "-->"
END = "<!-- /table -->"
PLACEHOLDER = re.compile(r"\{\{(?P<body>[^{}]+)\}\}")
OPERATOR = re.compile(r" ([-+*/]) ")
APPLY = {"+": float.__add__, "-": float.__sub__, "*": float.__mul__, "/": float.__truediv__}
NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$")
MISSING = "\u2013"


class TableError(ValueError):
    """A template that cannot be rendered: names the page, the line and the cause."""


@dataclass(frozen=True)
class Block:
    """One generated table of a page: its template and its current rendering."""

    page: Path
    line: int  # 1-based line of the opening comment
    source: str
    template: list[str]
    rendered: list[str]
    start: int  # index of the first rendered line
    end: int  # index of the END line


def pages(root: Path = REPO) -> list[Path]:
    """The pages that may hold generated tables: README.md and docs/**/*.md."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def blocks(page: Path, lines: Sequence[str]) -> Iterator[Block]:
    """The generated tables of ``page`` (its ``lines``), in order.

    Raises
    ------
    TableError
        If a template or its rendering is not closed.
    """
    i = 0
    while i < len(lines):
        match = OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        opening = i
        try:
            close = lines.index(CLOSE_TEMPLATE, i + 1)
            end = lines.index(END, close + 1)
        except ValueError:
            raise TableError(f"{page}:{opening + 1}: a table template needs a line "
                             f"'{CLOSE_TEMPLATE}' and, after its rendering, '{END}'") from None
        yield Block(page, opening + 1, match["source"], list(lines[opening + 1:close]),
                    list(lines[close + 1:end]), close + 1, end)
        i = end + 1


class Results:
    """The results files under one ``docs/results`` folder, each read once.

    Parameters
    ----------
    folder : Path
        The folder that the templates' file names are relative to.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._files: dict[str, Any] = {}

    def load(self, name: str) -> Any:
        """File ``name``: a CSV as a list of rows (dicts of strings), a JSON as it is."""
        if name not in self._files:
            path = self.folder / name
            if not path.is_file():
                raise ValueError(f"no file docs/results/{name}")
            if path.suffix == ".csv":
                with path.open(newline="") as file:
                    self._files[name] = list(csv.DictReader(file))
            else:
                self._files[name] = json.loads(path.read_text())
        return self._files[name]


def lookup(data: Any, path: str) -> Any:
    """The value at the dotted ``path`` of ``data`` (see the module docstring)."""
    rest = path
    while rest:
        if isinstance(data, list) and data and isinstance(data[0], dict):
            data, rest = _row(data, rest)
        elif isinstance(data, list):
            index, _, rest = rest.partition(".")
            if not index.isdigit() or int(index) >= len(data):
                raise KeyError(f"'{index}' is no index of a list of {len(data)}")
            data = data[int(index)]
        elif isinstance(data, dict):
            data, rest = _step(data, rest, "keys")
        else:
            raise KeyError(f"'{rest}' goes below a value ({data!r})")
    return data


def _row(rows: list[dict[str, Any]], rest: str) -> tuple[Any, str]:
    """The row that ``rest`` starts with: a value of the first column, or a selector
    ``column=value[,column=value...]`` where that is not unique (a value may hold dots,
    ``layer=1.weight``: the longest selector that matches one row is taken).
    """
    if "=" in rest.partition(".")[0]:
        parts = rest.split(".")
        for n in range(len(parts), 0, -1):
            found = _select(rows, ".".join(parts[:n]))
            if len(found) == 1:
                return found[0], ".".join(parts[n:])
        # the loop ends on the first key alone: name it and what it matched
        raise KeyError(f"{len(found)} rows match '{parts[0]}', not 1")
    first = next(iter(rows[0]))
    row, after = _step({str(row.get(first)): row for row in rows}, rest,
                       f"rows (by '{first}')")
    key = str(row.get(first))
    if sum(str(r.get(first)) == key for r in rows) > 1:
        raise KeyError(f"several rows have {first} '{key}': select one as "
                       f"'{first}={key},<column>=<value>'")
    return row, after


def _select(rows: list[dict[str, Any]], selector: str) -> list[dict[str, Any]]:
    """The rows whose columns hold every ``column=value`` of ``selector``."""
    pairs = [pair.split("=", 1) for pair in selector.split(",")]
    if any(len(pair) != 2 for pair in pairs):
        return []
    return [row for row in rows if all(str(row.get(k)) == v for k, v in pairs)]


def _step(mapping: dict[str, Any], rest: str, what: str) -> tuple[Any, str]:
    """The entry of the longest key of ``mapping`` that ``rest`` starts with."""
    for key in sorted(mapping, key=len, reverse=True):
        if rest == key or rest.startswith(key + "."):
            return mapping[key], rest[len(key) + 1:]
    names = ", ".join(sorted(mapping)[:12])
    raise KeyError(f"'{rest}' starts with none of the {len(mapping)} {what}: {names}")


def number(value: Any) -> float:
    """``value`` as a number (a CSV cell is a string).

    Raises
    ------
    ValueError
        If it is none (a word, a list, a boolean).
    """
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number") from None


def value_of(term: str, source: str, results: Results) -> Any:
    """A term's value: a number, or the entry at ``[file#]path``."""
    if NUMBER.match(term):
        return float(term)
    name, _, path = term.rpartition("#")
    return lookup(results.load(name or source), path)


def render_field(body: str, source: str, results: Results) -> str:
    """One placeholder's text."""
    expression, colon, spec = body.strip().rpartition(":")
    if not colon:
        expression, spec = spec, ""
    parts = OPERATOR.split(expression.strip())
    terms = [term.strip() for term in parts[::2]]
    opening = [len(t) - len(t.lstrip("(")) for t in terms]
    closing = [len(t) - len(t.rstrip(")")) for t in terms]
    values = [value_of(t.strip("()"), source, results) for t in terms]
    if any(v is None or v == "" for v in values):
        return MISSING
    if len(values) == 1 and not spec:
        return str(values[0])
    if sum(opening) != sum(closing):
        raise ValueError(f"unbalanced parentheses in {expression.strip()!r}")
    stack: list[tuple[float | None, str]] = []  # (value so far, operator) of open groups
    value: float | None = None
    for i, term in enumerate(values):
        op = parts[2 * i - 1] if i else ""
        for _ in range(opening[i]):
            stack.append((value, op))
            value, op = None, ""
        value = number(term) if value is None else APPLY[op](value, number(term))
        for _ in range(closing[i]):
            outer, op = stack.pop()
            value = value if outer is None else APPLY[op](outer, value)
    assert value is not None
    return format(value, spec)


def render(block: Block, results: Results) -> list[str]:
    """The block's template with every placeholder replaced.

    Raises
    ------
    TableError
        Naming the page, the line and the placeholder that cannot be rendered.
    """
    out = []
    for offset, line in enumerate(block.template, start=1):
        def replace(match: re.Match[str], line_no: int = block.line + offset) -> str:
            try:
                return render_field(match["body"], block.source, results)
            except (KeyError, ValueError) as err:
                message = err.args[0] if err.args else repr(err)
                raise TableError(f"{block.page}:{line_no}: {{{{{match['body']}}}}}: "
                                 f"{message}") from None
        out.append(PLACEHOLDER.sub(replace, line))
    # blank lines around the table: Markdown ends the comment's HTML block before it
    return ["", *out, ""]


def update(page: Path, results: Results, write: bool) -> list[Block]:
    """Render every table of ``page``; with ``write``, save the page if one changed.

    Returns
    -------
    list[Block]
        The tables whose rendering on the page differs from their template's.
    """
    lines = page.read_text().split("\n")
    stale = []
    for block in reversed(list(blocks(page, lines))):
        new = render(block, results)
        if new != block.rendered:
            stale.append(block)
            lines[block.start:block.end] = new
    if stale and write:
        page.write_text("\n".join(lines))
    return stale[::-1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; list the stale tables and exit 1 if any")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository")
    args = parser.parse_args(argv)
    results = Results(args.root / RESULTS)
    stale = [block for page in pages(args.root)
             for block in update(page, results, write=not args.check)]
    for block in stale:
        verb = "is stale" if args.check else "rewritten"
        print(f"{block.page.relative_to(args.root)}:{block.line}: table from "
              f"{block.source} {verb}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
