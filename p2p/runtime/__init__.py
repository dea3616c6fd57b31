"""The trio runtime: one VCube-PS node on real TCP, mDNS and the fleet's secure channel.

The runtime is thin: every protocol decision is the sans-IO core's
(:class:`topics.VCubePS`).  This package moves bytes and keeps four promises:

* **Every connection is authenticated and every frame sealed** (``p2p._secure``);
  each frame body is checked by ``p2p.wire`` before a packet reaches the core.
  A peer that breaks the handshake, a seal, the wire schema or the protocol
  gets a log line naming it and its connection closed; nothing else changes
  (the core rejects a bad packet before changing state).
* **Connections follow need**: a node dials a peer only when the core sends to
  it, i.e. its O(log N) tree neighbours, re-dialling with capped backoff.
  Each direction uses the connection its sender dialled.
* **Link coalescing without timers**: each peer has an outbox; whatever queues
  while the previous frame is being written leaves together in the next frame.
* **Bounded memory**: an outbox holds at most ``outbox_limit`` packets and a
  subscription at most ``delivery_buffer`` deliveries; overflow is counted and
  logged (``Node.stats``), never silent.

Members are found by mDNS on the node's interface and, for networks without
multicast, through *static seeds* (``NodeConfig.seeds``): a node sends its
signed discovery record and the records it knows to each seed and asks for
theirs (peer exchange); a node that learns new records passes them on to its
VCube neighbours, so every member hears of a join in O(log N) hops.  Every
record is verified (fleet membership, signature) before it is used.

Links lose nothing (``p2p._reliable``): each link numbers its frames and
keeps them until the peer confirms them on the same connection; a new
connection sends again what was not confirmed, and the receiver drops what it
already handled.  Only frames meant for a peer that restarted as another
incarnation are lost (counted in ``stats["lost_on_disconnect"]``).

Failures (issue 5): each node runs the VCube failure detector
(``vcube.Detector``) over its members, its probes and replies riding the
fleet connections as control packets, and every received frame counting as a
sign of life.  A suspected or departed node leaves the overlay, its link is
dropped and the core repairs around it (``VCubePS.crashed``); a node that
joins or restarts (a higher incarnation, ``p2p.runtime._liveness``) is announced to
the core (``VCubePS.joined``).  A node closing cleanly announces its leave.

It drives the sans-IO :class:`p2p.machine.NodeMachine` and imports only
downwards: ``p2p.machine``, ``p2p.wire``, ``p2p._reliable``, the secure
channel (``p2p._identity``, ``p2p._secure``, ``p2p._transport``,
``p2p._revocation``, shared with the telemetry collector), ``p2p.telemetry``
(recording and upload, loaded only when configured) and the pure packages.
Nothing below imports it; ``p2p`` loads it on first use of a runtime name,
and it loads each of its modules on first use of one of their names
(``from p2p import open_node`` loads neither ``_blocking`` nor the causal
broadcast of ``causal``: the pure packages' names load lazily too).

Modules, each layer using only those above it in this list:

* ``_liveness``: incarnations and the detector settings a node runs with;
* ``_discovery``: mDNS / DNS-SD, bridged into trio;
* ``_config``: :class:`NodeConfig` and the trace hook;
* ``_delivery``: :class:`Delivery`, :class:`MembershipEvent`, :class:`Subscription`;
* ``_link``: per-peer outboxes, writers, reconnection and resending;
* ``_state``: the node's state and its authenticated dials;
* ``_driver``: carrying out the machine's outputs, timers, revocations;
* ``_serve``: accepted connections, the handshake, reading frames, seeds;
* ``_node``: the public :class:`Node` and :func:`open_node`;
* ``_blocking``: :class:`BlockingNode` for plain scripts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2p._errors import NodeError as NodeError
from vcube._lazy import lazy_exports

if TYPE_CHECKING:
    from p2p._transport import parse_address as parse_address
    from p2p.runtime._blocking import BlockingNode as BlockingNode
    from p2p.runtime._blocking import BlockingSubscription as BlockingSubscription
    from p2p.runtime._config import NodeConfig as NodeConfig
    from p2p.runtime._delivery import Delivery as Delivery
    from p2p.runtime._delivery import MembershipEvent as MembershipEvent
    from p2p.runtime._delivery import Subscription as Subscription
    from p2p.runtime._node import Node as Node
    from p2p.runtime._node import open_node as open_node

_LAZY = {
    "p2p._transport": ("parse_address",),
    "p2p.runtime._blocking": ("BlockingNode", "BlockingSubscription"),
    "p2p.runtime._config": ("NodeConfig",),
    "p2p.runtime._delivery": ("Delivery", "MembershipEvent", "Subscription"),
    "p2p.runtime._node": ("Node", "open_node"),
}
"""Module -> the public names taken from it, imported on first use of one of them
(PEP 562), so importing one name does not load every module of the package."""

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY, globals(), eager=("NodeError",))
