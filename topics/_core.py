"""VCube-PS (thesis ch. 5, Algorithms 3 and 4) as a sans-IO state machine.

A :class:`VCubePS` is one node.  It never reads a clock, a socket or global
randomness: the driver (the simulator or the trio runtime) calls
:meth:`~VCubePS.subscribe`, :meth:`~VCubePS.unsubscribe`,
:meth:`~VCubePS.publish` and :meth:`~VCubePS.receive`, each of which returns the
outputs it caused: :class:`~topics.Send` packets and application events.

How it departs from the thesis, and why (each is argued where it is coded):

* **Rounds, not stop-and-wait.**  Per topic a source keeps a FIFO queue of its
  own operations.  One round is in flight at a time; when its ACK wave returns,
  everything queued behind it leaves as the next round (a SUB or UNS alone, or
  a batch of publications).  The ACK wave clocks the source; there is no timer.
  Rounds being sequential gives per-source FIFO reception.
* **Source-routed subscriber trees.**  A PUB or UNS round carries, to each
  child, the subscribers of the child's sub-cube (``dests``), taken from the
  *source's* view when the round starts.  The tree is the one Algorithm 1 builds
  over that set, but the set a round reaches no longer depends on what relays
  believe, so once the source knows a subscriber every later round reaches it.
* **Membership operations are causal events.**  Every node records every
  SUB/UNS it hears of (a per-topic directory, subscribed or not), and the ops it
  learned since its last publication join its causal barrier.  A publication
  made after its source learned of subscription ``x`` is *post-x*; ``x``
  delivers exactly the post-x publications.  SUB ACKs tell ``x``, per
  publisher, the first sequence number that is post-x (:class:`Bound`) and
  gather every node's view.  With ops in the barriers, the set of post-x
  publications is closed under causal succession, which is what makes it safe
  for ``x`` to skip the others; the thesis' ``first_rec`` rule is not (a late
  joiner can receive ``m2`` whose predecessor ``m1`` is still in flight from a
  source it has never heard from, deliver ``m2``, then ``m1``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from causal import CausalBarrier, CausalBuffer, Dep, MsgId, op_stream
from topics._config import PubSubConfig
from topics._errors import (
    AlreadySubscribedError,
    LocalProtocolError,
    NotSubscribedError,
    RemoteProtocolError,
)
from topics._events import (
    Delivered,
    Dropped,
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
)
from vcube import ID_BITS, Hypercube, cluster, partition_sorted

if TYPE_CHECKING:
    import random


PresetView = tuple[dict[int, ViewEntry], tuple[int, ...]]


def preset_view(subscribers: Iterable[int]) -> PresetView:
    """A directory in which every node of ``subscribers`` subscribed before time 0."""
    subs = tuple(sorted(set(subscribers)))
    return {n: ViewEntry(n, 0, 0, True) for n in subs}, subs


class _Pending:
    """A round this node forwarded (or started) whose ACKs are not all back.

    ``view`` and ``bounds`` gather membership for SUB rounds only; the other
    rounds (the hot path) allocate neither.
    """

    __slots__ = ("bounds", "ids", "kind", "parent", "topic", "view", "waiting")

    def __init__(
        self,
        topic: str,
        kind: str,
        parent: int | None,
        waiting: set[int],
        ids: tuple[MsgId, ...] = (),
    ) -> None:
        self.topic = topic
        self.kind = kind
        self.parent = parent
        self.waiting = waiting
        self.ids = ids
        self.view: dict[int, ViewEntry] | None = None
        self.bounds: dict[tuple[int, int], int] | None = None
        if kind == "SUB":
            self.view, self.bounds = {}, {}


class _Held:
    """A round's packet for ``child`` held back until ``blockers`` have been sent to it."""

    __slots__ = ("blockers", "child", "packet")

    def __init__(self, child: int, packet: PubRound, blockers: set[MsgId]) -> None:
        self.child = child
        self.packet = packet
        self.blockers = blockers


@dataclass(slots=True)
class _Topic:
    """Everything one node knows and holds about one topic."""

    name: str
    view: dict[int, ViewEntry] = field(default_factory=dict)
    learned_at: dict[int, int] = field(default_factory=dict)
    barrier: CausalBarrier = field(default_factory=CausalBarrier)
    subscribed: bool = False
    confirmed: bool = False
    published: bool = False
    last_pub: int = -1
    last_rx: dict[tuple[int, int], int] = field(default_factory=dict)
    queue: deque[PubMessage | ViewEntry] = field(default_factory=deque)
    in_flight: RoundId | None = None
    # Per subscription (reset by subscribe):
    bounds: dict[tuple[int, int], int] = field(default_factory=dict)
    buffer: CausalBuffer[PubMessage] = field(default_factory=CausalBuffer)
    early: list[PubMessage] = field(default_factory=list)

    subs_cache: tuple[int, ...] | None = None
    # Causal aggregation (see VCubePS._hold_or_send):
    held: dict[int, dict[MsgId, _Held]] = field(default_factory=dict)
    waiting: dict[tuple[int, MsgId], list[_Held]] = field(default_factory=dict)
    kids_cache: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def subscribers(self) -> tuple[int, ...]:
        """The subscribers in the view, sorted (cached until the view changes)."""
        if self.subs_cache is None:
            self.subs_cache = tuple(sorted(n for n, e in self.view.items() if e.subscribed))
        return self.subs_cache

    view_shared: bool = False

    def set_entry(self, entry: ViewEntry) -> None:
        if self.view_shared:  # copy on first write (see preset_subscription)
            self.view, self.view_shared = dict(self.view), False
        self.view[entry.node] = entry
        self.subs_cache = None
        self.kids_cache = {}

    def tree_kids(self, me: int, root: int) -> tuple[int, ...]:
        """My children in ``root``'s tree over the subscribers I know (cached per view)."""
        got = self.kids_cache.get(root)
        if got is None:
            subs = self.subscribers()
            got = Hypercube(subs).children(me, root) if me in subs else ()
            self.kids_cache[root] = got
        return got


def _deps(msg: PubMessage) -> list[Dep]:
    """What ``msg`` waits for: its barrier, its ops, and the source's previous publication.

    A publication id is its own dependency triple (no allocation); the source's
    previous publication is always in the causal past but may have left the
    barrier, so it is named too to keep per-source FIFO explicit.
    """
    deps: list[Dep] = list(msg.deps)
    deps.extend((op_stream(o.source), o.incarnation, o.seq) for o in msg.op_deps)
    if msg.prev >= 0:
        deps.append((msg.id.source, msg.id.incarnation, msg.prev))
    return deps


class VCubePS:
    """One VCube-PS node: topic membership, publication trees, causal delivery.

    ``overlay`` is the VCube of correct overlay nodes (the all-node tree of SUB
    rounds); replace it with :meth:`set_overlay` when membership changes.
    ``rng`` is accepted for symmetry with the other cores; the protocol itself
    makes no random choice.
    """

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

    def barrier(self, topic: str) -> CausalBarrier:
        """The causal barrier the next publication on ``topic`` would carry."""
        return self._topic(topic).barrier

    def held_back(self, topic: str) -> int:
        """Publications received and not yet deliverable on ``topic``."""
        state = self._topics.get(topic)
        return len(state.buffer) + len(state.early) if state else 0

    def queued(self, topic: str) -> int:
        """Local operations waiting behind the round in flight."""
        state = self._topics.get(topic)
        return len(state.queue) if state else 0

    def idle(self) -> bool:
        """No round pending anywhere on this node and nothing queued."""
        return not self._pending and all(
            not t.queue and t.in_flight is None for t in self._topics.values()
        )

    # --------------------------------------------------------- application API

    def subscribe(self, topic: str, now: float) -> list[Output]:
        """Algorithm 3 ``Subscribe``: join ``topic``; :class:`Subscribed` follows later."""
        state = self._topic(topic)
        if state.subscribed:
            raise AlreadySubscribedError(f"node {self.id} is already subscribed to {topic!r}")
        op = self._new_op(state, subscribed=True)
        state.subscribed, state.confirmed = True, False
        # A fresh subscription owns nothing published before it, its own included.
        state.bounds = {(self.id, self.incarnation): op.rc}
        state.buffer = CausalBuffer()
        state.buffer.advance(self.id, self.incarnation, op.rc - 1)
        state.early = []
        return self._enqueue(state, op, now)

    def unsubscribe(self, topic: str, now: float) -> list[Output]:
        """Algorithm 3 ``Unsubscribe``: stop delivering at once, tell the subscribers."""
        state = self._topics.get(topic)
        if state is None or not state.subscribed:
            raise NotSubscribedError(f"node {self.id} is not subscribed to {topic!r}")
        op = self._new_op(state, subscribed=False)
        state.subscribed = state.confirmed = False
        out: list[Output] = []
        held = len(state.buffer) + len(state.early)
        if held:
            out.append(Dropped(topic, held, "unsubscribed before their predecessors arrived"))
        state.buffer, state.early = CausalBuffer(), []
        out.extend(self._flush_held(state))
        out.extend(self._enqueue(state, op, now))
        return out

    def publish(self, topic: str, payload: bytes, now: float) -> list[Output]:
        """Algorithm 3 ``Publish``: refused unless subscribed; delivered locally at once."""
        state = self._topics.get(topic)
        if state is None or not state.subscribed:
            raise NotSubscribedError(f"node {self.id} must subscribe to {topic!r} to publish")
        if len(payload) > self.config.max_payload:
            raise LocalProtocolError(
                f"payload of {len(payload)} bytes exceeds max_payload={self.config.max_payload}"
            )
        if len(state.queue) >= self.config.max_queued_ops:
            raise LocalProtocolError(f"{len(state.queue)} operations already queued on {topic!r}")
        mid = MsgId(self.id, self.incarnation, self._next_seq())
        msg = PubMessage(mid, bytes(payload), state.barrier.pubs, state.barrier.ops, state.last_pub)
        state.barrier.published(mid)
        state.published, state.last_pub = True, mid.seq
        out: list[Output] = [Published(topic, mid), Delivered(topic, mid, msg.payload, own=True)]
        out.extend(self._release(state, state.buffer.advance(self.id, self.incarnation, mid.seq)))
        out.extend(self._enqueue(state, msg, now))
        return out

    def preset_subscription(
        self, topic: str, subscribers: Iterable[int], *, shared: PresetView | None = None
    ) -> None:
        """Oracle start (thesis simulator switch): ``subscribers`` are already known.

        Every node of the run must be given the same set before anything
        happens; this node becomes a confirmed subscriber if it is in the set.
        A driver presetting many nodes passes one :func:`preset_view` as
        ``shared``: the nodes then share it copy-on-write instead of each
        holding its own O(N) directory (O(N^2) memory for a fleet).
        """
        state = self._topic(topic)
        if state.view or state.queue or state.in_flight is not None:
            raise LocalProtocolError(f"preset_subscription on {topic!r} after activity")
        view, subs = shared if shared is not None else preset_view(subscribers)
        state.view, state.view_shared, state.subs_cache = view, True, subs
        # learned_at stays empty: an oracle subscription was "learned" before any
        # publication, so it bounds nothing (a missing entry reports no Bound).
        if self.id in view:
            state.subscribed = state.confirmed = True
            state.bounds = {}
            self._counter = max(self._counter, 1)

    # ----------------------------------------------------------------- network

    def receive(self, sender: int, packet: Packet, now: float) -> list[Output]:
        """Handle one packet from ``sender``; raises :class:`RemoteProtocolError` on garbage.

        A packet that raises has not changed this node's state.
        """
        if isinstance(packet, PubRound):
            return self._on_round(sender, packet, packet.dests, packet.messages)
        if isinstance(packet, Uns):
            return self._on_round(sender, packet, packet.dests, ())
        if isinstance(packet, Sub):
            return self._on_sub(sender, packet)
        if isinstance(packet, Ack):
            return self._on_ack(sender, packet)
        raise RemoteProtocolError(f"unknown packet type {type(packet).__name__}")

    def _check_remote(self, topic: str, messages: tuple[PubMessage, ...] = ()) -> None:
        """Reject a packet whose sizes break the configured limits (before any state change)."""
        cfg = self.config
        if not isinstance(topic, str) or not topic or len(topic.encode()) > cfg.max_topic_len:
            raise RemoteProtocolError(f"bad topic name {str(topic)[:64]!r}")
        if len(messages) > cfg.max_round_messages:
            raise RemoteProtocolError(f"round of {len(messages)} publications exceeds the limit")
        for msg in messages:
            if len(msg.payload) > cfg.max_payload:
                raise RemoteProtocolError(f"payload of {msg.id!r} exceeds max_payload")
            if len(msg.deps) + len(msg.op_deps) > cfg.max_barrier:
                raise RemoteProtocolError(f"causal barrier of {msg.id!r} exceeds max_barrier")
        held = self.held_back(topic)
        if (
            messages
            and held + len(messages) > cfg.max_held
            and held + self._would_hold(topic, messages) > cfg.max_held
        ):
            raise RemoteProtocolError(f"hold-back buffer of {topic!r} full (max_held)")
        if len(self._pending) >= cfg.max_pending_rounds:
            raise RemoteProtocolError("too many rounds awaiting acknowledgement")

    @staticmethod
    def _check_fifo(
        last_rx: dict[tuple[int, int], int], rid: RoundId, messages: tuple[PubMessage, ...]
    ) -> int | None:
        """Reject a round whose publications are not its source's, in increasing order,
        after everything already received from that source; return the new last seq.

        Honest sources never break this (their rounds are sequential and a node
        receives each round once), so it also rejects duplicates up front.
        Pure: the caller records the result only once every check passed.
        """
        if not messages:
            return None
        stream = (rid.source, rid.incarnation)
        last = last_rx.get(stream, -1)
        for msg in messages:
            if (msg.id.source, msg.id.incarnation) != stream or msg.id.seq <= last:
                raise RemoteProtocolError(
                    f"publication {msg.id!r} received twice, out of order, or not from {rid!r}"
                )
            last = msg.id.seq
        return last

    def _on_sub(self, sender: int, packet: Sub) -> list[Output]:
        if sender == self.id or packet.op.node != packet.round.source:
            raise RemoteProtocolError(f"malformed SUB from {sender}: {packet!r}")
        if packet.round in self._pending:
            raise RemoteProtocolError(f"round {packet.round!r} received twice")
        self._check_remote(packet.topic)
        state = self._topic(packet.topic)
        out = self._learn(state, packet.op)
        kids = self.overlay.children_at(self.id, cluster(sender, self.id) - 1)
        pending = _Pending(packet.topic, "SUB", sender, set(kids))
        out.extend(self._forward(packet.round, pending, [(k, packet) for k in kids]))
        return out

    def _on_round(
        self,
        sender: int,
        packet: PubRound | Uns,
        dests: tuple[int, ...],
        messages: tuple[PubMessage, ...],
    ) -> list[Output]:
        if sender == self.id or self.id in dests or list(dests) != sorted(set(dests)):
            raise RemoteProtocolError(f"malformed {packet.kind} from {sender}: {packet.round!r}")
        if packet.round in self._pending:
            raise RemoteProtocolError(f"round {packet.round!r} received twice")
        self._check_remote(packet.topic, messages)
        known = self._topics.get(packet.topic)
        last_rx = self._check_fifo(known.last_rx if known else {}, packet.round, messages)
        state = known or self._topic(packet.topic)
        if last_rx is not None:
            state.last_rx[(packet.round.source, packet.round.incarnation)] = last_rx
        out: list[Output] = []
        if isinstance(packet, Uns):
            out.extend(self._learn(state, packet.op))
        for msg in messages:
            out.extend(self._on_publication(state, msg))
        children: list[tuple[int, Packet]] = []
        for child, share in partition_sorted(self.id, dests):
            if isinstance(packet, PubRound):
                children.append((child, PubRound(packet.round, packet.topic, messages, share)))
            else:
                children.append((child, Uns(packet.round, packet.topic, packet.op, share)))
        pending = _Pending(packet.topic, packet.kind, sender, {c for c, _ in children})
        if messages and (state.held or (self.config.aggregation and state.confirmed)):
            if not children:
                out.append(self._ack_for(packet.round, pending))
            else:
                self._pending[packet.round] = pending
            out.extend(self._aggregate(state, messages, children))
            return out
        out.extend(self._forward(packet.round, pending, children))
        return out

    # ------------------------------------------------------ causal aggregation

    def _aggregate(
        self, state: _Topic, messages: tuple[PubMessage, ...], children: list[tuple[int, Packet]]
    ) -> list[Output]:
        """Forward a PUB round, holding its packet back from children that cannot use it yet.

        The packet for child ``k`` is held while the round's first publication
        has a direct predecessor ``d`` that (a) this node has not received, will
        receive (it is post-subscription here, so this node's own delivery waits
        for it) and routes to ``k`` (``k`` is its child in ``d``'s tree over the
        view), or (b) sits in a packet already held from ``k``.  ``k`` could not
        deliver the round before ``d`` anyway (per-source FIFO makes the first
        publication gate the whole round), so holding costs it nothing, and the
        packets leave together.  Held packets are released when every blocker
        has been sent to ``k``, or arrived here without a packet for ``k`` (the
        view was wrong about the tree: a bounded delay, counted in
        ``mistaken_holds``).  Liveness: a blocker is a message this node's own
        delivery waits for, so it arrives; releases cascade in causal order.
        Safety never depends on holding: causal delivery is the receiver's.
        """
        out: list[Output] = []
        ready: dict[int, list[Packet]] = {}
        held_now: set[int] = set()
        ids = tuple(m.id for m in messages)
        for child, pkt in children:
            blockers = self._blockers(state, messages[0], child)
            if not blockers:
                ready.setdefault(child, []).append(pkt)
                continue
            assert isinstance(pkt, PubRound)
            held = _Held(child, pkt, blockers)
            by_id = state.held.setdefault(child, {})
            for mid in ids:
                by_id[mid] = held
            for d in blockers:
                state.waiting.setdefault((child, d), []).append(held)
            held_now.add(child)
            self.holds += 1
            out.append(Held(state.name, child, ids))
        for child in [c for c in state.held if c not in held_now]:
            for mid in ids:
                if (child, mid) in state.waiting:
                    if child not in ready:
                        self.mistaken_holds += 1
                    self._resolve(state, child, mid, ready)
        for child, pkts in ready.items():
            out.append(Send(child, pkts[0] if len(pkts) == 1 else Bundle(tuple(pkts))))
        return out

    def _blockers(self, state: _Topic, first: PubMessage, child: int) -> set[MsgId]:
        """The predecessors of ``first`` that ``child`` waits for and this node will bring."""
        if not (self.config.aggregation and state.confirmed):
            return set()
        held = state.held.get(child)
        found: set[MsgId] = set()
        for d in first.deps:
            if (held is not None and d in held) or (
                d.source != self.id
                and state.last_rx.get((d.source, d.incarnation), -1) < d.seq
                and d.seq >= state.bounds.get((d.source, d.incarnation), 0)
                and child in state.tree_kids(self.id, d.source)
            ):
                found.add(d)
        return found

    def _resolve(
        self, state: _Topic, child: int, mid: MsgId, ready: dict[int, list[Packet]]
    ) -> None:
        """``mid`` is settled for ``child``: release what no longer waits, in causal order."""
        work = [mid]
        while work:
            settled = work.pop()
            for held in state.waiting.pop((child, settled), ()):
                held.blockers.discard(settled)
                if held.blockers:
                    continue
                ready.setdefault(child, []).append(held.packet)
                by_id = state.held[child]
                for m in held.packet.messages:
                    del by_id[m.id]
                    work.append(m.id)
                if not by_id:
                    del state.held[child]

    def _flush_held(self, state: _Topic) -> list[Output]:
        """Send everything held on ``state`` at once (this node stops relaying knowledge)."""
        out: list[Output] = []
        for child, by_id in state.held.items():
            pkts = list({id(h): h.packet for h in by_id.values()}.values())
            out.append(Send(child, pkts[0] if len(pkts) == 1 else Bundle(tuple(pkts))))
        state.held, state.waiting = {}, {}
        return out

    def _forward(
        self, rid: RoundId, pending: _Pending, children: list[tuple[int, Packet]]
    ) -> list[Output]:
        """Send a round on to ``children``; a leaf acknowledges at once (lines 48-59)."""
        if not children:
            return [self._ack_for(rid, pending)]
        self._pending[rid] = pending
        return [Send(child, pkt) for child, pkt in children]

    def _ack_for(self, rid: RoundId, pending: _Pending) -> Send:
        """The ACK this node sends its parent once its whole sub-tree has the round."""
        assert pending.parent is not None
        if pending.kind != "SUB":
            return Send(pending.parent, Ack(rid, pending.topic))
        state = self._topic(pending.topic)
        assert pending.view is not None
        assert pending.bounds is not None
        merged = dict(pending.view)
        for node, entry in state.view.items():
            if entry.newer_than(merged.get(node)):
                merged[node] = entry
        bounds = dict(pending.bounds)
        learned = state.learned_at.get(rid.source)
        if state.published and learned is not None:
            bounds[(self.id, self.incarnation)] = learned
        return Send(
            pending.parent,
            Ack(
                rid,
                pending.topic,
                tuple(merged.values()),
                tuple(Bound(n, i, b) for (n, i), b in bounds.items()),
            ),
        )

    def _on_ack(self, sender: int, packet: Ack) -> list[Output]:
        pending = self._pending.get(packet.round)
        if pending is None or pending.topic != packet.topic or sender not in pending.waiting:
            raise RemoteProtocolError(f"unexpected ACK from {sender} for {packet.round!r}")
        limit = self.config.max_view_entries
        if len(packet.view) > limit or len(packet.bounds) > limit:
            raise RemoteProtocolError(f"ACK from {sender} carries more than {limit} entries")
        if pending.view is not None and pending.bounds is not None:
            for entry in packet.view:
                if entry.newer_than(pending.view.get(entry.node)):
                    pending.view[entry.node] = entry
            for b in packet.bounds:
                key = (b.node, b.incarnation)
                pending.bounds[key] = max(pending.bounds.get(key, 0), b.first_owned)
        pending.waiting.discard(sender)
        if pending.waiting:
            return []
        del self._pending[packet.round]
        if pending.parent is not None:
            return [self._ack_for(packet.round, pending)]
        return self._round_done(packet.round, pending)

    # ----------------------------------------------------------- source rounds

    def _enqueue(self, state: _Topic, op: PubMessage | ViewEntry, now: float) -> list[Output]:
        state.queue.append(op)
        return self._start_round(state) if state.in_flight is None else []

    def _start_round(self, state: _Topic) -> list[Output]:
        """Start the next round from the queue; loops while rounds complete at once.

        Invariant: at most one round per topic is in flight from this source,
        so rounds (and so receptions from this source) are totally ordered.
        """
        out: list[Output] = []
        while state.queue and state.in_flight is None:
            rid = RoundId(self.id, self.incarnation, self._rounds)
            self._rounds += 1
            head = state.queue.popleft()
            children: list[tuple[int, Packet]]
            if isinstance(head, ViewEntry) and head.subscribed:
                kids = self.overlay.children_at(self.id, ID_BITS)
                sub = Sub(rid, state.name, head)
                children = [(k, sub) for k in kids]
                pending = _Pending(state.name, "SUB", None, set(kids), (head.op_id,))
            elif isinstance(head, ViewEntry):
                dests = partition_sorted(self.id, state.subscribers())
                children = [(c, Uns(rid, state.name, head, share)) for c, share in dests]
                pending = _Pending(state.name, "UNS", None, {c for c, _ in children}, (head.op_id,))
            else:
                batch = self._take_batch(state, head)
                dests = partition_sorted(self.id, state.subscribers())
                children = [(c, PubRound(rid, state.name, batch, share)) for c, share in dests]
                ids = tuple(m.id for m in batch)
                pending = _Pending(state.name, "PUB", None, {c for c, _ in children}, ids)
            out.extend(Send(c, p) for c, p in children)
            if children:
                state.in_flight = rid
                self._pending[rid] = pending
            else:
                out.extend(self._complete(state, pending))
        return out

    def _take_batch(self, state: _Topic, head: PubMessage) -> tuple[PubMessage, ...]:
        """``head`` and the publications queued right behind it, within the round limits."""
        batch = [head]
        size = len(head.payload)
        cfg = self.config
        while state.queue and len(batch) < cfg.max_round_messages:
            nxt = state.queue[0]
            if not isinstance(nxt, PubMessage) or size + len(nxt.payload) > cfg.max_round_bytes:
                break
            batch.append(nxt)
            size += len(nxt.payload)
            state.queue.popleft()
        return tuple(batch)

    def _round_done(self, rid: RoundId, pending: _Pending) -> list[Output]:
        state = self._topics[pending.topic]
        state.in_flight = None
        out = self._complete(state, pending)
        out.extend(self._start_round(state))
        return out

    def _complete(self, state: _Topic, pending: _Pending) -> list[Output]:
        """The ACK wave of one of this node's rounds came back (line 34)."""
        out: list[Output] = [RoundAcked(state.name, pending.kind, pending.ids)]
        if pending.kind != "SUB":
            return out
        assert pending.view is not None
        assert pending.bounds is not None
        for entry in pending.view.values():
            out.extend(self._learn(state, entry))
        own = state.view.get(self.id)
        if state.subscribed and own is not None and own.op_id == pending.ids[0]:
            for key, first in pending.bounds.items():
                state.bounds[key] = max(state.bounds.get(key, 0), first)
            state.confirmed = True
            out.append(Subscribed(state.name))
            out.extend(self._confirm(state))
        return out

    # -------------------------------------------------------- causal delivery

    def _confirm(self, state: _Topic) -> list[Output]:
        """Open delivery: every bound and learned op is now known (Subscribed)."""
        out: list[Output] = []
        for (node, inc), first in state.bounds.items():
            out.extend(self._release(state, state.buffer.advance(node, inc, first - 1)))
        for entry in state.view.values():
            out.extend(self._op_learned(state, entry))
        early, state.early = state.early, []
        for msg in early:
            out.extend(self._consider(state, msg))
        return out

    def _on_publication(self, state: _Topic, msg: PubMessage) -> list[Output]:
        out: list[Output] = [Received(state.name, msg.id, relay=not state.subscribed)]
        if not state.subscribed or msg.id.source == self.id:
            return out
        if not state.confirmed:
            state.early.append(msg)
            self._note_held()
            return out
        out.extend(self._consider(state, msg))
        return out

    def _would_hold(self, topic: str, messages: tuple[PubMessage, ...]) -> int:
        """How many of a round's publications would be held back if received now.

        Exact for the buffer as it stands (releases could only lower it), so a
        full buffer still admits the predecessors that drain it: the bound on
        held publications never blocks honest traffic.
        """
        state = self._topics.get(topic)
        if state is None or not state.subscribed:
            return 0
        if not state.confirmed:
            return len(messages)
        arriving: set[Dep] = set()
        held = 0
        for msg in messages:
            if msg.id.source == self.id:
                continue
            first = state.bounds.get((msg.id.source, msg.id.incarnation), 0)
            ready = msg.id.seq < first or all(
                d in arriving or state.buffer.satisfied(d) for d in _deps(msg)
            )
            if ready:
                arriving.add((msg.id.source, msg.id.incarnation, msg.id.seq))
            else:
                held += 1
        return held

    def _consider(self, state: _Topic, msg: PubMessage) -> list[Output]:
        """Deliver ``msg`` now, hold it back, or skip it as older than the subscription."""
        first = state.bounds.get((msg.id.source, msg.id.incarnation), 0)
        if msg.id.seq < first:
            return []  # not post-subscription: never delivered here, never waited for
        if state.buffer.add(msg, _deps(msg)):
            return self._release(state, [msg])
        self._note_held()
        return []

    def _note_held(self) -> None:
        """Keep ``pending_max`` (only called when something was just held back)."""
        held = sum(len(t.buffer) + len(t.early) for t in self._topics.values())
        self.pending_max = max(self.pending_max, held)

    def _release(self, state: _Topic, ready: list[PubMessage]) -> list[Output]:
        """Deliver ``ready`` and everything their delivery unblocks (CHECKDELIVERY)."""
        out: list[Output] = []
        work = list(ready)
        while work:
            msg = work.pop(0)
            state.barrier.delivered(msg.id, msg.deps, msg.op_deps)
            out.append(Delivered(state.name, msg.id, msg.payload))
            work.extend(state.buffer.advance(msg.id.source, msg.id.incarnation, msg.id.seq))
        return out

    # ---------------------------------------------------------------- helpers

    def _op_learned(self, state: _Topic, entry: ViewEntry) -> list[Output]:
        """Release what waited for ``entry`` (or an older op of its node)."""
        stream = op_stream(entry.node)
        ready = state.buffer.advance(stream, entry.incarnation, entry.rc)
        if entry.incarnation:
            ready.extend(state.buffer.retire_below(stream, entry.incarnation))
        return self._release(state, ready)

    def _learn(self, state: _Topic, entry: ViewEntry) -> list[Output]:
        """Record ``entry`` if it is newer than what this node knew (UPDATE, lines 81-87).

        A newly learned op of another node joins the causal barrier, so the
        next publication here is causally after it.
        """
        if not entry.newer_than(state.view.get(entry.node)):
            return []
        state.set_entry(entry)
        state.learned_at[entry.node] = self._counter
        if entry.node != self.id:
            state.barrier.learned_op(entry.op_id)
        return self._op_learned(state, entry) if state.confirmed else []

    def _new_op(self, state: _Topic, *, subscribed: bool) -> ViewEntry:
        op = ViewEntry(self.id, self.incarnation, self._next_seq(), subscribed)
        state.set_entry(op)
        state.learned_at[self.id] = op.rc
        return op

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
