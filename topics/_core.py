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

The node is built in layers, a module each, every one adding behaviour to the
state :class:`~topics._base._CoreBase` declares (the records it holds are in
:mod:`~topics._state`): :mod:`~topics._delivery` (causal delivery),
:mod:`~topics._aggregation` (holding round packets back per child),
:mod:`~topics._announce` (announces to newcomers, frontiers),
:mod:`~topics._rounds` (a source's rounds, forwarding, ACK waves),
:mod:`~topics._repair` (crashes and joins), :mod:`~topics._fence`
(agreement on where a crashed stream ends), :mod:`~topics._receive`
(packets from peers), and here the application API.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from causal import CausalBuffer, MsgId
from topics._errors import AlreadySubscribedError, LocalProtocolError, NotSubscribedError
from topics._events import Delivered, Dropped, Output, Published, PublishedRun
from topics._messages import PubMessage, ViewEntry
from topics._receive import _Receive
from topics._state import PresetView, _stream_key, _stream_of, _Topic, preset_view


class VCubePS(_Receive):
    """One VCube-PS node: topic membership, publication trees, causal delivery.

    ``overlay`` is the VCube of correct overlay nodes (the all-node tree of SUB
    rounds); replace it with :meth:`set_overlay` when membership changes.
    ``rng`` is accepted for symmetry with the other cores; the protocol itself
    makes no random choice.
    """

    def subscribe(self, topic: str, now: float) -> list[Output]:
        """Algorithm 3 ``Subscribe``: join ``topic``; :class:`Subscribed` follows later."""
        state = self._topic(topic)
        if state.subscribed:
            raise AlreadySubscribedError(f"node {self.id} is already subscribed to {topic!r}")
        op = self._new_op(state, subscribed=True)
        state.subscribed, state.confirmed = True, False
        # A fresh subscription owns nothing published before it, its own included.
        state.bounds = {(self.id, self.incarnation): op.rc}
        # What came here before (as a relay, or to an earlier subscription)
        # predates this one, and will not come again (dropped as duplicates).
        state.predates = {_stream_of(k): seq + 1 for k, seq in state.last_rx.items()}
        state.inferred = set()
        state.lonely = False  # known when its SUB round starts (_round_for)
        state.sub_rc, state.blind, state.seen = op.rc, False, {}
        state.follows = {_stream_key(self.id, self.incarnation): op.rc}
        state.buffer = CausalBuffer()
        state.buffer.advance(self.id, self.incarnation, op.rc - 1)
        state.early = []
        state.syncing, state.asked = set(), set()
        state.bridges = {}
        state.skipped_past = {}
        state.marked, state.awaiting = {}, {}
        return self._enqueue(state, op)

    def unsubscribe(self, topic: str, now: float) -> list[Output]:
        """Algorithm 3 ``Unsubscribe``: stop delivering at once, tell the subscribers."""
        state = self._topics.get(topic)
        if state is None or not state.subscribed:
            raise NotSubscribedError(f"node {self.id} is not subscribed to {topic!r}")
        op = self._new_op(state, subscribed=False)
        state.subscribed = state.confirmed = False
        out: list[Output] = []
        held = state.kept()
        if held:
            out.append(Dropped(topic, held, "unsubscribed before their predecessors arrived"))
        state.buffer, state.early, state.marked, state.awaiting = CausalBuffer(), [], {}, {}
        out.extend(self._flush_held(state))
        out.extend(self._enqueue(state, op))
        return out

    def recovered(self, topic: str, mid: MsgId) -> list[Output]:
        """The application got publication ``mid`` on ``topic`` from outside this
        core (its source's history, ``p2p.machine._recovery``): it counts as
        delivered here.  So this node's later publications follow it (their
        barrier names it), and what waits for it here goes on (returned);
        a copy that arrives later is not delivered again.  Ignored unless
        subscribed, or if this core has delivered it already."""
        state = self._topics.get(topic)
        if state is None or not state.subscribed or state.buffer.satisfied(mid):
            return []
        state.barrier.delivered(mid, (), ())
        return self._release(state, state.buffer.deliver(mid))

    def unsettled(self, topic: str, node: int, incarnation: int) -> tuple[int, bool] | None:
        """This incarnation's publications on ``topic`` whose rounds have not
        completed (queued, or in the round in flight): the lowest sequence
        number among them, and whether every one of them is owed to ``node``'s
        subscription as ``incarnation`` by its round (its round's view holds
        that subscription, and it was published after this node learnt it:
        an earlier one is below the subscriber's bound and skipped there).
        ``None``: every round completed (a pure query)."""
        state = self._topics.get(topic)
        if state is None:
            return None
        queued = [m.id.seq for m in state.queue if type(m) is PubMessage]
        rid = state.in_flight
        pending = None if rid is None else self._pending.get(rid)
        me = self.id, self.incarnation
        flying = (
            []
            if pending is None
            else [i.seq for i in pending.ids if (i.source, i.incarnation) == me]
        )
        if not queued and not flying:
            return None
        owed_from = state.learned_at.get(node)
        owed = (
            owed_from is not None
            and _holds(state.view, node, incarnation)
            and (not flying or _holds(state.round_view, node, incarnation))
            and min(queued + flying) >= owed_from
        )
        return min(queued + flying), owed

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
        return self._publish(state, topic, payload)

    def publish_many(
        self, topic: str, payloads: Sequence[bytes], now: float
    ) -> list[Output] | None:
        """:meth:`publish` for each of ``payloads``, in order, in one call: the
        same state, and the same outputs but that each publication's
        ``Published`` and own ``Delivered`` come as one :class:`PublishedRun`
        ahead of the rest.  ``None``, with nothing done, unless every one
        would be accepted and none lets a held publication go (then the
        caller publishes them one by one)."""
        state = self._topics.get(topic)
        limit = self.config.max_payload
        if (
            state is None
            or not state.subscribed
            or len(state.queue) + len(payloads) > self.config.max_queued_ops
            or max(map(len, payloads), default=0) > limit
            or state.buffer.waited_on(self.id, self.incarnation)
        ):
            return None
        msgs: list[PubMessage] = []
        rest: list[Output] = []
        me, life, advance = self.id, self.incarnation, state.buffer.advance
        for i, payload in enumerate(payloads):
            if i and state.in_flight is not None:  # the rest only queue: a chain
                msgs += self._chain(state, payloads[i:])
                break
            msg = self._take(state, payload)
            msgs.append(msg)
            advance(me, life, msg.id.seq)  # releases nothing: nothing waits on the stream
            rest += self._queue_publication(state, msg)
        return [PublishedRun(topic, tuple(msgs)), *rest]

    def _chain(self, state: _Topic, payloads: Sequence[bytes]) -> list[PubMessage]:
        """:meth:`_take` and :meth:`_queue_publication` for each of ``payloads``
        behind the round in flight, in one pass: each names only the one
        before it (the barrier of a publication right after another is that
        one, and no op), so none is marked (:meth:`_note_own`), and the
        stream's frontier moves once (nothing waits on it)."""
        me, life, seq = self.id, self.incarnation, self._counter
        before = MsgId(me, life, state.last_pub)
        new, queue, out = tuple.__new__, state.queue, []
        for payload in payloads:
            mid = new(MsgId, (me, life, seq))
            msg = PubMessage(mid, bytes(payload), (before,), (), before[2], 0)
            out.append(msg)
            queue.append(msg)
            before, seq = mid, seq + 1
        self._counter = seq
        state.barrier.published(before)
        state.last_pub = before[2]
        state.buffer.advance(me, life, before[2])
        return out

    def _publish(self, state: _Topic, topic: str, payload: bytes) -> list[Output]:
        """:meth:`publish` once its checks passed."""
        msg = self._take(state, payload)
        mid = msg.id
        out: list[Output] = [Published(topic, mid), Delivered(topic, mid, msg.payload, own=True)]
        released = state.buffer.advance(self.id, self.incarnation, mid.seq)
        if released:
            out += self._release(state, released)
        out += self._queue_publication(state, msg)
        return out

    def _take(self, state: _Topic, payload: bytes) -> PubMessage:
        """The next publication of this node on ``state``'s topic, with its barrier."""
        mid = MsgId(self.id, self.incarnation, self._next_seq())
        pubs, ops = state.barrier.publish(mid)
        joins = state.op_joins(ops) if ops else 0
        msg = PubMessage(mid, bytes(payload), pubs, ops, state.last_pub, joins)
        state.published, state.last_pub = True, mid.seq
        if not state.preset and (ops or len(pubs) != 1 or pubs[0][0:2] != mid[0:2]):
            self._note_own(state, msg)  # else it names only its own stream: nothing to mark
        return msg

    def _queue_publication(self, state: _Topic, msg: PubMessage) -> list[Output]:
        """Queue ``msg`` for the topic's next round, started now if none is in flight."""
        if state.in_flight is None:
            return self._enqueue(state, msg)
        state.queue.append(msg)  # _enqueue's case while a round is in flight
        return []

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


def _holds(view: dict[int, ViewEntry], node: int, incarnation: int) -> bool:
    """Whether ``view`` holds ``node``'s subscription as ``incarnation``."""
    entry = view.get(node)
    return entry is not None and entry.subscribed and entry.incarnation == incarnation
