"""p2p: VCube-PS publish/subscribe on real networks, and its deterministic simulator.

The runtime names load on first use, so ``import p2p`` (and the simulator)
stays light on devices that never open a node::

    import trio
    from p2p import open_node

    async def main() -> None:
        async with open_node("node-dir") as node:
            room = await node.subscribe("lobby")
            await node.publish("lobby", b"hello")
            print(await room.receive())

    trio.run(main)

Plain scripts use :class:`BlockingNode` instead (no trio needed), asyncio
programs :func:`p2p.aio.open_node`; :mod:`p2p.fleet` makes fleets and node
directories.  :func:`percentile_of` is the project's one percentile rule
(nearest rank), for applications that report latencies as the library does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2p._errors import P2PError, ScenarioError, SecurityError
from vcube._lazy import lazy_exports

if TYPE_CHECKING:
    from p2p._stats import percentile_of
    from p2p.runtime import (
        BlockingNode,
        BlockingSubscription,
        Delivery,
        MembershipEvent,
        Node,
        NodeConfig,
        NodeError,
        Subscription,
        open_node,
    )

__version__ = "0.1.0"

_LAZY = {
    "BlockingNode": "p2p.runtime",
    "BlockingSubscription": "p2p.runtime",
    "Delivery": "p2p.runtime",
    "MembershipEvent": "p2p.runtime",
    "Node": "p2p.runtime",
    "NodeConfig": "p2p.runtime",
    "NodeError": "p2p.runtime",
    "Subscription": "p2p.runtime",
    "open_node": "p2p.runtime",
    "percentile_of": "p2p._stats",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "BlockingNode",
    "BlockingSubscription",
    "Delivery",
    "MembershipEvent",
    "Node",
    "NodeConfig",
    "NodeError",
    "P2PError",
    "ScenarioError",
    "SecurityError",
    "Subscription",
    "__version__",
    "open_node",
    "percentile_of",
]
