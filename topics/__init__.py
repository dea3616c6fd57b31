"""VCube-PS topic-based publish/subscribe as a sans-IO core (thesis ch. 5)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcube._lazy import lazy_exports

if TYPE_CHECKING:
    from topics._config import PubSubConfig
    from topics._core import VCubePS
    from topics._errors import (
        AlreadySubscribedError,
        LocalProtocolError,
        NotSubscribedError,
        RemoteProtocolError,
        TopicsError,
    )
    from topics._events import (
        Delivered,
        Dropped,
        Event,
        Held,
        Output,
        Published,
        Received,
        RoundAcked,
        Send,
        Subscribed,
    )
    from topics._messages import (
        Ack,
        Bound,
        Bundle,
        Fence,
        Packet,
        PubMessage,
        PubRound,
        RoundId,
        Sub,
        Uns,
        ViewEntry,
        wire_size,
    )
    from topics._srpt import SRPTNode
    from topics._state import PresetView, preset_view

_LAZY = {
    "Ack": "topics._messages",
    "AlreadySubscribedError": "topics._errors",
    "Bound": "topics._messages",
    "Bundle": "topics._messages",
    "Delivered": "topics._events",
    "Dropped": "topics._events",
    "Event": "topics._events",
    "Fence": "topics._messages",
    "Held": "topics._events",
    "LocalProtocolError": "topics._errors",
    "NotSubscribedError": "topics._errors",
    "Output": "topics._events",
    "Packet": "topics._messages",
    "PubMessage": "topics._messages",
    "PubRound": "topics._messages",
    "PresetView": "topics._state",
    "PubSubConfig": "topics._config",
    "Published": "topics._events",
    "Received": "topics._events",
    "RemoteProtocolError": "topics._errors",
    "RoundAcked": "topics._events",
    "RoundId": "topics._messages",
    "SRPTNode": "topics._srpt",
    "Send": "topics._events",
    "Sub": "topics._messages",
    "Subscribed": "topics._events",
    "TopicsError": "topics._errors",
    "Uns": "topics._messages",
    "VCubePS": "topics._core",
    "ViewEntry": "topics._messages",
    "preset_view": "topics._state",
    "wire_size": "topics._messages",
}
"""Public name -> the private module defining it, imported on first use (PEP 562),
so importing one name does not load every module of the package."""

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "Ack",
    "AlreadySubscribedError",
    "Bound",
    "Bundle",
    "Delivered",
    "Dropped",
    "Event",
    "Fence",
    "Held",
    "LocalProtocolError",
    "NotSubscribedError",
    "Output",
    "Packet",
    "PresetView",
    "PubMessage",
    "PubRound",
    "PubSubConfig",
    "Published",
    "Received",
    "RemoteProtocolError",
    "RoundAcked",
    "RoundId",
    "SRPTNode",
    "Send",
    "Sub",
    "Subscribed",
    "TopicsError",
    "Uns",
    "VCubePS",
    "ViewEntry",
    "preset_view",
    "wire_size",
]
