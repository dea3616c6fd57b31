"""Lazy re-exports for a package ``__init__`` (PEP 562), written once for every package.

A package lists its lazy names once, grouped by the module it takes them from,
and takes its module-level ``__getattr__``, ``__dir__`` and ``__all__`` from
:func:`lazy_exports`: a name's module is imported on first use of the name,
so importing one name does not load every module of the package.  Type
checkers see the same names through the package's ``TYPE_CHECKING`` imports,
written ``from module import A as A`` (the explicit re-export form, so that
mypy --strict exports them without a literal ``__all__``).

This module imports nothing of the project, so every package may use it:
``vcube`` is the lowest of them (``causal``, ``topics`` and ``p2p`` import it,
it imports none of them), and loading this module loads nothing of the rest of
``vcube`` either.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    modules: Mapping[str, Iterable[str]],
    namespace: dict[str, Any],
    eager: Iterable[str] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The ``__getattr__``, ``__dir__`` and ``__all__`` of ``package``, whose
    module namespace is ``namespace`` (its ``globals()``): ``modules`` maps each
    module to the names the package takes from it on first use, and ``eager``
    lists the public names the package binds itself.  ``__all__`` is all of
    them, sorted.  A lazy name, once imported, is stored in ``namespace``, so
    ``__getattr__`` runs once per name."""
    names = {name: module for module, exported in modules.items() for name in exported}

    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(names))

    return getattr_, dir_, sorted({*names, *eager})
