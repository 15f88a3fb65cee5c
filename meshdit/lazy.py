"""Module-level __getattr__ that imports a name's submodule on first use (PEP 562)."""
from __future__ import annotations

import importlib
from typing import Callable


def lazy_names(package: str, table: dict[str, str]) -> Callable[[str], object]:
    """table: exported name -> relative submodule that defines it (imported when the name is first read)."""

    def __getattr__(name: str):
        if name in table:
            return getattr(importlib.import_module(table[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
