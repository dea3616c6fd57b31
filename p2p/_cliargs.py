"""Argument types shared by the ``p2p`` commands (``p2p.cli`` and ``p2p.telemetry``)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from p2p._errors import P2PError


def nonempty(text: str) -> str:
    """A path (or URI) argument kept as text, which must not be empty: an empty
    path means the current directory to the code that opens it."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def finite(text: str) -> float:
    """A number argument that is finite: ``nan`` passed every ``<= 0`` check and
    reached trio as a deadline (a traceback); ``inf`` never ends a wait."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def path_arg(text: str) -> Path:
    """A path argument that must not be empty: ``Path("")`` is the current
    directory, so ``p2p fleet add-node FLEET ""`` wrote a node's key there."""
    return Path(nonempty(text))


def check_output(path: Path | None, flag: str) -> None:
    """Fail before the work, not after it, when ``path`` cannot be written: a
    long simulation that ends in "No such file or directory" loses its run."""
    if path is None:
        return
    parent = path.parent
    if path.is_dir():
        raise P2PError(f"{flag} {path}: is a directory")
    if not parent.is_dir():
        raise P2PError(f"{flag} {path}: no directory {parent}")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise P2PError(f"{flag} {path}: not writable")


__all__ = ["check_output", "finite", "nonempty", "path_arg"]
