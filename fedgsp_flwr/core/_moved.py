"""Deprecated aliases of names that left core/ (for one release: 0.7.0 to 0.8.0).

core/ imports nothing of the package; an old name's new home is imported only when the
old name is used, so that core stays free of Flower and torch.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping


def moved(module: str, targets: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` (``__getattr__ = moved(__name__, {...})``) that gives each
    old name the object ``targets[name]`` (``"package.module:attribute"``) names, with a
    DeprecationWarning, and raises ``AttributeError`` for any other name.
    """

    def getattr_(name: str) -> object:
        if name not in targets:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, attribute = targets[name].partition(":")
        warnings.warn(f"{module}.{name} is now {where}.{attribute} (0.7.0); the old name "
                      "goes in 0.8.0", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(where), attribute)

    return getattr_
