"""The wire names live in fedgsp_flwr.protocol only: no other module of the package
writes one of its constants as a literal (docstrings aside), so that a strategy and the
handler that answers it cannot drift apart.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from fedgsp_flwr import protocol

PACKAGE = Path(protocol.__file__).resolve().parent
# (module path under the package, literal): where the same word means something else
ALLOWED = {
    ("data/partition.py", "train"): "a dataset's split name (Hugging Face's 'train')",
    ("data/sources.py", "train"): "a dataset's split name",
    ("training.py", "evaluate"): "the phase named in a batch-size error",
    ("core/ifca.py", "eval-loss"): "loss names any ClientApp's evaluate reply may use",
    ("core/edge_assignment/topology.py", "edges"): "the topology CSV file's header",
    ("strategies/cfl.py", "cluster"): "a field of cfl-clusters.json",
    ("strategies/stocfl.py", "lambda"): "the settings named in clusters.json",
}


def wire_names() -> dict[str, str]:
    """Value -> constant name, for every string constant of the protocol module."""
    names: dict[str, str] = {}
    for name, value in vars(protocol).items():
        if name.isupper() and isinstance(value, str):
            names.setdefault(value, name)
    return names


def literals(path: Path) -> list[tuple[int, str]]:
    """(line, value) of each string constant in the module, docstrings and parameter
    names aside (also the string parts of f-strings)."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    # A Param's first argument is a constructor keyword, a Python name, not a wire name.
    docs |= {id(node.args[0]) for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id == "Param" and node.args}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docs]


def test_no_module_spells_a_wire_name() -> None:
    names = wire_names()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == "protocol.py":
            continue
        found += [f"{module}:{line}: {value!r} is protocol.{names[value]}"
                  for line, value in literals(path)
                  if value in names and (module, value) not in ALLOWED]
    assert found == [], "\n".join(found)


def test_every_allowance_is_still_needed() -> None:
    names = wire_names()
    used = {(path.relative_to(PACKAGE).as_posix(), value)
            for path in PACKAGE.rglob("*.py") for _, value in literals(path) if value in names}
    assert set(ALLOWED) - used == set()


def test_the_names_are_distinct_and_every_message_type_is_described() -> None:
    values = [v for k, v in vars(protocol).items() if k.isupper() and isinstance(v, str)]
    types = {v for v in values if v.partition(".")[0] in protocol.CATEGORIES
             and (v in protocol.BASIC_TYPES or "." in v)}
    assert len(values) == len(set(values))
    assert types == set(protocol.MESSAGES)


@pytest.mark.parametrize("module", ["fedgsp_flwr.core.ditto", "fedgsp_flwr.core.fedmmd",
                                    "fedgsp_flwr.core.fusion", "fedgsp_flwr.core.hooks",
                                    "fedgsp_flwr.core.ifca", "fedgsp_flwr.clients.handlers",
                                    "fedgsp_flwr.threads", "fedgsp_flwr.strategies.fedavg",
                                    "fedgsp_flwr.strategies.stocfl",
                                    "fedgsp_flwr.strategies.nodes"])
def test_the_old_names_still_resolve_with_a_deprecation_warning(module: str) -> None:
    old = importlib.import_module(module)
    moved = vars(old)["_MOVED"]
    assert moved
    for name, target in moved.items():
        where, _, attribute = target.partition(":")
        with pytest.warns(DeprecationWarning, match=f"{name} is now {where}.{attribute}"):
            value = getattr(old, name)
        assert value is getattr(importlib.import_module(where), attribute)
    assert not hasattr(old, "NO_SUCH_NAME")
