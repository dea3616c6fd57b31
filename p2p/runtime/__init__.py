"""The trio runtime: real nodes on TCP, mDNS and the fleet's secure channel.

It drives the sans-IO :class:`p2p.machine.NodeMachine` (feeds it frames,
hints and timers, carries out its outputs) and owns the I/O around it:
sockets, the handshake, discovery, timers.  It imports ``p2p.machine``,
``p2p._wire``, ``p2p._reliable`` and the pure packages below them; nothing
below imports it (``p2p`` itself loads it lazily, on first use of a runtime
name).
"""

from __future__ import annotations

from p2p.runtime._blocking import BlockingNode, BlockingSubscription
from p2p.runtime._node import (
    Delivery,
    MembershipEvent,
    Node,
    NodeConfig,
    NodeError,
    Subscription,
    open_node,
    parse_address,
)

__all__ = [
    "BlockingNode",
    "BlockingSubscription",
    "Delivery",
    "MembershipEvent",
    "Node",
    "NodeConfig",
    "NodeError",
    "Subscription",
    "open_node",
    "parse_address",
]
