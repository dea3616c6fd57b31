"""Causal aggregation without timers (DESIGN.md §4): a relay holds a round's
packet back from a child that could not deliver it yet, and sends it along
with what it waited for.

Invariants: a packet is held from a child only while one of its blockers is
a publication this node's own delivery waits for (so it arrives) or one held
from the same child; held packets for one child leave in the order they were
held.  Safety never depends on holding (causal delivery is the receiver's),
so :meth:`_Aggregation._flush_held` may release everything at once.
"""

from __future__ import annotations

from causal import MsgId
from topics._delivery import _predates
from topics._events import Held, Output, Send
from topics._messages import Bundle, Packet, PubMessage, PubRound
from topics._runs import _Runs
from topics._state import _Held, _Topic


def _all_delivered(state: _Topic, first: PubMessage) -> bool:
    """Whether every predecessor of ``first`` is known delivered here (or is this
    node's own publication): then none is still coming.

    The buffer's met set holds ids delivered here and ids its frontier showed
    satisfied (:meth:`~causal.CausalBuffer.known_met`).  A publication
    stream's frontier passes an id without delivering it only through a
    bound or a predates mark (``_confirm``, ``_start_stream_at``, announces),
    which this subscription's ``bounds`` and ``predates`` keep for as long as
    its buffer lives; while both are empty, the frontier moves by delivery
    alone and per-source FIFO, so a met id was delivered, hence received.
    Otherwise the answer is ``False`` and the caller checks id by id."""
    if state.bounds or state.predates:
        return False
    return state.buffer.known_met(first.dep_lookup())


class _Aggregation(_Runs):
    """Hold-back of round packets per child (see the module docstring)."""

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
        coming = self._coming(state, messages[0]) if children else []
        if not (coming or state.held):
            # Nothing held here, nothing coming: no child has a blocker and no
            # hold waits on this round (the common case, without the per-child work).
            return [Send(child, pkt) for child, pkt in children]
        out: list[Output] = []
        ready: dict[int, list[Packet]] = {}
        held_now: set[int] = set()
        ids = tuple(m.id for m in messages)
        for child, pkt in children:
            # Without holds for the child and nothing coming, _blockers finds none.
            if not (coming or child in state.held):
                ready.setdefault(child, []).append(pkt)
                continue
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
        if _all_delivered(state, first):
            return []  # the common case, in one set test instead of a loop over the barrier
        me, received, bounds, dead = self.id, state.last_rx.get, state.bounds, self._dead
        # Without bounds or predates marks, a met id is not coming, as in
        # _all_delivered: look only at the others (a few of a long barrier).
        deps = first.deps if bounds or state.predates else state.buffer.unmet(first.dep_lookup())
        found: list[tuple[MsgId, tuple[int, ...]]] = []
        for d in deps:
            src, inc, seq = d
            if received(src if inc == 0 else (src, inc), -1) >= seq:
                continue  # received already: the common case, so tested first
            if src == me or src in dead:
                continue
            if (bounds or state.predates) and _predates(state, src, inc, seq):
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
            deps = first.dep_lookup()
            if isinstance(deps, frozenset):
                found.update(deps.intersection(held))  # C-level, no id hashed again
            else:
                found.update(d for d in deps if d in held)
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
        """Holds whose blocker a bound (or ``predates``) learnt since shows to
        predate this subscription: it never comes here (:meth:`_coming` would not
        count it now), so release what waited on it.  Without this, a
        restarted subscriber that held a round back from a child before its
        announce bound arrived kept it held for good, and the source's ACK
        wave never closed (found by the simulator's one-way property)."""
        if not state.waiting or not (state.bounds or state.predates):
            return []
        ready: dict[int, list[Packet]] = {}
        stale = [k for k in state.waiting if _predates(state, *k[1])]
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
