"""Rounds that are one chain (DESIGN.md §3, "A round is a run").

A source that publishes while its previous round is in flight, delivering
nothing meanwhile, sends a round in which every publication after the first
names only the one before it.  :class:`Chain` is such a round's tuple of
publications, marked as one, so that a receiver checks the structure once
per round instead of once per publication.

Invariant of a ``Chain`` ``c``: ``len(c) >= 2``, and for every ``i >= 1``
``c[i].chains_on(c[i - 1].id)`` and ``c[i].id.seq > c[i - 1].id.seq``: one
stream, in strictly increasing order, each after the first naming exactly
its predecessor as barrier and ``prev``, and no op.  It is built only where
that was checked: by :func:`chain_of`, and by the wire's direct decoder from
the short forms it read (each is that by construction; the decoder checks
the order).  It is an ordinary tuple in every other respect (equality, hash,
``repr``; a slice is a plain tuple), so code that does not look for it is
unchanged.  This module is not compiled (a compiled class cannot extend
``tuple``); the modules that test for it are.
"""

from __future__ import annotations

from collections.abc import Sequence

from topics._messages import PubMessage, chain_end


class Chain(tuple[PubMessage, ...]):
    """A round's publications that form one chain (see the module docstring)."""

    __slots__ = ()


def chain_of(messages: Sequence[PubMessage]) -> tuple[PubMessage, ...]:
    """``messages`` as a :class:`Chain` if they are one, else as a plain tuple."""
    if len(messages) < 2 or chain_end(messages, 1) < len(messages):
        return tuple(messages)
    return Chain(messages)
