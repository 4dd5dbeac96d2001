"""The documentation site (mkdocs.yml, docs/) builds with ``--strict`` and its API
reference names every public class and function of the library's three packages."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
# Each package's public names: its __all__ where it has one (strategies, clients); else
# (core, which exports nothing itself) every module's __all__, or the names not starting
# with "_" that the module defines.
PACKAGES = ("fedgsp_flwr.strategies", "fedgsp_flwr.clients", "fedgsp_flwr.core")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One strict build of the site into a temporary folder, and its process."""
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=540,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    return out, build


def test_site_builds_strictly(site: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """A broken link, a missing anchor, a page not in the nav, a docstring that does not
    match its signature or an unknown params marker fails the build."""
    _, build = site
    assert build.returncode == 0, (
        f"mkdocs build --strict failed ({build.returncode}):\n{build.stdout}\n{build.stderr}")


def modules_of(package: str) -> list[Any]:
    """The package, and for a package without ``__all__`` every public module under it."""
    root = importlib.import_module(package)
    if hasattr(root, "__all__"):
        return [root]
    found = [root]
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.append(importlib.import_module(info.name))
    return found


def public_objects() -> dict[str, Any]:
    """Every public class and function, by the dotted name it is exported under."""
    objects: dict[str, Any] = {}
    for package in PACKAGES:
        for module in modules_of(package):
            if hasattr(module, "__all__"):
                names = list(module.__all__)
            else:
                names = [name for name, obj in vars(module).items() if not name.startswith("_")
                         and getattr(obj, "__module__", None) == module.__name__]
            for name in names:
                obj = getattr(module, name)
                if inspect.isclass(obj) or inspect.isfunction(obj):
                    objects[f"{module.__name__}.{name}"] = obj
    return objects


def inventory_names(path: Path) -> set[str]:
    """The object names of a Sphinx inventory (version 2): four header lines, then
    zlib-compressed lines ``name domain:role priority uri dispname``."""
    lines = path.read_bytes().split(b"\n", 4)
    assert lines[0] == b"# Sphinx inventory version 2", lines[0]
    body = zlib.decompress(lines[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines() if line.strip()}


def test_api_reference_names_every_public_object(
        site: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = site
    inventory = out / "objects.inv"
    assert inventory.is_file(), f"no objects.inv in the built site {out}"
    names = inventory_names(inventory)
    objects = public_objects()
    assert len(objects) > 100, sorted(objects)
    missing = sorted(name for name, obj in objects.items()
                     if name not in names and f"{obj.__module__}.{obj.__qualname__}" not in names)
    assert not missing, (f"{len(missing)} public names missing from the API reference "
                         f"(docs/api/*.md): {', '.join(missing)}")
