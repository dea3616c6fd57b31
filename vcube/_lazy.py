"""Lazy re-exports for a package ``__init__`` (PEP 562), written once for every package.

A package lists its public names, each with the private module that defines
it, and takes its module-level ``__getattr__`` and ``__dir__`` from
:func:`lazy_exports`: a name's module is imported on first use of the name,
so importing one name does not load every module of the package.

This module imports nothing of the project, so every package may use it:
``vcube`` is the lowest of them (``causal``, ``topics`` and ``p2p`` import it,
it imports none of them), and loading this module loads nothing of the rest of
``vcube`` either.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose module namespace
    is ``namespace`` (its ``globals()``): ``names`` maps each lazily exported
    name to the module defining it.  A name, once imported, is stored in
    ``namespace``, so ``__getattr__`` runs once per name."""

    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(names))

    return getattr_, dir_
