"""The package's architecture: core <- strategies <- app, with protocol (the wire names)
below strategies and clients; no import cycles, shallow strategy classes, and a library
that imports without torch.

The import graph is read from the source (every ``import`` statement, also inside
functions), so a lazy import counts as an edge too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from flwr.serverapp.strategy import Strategy

from fedgsp_flwr.strategies.configured import Configured

PACKAGE = Path(__file__).resolve().parents[1] / "fedgsp_flwr"

# Layer of a module (its first sub-package, or its own name) -> top-level names it
# must not import. Third-party names are checked by their top-level package.
OURS = ("core", "strategies", "clients", "app", "tools", "data", "models", "training",
        "threads", "grids", "protocol")
FORBIDDEN: dict[str, set[str]] = {
    "core": {"flwr", "torch", *(f"fedgsp_flwr.{p}" for p in OURS if p != "core")},
    "strategies": {"torch", "fedgsp_flwr.app", "fedgsp_flwr.tools", "fedgsp_flwr.clients",
                   "fedgsp_flwr.data", "fedgsp_flwr.models", "fedgsp_flwr.training"},
    "clients": {"fedgsp_flwr.app", "fedgsp_flwr.tools", "fedgsp_flwr.strategies"},
    "data": {"fedgsp_flwr.app", "fedgsp_flwr.tools", "fedgsp_flwr.strategies",
             "fedgsp_flwr.clients"},
    "models": {"fedgsp_flwr.app", "fedgsp_flwr.tools", "fedgsp_flwr.strategies"},
    "training": {"fedgsp_flwr.app", "fedgsp_flwr.tools", "fedgsp_flwr.strategies"},
    "app": {"fedgsp_flwr.tools"},
    "threads": {"torch", *(f"fedgsp_flwr.{p}" for p in OURS
                           if p not in ("threads", "core", "grids", "protocol"))},
    "grids": {"torch", *(f"fedgsp_flwr.{p}" for p in OURS if p != "grids")},
    # the wire names strategies and client handlers share: below both, above nothing
    "protocol": {"torch", *(f"fedgsp_flwr.{p}" for p in OURS if p != "protocol")},
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules and packages it imports (absolute names)."""
    graph: dict[str, set[str]] = {}
    members: dict[str, set[str]] = {}  # `from package import name`: a module, or not
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        named = members.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                edges.add(base)
                named.update(f"{base}.{alias.name}" for alias in node.names)
    for name, named in members.items():  # `from package import module` imports it
        graph[name].update(n for n in named if n in graph)
    return graph


def forbidden_edges(graph: Mapping[str, Iterable[str]], root_name: str) -> list[str]:
    """Every import of a module that its layer must not make."""
    problems = []
    for module, imports in graph.items():
        layer = module.split(".")[1] if "." in module else ""
        for target in imports:
            for banned in FORBIDDEN.get(layer, ()):
                banned = banned.replace("fedgsp_flwr", root_name, 1)
                if target == banned or target.startswith(banned + "."):
                    problems.append(f"{module} imports {target}")
    return sorted(problems)


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle among the graph's own modules, or ``None``."""
    internal = {m: sorted(t for t in targets if t in graph and t != m)
                for m, targets in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in internal[module]:
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(internal):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def package_of(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The graph with a package's ``__init__`` importing only what it imports itself:
    a module imports its package's ``__init__`` implicitly, which is no cycle.
    """
    return {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in graph.items()}


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(package_of(import_graph(PACKAGE)))
    assert cycle is None, " -> ".join(cycle or [])


def test_no_layer_imports_upwards() -> None:
    assert forbidden_edges(import_graph(PACKAGE), "fedgsp_flwr") == []


def write_package(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = root / "fedgsp_flwr" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "fedgsp_flwr"


def test_the_checks_catch_a_new_cycle_and_an_upward_import(tmp_path: Path) -> None:
    clean = {"__init__.py": "", "core/__init__.py": "", "core/a.py": "import numpy\n",
             "strategies/__init__.py": "from .s import S\n",
             "strategies/s.py": "from ..core.a import x\nimport flwr\n",
             "app/__init__.py": "", "app/c.py": "from ..strategies import S\n"}
    graph = import_graph(write_package(tmp_path / "clean", clean))
    assert find_cycle(package_of(graph)) is None
    assert forbidden_edges(graph, "fedgsp_flwr") == []
    bad = {**clean, "core/a.py": "import numpy\nfrom ..strategies.s import S\n",
           "strategies/t.py": "def f():\n    import torch\n    from ..app import c\n"}
    graph = import_graph(write_package(tmp_path / "bad", bad))
    cycle = find_cycle(package_of(graph))
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"fedgsp_flwr.core.a", "fedgsp_flwr.strategies.s"}
    assert forbidden_edges(graph, "fedgsp_flwr") == [
        "fedgsp_flwr.core.a imports fedgsp_flwr.strategies.s",
        "fedgsp_flwr.strategies.t imports fedgsp_flwr.app",
        "fedgsp_flwr.strategies.t imports fedgsp_flwr.app.c",
        "fedgsp_flwr.strategies.t imports torch",
    ]


def strategy_classes() -> list[type]:
    from fedgsp_flwr import strategies

    return [c for c in vars(strategies).values()
            if isinstance(c, type) and issubclass(c, Strategy)]


@pytest.mark.parametrize("cls", strategy_classes(), ids=lambda c: c.__name__)
def test_each_strategy_has_at_most_four_classes_of_ours(cls: type) -> None:
    # Configured is the constructor from declared parameters (a dataclass's, for a
    # class that is not one): no behaviour of a strategy's round.
    ours = [c.__qualname__ for c in cls.__mro__
            if c.__module__.startswith("fedgsp_flwr") and c is not Configured]
    assert len(ours) <= 4, ours


@pytest.mark.parametrize(("module", "absent"), [
    ("fedgsp_flwr.core", {"flwr", "torch"}),
    ("fedgsp_flwr.strategies", {"torch", "fedgsp_flwr.app", "fedgsp_flwr.clients"}),
    # Deployment starts a ClientApp process per message: the solvers' imports (~0.8 s
    # here) are paid only where something is solved.
    ("fedgsp_flwr.app.client_app", {"scipy.cluster", "scipy.spatial", "ortools"}),
])
def test_the_library_imports_without_what_it_does_not_need(module: str,
                                                           absent: set[str]) -> None:
    code = (f"import sys, {module}; "
            f"print(sorted(set({sorted(absent)!r}) & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent).stdout.strip()
    assert out == "[]"
