"""What a regular (non-editable) install contains: every package of the checkout."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_installed() -> None:
    """A package missing from the configuration is missing from the wheel (it
    once lacked ``p2p.runtime``, ``p2p.cli`` and ``p2p.machine``: no ``p2p``
    command after ``pip install .``), though an editable install hides it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = config["packages"]["find"]["include"]  # setuptools matches these with fnmatch
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("p2p", "vcube", "causal", "topics", "edge_examples")
        for init in (ROOT / top).rglob("__init__.py")
    }
    found = {name for name in on_disk if any(fnmatchcase(name, pat) for pat in include)}
    assert found == on_disk, sorted(on_disk - found)
    assert {"p2p.runtime", "p2p.cli", "p2p.machine"} <= found
