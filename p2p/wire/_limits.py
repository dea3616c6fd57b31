"""The wire's bounds and constants: :class:`WireError`, :class:`WireLimits`, the
protocol version, the integer ranges and the packets' type tags (see ``p2p.wire``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

from p2p._errors import P2PError
from topics import PubSubConfig

PROTOCOL_VERSION: Final = 3
"""Version of the body layout; a peer speaking another version is refused.
(2: the optional *alive* element, the sender's detector version.)"""

PREFIX_BYTES: Final = 4
"""Bytes of the big-endian length prefix of a frame."""

NODE_LIMIT: Final = 1 << 64
"""Node ids are unsigned 64-bit integers."""

COUNTER_LIMIT: Final = 1 << 63
"""Incarnations, round numbers and sequence numbers are below this."""

MAX_DEPTH: Final = 7
"""Deepest array nesting of a valid body: body, packets, packet, messages, message, deps, id."""

_PUB, _SUB, _UNS, _ACK, _DET, _LEAVE, _MEMBERS, _REVOKED = 0, 1, 2, 3, 4, 5, 6, 7
_FENCE = 8
_RESUME, _REPLAY = 9, 10
_CONTROL_TAGS = (_DET, _LEAVE, _MEMBERS, _REVOKED, _RESUME, _REPLAY)


class WireError(P2PError):
    """A frame breaks the wire format or its limits; the connection that sent it is closed."""


_CORE = PubSubConfig()
"""The core's default limits: the wire's defaults for the same bounds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WireLimits:
    """Bounds on what one received frame may hold.  The core's bounds default to
    :class:`PubSubConfig`'s (one source, ``_CORE``); :meth:`from_config` takes
    them from a node's own config."""

    max_frame: int = 4 * 1024 * 1024
    """Largest frame body, in bytes (checked on the length prefix, before buffering)."""

    max_items: int = 1 << 20
    """Most CBOR data items in one body (bounds the objects a body decodes to)."""

    max_packets: int = 4096
    """Most packets in one frame (a bundle counts its packets)."""

    max_topic_len: int = _CORE.max_topic_len
    """Longest topic name, in UTF-8 bytes."""

    max_payload: int = _CORE.max_payload
    """Largest publication payload, in bytes."""

    max_round_messages: int = _CORE.max_round_messages
    """Most publications in one PUB round."""

    max_round_bytes: int = _CORE.max_round_bytes
    """Most payload bytes in a PUB round of more than one publication."""

    max_barrier: int = _CORE.max_barrier
    """Most entries (``deps`` plus ``op_deps``) in one causal barrier."""

    max_view_entries: int = _CORE.max_view_entries
    """Most view entries, and most bounds, in one ACK."""

    max_dests: int = _CORE.max_view_entries
    """Most node ids in the ``dests`` route of a PUB or UNS."""

    max_records: int = 1024
    """Most discovery records in one peer exchange."""

    max_record: int = 1200
    """Largest discovery record, in bytes (``p2p._secure.MAX_DISCOVERY_SIZE``)."""

    max_detector_entries: int = 4096
    """Most entries in one failure-detector reply or push (``vcube.DetectorConfig.max_entries``)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{f.name} must be a positive int, got {value!r}")
        if self.max_frame >= 1 << (8 * PREFIX_BYTES):
            raise ValueError(f"max_frame must fit the {PREFIX_BYTES}-byte length prefix")

    @classmethod
    def from_config(cls, config: PubSubConfig, *, max_frame: int = 4 * 1024 * 1024) -> WireLimits:
        """The limits a node running ``config`` applies to what it receives."""
        return cls(
            max_frame=max_frame,
            max_items=max(max_frame // 4, 1),
            max_topic_len=config.max_topic_len,
            max_payload=config.max_payload,
            max_round_messages=config.max_round_messages,
            max_round_bytes=config.max_round_bytes,
            max_barrier=config.max_barrier,
            max_view_entries=config.max_view_entries,
            max_dests=config.max_view_entries,
        )
