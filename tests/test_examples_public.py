"""The examples use only the public API (issue 44): no import of a private module
of ``p2p`` (a dotted path with a part starting with ``_``) and no private name
taken from a public one.  The benchmarks may reach internals they measure, but
only those listed here, so a new one is a decision, not an accident."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BENCH_INTERNALS = {
    # Benchmarks of internals that have no public name: the telemetry job's
    # parsers and tables, the simulator's frames, the runtime's payload stamp,
    # the recorder the runtime benchmark drives, the build probe, the
    # detector's own network harness.
    ("bench/_common.py", "p2p._build"),
    ("bench/detector_sim.py", "p2p.sim._detsim"),
    ("bench/runtime.py", "p2p._build"),
    ("bench/runtime.py", "p2p.runtime._delivery"),
    ("bench/runtime.py", "p2p.telemetry._recorder"),
    ("bench/_runtime_workers.py", "p2p.telemetry._recorder"),
    ("bench/reproduce_thesis.py", "p2p.sim._frames"),
    ("bench/telemetry_spark.py", "p2p.telemetry._batch"),
    ("bench/telemetry_spark.py", "p2p.telemetry._fast"),
    ("bench/telemetry_spark.py", "p2p.telemetry._generate"),
    ("bench/telemetry_spark.py", "p2p.telemetry._job"),
    ("bench/telemetry_spark.py", "p2p.telemetry._standalone"),
    ("bench/telemetry_spark.py", "p2p.telemetry._tables"),
    ("bench/telemetry_spark.py", "p2p.telemetry._task"),
}


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def private_imports(path: Path) -> set[str]:
    """The private ``p2p`` modules and names ``path`` imports (anywhere in the file)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("p2p.") and _private(name):
                found.add(name)
    return found


def _offending(path: Path) -> set[str]:
    """Dotted private paths as imported: ``p2p._identity``, ``p2p.runtime._delivery``."""
    out = set()
    for name in private_imports(path):
        parts = name.split(".")
        cut = next(i for i, part in enumerate(parts) if part.startswith("_"))
        out.add(".".join(parts[: cut + 1]))
    return out


@pytest.mark.parametrize(
    "path", sorted((ROOT / "edge_examples").glob("*.py")), ids=lambda p: p.name
)
def test_examples_import_only_public_names(path: Path) -> None:
    assert _offending(path) == set(), f"{path.name} imports private p2p modules"


def test_bench_reaches_only_the_listed_internals() -> None:
    seen = {
        (str(path.relative_to(ROOT)), module)
        for path in sorted((ROOT / "bench").glob("*.py"))
        for module in _offending(path)
    }
    assert seen == BENCH_INTERNALS


def test_the_check_catches_what_it_is_for(tmp_path: Path) -> None:
    """The detector itself: each form of a private import is found, public ones are not."""
    cases = {
        "from p2p._identity import add_node": {"p2p._identity"},
        "import p2p._stats": {"p2p._stats"},
        "from p2p import _build": {"p2p._build"},
        "from p2p.runtime._delivery import _STAMP": {"p2p.runtime._delivery"},
        "from p2p.runtime import _blocking": {"p2p.runtime._blocking"},
        "def f():\n    from p2p.telemetry._cli import main": {"p2p.telemetry._cli"},
        "from p2p.fleet import add_node\nfrom p2p import open_node\nimport p2p.aio": set(),
        "from p2p.cli import main\nfrom ._game_logic import x\nimport _thread": set(),
    }
    for i, (code, expected) in enumerate(cases.items()):
        path = tmp_path / f"case{i}.py"
        path.write_text(code + "\n")
        assert _offending(path) == expected, code
