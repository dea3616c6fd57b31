"""Packing messages into link packets bounded by an MTU (thesis §4.5.1, §4.5.3).

The size model is the thesis': a packet is a fixed header plus its messages,
and no packet exceeds the MTU.  A message that alone exceeds the room a
packet has travels alone (a transport would fragment it); the packer never
splits a message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from causal._errors import CausalError

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class PacketLimits:
    """``mtu`` bytes per packet, ``header`` of them taken by the packet header."""

    mtu: int = 1500
    header: int = 20

    def __post_init__(self) -> None:
        if self.header < 0 or self.mtu <= self.header:
            raise CausalError(f"need 0 <= header < mtu, got header={self.header} mtu={self.mtu}")

    @property
    def room(self) -> int:
        """Bytes of messages one packet can carry."""
        return self.mtu - self.header


def pack(items: Sequence[T], size_of: Callable[[T], int], limits: PacketLimits) -> list[list[T]]:
    """Split ``items`` into packets, in order, each within ``limits.room``.

    Invariant: the concatenation of the packets is ``items``; every packet is
    non-empty and either fits the room or holds one oversized item alone.
    """
    packets: list[list[T]] = []
    current: list[T] = []
    used = 0
    for item in items:
        size = size_of(item)
        if current and used + size > limits.room:
            packets.append(current)
            current, used = [], 0
        current.append(item)
        used += size
    if current:
        packets.append(current)
    return packets


__all__ = ["PacketLimits", "pack"]
