"""Which build of the cores runs (``p2p._build``): pure Python or compiled by mypyc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import p2p
import p2p._build as build

ROOT = Path(__file__).resolve().parent.parent


def test_the_build_running_is_the_one_expected() -> None:
    """``make test-compiled`` sets ``P2P_EXPECT_BUILD=mypyc``: its tests must run
    compiled code, not the ``.py`` files beside a failed build."""
    expected = os.environ.get("P2P_EXPECT_BUILD")
    kind = build.build_kind()
    if expected is not None:
        assert kind == expected
    else:
        assert kind in ("pure", "mypyc")


def test_a_partial_build_is_reported_as_mixed() -> None:
    first = build.COMPILED_MODULES[0]

    def files(ext: str, first_ext: str | None) -> dict[str, str | None]:
        return {m: first_ext if m == first else f"/x/{m}{ext}" for m in build.COMPILED_MODULES}

    so = ".cpython-311-x86_64-linux-gnu.so"
    assert build.build_kind(files(".py", "/x/first" + so)) == "mixed"
    assert build.build_kind(files(so, "/x/first" + so)) == "mypyc"
    assert build.build_kind(files(".py", None)) == "pure"
    assert build.build_kind(files(so, None)) == "mixed"  # one module not found


def test_the_list_names_existing_sources(capsys: pytest.CaptureFixture[str]) -> None:
    files = build.sources()
    assert all((ROOT / f).is_file() for f in files), files
    assert "topics/_core.py" in files
    assert set(build.origins()) == set(build.COMPILED_MODULES)
    assert build.main(["--bogus"]) == 2
    assert "usage" in capsys.readouterr().err


def test_the_cli_names_the_build(capsys: pytest.CaptureFixture[str]) -> None:
    from p2p.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"p2p {p2p.__version__} ({build.build_kind()} build)"


def test_the_build_loads_from_any_working_directory(tmp_path: Path) -> None:
    """A console script starts with its own directory on ``sys.path``, not the
    checkout: every compiled module, and mypyc's runtime for it, must load
    from there (a single shared library at the checkout's root did not)."""
    code = "import topics._core, causal._buffer, p2p.wire, p2p._build as b; print(b.build_kind())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == build.build_kind()
