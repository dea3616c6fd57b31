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


REPAIR_ROUNDS = 1 << 62
"""Round numbers from here on name repair copies (:meth:`VCubePS._repair_child`);
a source's own rounds count up from 0 and never get there."""

DEAD_BOUND = (1 << 63) - 1
"""The :class:`Bound` a SUB ACK gives for a crashed source: every publication of
it predates the subscription (the largest counter the wire carries)."""

ANY_OP = -1
"""In ``_Topic.novel``: a publication that may follow an unknown op of any node
(a publication of another stream it names never came here)."""

GAP = -2
"""In ``_Topic.novel``: the first publication received whose predecessor in its
own stream never came here (a gap: see ``VCubePS._sync_frontier``'s ``beyond``).
Another stream's publication that follows it is marked ``ANY_OP``."""

GAP2 = -3
"""In ``_Topic.novel``: the publication after the stream's second gap."""

SKIPPED_PAST = 4096
"""Skipped publications whose causal past a subscription remembers (oldest forgotten)."""

PresetView = tuple[dict[int, ViewEntry], tuple[int, ...], Hypercube]

StreamKey = int | tuple[int, int]
"""A source stream in the per-stream maps of :class:`_Topic`: the source alone for
incarnation 0, else ``(source, incarnation)``.  Every node keeps an entry per
source of a topic, so at N sources that is N^2 entries per run: an int key
costs no tuple (about 56 bytes per entry) and hashes without allocating."""


def _stream_key(source: int, incarnation: int) -> StreamKey:
    return source if incarnation == 0 else (source, incarnation)


def _stream_of(key: StreamKey) -> tuple[int, int]:
    """``(source, incarnation)`` of a :data:`StreamKey`."""
    return (key, 0) if isinstance(key, int) else key


def preset_view(subscribers: Iterable[int]) -> PresetView:
    """A directory in which every node of ``subscribers`` subscribed before time 0,
    with the hypercube of its subscribers (whose tree caches the nodes then share)."""
    subs = tuple(sorted(set(subscribers)))
    return {n: ViewEntry(n, 0, 0, True) for n in subs}, subs, Hypercube(subs)


class _Pending:
    """A round this node forwarded (or started) whose ACKs are not all back.

    ``view`` and ``bounds`` gather membership for SUB rounds only; the other
    rounds (the hot path) allocate neither.  :meth:`sent_to` gives the packet
    a child still awaited got, so a crashed child's share can be sent again
    to the next correct node of its cluster (:meth:`VCubePS.crashed`);
    ``replaced`` are children repaired away, whose ACKs may still come and
    are ignored.
    """

    __slots__ = (
        "_sent",
        "beyond",
        "bounds",
        "children",
        "dest",
        "ids",
        "kind",
        "lives",
        "parent",
        "predates",
        "relayed",
        "replaced",
        "topic",
        "view",
        "waiting",
    )

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
        self.children: list[tuple[int, Packet]] = []
        """What each child was first sent (never changed: the list the round was sent from)."""
        self.relayed: PubRound | Uns | None = None
        """For a round relayed here, the packet received instead of ``children``:
        its route gives the same child packets again (:meth:`VCubePS._relay_packets`),
        so they are not kept alive while the ACK wave is out."""
        self._sent: dict[int, Packet] | None = None
        """Made from ``children`` (or ``relayed``) at the first repair only: a
        dict per round and node costs time and memory on every hop of the hot
        path, and only a crash ever needs it (issue 21)."""
        self.lives: dict[int, int] | None = None
        """Incarnation each child was known by when it was sent the round (if not 0)."""
        self.replaced: set[int] | None = None
        self.dest = -1
        """An announce's destination (kind SYNC, this node's own round)."""
        self.view: dict[int, ViewEntry] | None = None
        self.bounds: dict[tuple[int, int], int] | None = None
        self.predates: dict[tuple[int, int], int] | None = None
        self.beyond: dict[tuple[int, int], int] | None = None
        """A SYNC's: the newcomer's frontier past its gaps (:attr:`Ack.beyond`)."""
        if kind in ("SUB", "SYNC"):  # a SYNC: the newcomer's entry and bound (VCubePS.joined)
            self.view, self.bounds, self.predates = {}, {}, {}
        if kind == "SYNC":
            self.beyond = {}

    def _packets(self, me: int) -> dict[int, Packet]:
        if self._sent is None:
            relayed = self.relayed
            sent = self.children if relayed is None else _relay_packets(me, relayed)
            self._sent = dict(sent)
        return self._sent

    def take_sent(self, me: int, child: int) -> Packet | None:
        """The packet ``child`` got, forgotten here (it is being repaired away).

        Only asked of a child still in ``waiting``, whose entry is then the
        packet it was last sent: an acknowledged child's entry may be stale
        (ACKs no longer remove it), but a child leaves ``waiting`` on its ACK
        and comes back only through :meth:`set_sent`, which replaces it.
        ``me`` is the node holding this record."""
        return self._packets(me).pop(child, None)

    def set_sent(self, me: int, child: int, packet: Packet) -> None:
        """``child`` (a repair's new child) was sent ``packet`` by ``me``."""
        self._packets(me)[child] = packet


@dataclass(frozen=True, slots=True)
class _Relay:
    """Publications of a crashed source that this node passes on (see :meth:`VCubePS.crashed`)."""

    messages: tuple[PubMessage, ...]


@dataclass(frozen=True, slots=True)
class _Announce:
    """Tell ``dest`` (which just joined) this node's subscription (see :meth:`VCubePS.joined`)."""

    dest: int


QueueItem = PubMessage | ViewEntry | _Relay | _Announce


class _Held:
    """A round's packet for ``child`` held back until ``blockers`` have been sent to it."""

    __slots__ = ("blockers", "child", "order", "packet")

    def __init__(self, child: int, packet: PubRound, blockers: set[MsgId], order: int) -> None:
        self.child = child
        self.packet = packet
        self.blockers = blockers
        self.order = order
        """Creation order: held packets for one child leave in this order."""


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
    last_rx: dict[StreamKey, int] = field(default_factory=dict)
    queue: deque[QueueItem] = field(default_factory=deque)
    in_flight: RoundId | None = None
    # The view this node's PUB round in flight was routed over: its subscribed
    # entries are the subscriptions (op node, incarnation, rc) the round went
    # to.  A round to an old life, or to an older subscription of the same
    # life, does not reach a newer subscription (see VCubePS._sync_bound).
    # Kept as the view dict itself, frozen by marking the view shared (the
    # next change copies it), rather than as a set of N ops per round: that
    # set cost O(N) time per round and O(N) memory per node (issue 21).
    round_view: dict[int, ViewEntry] = field(default_factory=dict)
    # Per subscription (reset by subscribe):
    bounds: dict[tuple[int, int], int] = field(default_factory=dict)
    # Streams below which the SUB round's sub-trees had received publications
    # before acknowledging (Ack.predates): skipped where no bound came.
    predates: dict[tuple[int, int], int] = field(default_factory=dict)
    # Streams whose bound stands in for one that will not come
    # (VCubePS._start_stream_at): a member's frontier may raise it.
    inferred: set[tuple[int, int]] = field(default_factory=set)
    # Per stream, per node, the first publication received here that may follow
    # an op of that node this node did not know when it came (ANY_OP: of any
    # node; VCubePS._note_novel): where the frontier an announce to or from
    # that node stops (VCubePS._sync_frontier).
    novel: dict[StreamKey, dict[int, int]] = field(default_factory=dict)
    # Per stream, the first publication received here (this life): a frontier's
    # ``beyond`` holds only for streams received from above it (VCubePS._frontier).
    first_rx: dict[StreamKey, int] = field(default_factory=dict)
    # Started by an oracle (preset_subscription): no marks are kept, so no
    # frontier is ever sent (an oracle's members never subscribe knowing
    # nobody, and the marks would cost every received publication).
    preset: bool = False
    # This subscription's SUB round reached nobody (it is confirmed knowing
    # nobody, or waits only for announces to subscribers it learned of since):
    # the only case that takes members' frontiers (VCubePS._frontier).
    lonely: bool = False
    buffer: CausalBuffer[PubMessage] = field(default_factory=CausalBuffer)
    early: list[PubMessage] = field(default_factory=list)

    subs_cache: tuple[int, ...] | None = None
    cube_cache: Hypercube | None = None
    # Causal aggregation (see VCubePS._hold_or_send):
    held: dict[int, dict[MsgId, _Held]] = field(default_factory=dict)
    waiting: dict[tuple[int, MsgId], list[_Held]] = field(default_factory=dict)
    # The newest round received from each source stream (the one that brought
    # its newest publication here): what this node relays if it crashes.
    last_round: dict[StreamKey, tuple[PubMessage, ...]] = field(default_factory=dict)
    # A stream of ``last_round`` whose last round arrived while this node's
    # subscription was confirmed may have been delivered from: the node owes
    # its relay at the source's crash even if it unsubscribes meanwhile
    # (agreement).  Kept as the complement, the streams of ``last_round`` not
    # owed (a subset of its keys), empty while the subscription stays
    # confirmed instead of an entry per source.
    relay_unowed: set[StreamKey] = field(default_factory=set)
    # Sources dead before this subscription was confirmed: node -> newest dead incarnation.
    retired: dict[int, int] = field(default_factory=dict)
    # Subscribers the SUB round missed, told by an announce before confirming.
    syncing: set[int] = field(default_factory=set)
    # Publications skipped here (predating the subscription, or of a source that
    # gave no bound) -> what they waited for: a publication after one of them
    # waits for that instead (see VCubePS._live_deps).  At most SKIPPED_PAST.
    skipped_past: dict[Dep, tuple[Dep, ...]] = field(default_factory=dict)

    def subscribers(self) -> tuple[int, ...]:
        """The subscribers in the view, sorted (cached until the view changes)."""
        if self.subs_cache is None:
            self.subs_cache = tuple(sorted(n for n, e in self.view.items() if e.subscribed))
        return self.subs_cache

    view_shared: bool = False

    def freeze_round_view(self) -> None:
        """A PUB round leaves over the current view: keep it as ``round_view``.

        Invariant: ``round_view`` never changes afterwards, because a shared
        view is copied before its first change (:meth:`set_entry`,
        :meth:`drop_entry`)."""
        self.round_view, self.view_shared = self.view, True

    def round_reached(self, op: MsgId) -> bool:
        """Whether the PUB round in flight (the last one sent) went to subscription ``op``."""
        entry = self.round_view.get(op.source)
        return (
            entry is not None
            and entry.subscribed
            and entry.incarnation == op.incarnation
            and entry.rc == op.seq
        )

    def set_entry(self, entry: ViewEntry) -> None:
        if self.view_shared:  # copy on first write (see preset_subscription)
            self.view, self.view_shared = dict(self.view), False
        self.view[entry.node] = entry
        self.subs_cache = self.cube_cache = None

    def drop_entry(self, node: int) -> None:
        """Forget ``node`` (it crashed): it is no longer in any tree of this topic."""
        if self.view_shared:
            self.view, self.view_shared = dict(self.view), False
        if self.view.pop(node, None) is not None:
            self.subs_cache = self.cube_cache = None
        self.learned_at.pop(node, None)

    def tree_kids(self, me: int, root: int) -> tuple[int, ...]:
        """My children in ``root``'s tree over the subscribers I know.

        The hypercube of the subscribers is built once per view (and shared by
        every node of a preset start); its caches hold O(N log N) tree hops, so
        no node keeps a structure per root."""
        cube = self.cube_cache
        if cube is None:
            cube = self.cube_cache = Hypercube(self.subscribers())
        return cube.children(me, root) if me in cube else ()


def _deps(msg: PubMessage) -> list[Dep]:
    """What ``msg`` waits for: its barrier, its ops, and the source's previous publication.

    A publication id is its own dependency triple (no allocation); the source's
    previous publication is always in the causal past but may have left the
    barrier, so it is named too to keep per-source FIFO explicit.
    """
    deps: list[Dep] = list(msg.deps)
    if msg.op_deps:
        deps.extend((op_stream(o.source), o.incarnation, o.seq) for o in msg.op_deps)
    if msg.prev >= 0:
        deps.append((msg.id.source, msg.id.incarnation, msg.prev))
    return deps


def _relay_packets(me: int, packet: PubRound | Uns) -> list[tuple[int, Packet]]:
    """What node ``me`` forwards of a received PUB or UNS round: to each child on
    its route, the packet with that child's share of the route (a pure function
    of ``me`` and ``packet``, so it can be made again for a repair)."""
    children: list[tuple[int, Packet]] = []
    for child, share in partition_sorted(me, packet.dests):
        if isinstance(packet, PubRound):
            children.append((child, PubRound(packet.round, packet.topic, packet.messages, share)))
        else:
            children.append((child, Uns(packet.round, packet.topic, packet.op, share)))
    return children


def _strictly_increasing(ids: tuple[int, ...]) -> bool:
    """Whether ``ids`` is sorted without duplicates (a route is; most have 0 or 1 id)."""
    return len(ids) < 2 or list(ids) == sorted(set(ids))


def _dead_stream(key: StreamKey, node: int, incarnation: int) -> bool:
    """Whether stream ``key`` is one of ``node``'s up to ``incarnation``."""
    source, inc = _stream_of(key)
    return source == node and inc <= incarnation


def _merge_max(
    into: dict[tuple[int, int], int], firsts: Iterable[tuple[tuple[int, int], int]]
) -> None:
    """Take ``(stream, first)`` pairs (bounds, or predates) into ``into``: per
    stream the larger first-owned wins."""
    for key, first in firsts:
        into[key] = max(into.get(key, 0), first)


def _bounds_of(bounds: Iterable[Bound]) -> Iterable[tuple[tuple[int, int], int]]:
    """The ``(stream, first)`` pairs of wire :class:`Bound` s."""
    return (((b.node, b.incarnation), b.first_owned) for b in bounds)


def _as_bounds(firsts: dict[tuple[int, int], int]) -> tuple[Bound, ...]:
    """The wire :class:`Bound` s of ``(stream, first)`` pairs (:func:`_bounds_of` reversed)."""
    return tuple(Bound(n, i, b) for (n, i), b in firsts.items())


def _held_through(state: _Topic, oldest: PubMessage, bound: int) -> bool:
    """Whether every publication of ``oldest``'s stream from it up to ``bound - 1``
    is held here: only then can the stream start at ``oldest`` below a
    newcomer's announce bound.  A gap means the held ones came another way (a
    round repaired through this node as a relay, after a restart) and the
    gap's rounds never came here: starting there would wait for them forever."""
    src, inc = oldest.id.source, oldest.id.incarnation
    seqs = {
        m.id.seq for m in state.buffer.items() if m.id.source == src and m.id.incarnation == inc
    }
    return all(s in seqs for s in range(oldest.id.seq, bound))


def _oldest_held(state: _Topic, node: int, inc: int, below: int | None = None) -> PubMessage | None:
    """The oldest publication of stream ``(node, inc)`` held here (below ``below``)."""
    held = [m for m in state.buffer.items() if m.id.source == node
            and m.id.incarnation == inc and (below is None or m.id.seq < below)]  # fmt: skip
    return min(held, key=lambda m: m.id.seq, default=None)


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
        state.predates, state.inferred = {}, set()
        state.lonely = False  # known when its SUB round starts (_round_for)
        state.buffer = CausalBuffer()
        state.buffer.advance(self.id, self.incarnation, op.rc - 1)
        state.early = []
        state.syncing = set()
        state.skipped_past = {}
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
        if not state.preset:
            self._note_own(state, msg)
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
        view, subs, cube = shared if shared is not None else preset_view(subscribers)
        state.view, state.view_shared, state.subs_cache = view, True, subs
        state.cube_cache = cube
        # learned_at stays empty: an oracle subscription was "learned" before any
        # publication, so it bounds nothing (a missing entry reports no Bound).
        state.preset = True
        if self.id in view:
            state.subscribed = state.confirmed = True
            state.bounds = {}
            self._counter = max(self._counter, 1)

    # ----------------------------------------------------------------- failures

    def crashed(self, node: int, incarnation: int, now: float) -> list[Output]:
        """``node`` (every incarnation up to ``incarnation``) crashed: repair around it.

        The failure detector delivers this fact; the driver has already given
        :meth:`set_overlay` a membership without ``node``.  Every node does:

        * forget it: it leaves every topic's view (so no later tree has it) and
          its membership ops stop being waited for;
        * relay: a subscriber passes on the last round it received from
          ``node`` over its own tree, because that round may not have reached
          everyone (a source has one round in flight per topic, so earlier
          rounds did); receivers drop what they have by id, so every
          publication of ``node`` that some correct subscriber holds reaches
          all of them (agreement);
        * repair: where ``node`` is a child this node still waits for, its
          share of the round goes to the next correct node of its cluster,
          which takes over the whole sub-cube (:meth:`_repair_child`); the ACK
          wave then completes around the crash.

        Idempotent; never raises for a node it does not know.
        """
        if node == self.id:
            raise LocalProtocolError("a node cannot declare itself crashed")
        if self._is_dead(node, incarnation):
            return []
        self._dead[node] = incarnation
        out: list[Output] = []
        for state in self._topics.values():
            out.extend(self._forget(state, node, incarnation, now))
        for rid, pending in list(self._pending.items()):
            if node in pending.waiting and self._sent_to_life(pending, node) <= incarnation:
                out.extend(self._repair_child(rid, pending, node))
        return out

    @staticmethod
    def _sent_to_life(pending: _Pending, child: int) -> int:
        """The incarnation of ``child`` this node knew when it sent the round (a
        lower bound on the one that got it: a crash of a newer one cannot be it)."""
        return pending.lives.get(child, 0) if pending.lives is not None else 0

    def joined(self, node: int, incarnation: int, now: float) -> list[Output]:
        """``node`` is up as ``incarnation``; any older incarnation of it crashed.

        A node that joins (or comes back) missed the SUB rounds flooded while
        it was not in others' overlays, and a publication that names one of
        those ops would wait for it forever there.  So each subscriber tells
        it its own subscription, in a one-destination round queued behind its
        own operations (so per-source order of ops is kept), acknowledged
        with the newcomer's entry and bound (:meth:`_synced`).
        """
        if node == self.id or incarnation < self._life.get(node, 0):
            return []
        self._life[node] = incarnation
        out = self.crashed(node, incarnation - 1, now) if incarnation > 0 else []
        for state in self._topics.values():
            if state.subscribed:
                out.extend(self._enqueue(state, _Announce(node), now))
        return out

    def _known_dead(self, node: int) -> bool:
        """Crashed, with no sign of a newer incarnation (so a packet to it is lost)."""
        return self._is_dead(node, self._life.get(node, 0))

    def _is_dead(self, node: int, incarnation: int) -> bool:
        """Whether ``incarnation`` of ``node`` is known to have crashed."""
        return incarnation <= self._dead.get(node, -1)

    def _forget(self, state: _Topic, node: int, incarnation: int, now: float) -> list[Output]:
        """Drop ``node`` from ``state``; release what waited on its ops; relay its last round."""
        entry = state.view.get(node)
        if entry is not None and entry.incarnation <= incarnation:
            state.drop_entry(node)
        out = self._release(state, state.buffer.retire_below(op_stream(node), incarnation + 1))
        if state.confirmed:
            out.extend(self._release(state, self._settle_dead_streams(state, node, incarnation)))
        out.extend(self._flush_held(state))  # holds assume blockers arrive: not any more
        gone = [k for k in state.last_round if _dead_stream(k, node, incarnation)]
        for stream in gone:
            messages = state.last_round.pop(stream)
            owed = state.subscribed or stream not in state.relay_unowed
            state.relay_unowed.discard(stream)
            if owed and any(n != self.id for n in state.subscribers()):
                self.relayed += 1
                out.extend(self._enqueue(state, _Relay(messages), now))
        return out

    def _settle_dead_streams(self, state: _Topic, node: int, incarnation: int) -> list[PubMessage]:
        """:meth:`_start_stream_at` for the unbounded streams of ``node`` (up to
        ``incarnation``, now crashed) that have publications held here."""
        incs = {m.id.incarnation for m in state.buffer.items()
                if m.id.source == node and m.id.incarnation <= incarnation}  # fmt: skip
        released: list[PubMessage] = []
        for inc in incs - {i for n, i in state.bounds if n == node}:
            oldest = _oldest_held(state, node, inc)
            if oldest is not None and oldest.prev >= 0:  # a stream's first needs no bound
                released.extend(self._start_stream_at(state, oldest))
        return released

    def _repair_child(self, rid: RoundId, pending: _Pending, dead: int) -> list[Output]:
        """Send ``dead``'s share of round ``rid`` to the next correct node of its cluster.

        The share (everything below ``dead`` in the tree) lies in one cluster
        of this node, so its XOR-closest correct member becomes the new child
        and covers the rest, exactly as the tree built without ``dead`` would.
        The copy travels as a repair round ``R'`` of this node (numbered from
        :data:`REPAIR_ROUNDS`, so it never collides with a source's rounds) whose ACK counts
        for ``dead``'s.  Receivers that had the round already drop its
        publications by id and forward it anyway: their own sub-trees may miss it.
        """
        pkt = pending.take_sent(self.id, dead)
        pending.waiting.discard(dead)
        if pkt is not None and pkt.round != rid:
            # ``dead`` held an earlier repair copy: its late ACK is now stale.
            self._repair_of.pop(pkt.round, None)
            self._retire(pkt.round)
        if pending.replaced is None:
            pending.replaced = set()
        pending.replaced.add(dead)
        out: list[Output] = []
        new = self._repair_packet(pkt, dead) if pkt is not None else None
        if new is not None:
            child, packet = new
            self._repair_of[packet.round] = rid
            pending.waiting.add(child)
            pending.set_sent(self.id, child, packet)
            self._note_lives(pending, [child])
            self.repaired += 1
            out.append(Send(child, packet))
        elif not pending.waiting:
            out.extend(self._finish(rid, pending))
        return out

    def _repair_packet(self, pkt: Packet, dead: int) -> tuple[int, Sub | PubRound | Uns] | None:
        """The repair copy of ``pkt`` (sent to ``dead``) and its new receiver, if any is left."""
        self._repairs += 1
        rid = RoundId(self.id, self.incarnation, REPAIR_ROUNDS + self._repairs)
        if isinstance(pkt, Sub):
            child = self.overlay.first_child(self.id, cluster(self.id, dead))
            return None if child is None else (child, Sub(rid, pkt.topic, pkt.op))
        if not isinstance(pkt, PubRound | Uns):
            return None
        share = [d for d in pkt.dests if not self._known_dead(d)]
        if not share:
            return None
        ((child, rest),) = partition_sorted(self.id, share)
        if isinstance(pkt, PubRound):
            return child, PubRound(rid, pkt.topic, pkt.messages, rest)
        return child, Uns(rid, pkt.topic, pkt.op, rest)

    def _retire(self, rid: RoundId) -> None:
        """Remember a repaired round, so late ACKs of repaired-away children are
        ignored rather than blamed on an honest peer (bounded memory)."""
        self._stale.add(rid)
        self._stale_order.append(rid)
        if len(self._stale_order) > self.config.max_pending_rounds:
            self._stale.discard(self._stale_order.popleft())

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
        # A topic this node holds passed the same checks when it was created
        # (_topic): encoding its name again on every packet is wasted work.
        known = isinstance(topic, str) and topic in self._topics
        if not known and (
            not isinstance(topic, str) or not topic or len(topic.encode()) > cfg.max_topic_len
        ):
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

    def _fresh(
        self, last_rx: dict[StreamKey, int], messages: tuple[PubMessage, ...]
    ) -> tuple[tuple[PubMessage, ...], int | None]:
        """The publications of a round not received before, and the stream's new last seq.

        A round carries publications of one stream (its source's, or a crashed
        source's when relayed) in increasing order; anything else is rejected.
        Those at or below what was already received from the stream are
        duplicates of a retransmission or relay, dropped by id: an honest
        stream only ever arrives again as a repeat of a prefix, because its
        rounds are sequential and a source sends a round again only in full.
        Pure: the caller records the result only once every check passed.
        """
        if not messages:
            return (), None
        source, inc = messages[0].id.source, messages[0].id.incarnation
        last = before = last_rx.get(_stream_key(source, inc), -1)
        prev = -1
        for msg in messages:
            if (msg.id.source, msg.id.incarnation) != (source, inc) or msg.id.seq <= prev:
                raise RemoteProtocolError(f"round mixes streams or is out of order at {msg.id!r}")
            prev = msg.id.seq
        last = max(last, prev)
        if messages[0].id.seq > before:
            return messages, last
        fresh = tuple(m for m in messages if m.id.seq > before)
        self.duplicates += len(messages) - len(fresh)
        return fresh, (last if fresh else None)

    def _on_sub(self, sender: int, packet: Sub) -> list[Output]:
        repair = packet.round.number >= REPAIR_ROUNDS  # a repairer's copy (see _repair_child)
        if sender == self.id or (packet.op.node != packet.round.source and not repair):
            raise RemoteProtocolError(f"malformed SUB from {sender}: {packet!r}")
        if packet.round in self._pending:
            raise RemoteProtocolError(f"round {packet.round!r} received twice")
        self._check_remote(packet.topic)
        state = self._topic(packet.topic)
        out = self._learn(state, packet.op)
        span = cluster(sender, self.id) - 1
        kids = self.overlay.children_at(self.id, span)
        pending = _Pending(packet.topic, "SUB", sender, set(kids), (packet.op.op_id,))
        out.extend(self._forward(packet.round, pending, [(k, packet) for k in kids]))
        return out

    def _on_round(
        self,
        sender: int,
        packet: PubRound | Uns,
        dests: tuple[int, ...],
        messages: tuple[PubMessage, ...],
    ) -> list[Output]:
        if sender == self.id or self.id in dests or not _strictly_increasing(dests):
            raise RemoteProtocolError(f"malformed {packet.kind} from {sender}: {packet.round!r}")
        if packet.round in self._pending:
            raise RemoteProtocolError(f"round {packet.round!r} received twice")
        if isinstance(packet, Uns) and len(packet.predates) > self.config.max_view_entries:
            raise RemoteProtocolError(f"UNS from {sender} carries too many predates")
        self._check_remote(packet.topic, messages)
        known = self._topics.get(packet.topic)
        fresh, last_rx = self._fresh(known.last_rx if known else {}, messages)
        state = known or self._topic(packet.topic)
        out: list[Output] = []
        if fresh and not state.preset:
            self._note_novel(state, fresh)
            state.first_rx.setdefault(_stream_key(fresh[0].id.source, fresh[0].id.incarnation),
                                      fresh[0].id.seq)  # fmt: skip
        if last_rx is not None:  # something new: the newest round of its stream here
            stream = _stream_key(messages[0].id.source, messages[0].id.incarnation)
            # Only then: a relay of an older round, all duplicates, must not
            # replace the newest one as what this node relays at the crash.
            state.last_round[stream] = messages
            if not state.confirmed:
                state.relay_unowed.add(stream)
            elif state.relay_unowed:
                state.relay_unowed.discard(stream)
            state.last_rx[stream] = last_rx
        new_op = False  # an announce that teaches this node the op (see _sync_ack)
        if isinstance(packet, Uns):
            new_op = packet.op.newer_than(state.view.get(packet.op.node))
            out.extend(self._learn(state, packet.op))
            if packet.predates and state.subscribed and state.lonely:
                beyond = dict(_bounds_of(packet.beyond))
                out.extend(self._frontier(state, dict(_bounds_of(packet.predates)), beyond))
        for msg in fresh:
            out.extend(self._on_publication(state, msg))
        children = _relay_packets(self.id, packet)
        pending = self._received_pending(sender, packet, children)
        if pending.kind == "SYNC" and not new_op:
            pending.predates = None  # knew this op already: no frontier (_sync_ack)
        if messages and (state.held or (self.config.aggregation and state.confirmed)):
            if not children:
                out.append(self._ack_for(packet.round, pending))
            else:
                self._track(packet.round, pending, children, packet)
            out.extend(self._aggregate(state, messages, children))
            out.extend(self._repair_known_dead(packet.round, pending))
            return out
        out.extend(self._forward(packet.round, pending, children, packet))
        return out

    @staticmethod
    def _received_pending(
        sender: int, packet: PubRound | Uns, children: list[tuple[int, Packet]]
    ) -> _Pending:
        """The record of a received round; an announce (a subscribed op in a
        one-destination UNS round, see :meth:`joined`) is a SYNC, acked with a bound."""
        waiting = {c for c, _ in children}
        if isinstance(packet, Uns) and packet.op.subscribed and not packet.dests:
            return _Pending(packet.topic, "SYNC", sender, waiting, (packet.op.op_id,))
        return _Pending(packet.topic, packet.kind, sender, waiting)

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
        coming = self._coming(state, messages[0]) if children else []
        for child, pkt in children:
            blockers = self._blockers(state, messages[0], coming, child)
            if not blockers:
                ready.setdefault(child, []).append(pkt)
                continue
            assert isinstance(pkt, PubRound)
            held = _Held(child, pkt, blockers, self.holds)
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

    def _coming(self, state: _Topic, first: PubMessage) -> list[tuple[MsgId, tuple[int, ...]]]:
        """The predecessors of ``first`` this node has not received and will (it
        owes their delivery: post-subscription, live source, not its own), each
        with this node's children in its source's tree.

        Computed once per round, not per child: a barrier can be long, and
        almost all of it has usually arrived already."""
        if not (self.config.aggregation and state.confirmed):
            return []
        me, last_rx, bounds, dead = self.id, state.last_rx, state.bounds, self._dead
        found: list[tuple[MsgId, tuple[int, ...]]] = []
        for d in first.deps:
            src, inc, seq = d
            if src == me or src in dead:
                continue
            if last_rx.get(src if inc == 0 else (src, inc), -1) >= seq:
                continue  # received already: the common case
            if bounds and seq < bounds.get((src, inc), 0):
                continue  # predates this subscription: not owed
            found.append((d, state.tree_kids(me, src)))
        return found

    def _blockers(
        self,
        state: _Topic,
        first: PubMessage,
        coming: list[tuple[MsgId, tuple[int, ...]]],
        child: int,
    ) -> set[MsgId]:
        """The predecessors of ``first`` that ``child`` waits for and this node will bring:
        those held from ``child`` already, and those of ``coming`` routed to it."""
        if not (self.config.aggregation and state.confirmed):
            return set()
        held = state.held.get(child)
        found: set[MsgId] = set()
        if held is not None:
            found.update(d for d in first.deps if d in held)
        if coming:
            found.update(d for d, kids in coming if child in kids)
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
                # A publication can be held twice for one child (a crashed
                # source's last round relayed again): forget only this hold.
                by_id = state.held.get(child, {})
                for m in held.packet.messages:
                    if by_id.get(m.id) is held:
                        del by_id[m.id]
                    work.append(m.id)
                if not by_id:
                    state.held.pop(child, None)

    def _unblock_predating(self, state: _Topic) -> list[Output]:
        """Holds whose blocker a bound learnt since shows to predate this
        subscription: that blocker never comes here (:meth:`_coming` would not
        count it now), so release what waited on it.  Without this, a
        restarted subscriber that held a round back from a child before its
        announce bound arrived kept it held for good, and the source's ACK
        wave never closed (found by the simulator's one-way property)."""
        bounds = state.bounds
        if not state.waiting or not bounds:
            return []
        ready: dict[int, list[Packet]] = {}
        stale = [
            k for k in state.waiting if k[1].seq < bounds.get((k[1].source, k[1].incarnation), 0)
        ]
        for child, d in stale:
            if (child, d) in state.waiting:  # an earlier release may have taken it
                self._resolve(state, child, d, ready)
        return [Send(c, p[0] if len(p) == 1 else Bundle(tuple(p))) for c, p in ready.items()]

    def _flush_held(self, state: _Topic) -> list[Output]:
        """Send everything held on ``state`` at once (this node stops relaying knowledge)."""
        # Every hold not released yet still waits on a blocker, including one
        # superseded in ``held`` by a later hold of the same publication.
        holds: dict[int, dict[int, _Held]] = {child: {} for child in state.held}  # send order
        for waiting in state.waiting.values():
            for h in waiting:
                holds.setdefault(h.child, {})[h.order] = h
        out: list[Output] = []
        for child, by_order in holds.items():
            pkts = [by_order[k].packet for k in sorted(by_order)]
            out.append(Send(child, pkts[0] if len(pkts) == 1 else Bundle(tuple(pkts))))
        state.held, state.waiting = {}, {}
        return out

    def _forward(
        self,
        rid: RoundId,
        pending: _Pending,
        children: list[tuple[int, Packet]],
        relayed: PubRound | Uns | None = None,
    ) -> list[Output]:
        """Send a round on to ``children``; a leaf acknowledges at once (lines 48-59)."""
        if not children:
            return [self._ack_for(rid, pending)]
        self._track(rid, pending, children, relayed)
        out: list[Output] = [Send(child, pkt) for child, pkt in children]
        out.extend(self._repair_known_dead(rid, pending))
        return out

    def _track(
        self,
        rid: RoundId,
        pending: _Pending,
        children: list[tuple[int, Packet]],
        relayed: PubRound | Uns | None = None,
    ) -> None:
        """Record ``pending``, what each child got (``children``, or the ``relayed``
        packet they were made from) and which life of it (for :meth:`_repair_child`)."""
        if relayed is None:
            pending.children = children
        else:
            pending.relayed = relayed
        if self._life:
            self._note_lives(pending, [c for c, _ in children])
        self._pending[rid] = pending

    def _note_lives(self, pending: _Pending, children: list[int]) -> None:
        for child in children:
            life = self._life.get(child, 0)
            if life:
                if pending.lives is None:
                    pending.lives = {}
                pending.lives[child] = life

    def _repair_known_dead(self, rid: RoundId, pending: _Pending) -> list[Output]:
        """Repair at once around children already known to have crashed.

        A source's tree may name a node this node heard crashed (the source
        heard later, or of a newer incarnation this node has not seen): the
        packet still goes to it, harmless if it is down, and its share goes to
        the next correct node too, so the round never waits on a dead child.
        """
        if not self._dead:
            return []
        out: list[Output] = []
        for child in [c for c in pending.waiting if self._known_dead(c)]:
            out.extend(self._repair_child(rid, pending, child))
        return out

    def _ack_for(self, rid: RoundId, pending: _Pending) -> Send:
        """The ACK this node sends its parent once its whole sub-tree has the round."""
        assert pending.parent is not None
        if pending.kind == "SYNC":
            return self._sync_ack(rid, pending)
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
        learned = state.learned_at.get(pending.ids[0].source if pending.ids else rid.source)
        if learned is not None:
            # even with nothing published: the subscriber knows it reached this
            # incarnation (see _unreached) and retires older ones (_confirm)
            bounds[(self.id, self.incarnation)] = learned
        for node, inc in self._dead.items():
            # A crashed source reports no bound, and it died before this SUB
            # round completes, so all it published predates the confirmation:
            # none of it is owed to the new subscriber.  Saying so here keeps
            # a subscriber that has not heard of the crash yet from taking
            # the missing bound for "everything is post-subscription".
            bounds[(node, inc)] = DEAD_BOUND
        predates = self._predates(state, pending.predates or {}, bounds)
        return Send(
            pending.parent,
            Ack(
                rid,
                pending.topic,
                tuple(merged.values()),
                _as_bounds(bounds),
                _as_bounds(predates),
            ),
        )

    def _predates(
        self,
        state: _Topic,
        below: dict[tuple[int, int], int],
        bounds: dict[tuple[int, int], int],
    ) -> dict[tuple[int, int], int]:
        """``below`` (the sub-tree's :attr:`Ack.predates`) with this node's own:
        per source stream, one past the newest publication received here, or
        skipped here (below this node's bound, or predating its subscription).

        Why the new subscriber needs it: one of this node's publications that
        predates the subscription is skipped there unseen, and its causal past
        (all received here before this node learnt of the subscription, this
        ACK is later) must be skipped too, or a copy of it arriving later (a
        crashed source's last round, relayed) would be delivered after what
        followed it.  A bound, where one comes, says more; it wins.  Every
        entry counts publications made before the subscription is confirmed,
        none of which is owed to it."""
        out = dict(below)
        for key, seq in state.last_rx.items():
            stream = _stream_of(key)
            out[stream] = max(out.get(stream, 0), seq + 1)
        if state.subscribed:
            for mine in (state.bounds, state.predates):
                for stream, first in mine.items():
                    if first < DEAD_BOUND:
                        out[stream] = max(out.get(stream, 0), first)
        for stream in [s for s in out if s in bounds or s[0] == self.id]:
            del out[stream]
        return out

    def _note_novel(self, state: _Topic, fresh: tuple[PubMessage, ...]) -> None:
        """Mark, per node, the first of ``fresh`` (one stream, in order) that may
        follow an op of that node this node does not know: it names one, or
        follows one marked for that node (so marks follow causal chains), or a
        publication of another stream that never came here (then for any node,
        ``ANY_OP``).  The first whose own predecessor never came here is marked
        ``GAP``."""
        src, inc = fresh[0].id.source, fresh[0].id.incarnation
        key = _stream_key(src, inc)
        marks = state.novel.get(key)
        if marks is not None and ANY_OP in marks:
            return  # everything from there on is marked already
        last = state.last_rx.get(key, -1)
        for msg in fresh:
            found = self._unknown_ops(state, msg)
            if msg.prev > last:
                found.add(GAP2 if marks and GAP in marks else GAP)
            if found:
                marks = state.novel.setdefault(key, {})
                for node in found:
                    marks.setdefault(node, msg.id.seq)
                if ANY_OP in found:
                    return
            last = msg.id.seq

    def _note_own(self, state: _Topic, msg: PubMessage) -> None:
        """:meth:`_note_novel` for this node's own publication ``msg``: it follows
        what the publications it names were marked for, so a publication of
        another source that names it is marked through it."""
        found = self._unknown_ops(state, msg)
        if found:
            marks = state.novel.setdefault(_stream_key(self.id, self.incarnation), {})
            for node in found:
                marks.setdefault(node, msg.id.seq)

    def _unknown_ops(self, state: _Topic, msg: PubMessage) -> set[int]:
        """The nodes of ops ``msg`` may follow that this node does not know
        (``ANY_OP``: a publication of another stream it names never came here,
        or came after a gap there; this node's own count as come, and
        :meth:`_note_own` marks them).  Its own stream is left to the marks
        there (:meth:`_note_novel`)."""
        src, inc = msg.id.source, msg.id.incarnation
        found: set[int] = set()
        view, me, life = state.view, self.id, self.incarnation
        for o in msg.op_deps:
            e = view.get(o.source)
            if (e is None or (e.incarnation, e.rc) < (o.incarnation, o.seq)) and o.source != me:
                found.add(o.source)
        last_rx, novel = state.last_rx, state.novel
        for d in msg.deps:
            if d.source == src and d.incarnation == inc:
                continue  # its own stream: the marks there stop a frontier already
            k = _stream_key(d.source, d.incarnation)
            if d.seq > last_rx.get(k, -1) and (d.source != me or d.incarnation != life):
                return {ANY_OP}
            marks = novel.get(k) if novel else None
            if marks:
                for n, first in marks.items():
                    if d.seq >= first:
                        found.add(n if n >= 0 else ANY_OP)  # a gap there: any op
        return found

    def _sync_frontier(
        self, state: _Topic, newcomer: int
    ) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
        """What an announce to or from ``newcomer``, or its ACK, tells it: per
        stream, one past the newest publication received here, stopped at the
        first that may follow an op of ``newcomer`` this node did not know when
        it came (:meth:`_note_novel`).

        Invariant (why none of it is owed to the newcomer): it is taken while
        this node does not know the newcomer's op (an ACK only if the
        announce taught it; an announce only if this node holds no entry of
        the newcomer's life).  A publication owed there was made by a source
        that knew the op, so it follows, through a chain of direct
        predecessors, one that names the op; at each link this node either
        lacked the predecessor or marked it, so the mark stops the frontier
        before it; a link of the source's own stream that never came here
        stops it too (a gap, ``GAP``).  This node's own publications and
        skipped ones are left out (its bound says more; what it skipped is not
        known here).

        Returns that frontier and ``beyond``: for the streams where a gap
        stopped it, where it would stop without that gap (at the next gap at
        most).  The gap cannot hold the first publication its source made
        after it learnt the op: that one went to the newcomer in a round that
        completed before the round of the publication after the gap (received
        here) started.  So if the newcomer received nothing of the stream
        below the frontier (the publication after the gap), nothing in the
        gap follows the op (:meth:`_frontier`)."""
        first: dict[tuple[int, int], int] = {}
        beyond: dict[tuple[int, int], int] = {}
        if state.preset:
            return first, beyond  # no marks kept: nothing provably not owed
        novel = state.novel
        for key, seq in state.last_rx.items():
            stream = _stream_of(key)
            if stream[0] == self.id:
                continue
            end = seq + 1
            marks = novel.get(key)
            if marks:
                end = min(end, marks.get(newcomer, end), marks.get(ANY_OP, end))
            gap = marks.get(GAP) if marks else None
            if marks and gap is not None and gap < end:
                beyond[stream] = min(end, marks.get(GAP2, end))  # past one gap only
                end = gap
            if end > 0:
                first[stream] = end
        return first, beyond

    def _sync_ack(self, rid: RoundId, pending: _Pending) -> Send:
        """ACK an announce with this node's entry and, if it published, its bound
        for the announcer (:meth:`_sync_bound`), as a SUB round's ACK would have;
        and this node's frontier if the announce taught it the op."""
        assert pending.parent is not None
        state = self._topic(pending.topic)
        bounds: tuple[Bound, ...] = ()
        if state.published:
            bound = self._sync_bound(state, pending.ids[0])
            bounds = (Bound(self.id, self.incarnation, bound),)
        # This node's own entry too: an UNS of it that started before it
        # learned of the announcer went elsewhere, and the announcer may know
        # the subscription it ends (from another node's view).
        own = state.view.get(self.id)
        view = (own,) if own else ()
        frontier: tuple[dict[tuple[int, int], int], ...] = ({}, {})
        if pending.predates is not None:  # this announce taught the op
            frontier = self._sync_frontier(state, pending.ids[0].source)
        return Send(
            pending.parent,
            Ack(
                rid,
                pending.topic,
                view,
                bounds,
                _as_bounds(frontier[0]),
                _as_bounds(frontier[1]),
            ),
        )

    def _sync_bound(self, state: _Topic, announced: MsgId) -> int:
        """The first of this node's publications not known to have reached the
        ``announced`` subscription already, all of which will: the PUB round in
        flight if it went to that very op, else the first one still queued (its
        round will go there: the announce is in the view now), else the next
        one.  Everything older was in a completed round, so if it went there it
        is there.  A round in flight to an older op of the announcer (an older
        life, or a subscription it has left since) may arrive before the
        announced one started: not owed, so not in the bound."""
        pending = self._pending.get(state.in_flight) if state.in_flight else None
        reached = state.round_reached(announced)
        if pending is not None and pending.kind == "PUB" and reached:
            return pending.ids[0].seq
        for item in state.queue:
            if isinstance(item, PubMessage):
                return item.id.seq
        return self._counter

    def _on_ack(self, sender: int, packet: Ack) -> list[Output]:
        rid = self._repair_of.get(packet.round, packet.round)
        pending = self._pending.get(rid)
        if self._stale_ack(sender, rid, pending, repair=rid != packet.round):
            return []
        if pending is None or pending.topic != packet.topic or sender not in pending.waiting:
            raise RemoteProtocolError(f"unexpected ACK from {sender} for {packet.round!r}")
        if rid != packet.round:
            del self._repair_of[packet.round]
        limit = self.config.max_view_entries
        if (
            len(packet.view) > limit
            or max(len(packet.bounds), len(packet.predates), len(packet.beyond)) > limit
        ):
            raise RemoteProtocolError(f"ACK from {sender} carries more than {limit} entries")
        if pending.view is not None:
            for entry in packet.view:
                if entry.newer_than(pending.view.get(entry.node)):
                    pending.view[entry.node] = entry
        if pending.bounds is not None:
            _merge_max(pending.bounds, _bounds_of(packet.bounds))
        if pending.predates is not None and packet.predates:
            _merge_max(pending.predates, _bounds_of(packet.predates))
        if pending.beyond is not None and packet.beyond:
            _merge_max(pending.beyond, _bounds_of(packet.beyond))
        pending.waiting.discard(sender)
        if pending.waiting:
            return []
        return self._finish(rid, pending)

    def _stale_ack(
        self, sender: int, rid: RoundId, pending: _Pending | None, *, repair: bool
    ) -> bool:
        """An honest ACK that no longer matters: one of the original round from a
        child repaired away (it was wrongly taken for crashed), or for a round
        of a repair copy itself repaired away (:meth:`_repair_child` retires
        it), or any ACK with no round here at a restarted node.  A live repair
        round's ACK counts even from the same id (a newer incarnation of the
        crashed child)."""
        if pending is not None:
            return not repair and pending.replaced is not None and sender in pending.replaced
        # A restarted node may get ACKs its previous incarnation was owed (the
        # sender has not heard of the restart): no id on an ACK tells them
        # from garbage, and dropping one changes nothing here.
        return rid in self._stale or self.incarnation > 0

    def _finish(self, rid: RoundId, pending: _Pending) -> list[Output]:
        """Every child acknowledged ``rid``: acknowledge upwards, or end the source's round."""
        del self._pending[rid]
        if pending.replaced is not None:
            self._retire(rid)
        if pending.parent is not None:
            return [self._ack_for(rid, pending)]
        return self._round_done(rid, pending)

    # ----------------------------------------------------------- source rounds

    def _enqueue(self, state: _Topic, op: QueueItem, now: float) -> list[Output]:
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
            children, pending = self._round_for(state, rid, head)
            out.extend(Send(c, p) for c, p in children)
            if children:
                state.in_flight = rid
                self._track(rid, pending, children)
            else:
                out.extend(self._complete(state, pending))
        return out

    def _round_for(
        self, state: _Topic, rid: RoundId, head: QueueItem
    ) -> tuple[list[tuple[int, Packet]], _Pending]:
        """The packets of round ``rid`` starting with ``head``, and its pending record."""
        name = state.name
        if isinstance(head, ViewEntry) and head.subscribed:
            kids = self.overlay.children_at(self.id, ID_BITS)
            state.lonely = not kids
            sub = Sub(rid, name, head)
            pend = _Pending(name, "SUB", None, set(kids), (head.op_id,))
            return [(k, sub) for k in kids], pend
        subs = state.subscribers()
        dests = partition_sorted(self.id, subs)
        kind: str
        ids: tuple[MsgId, ...]
        if isinstance(head, _Announce):
            own = state.view.get(self.id)
            if own is None:
                return [], _Pending(name, "SYNC", None, set())
            pend = _Pending(name, "SYNC", None, set(), (own.op_id,))
            pend.dest = head.dest
            if self._known_dead(head.dest):
                return [], pend  # completes at once: nobody to wait for
            pend.waiting.add(head.dest)
            known = state.view.get(head.dest)
            frontier: tuple[dict[tuple[int, int], int], ...] = ({}, {})
            if known is None or known.incarnation < self._life.get(head.dest, 0):
                frontier = self._sync_frontier(state, head.dest)  # the op is unknown here
            first, beyond = (_as_bounds(f) for f in frontier)
            return [(head.dest, Uns(rid, name, own, (), first, beyond))], pend
        children: list[tuple[int, Packet]]
        if isinstance(head, ViewEntry):
            children = [(c, Uns(rid, name, head, share)) for c, share in dests]
            kind, ids = "UNS", (head.op_id,)
        elif isinstance(head, _Relay):
            batch = head.messages
            children = [(c, PubRound(rid, name, batch, share)) for c, share in dests]
            kind, ids = "RELAY", tuple(m.id for m in batch)
        else:
            batch = self._take_batch(state, head)
            children = [(c, PubRound(rid, name, batch, share)) for c, share in dests]
            kind, ids = "PUB", tuple(m.id for m in batch)
            state.freeze_round_view()
        waiting = {c for c, _ in children}
        return children, _Pending(name, kind, None, waiting, ids)

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
        if pending.kind == "SYNC":
            return self._synced(state, pending)
        if pending.kind == "RELAY":
            return []
        out: list[Output] = [RoundAcked(state.name, pending.kind, pending.ids)]
        if pending.kind != "SUB":
            return out
        assert pending.view is not None
        assert pending.bounds is not None
        for entry in pending.view.values():
            out.extend(self._learn(state, entry))
        own = state.view.get(self.id)
        if state.subscribed and own is not None and own.op_id == pending.ids[0]:
            _merge_max(state.bounds, pending.bounds.items())
            state.predates = pending.predates or {}
            state.syncing = self._unreached(state)
            if not state.syncing:
                out.extend(self._open(state))
            for node in sorted(state.syncing, reverse=True):
                state.queue.appendleft(_Announce(node))  # next, before any later op
        return out

    def _unreached(self, state: _Topic) -> set[int]:
        """Subscribers this SUB round did not reach: every node it reached gave
        a bound, so these are up as an incarnation this node took for dead (or
        did not know) when the round started.  They could publish without ever
        sending here: each gets an announce, and confirmation waits for it."""
        return {
            n for n, e in state.view.items()
            if e.subscribed and n != self.id and (n, e.incarnation) not in state.bounds
            and not self._is_dead(n, e.incarnation)
        }  # fmt: skip

    def _open(self, state: _Topic) -> list[Output]:
        """The subscription is confirmed: deliveries may start (Subscribed)."""
        state.confirmed = True
        return [Subscribed(state.name), *self._confirm(state)]

    def _synced(self, state: _Topic, pending: _Pending) -> list[Output]:
        """The newcomer acknowledged this node's announce with its own entry
        (learned here) and ``b``, the first of its publications not known to
        have reached this node already, all of which will (:meth:`_sync_bound`).

        Used only for a stream with no bound yet (a SUB round's ACK said more).
        Everything from ``b`` on comes here.  Before ``b``, the newcomer may
        still have sent publications here under an older entry of this node in
        its view: the oldest one held starts the stream instead
        (:meth:`_start_stream_at`).  Older ones are not owed.
        """
        out: list[Output] = []
        for entry in (pending.view or {}).values():
            out.extend(self._learn(state, entry))
        own = state.view.get(self.id)
        if own is None or not own.subscribed or pending.ids != (own.op_id,):
            return out  # announced an older op: the bound says nothing of this one
        if pending.predates and state.lonely:  # also while confirmation waits for it
            out.extend(self._frontier(state, pending.predates, pending.beyond or {}))
        if not state.confirmed:
            if pending.dest not in state.syncing:
                return out  # the SUB round of this op is still to come
            return out + self._sync_before_confirm(state, pending)
        if not pending.bounds:
            return out
        ready: list[PubMessage] = []
        for (node, inc), first in pending.bounds.items():
            if (node, inc) in state.bounds:
                continue
            oldest = _oldest_held(state, node, inc, below=first)
            if oldest is not None and _held_through(state, oldest, first):
                ready.extend(self._start_stream_at(state, oldest))
            else:
                state.bounds[(node, inc)] = first
                ready.extend(state.buffer.advance(node, inc, first - 1))
        out.extend(self._release(state, ready))
        out.extend(self._unblock_predating(state))
        return out

    def _frontier(
        self,
        state: _Topic,
        predates: dict[tuple[int, int], int],
        beyond: dict[tuple[int, int], int],
    ) -> list[Output]:
        """A member's frontier (:meth:`_sync_frontier`), from the ACK of this
        node's announce or from an announce it sent here: skipped where no
        bound came, as a SUB round's ``predates``.

        What makes a subscription confirmed knowing nobody (its SUB round
        reached nobody) live: a publication owed here that names a publication
        of a source that died unseen (which never comes) no longer waits.
        Only such a subscription takes frontiers (``lonely``): it exists only
        where membership is partial, and there a publication is owed only to
        the subscribers its source knew, which it then names in its barrier;
        with full membership a publication made before its source's own SUB
        round ended names nobody yet is owed to every subscriber confirmed
        before it (found: ``tests/test_checkcli.py``'s eighty scenarios, seed
        74), and frontiers are not needed there.

        A publication the frontier covers that is held here is dropped, as
        skipped (none of it is owed): kept, it would wait for its past while
        what follows it in other streams, skipped unseen past the same cut,
        let their successors go first (found: a held relay of a dead source's
        last round, delivered after a publication that follows it).  Where
        the member's frontier stopped at a gap, ``beyond`` is taken instead if
        this node received nothing of the stream below it (see
        :meth:`_sync_frontier`)."""
        if beyond:
            predates = dict(predates)
            for stream, end in beyond.items():
                got = state.first_rx.get(_stream_key(*stream))
                if got is None or got >= predates.get(stream, end):
                    predates[stream] = max(end, predates.get(stream, 0))
        bounds, inferred = state.bounds, state.inferred
        cut = {
            stream: first for stream, first in predates.items()
            if (stream not in bounds or stream in inferred)
            and first > bounds.get(stream, state.predates.get(stream, 0))
        }  # fmt: skip
        if not cut:
            return []
        for stream, first in cut.items():
            if stream in bounds:
                bounds[stream] = first  # it stood in for a bound: the frontier says more
            else:
                state.predates[stream] = first
        dropped = state.buffer.discard(
            lambda m: m.id.seq < cut.get((m.id.source, m.id.incarnation), -1)
        )
        for msg in dropped:
            self._remember_skipped(state, msg)
        ready: list[PubMessage] = []
        for (node, inc), first in cut.items():
            ready.extend(state.buffer.advance(node, inc, first - 1))
        return self._release(state, ready)

    def _sync_before_confirm(self, state: _Topic, pending: _Pending) -> list[Output]:
        """An announce sent for :meth:`_unreached` came back: its bound counts as a
        SUB round's would; the last one confirms the subscription."""
        _merge_max(state.bounds, (pending.bounds or {}).items())
        state.syncing.discard(pending.dest)
        return [] if state.syncing else self._open(state)

    # -------------------------------------------------------- causal delivery

    def _retired_at_confirm(self, state: _Topic) -> dict[int, int]:
        """Per node, the newest incarnation whose streams predate this subscription."""
        retired = {n: i for n, i in self._dead.items() if (n, i) not in state.bounds}
        newest = dict(self._life)
        for node, inc in state.bounds:
            newest[node] = max(newest.get(node, 0), inc)
        for node, inc in newest.items():
            if inc > 0 and node != self.id:
                retired[node] = max(retired.get(node, -1), inc - 1)
        return retired

    def _confirm(self, state: _Topic) -> list[Output]:
        """Open delivery: every bound and learned op is now known (Subscribed).

        A source that crashed without giving a bound never learned of this
        subscription (or its ACK died with it, before the subscription was
        confirmed): none of its publications is post-subscription here, so
        its streams are retired rather than waited for.  So are incarnations
        older than one known to be up (in the view, or a bound): they crashed
        before this confirmation.  A bound, if one came, still wins.
        """
        out: list[Output] = []
        state.retired = self._retired_at_confirm(state)
        for (node, inc), first in state.bounds.items():
            out.extend(self._release(state, state.buffer.advance(node, inc, first - 1)))
        for (node, inc), first in state.predates.items():
            if (node, inc) not in state.bounds:
                out.extend(self._release(state, state.buffer.advance(node, inc, first - 1)))
        for entry in state.view.values():
            out.extend(self._op_learned(state, entry))
        early, state.early = state.early, []
        for msg in early:  # first, so that what depends on them, in any order, waits
            if self._skipped(state, msg):
                self._remember_skipped(state, msg)
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
            ready = self._skipped(state, msg) or all(
                d in arriving or state.buffer.satisfied(d) for d in self._live_deps(state, msg)
            )
            if ready:
                arriving.add((msg.id.source, msg.id.incarnation, msg.id.seq))
            else:
                held += 1
        return held

    def _consider(self, state: _Topic, msg: PubMessage) -> list[Output]:
        """Deliver ``msg`` now, hold it back, or skip it as older than the subscription."""
        if self._skipped(state, msg):
            self._remember_skipped(state, msg)
            return []  # not post-subscription: never delivered here, never waited for
        out: list[Output] = []
        src, inc = msg.id.source, msg.id.incarnation
        if msg.prev >= 0 and self._is_dead(src, inc) and (src, inc) not in state.bounds:
            out.extend(self._release(state, self._start_stream_at(state, msg)))
        if state.buffer.add(msg, self._live_deps(state, msg)):
            out.extend(self._release(state, [msg]))
        else:
            self._note_held()
        return out

    @staticmethod
    def _start_stream_at(state: _Topic, first: PubMessage) -> list[PubMessage]:
        """Stand in for a bound that will not come: ``first`` is the oldest
        publication of its stream held here, and its predecessor is not.

        That predecessor travelled in an earlier round of the source, which
        completed before the next one started, so had this subscription been
        among its destinations it would be here: it predates the subscription.
        So ``first`` becomes the stream's first owned publication (older ones
        are skipped) and its predecessor counts as settled.  Returns what that
        releases.  For a crashed source that gave no bound, and for a
        newcomer's stream below its announce bound (:meth:`_synced`).
        """
        stream = (first.id.source, first.id.incarnation)
        state.bounds[stream] = first.id.seq
        state.inferred.add(stream)
        return state.buffer.advance(first.id.source, first.id.incarnation, first.prev)

    @staticmethod
    def _skipped(state: _Topic, msg: PubMessage) -> bool:
        """Whether ``msg`` predates this subscription: never delivered, never waited for."""
        src, inc = msg.id.source, msg.id.incarnation
        bound = state.bounds.get((src, inc)) if state.bounds else None
        if bound is not None:
            return msg.id.seq < bound
        if state.predates and msg.id.seq < state.predates.get((src, inc), 0):
            return True
        return inc <= state.retired.get(src, -1)

    def _live_deps(self, state: _Topic, msg: PubMessage) -> list[Dep]:
        """:func:`_deps` without what can never come: ops of crashed nodes (never
        learned, nor needed) and publications of retired streams (see :meth:`_confirm`).

        A skipped publication counts as delivered, so what depends on it would
        not wait for its causal past, part of which may well be delivered here
        (published after this subscription, or by a source that gave a bound):
        so a dependency on a skipped publication seen here brings in what that
        one waited for (:meth:`_remember_skipped`), keeping causal order
        through it.
        """
        deps = _deps(msg)
        if state.skipped_past:
            past = state.skipped_past
            deps.extend(d for dep in list(deps) for d in past.get(dep, ()))
        if self._dead or self.incarnation or state.retired:  # else nothing can be gone
            deps = [d for d in deps if not self._gone(state, d)]
        return deps

    def _remember_skipped(self, state: _Topic, msg: PubMessage) -> None:
        """Note what skipped ``msg`` waited for (transitively through earlier skipped
        ones), for :meth:`_live_deps`; the oldest note goes beyond SKIPPED_PAST."""
        past = state.skipped_past
        key = (msg.id.source, msg.id.incarnation, msg.id.seq)
        if key in past:  # noted already (_confirm notes the early ones first)
            return
        # Only what is still missing: the notes stay as small as the gaps.
        deps = self._live_deps(state, msg)
        waits = dict.fromkeys(d for d in deps if not state.buffer.satisfied(d))
        past[key] = tuple(waits)
        if len(past) > SKIPPED_PAST:
            del past[next(iter(past))]

    def _gone(self, state: _Topic, dep: Dep) -> bool:
        """Whether ``dep`` names something that will never come (see :meth:`_live_deps`).

        This node's own earlier incarnations count as crashed: a restarted
        node holds nothing of its previous life.
        """
        stream, inc = dep[0], dep[1]
        node = -stream - 1 if stream < 0 else stream
        if node == self.id:
            return inc < self.incarnation
        if stream < 0:
            return self._is_dead(node, inc)
        return inc <= state.retired.get(stream, -1) and (stream, inc) not in state.bounds

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
        if not entry.newer_than(state.view.get(entry.node)) or self._is_dead(
            entry.node, entry.incarnation
        ):
            return []
        state.set_entry(entry)
        if entry.incarnation > self._life.get(entry.node, 0):
            self._life[entry.node] = entry.incarnation
        state.learned_at[entry.node] = self._counter
        if entry.node != self.id:
            state.barrier.learned_op(entry.op_id)
        return self._op_learned(state, entry) if state.confirmed else []

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
