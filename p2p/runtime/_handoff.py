"""What a node hands the application: deliveries (one by one, as runs, after
a gap), its own publications, and the ACK waves its callers wait for.

Invariant: a subscription gets its topic's deliveries in the order the
machine made them, each once, after nothing it missed went uncounted; a
full queue drops and counts, never blocks the node; a payload without the
envelope and stamp is counted and dropped (no honest member sends one).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from causal import MsgId
from p2p.machine import ENVELOPE_SIZE, Release
from p2p.runtime._delivery import _STAMP_SIZE, Subscription, _new_delivery, _unpack_stamp
from p2p.runtime._state import _NodeState
from topics import (
    Delivered,
    DeliveredRun,
    Published,
    PublishedRun,
    PubMessage,
    Received,
    RoundAcked,
)

log = logging.getLogger("p2p.node")

_HEAD = ENVELOPE_SIZE + _STAMP_SIZE
"""Bytes ahead of the application's payload: the machine's envelope, the publish stamp."""


class _HandOff(_NodeState):
    """The hand-off to the application (see the module docstring)."""

    def _hand(self, o: Delivered | DeliveredRun | Received | Release, recording: bool) -> None:
        """One of the outputs that hand publications on (or time them)."""
        if isinstance(o, Delivered):
            self._deliver(o)
        elif isinstance(o, DeliveredRun):
            self._deliver_run(o)
        elif isinstance(o, Received):
            if recording and not o.relay:
                self._received(o)
        else:
            self._released(o)

    def _settled(self) -> None:
        """The end of a batch of deliveries: what arrived and was not delivered
        in it is timed from now."""
        if self._arrived is not None:
            self._received_at[self._arrived] = self._now
            self._arrived = None

    def _hand_later(self) -> None:
        """Hand on the deliveries :meth:`_handle` kept while a frame was read:
        the frame's forwards and ACKs are written first (cut-through: an ACK
        says the sub-tree received a round; handing it to the application
        comes after, as it always came after the core delivered it)."""
        later, self._later = self._later, []
        if later:
            recording = self.recorder is not None
            for o in later:
                self._hand(o, recording)
            self._settled()

    def _on_published(self, o: Published) -> None:
        if self._trace is not None:
            self._trace("publish", o.topic, o.id.source, o.id.seq, o.id.incarnation)
        if self.recorder is not None:
            self.recorder.published(o.topic)
            self._published_at[o.id] = self._now

    def _on_published_run(self, o: PublishedRun) -> None:
        """Each publication's ``Published`` and own ``Delivered``, where anything
        traces, records or reads them: when only a subscription reads them, in
        one loop (:meth:`_queue_run`), the same deliveries as event by event."""
        sub = self._subs.get(o.topic)
        if self._trace is None and self.recorder is None:
            if sub is not None and sub.own:
                self._queue_run(sub, o.messages, True)
            return
        for e in o.expand():
            if isinstance(e, Published):
                self._on_published(e)
            else:
                self._deliver(e)

    def _on_acked(self, o: RoundAcked) -> None:
        if self._acked:  # somebody waits for the ACK wave
            for mid in o.ids:
                acked = self._acked.pop(mid, None)
                if acked is not None:
                    self.acked_views[mid] = self.core.view(o.topic)
                    if len(self.acked_views) > 1024:  # callers that never look: bounded
                        del self.acked_views[next(iter(self.acked_views))]
                    acked.set()
        if self._published_at and self.recorder is not None:
            pop = self._published_at.pop
            self.recorder.acked_since(o.topic, self._now, [pop(mid, None) for mid in o.ids])

    def _deliver(self, d: Delivered) -> None:
        """The machine delivers ``d`` (through its frontier: nothing missed before
        it): on to the application, unless its payload lacks the envelope and
        stamp (no honest member sends that)."""
        if d.own and self._trace is None:  # not traced: nothing to do unless it is read
            sub = self._subs.get(d.topic)
            if sub is None or not sub.own:
                return
        if len(d.payload) < _HEAD:
            self._malformed(d.topic, d.id)
            return
        self._hand_on(d, 0)

    def _malformed(self, topic: str, mid: MsgId) -> None:
        """A publication whose payload lacks the envelope and stamp: counted,
        logged, not delivered (no honest member sends one)."""
        self.stats["malformed_payload"] += 1
        log.error("publication %r on %r has no envelope: not delivered", mid, topic)

    def _received(self, o: Received) -> None:
        """A publication arrived (recording): timed from now, unless it is
        delivered in this batch (:meth:`_hand_on`)."""
        if self._arrived is not None:
            self._received_at[self._arrived] = self._now
        self._arrived = o.id

    def _deliver_run(self, run: DeliveredRun) -> None:
        """The machine delivers ``run`` (through its frontier, nothing missed):
        each on to the application as :meth:`_deliver` would, in one loop
        when nothing is traced or recorded, else event by event."""
        sub = self._subs.get(run.topic)
        if self._trace is not None or self.recorder is not None or sub is None:
            recording = self.recorder is not None
            for e in run.expand():
                self._hand(e, recording)
            return
        self._queue_run(sub, run.messages, False)

    def _queue_run(self, sub: Subscription, messages: Sequence[PubMessage], own: bool) -> None:
        """Queue ``messages`` for ``sub`` as :meth:`_hand_on` queues each (nothing
        traced or recorded, nothing missed): malformed ones counted, a full
        queue drops and counts, the reader woken once."""
        queue, topic, capacity = sub._queue, sub.topic, sub._capacity
        dropped = 0
        for m in messages:
            payload = m.payload
            if len(payload) < _HEAD:
                self._malformed(topic, m.id)
                continue
            if len(queue) >= capacity:
                dropped += 1
                continue
            (stamp,) = _unpack_stamp(payload, ENVELOPE_SIZE)
            source, incarnation, seq = m.id
            queue.append(
                _new_delivery(topic, source, incarnation, seq, payload[_HEAD:], own, stamp, 0)
            )
        if dropped:
            self._dropped(sub, dropped)
        if sub._parked:
            sub._parked = False
            sub._waiting.unpark_all()

    def _released(self, o: Release) -> None:
        """A delivery after a gap, one the machine held, or one recovered from
        its source's history (each checked as :meth:`_deliver` checks)."""
        if len(o.delivery.payload) < _HEAD:
            self.stats["malformed_payload"] += 1
            return
        if o.recovered:
            self.stats["recovered"] += 1
        self._hand_on(o.delivery, o.missed)

    def _hand_on(self, d: Delivered, missed: int) -> None:
        """Hand ``d`` to its subscription (after ``missed`` publications of its
        source it will not get): traced, timed, queued for the reader."""
        source, incarnation, seq = mid = d.id
        if self._trace is not None:
            self._trace("deliver", d.topic, source, seq, incarnation)
        payload = d.payload
        (stamp,) = _unpack_stamp(payload, ENVELOPE_SIZE)
        if missed:
            self._missed(d.topic, source, incarnation, missed)
        if self.recorder is not None and not d.own:
            now = self._now
            if mid == self._arrived:  # delivered in the batch it arrived in
                self._arrived = None
                held = 0.0
            else:
                got = self._received_at.pop(mid, None)
                held = 0.0 if got is None else (now - got) * 1000
            self.recorder.delivered(d.topic, (now + self._wall_offset - stamp) * 1000, held)
        sub = self._subs.get(d.topic)
        if sub is None or (d.own and not sub.own):
            return
        queue = sub._queue  # Subscription._put, inlined: once per delivery
        if len(queue) >= sub._capacity:
            self._dropped(sub, 1)
            return
        queue.append(
            _new_delivery(d.topic, source, incarnation, seq, payload[_HEAD:], d.own, stamp, missed)
        )
        if sub._parked:
            sub._parked = False
            sub._waiting.unpark_all()

    def _dropped(self, sub: Subscription, count: int) -> None:
        """``count`` deliveries for ``sub`` found its queue full: counted, logged."""
        sub.dropped += count
        # One line per topic per interval, with the count: a stalled reader
        # under load dropped (and logged) tens of thousands a second.
        self.quiet.error(
            ("undelivered", sub.topic),
            "subscription %r is not being read: deliveries dropped (%d in all)",
            sub.topic,
            sub.dropped,
        )

    def _missed(self, topic: str, source: int, incarnation: int, count: int) -> None:
        """A gap: ``count`` publications of ``source`` on ``topic`` will not reach
        this node (traced, counted, logged; the next delivery carries it)."""
        self.stats["missed"] += count
        if self._trace is not None:
            self._trace("gap", topic, source, count, incarnation)
        self.quiet.warn(
            ("missed", (topic, source)),
            "missed %d publications of %016x on %r (published while this node was away)",
            count,
            source,
            topic,
        )
