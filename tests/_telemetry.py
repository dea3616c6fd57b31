"""Reading telemetry files back in tests: every item must decode and validate."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from p2p.telemetry import iter_items, validate


def read_records(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The records of these spool or landing files, in order; fails on a corrupt item."""
    out = []
    for f in paths:
        for item, err in iter_items(f.read_bytes()):
            assert err is None, (f, err)
            out.append(validate(item))
    return out


def landed(landing: Path) -> list[dict[str, Any]]:
    """The records of a landing directory; each must sit in its own device's folder."""
    files = sorted(landing.glob("date=*/device=*/*.cbor"))
    for f in files:
        for rec in read_records([f]):
            assert f.parent.name == f"device={rec['device']}", f
    return read_records(files)
