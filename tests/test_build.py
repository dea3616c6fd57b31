"""Which build of the cores runs (``p2p._build``): pure Python or compiled by mypyc."""

from __future__ import annotations

import os

import pytest

import p2p._build as build


def test_the_build_running_is_the_one_expected() -> None:
    """``make test-compiled`` sets ``P2P_EXPECT_BUILD=mypyc``: its tests must run
    compiled code, not the ``.py`` files beside a failed build."""
    expected = os.environ.get("P2P_EXPECT_BUILD")
    kind = build.build_kind()
    if expected is not None:
        assert kind == expected
    else:
        assert kind in ("pure", "mypyc")


def test_a_partial_build_is_reported_as_mixed(monkeypatch: pytest.MonkeyPatch) -> None:
    first = build.COMPILED_MODULES[0]
    monkeypatch.setattr(build, "_is_extension", lambda m: m == first)
    assert build.build_kind() == "mixed"
    monkeypatch.setattr(build, "_is_extension", lambda m: True)
    assert build.build_kind() == "mypyc"
    monkeypatch.setattr(build, "_is_extension", lambda m: None if m == first else False)
    assert build.build_kind() == "pure"


def test_the_list_names_existing_sources(capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--sources"]) == 0
    files = capsys.readouterr().out.split()
    assert files == build.sources()
    assert "topics/_core.py" in files
    assert build.main(["--bogus"]) == 2
