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

from p2p._errors import P2PError as P2PError
from p2p._errors import ScenarioError as ScenarioError
from p2p._errors import SecurityError as SecurityError
from vcube._lazy import lazy_exports

if TYPE_CHECKING:
    from p2p._stats import percentile_of as percentile_of
    from p2p.runtime import BlockingNode as BlockingNode
    from p2p.runtime import BlockingSubscription as BlockingSubscription
    from p2p.runtime import Delivery as Delivery
    from p2p.runtime import MembershipEvent as MembershipEvent
    from p2p.runtime import Node as Node
    from p2p.runtime import NodeConfig as NodeConfig
    from p2p.runtime import NodeError as NodeError
    from p2p.runtime import Subscription as Subscription
    from p2p.runtime import open_node as open_node

__version__ = "0.1.0"

_LAZY = {
    "p2p._stats": ("percentile_of",),
    "p2p.runtime": (
        "BlockingNode",
        "BlockingSubscription",
        "Delivery",
        "MembershipEvent",
        "Node",
        "NodeConfig",
        "NodeError",
        "Subscription",
        "open_node",
    ),
}
"""Module -> the public names taken from it, imported on first use of one of them
(PEP 562), so importing one name does not load every module of the package."""

__getattr__, __dir__, __all__ = lazy_exports(
    __name__, _LAZY, globals(), eager=("P2PError", "ScenarioError", "SecurityError", "__version__")
)
