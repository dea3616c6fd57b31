"""VCube-PS topic-based publish/subscribe as a sans-IO core (thesis ch. 5)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcube._lazy import lazy_exports

if TYPE_CHECKING:
    from topics._chain import Chain as Chain
    from topics._chain import chain_of as chain_of
    from topics._config import PubSubConfig as PubSubConfig
    from topics._core import VCubePS as VCubePS
    from topics._errors import AlreadySubscribedError as AlreadySubscribedError
    from topics._errors import LocalProtocolError as LocalProtocolError
    from topics._errors import NotSubscribedError as NotSubscribedError
    from topics._errors import RemoteProtocolError as RemoteProtocolError
    from topics._errors import TopicsError as TopicsError
    from topics._events import Delivered as Delivered
    from topics._events import DeliveredRun as DeliveredRun
    from topics._events import Dropped as Dropped
    from topics._events import Event as Event
    from topics._events import Held as Held
    from topics._events import Output as Output
    from topics._events import Published as Published
    from topics._events import PublishedRun as PublishedRun
    from topics._events import Received as Received
    from topics._events import RoundAcked as RoundAcked
    from topics._events import Send as Send
    from topics._events import Subscribed as Subscribed
    from topics._messages import Ack as Ack
    from topics._messages import Bound as Bound
    from topics._messages import Bundle as Bundle
    from topics._messages import Fence as Fence
    from topics._messages import Packet as Packet
    from topics._messages import PubMessage as PubMessage
    from topics._messages import PubRound as PubRound
    from topics._messages import RoundId as RoundId
    from topics._messages import Sub as Sub
    from topics._messages import Uns as Uns
    from topics._messages import ViewEntry as ViewEntry
    from topics._messages import wire_size as wire_size
    from topics._srpt import SRPTNode as SRPTNode
    from topics._state import PresetView as PresetView
    from topics._state import preset_view as preset_view

_LAZY = {
    "topics._chain": ("Chain", "chain_of"),
    "topics._config": ("PubSubConfig",),
    "topics._core": ("VCubePS",),
    "topics._errors": (
        "AlreadySubscribedError",
        "LocalProtocolError",
        "NotSubscribedError",
        "RemoteProtocolError",
        "TopicsError",
    ),
    "topics._events": (
        "Delivered",
        "DeliveredRun",
        "Dropped",
        "Event",
        "Held",
        "Output",
        "Published",
        "PublishedRun",
        "Received",
        "RoundAcked",
        "Send",
        "Subscribed",
    ),
    "topics._messages": (
        "Ack",
        "Bound",
        "Bundle",
        "Fence",
        "Packet",
        "PubMessage",
        "PubRound",
        "RoundId",
        "Sub",
        "Uns",
        "ViewEntry",
        "wire_size",
    ),
    "topics._srpt": ("SRPTNode",),
    "topics._state": ("PresetView", "preset_view"),
}
"""Module -> the public names taken from it, imported on first use of one of them
(PEP 562), so importing one name does not load every module of the package."""

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY, globals())
