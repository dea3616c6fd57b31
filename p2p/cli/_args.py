"""Argument types shared by the ``p2p`` commands."""

from __future__ import annotations

import argparse
from pathlib import Path


def path_arg(text: str) -> Path:
    """A path argument that must not be empty: ``Path("")`` is the current
    directory, so ``p2p fleet add-node FLEET ""`` wrote a node's key there."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return Path(text)


__all__ = ["path_arg"]
