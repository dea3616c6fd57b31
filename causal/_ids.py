"""Message identifiers."""

from __future__ import annotations

from typing import NamedTuple


class MsgId(NamedTuple):
    """Identity of one publication or membership operation.

    ``seq`` comes from one counter per node incarnation, shared by every topic
    and message type, so ``(source, incarnation, seq)`` is never reused: a node
    that restarts takes a new ``incarnation``.  A named tuple rather than a
    dataclass because ids are hashed on every hop: tuple hashing is native.
    """

    source: int
    incarnation: int
    seq: int

    def __repr__(self) -> str:
        return f"<{self.source}.{self.incarnation}.{self.seq}>"
