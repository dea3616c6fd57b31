"""The state of one VCube-PS node and the queries over it.

:class:`_CoreBase` creates every table and counter of a node; the classes
above it (:mod:`~topics._delivery`, :mod:`~topics._aggregation`,
:mod:`~topics._announce`, :mod:`~topics._rounds`, :mod:`~topics._repair`,
:mod:`~topics._fence`, :mod:`~topics._receive` and :class:`~topics.VCubePS` in
:mod:`~topics._core`) add behaviour, never state of their own: each uses only the attributes
declared in :meth:`_CoreBase.__init__`.  Invariant: ``_dead`` and ``_life``
only grow (an incarnation known to have crashed, or to be up, is never
forgotten), so :meth:`_CoreBase._is_dead` never turns false again.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from causal import CausalBarrier
from topics._config import PubSubConfig
from topics._errors import LocalProtocolError
from topics._messages import RoundId, ViewEntry
from topics._state import _Pending, _Topic
from vcube import Hypercube

if TYPE_CHECKING:
    import random


class _CoreBase:
    """The tables and counters of a :class:`~topics.VCubePS` (see the module docstring)."""

    def __init__(
        self,
        node_id: int,
        *,
        overlay: Hypercube,
        config: PubSubConfig | None = None,
        rng: random.Random | None = None,
        incarnation: int = 0,
    ) -> None:
        self.id = node_id
        self.incarnation = incarnation
        self.overlay = overlay
        self.config = config or PubSubConfig()
        self.rng = rng
        self._counter = 0
        self._rounds = 0
        self._topics: dict[str, _Topic] = {}
        self._pending: dict[RoundId, _Pending] = {}
        self.pending_max = 0
        """Most publications held back for causal order at once, over all topics."""
        self.holds = 0
        """Round packets held back from a child by causal aggregation."""
        self.mistaken_holds = 0
        """Holds released because the blocker's round had no packet for the child."""
        self._dead: dict[int, int] = {}
        """Crashed nodes: the newest incarnation of each known to have crashed."""
        self._life: dict[int, int] = {}
        """Newest incarnation of each node known to be (or have been) alive."""
        self._repair_of: dict[RoundId, RoundId] = {}
        self._repairs = 0
        self._stale: set[RoundId] = set()
        self._stale_order: deque[RoundId] = deque()
        self.repaired = 0
        """Sub-trees sent again to the next correct node after a child crashed."""
        self.relayed = 0
        """Rounds of crashed sources this node passed on."""
        self.fence_decisions = 0
        """Crashed streams whose end this node applied (``topics._fence``)."""
        self.duplicates = 0
        """Publications received again (retransmissions, relays) and dropped by id."""

    def __repr__(self) -> str:
        subs = sorted(t for t, s in self._topics.items() if s.subscribed)
        return f"VCubePS(id={self.id}, inc={self.incarnation}, subscribed={subs})"

    # ------------------------------------------------------------------ queries

    def set_overlay(self, overlay: Hypercube) -> None:
        """Use a new overlay membership for future SUB rounds."""
        self.overlay = overlay

    def is_subscribed(self, topic: str) -> bool:
        state = self._topics.get(topic)
        return state is not None and state.subscribed

    def is_confirmed(self, topic: str) -> bool:
        state = self._topics.get(topic)
        return state is not None and state.confirmed

    def view(self, topic: str) -> frozenset[int]:
        """The subscribers of ``topic`` this node knows of (itself included)."""
        state = self._topics.get(topic)
        return frozenset(state.subscribers()) if state else frozenset()

    def subscriber_incarnations(self, topic: str) -> dict[int, int]:
        """The subscribers of ``topic`` this node knows of, with the incarnation
        each subscribed as (a subscriber's older life may still be listed)."""
        state = self._topics.get(topic)
        if state is None:
            return {}
        return {n: e.incarnation for n, e in state.view.items() if e.subscribed}

    def barrier(self, topic: str) -> CausalBarrier:
        """The causal barrier the next publication on ``topic`` would carry."""
        return self._topic(topic).barrier

    def held_back(self, topic: str) -> int:
        """Publications received and not yet deliverable on ``topic``."""
        state = self._topics.get(topic)
        return state.kept() if state else 0

    def queued(self, topic: str) -> int:
        """Local operations waiting behind the round in flight."""
        state = self._topics.get(topic)
        return len(state.queue) if state else 0

    def idle(self) -> bool:
        """No round pending anywhere on this node and nothing queued."""
        return not self._pending and all(
            not t.queue and t.in_flight is None for t in self._topics.values()
        )

    def believed_dead(self, node: int) -> bool:
        """Whether this core takes ``node`` for crashed, with no sign of a newer
        incarnation (a membership record in an ACK wave is one).  A driver
        may drop a packet to such a node (this core repairs around it), and
        must deliver any other: the core can learn a newer life of a member
        before the node's membership does, and a packet to that life dropped
        as "to a crashed node" is repaired by nobody."""
        return self._known_dead(node)

    def _known_dead(self, node: int) -> bool:
        """Crashed, with no sign of a newer incarnation (so a packet to it is lost)."""
        return self._is_dead(node, self._life.get(node, 0))

    def _is_dead(self, node: int, incarnation: int) -> bool:
        """Whether ``incarnation`` of ``node`` is known to have crashed."""
        return incarnation <= self._dead.get(node, -1)

    # ---------------------------------------------------------------- helpers

    def _new_op(self, state: _Topic, *, subscribed: bool) -> ViewEntry:
        op = ViewEntry(self.id, self.incarnation, self._next_seq(), subscribed)
        state.set_entry(op)
        state.learned_at[self.id] = op.rc
        return op

    @property
    def next_seq(self) -> int:
        """The sequence number the next publication or op of this node gets."""
        return self._counter

    def first_seq(self, seq: int) -> None:
        """Start numbering at ``seq`` (before any activity): lets a driver keep ids
        unique across incarnations in logs that do not name incarnations."""
        if self._counter or self._topics:
            raise LocalProtocolError("first_seq after activity")
        self._counter = seq

    def _next_seq(self) -> int:
        seq = self._counter
        self._counter += 1
        return seq

    def _topic(self, topic: str) -> _Topic:
        state = self._topics.get(topic)
        if state is None:
            if not isinstance(topic, str) or not topic:
                raise LocalProtocolError(f"topic must be a non-empty string, got {topic!r}")
            if len(topic.encode()) > self.config.max_topic_len:
                raise LocalProtocolError(f"topic longer than {self.config.max_topic_len} bytes")
            state = self._topics[topic] = _Topic(topic)
        return state
