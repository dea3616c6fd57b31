"""VCube-PS topic-based publish/subscribe as a sans-IO core (thesis ch. 5)."""

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

__all__ = [
    "Ack",
    "AlreadySubscribedError",
    "Bound",
    "Bundle",
    "Delivered",
    "Dropped",
    "Event",
    "Held",
    "LocalProtocolError",
    "NotSubscribedError",
    "Output",
    "Packet",
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
    "wire_size",
]
