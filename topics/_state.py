"""What a :class:`~topics.VCubePS` node holds, and the pure helpers over it.

Per topic a :class:`_Topic` (the directory, the barrier, the subscription's
bounds and marks, the hold-back buffer, the source's queue of
:data:`QueueItem` s); per round awaiting ACKs a :class:`_Pending`; per round
packet held back from a child a :class:`_Held`; the constants that name
repair rounds, dead sources' bounds and the marks of ``_Topic.novel``.

Nothing here decides what to send: the functions are pure (they read a
:class:`_Topic`, never change it), and the records change only through the
classes that make up :class:`~topics.VCubePS`.  Invariant kept by
:class:`_Topic`: a view shared with ``round_view`` or with other nodes (a
preset) is copied before its first change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from causal import CausalBarrier, CausalBuffer, Dep, MsgId
from topics._messages import Bound, Fence, Packet, PubMessage, PubRound, RoundId, Uns, ViewEntry
from vcube import Hypercube, partition_sorted
from vcube._hot import hot

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

GAP_FROM = -4
"""In ``_Topic.novel``: the first sequence number the stream's first gap may
hold (one past the newest publication received before it; 0 if the stream
was first received past its start).  A publication of another stream that
names one from there on names one that never came here (in the gap), or
follows the gap: it is marked ``ANY_OP``."""

FENCE_LATER = 256
"""FENCE packets a topic keeps for streams not known crashed yet (the oldest
stream's go beyond it): a member hears of a crash a detection delay after
the coordinator may have."""

DEAD_ROUNDS = 64
"""Crashed sources' last rounds a topic keeps for subscribers their relay
missed (the oldest is forgotten beyond it)."""

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


@hot
class _Relay:
    """Publications of a crashed source that this node passes on (see
    :meth:`VCubePS.crashed`): to every subscriber, or to ``dest`` alone (a
    subscriber the crash relay missed, :meth:`VCubePS._dead_rounds_ahead`)."""

    messages: tuple[PubMessage, ...]
    dest: int | None = None


class _DeadRound:
    """A crashed source's last round as this node received it, the
    subscriptions (node, incarnation) known to have it (:meth:`VCubePS._dead_rounds_ahead`),
    and whether this node relayed it at the crash (it was owed here)."""

    __slots__ = ("ids", "messages", "reached", "relayed")

    def __init__(
        self, messages: tuple[PubMessage, ...], reached: set[tuple[int, int]], relayed: bool
    ) -> None:
        self.messages = messages
        self.ids = frozenset(m.id for m in messages)
        self.reached = reached
        self.relayed = relayed

    def reach(self, life: tuple[int, int]) -> bool:
        """Mark the subscription ``life`` (node, incarnation) as having this
        round; ``True`` if it was not known to (the caller relays it then)."""
        if life in self.reached:
            return False
        self.reached.add(life)
        return True


class _Fenced:
    """This node's part in the agreement on a crashed stream (``topics._fence``):
    the answer it gave (it delivers nothing of the stream above it until a
    decision; later copies wait in ``stash``), the decision once known with
    the publications that came with it (what it answers a later poll), and
    the coordinator it expects that decision from."""

    __slots__ = ("content", "coordinator", "decided", "frozen", "marks", "others", "stash")

    def __init__(self, frozen: int, coordinator: int) -> None:
        self.frozen = frozen
        self.decided: int | None = None
        self.content: tuple[PubMessage, ...] = ()
        self.others: tuple[PubMessage, ...] = ()
        self.marks: tuple[MsgId, ...] = ()
        self.stash: dict[int, PubMessage] = {}
        self.coordinator = coordinator


class _Poll:
    """A coordinator's poll on a crashed stream: the members (node -> life
    asked) that have not answered, the best answer so far with its
    publications, a decision a member reported (which wins), everyone asked,
    and whether it gave way to a coordinator with a lower id (``deferred``:
    it decides nothing, and passes that one's decision on to ``asked``)."""

    __slots__ = (
        "asked",
        "askers",
        "best",
        "content",
        "decided",
        "deferred",
        "marks",
        "others",
        "waiting",
    )

    def __init__(self, waiting: dict[int, int]) -> None:
        self.waiting = waiting
        self.asked = tuple(sorted(waiting))
        self.best = -1
        self.content: tuple[PubMessage, ...] = ()
        self.decided: int | None = None
        self.deferred = False
        self.others: dict[MsgId, PubMessage] = {}
        """Publications of other crashed sources the members hold (Fence.others)."""
        self.marks: dict[tuple[int, int], int] = {}
        """How far each member's own stream had come when it answered (Fence.marks)."""
        self.askers: set[int] = set()
        """Nodes that asked while it ran: each gets the decision too."""


@hot
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
    # A lonely subscription that skipped publications it never received
    # (``blind``: under a bound, a frontier, or a bound it stood in for)
    # delivers from then on only publications that causally follow its own op
    # (VCubePS._follows_op).  ``follows``: per stream, the first delivered
    # here that does (later ones of the stream do too).  Reset by each
    # subscribe, which enters the node's own stream from its op (``sub_rc``) on.
    blind: bool = False
    # Per stream, the oldest publication this subscription took (delivered,
    # held or skipped): what a dependency must be at or above to count as seen.
    seen: dict[StreamKey, int] = field(default_factory=dict)
    follows: dict[StreamKey, int] = field(default_factory=dict)
    sub_rc: int = -1
    buffer: CausalBuffer[PubMessage] = field(default_factory=CausalBuffer)
    early: list[PubMessage] = field(default_factory=list)

    subs_cache: tuple[int, ...] | None = None
    cube_cache: Hypercube | None = None
    # Causal aggregation (see topics._aggregation, _Aggregation._aggregate):
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
    # The last round received from each crashed source stream, relayed at the
    # crash, kept for subscribers that round did not reach (at most DEAD_ROUNDS;
    # VCubePS._dead_rounds_ahead).
    dead_rounds: dict[StreamKey, _DeadRound] = field(default_factory=dict)
    # Sources dead before this subscription was confirmed: node -> newest dead incarnation.
    retired: dict[int, int] = field(default_factory=dict)
    # Crashed streams under agreement (topics._fence): this node's answer and
    # decision, the polls it coordinates, and the coordinator it asked.
    fences: dict[StreamKey, _Fenced] = field(default_factory=dict)
    polls: dict[StreamKey, _Poll] = field(default_factory=dict)
    fence_asked: dict[StreamKey, int] = field(default_factory=dict)
    # FENCE packets about a stream whose source is not known here to have
    # crashed (yet): stream -> sender -> packet, at most FENCE_LATER in all.
    fence_later: dict[StreamKey, dict[int, Fence]] = field(default_factory=dict)
    # Publications held behind what may precede a publication they name that
    # is never delivered here (VCubePS._fence_release, _behind_lost): id ->
    # (what it waits for of its own, those extra waits).  Others held that way
    # later do not wait on them, nor on what waits on them through these, and
    # an extra wait seen to follow its holder is dropped (no circle).
    fence_held: dict[MsgId, tuple[tuple[Dep, ...], tuple[Dep, ...]]] = field(default_factory=dict)
    # Publications kept until live members' streams came here up to their marks
    # in a fence decision (VCubePS._fence_release, _await_marks): id ->
    # (publication, the stream whose decision released it, or None).
    marked: dict[MsgId, tuple[PubMessage, StreamKey | None]] = field(default_factory=dict)
    # Publications naming one of a crashed stream whose past is unknown here,
    # kept until a fence decision on that stream (VCubePS._await_marks):
    # stream -> id -> publication.
    awaiting: dict[StreamKey, dict[MsgId, PubMessage]] = field(default_factory=dict)
    # Some bound is a crashed source's DEAD_BOUND: said by others, not by the
    # source, so what it skips may follow publications owed here.
    lossy_bounds: bool = False
    # Subscribers the SUB round missed, told by an announce before confirming.
    syncing: set[int] = field(default_factory=set)
    # Sources this confirmed subscription announced itself to for want of a
    # bound (VCubePS._ask_bound): once each per subscription.
    asked: set[int] = field(default_factory=set)
    # Publications skipped here (predating the subscription, or of a source that
    # gave no bound) -> what they waited for: a publication after one of them
    # waits for that instead (see VCubePS._live_deps).  At most SKIPPED_PAST.
    skipped_past: dict[Dep, tuple[Dep, ...]] = field(default_factory=dict)
    # Per stream, held publications below an announce bound that do not reach
    # it in one run: seq -> how far the stream's frontier goes once that one
    # is settled here (VCubePS._bridge_held).  Only entries for held ones.
    bridges: dict[StreamKey, dict[int, int]] = field(default_factory=dict)

    def kept(self) -> int:
        """Publications received here and neither delivered nor skipped yet:
        the buffer, what came before the confirmation, and what waits for a
        fence decision or for marks (``topics._fence``), each once: one waiting
        for decisions on two streams sits in two of ``awaiting``'s dicts (and
        in no other of these).  What ``max_held`` bounds."""
        count = len(self.buffer) + len(self.early)
        if self.marked:
            count += len(self.marked)
        if self.awaiting:
            waiting = self.awaiting.values()
            if len(self.awaiting) == 1:
                count += sum(map(len, waiting))
            else:
                ids: set[MsgId] = set()
                ids.update(*waiting)
                count += len(ids)
        return count

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

    def op_joins(self, ops: tuple[MsgId, ...]) -> int:
        """``PubMessage.op_joins`` for ``ops`` (this barrier's): the bits of those
        that are subscriptions.  The barrier keeps each node's newest op, which
        is its view entry; a node dropped from the view (it crashed) counts as
        unsubscribed, which is what its op means to anyone who learns it now."""
        view, bits = self.view, 0
        for i, op in enumerate(ops):
            entry = view.get(op.source)
            if entry is not None and entry.subscribed and entry.op_id == op:
                bits |= 1 << i
        return bits

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


def _kept_items(state: _Topic) -> list[PubMessage]:
    """Every publication received here (confirmed) and neither delivered nor
    skipped yet: the buffer's, and those a fence keeps for a decision or for
    marks (``awaiting``, ``marked``; ``topics._fence``), each once.

    What "held here" means to a bound or a cut: one kept by the fence came
    as surely as one in the buffer (failure_fuzz partial seed 2203593: an
    announce bound took node 0's (0, 1), kept for a decision on crashed
    node 2's stream, for one that never came, and skipped it)."""
    held = state.buffer.items()
    if not (state.marked or state.awaiting):
        return held
    kept = {m.id: m for m in held}
    for m, _ in state.marked.values():
        kept.setdefault(m.id, m)
    for waiting in state.awaiting.values():
        for m in waiting.values():
            kept.setdefault(m.id, m)
    return list(kept.values())


def _held_below(state: _Topic, node: int, inc: int, below: int) -> list[PubMessage]:
    """The publications of stream ``(node, inc)`` held here below ``below``
    (:func:`_kept_items`), oldest first."""
    held = [m for m in _kept_items(state) if m.id.source == node
            and m.id.incarnation == inc and m.id.seq < below]  # fmt: skip
    held.sort(key=lambda m: m.id.seq)
    return held


def _held_through(held: list[PubMessage], bound: int) -> bool:
    """Whether ``held`` (:func:`_held_below` ``bound``, not empty) is every
    publication of its stream from the oldest of them up to ``bound - 1``:
    only then can the stream start there below a newcomer's announce bound.
    A gap means the held ones came another way (a round repaired through
    this node as a relay, after a restart) and the gap's rounds never came
    here: starting there would wait for them forever."""
    seqs = {m.id.seq for m in held}
    return all(s in seqs for s in range(held[0].id.seq, bound))


def _oldest_held(state: _Topic, node: int, inc: int, below: int | None = None) -> PubMessage | None:
    """The oldest publication of stream ``(node, inc)`` held here (below
    ``below``; :func:`_kept_items`)."""
    held = [m for m in _kept_items(state) if m.id.source == node
            and m.id.incarnation == inc and (below is None or m.id.seq < below)]  # fmt: skip
    return min(held, key=lambda m: m.id.seq, default=None)
