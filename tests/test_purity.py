"""The protocol cores are sans-IO (DESIGN.md §1): no clocks, sockets, threads or
global randomness.  Checked on the source, so a new import cannot slip in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PURE = ("vcube", "causal", "topics")
FORBIDDEN = {"trio", "socket", "threading", "time", "random", "asyncio", "os", "select", "p2p"}


def runtime_imports(path: Path) -> set[str]:
    """Top-level modules imported at run time (``if TYPE_CHECKING:`` blocks excluded)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name.split(".")[0] for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.add(child.module.split(".")[0])
            visit(child)

    visit(tree)
    return found


@pytest.mark.parametrize("path", [p for pkg in PURE for p in sorted((ROOT / pkg).glob("*.py"))])
def test_pure_package_imports_no_io(path: Path) -> None:
    bad = runtime_imports(path) & FORBIDDEN
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_detector_sees_a_forbidden_import(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import random\n"
                   "def f():\n    import time\n")  # fmt: skip
    assert runtime_imports(src) & FORBIDDEN == {"time"}
