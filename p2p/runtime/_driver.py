"""The driver of the sans-IO :class:`~p2p.machine.NodeMachine`: it carries out
the machine's and the core's outputs and feeds it timers, control packets,
revocations and hints.

:meth:`_Driver._handle` is the one place outputs are carried out: packets go
to links, deliveries to subscriptions (the hand-off), membership changes to
links and watchers.  Invariants: outputs are carried out synchronously and in
order (the machine stays single-threaded); a packet for a node the core
treats as crashed is counted, never queued; a peer that leaves the view has
its link dropped and what it held counted as lost; a revoked node is dropped
at once and the list goes on to this node's VCube neighbours.
"""

from __future__ import annotations

import logging
from collections import deque

import trio

from causal import MsgId
from p2p._errors import IdentityError, IdentityInUseError, SecurityError
from p2p._membership import records_digest
from p2p._revocation import RevocationList, load_revocations
from p2p.machine import (
    ENVELOPE_SIZE,
    MemberDown,
    MemberUp,
    Reincarnated,
    Release,
    RoundStarted,
    SendControl,
    SendExchange,
    Stalled,
    Superseded,
    SuspicionCorrected,
)
from p2p.runtime._delivery import _STAMP_SIZE, MembershipEvent, _new_delivery, _unpack_stamp
from p2p.runtime._link import _NOT_CORE, _Link, _why
from p2p.runtime._state import _NodeState
from p2p.wire import (
    Control,
    Leave,
    Members,
    Replay,
    Resume,
    Revoked,
    WireError,
    encode_packets,
    frame,
)
from topics import (
    Bundle,
    Delivered,
    Dropped,
    Output,
    Published,
    Received,
    RoundAcked,
    Send,
    Subscribed,
)

log = logging.getLogger("p2p.node")


class _Driver(_NodeState):
    """Carries out outputs and feeds the machine (see the module docstring)."""

    # -------------------------------------------------------------- plumbing

    def _drop_link(self, node: int) -> None:
        """Stop dialling ``node``; what its outbox held is counted as lost."""
        link = self._links.pop(node, None)
        if link is not None:
            self.stats["lost_to_crash"] += link.core_packets()
            link.log.discard()
            link.scope.cancel()

    def _membership_changed(self, event: MembershipEvent) -> None:
        log.info(
            "%s %016x (%s; %d members)", event.kind, event.node, event.reason, len(self._alive) + 1
        )
        for w in list(self._watchers):
            try:
                w.send_nowait(event)
            except trio.WouldBlock:
                log.error("membership watcher too slow: dropped %s", event)

    def _handle(self, outputs: list[Output], now: float | None = None) -> None:
        """Carry out a core's outputs (synchronously: the core stays single-threaded).

        Dispatched on the exact type, the per-publication outputs first (a
        received round yields two per publication); anything else, a subclass
        included, goes through :meth:`_handle_other`.
        """
        recording = self.recorder is not None
        if recording:  # one clock read per batch (``now``, if the caller has one)
            self._now = trio.current_time() if now is None else now
        for o in outputs:
            if type(o) is Delivered:
                self._deliver(o)
            elif type(o) is Received:
                if recording and not o.relay:  # _on_received, inlined: hot path
                    if self._arrived is not None:
                        self._received_at[self._arrived] = self._now
                    self._arrived = o.id
            elif type(o) is Published:
                self._on_published(o)
            elif type(o) is Send:
                self._send(o)
            else:
                self._handle_other(o)
        if self._arrived is not None:  # held back past its batch: timed from now
            self._received_at[self._arrived] = self._now
            self._arrived = None
        if self.machine.pending:  # what the deliveries asked for (a RESUME)
            pending, self.machine.pending = self.machine.pending, []
            self._handle(pending, now)
            return
        if self._eager and not self._stepping:
            self._write_eager()
        if self._frontier_store is not None:  # once per batch: the check is inside
            self._write_frontier()

    def _write_frontier(self) -> None:
        """Write the frontier after the deliveries that moved it (one ``pwrite``,
        no fsync: a killed process loses nothing written; ``_keep_frontier``
        makes it durable).  A failure is logged, never raised."""
        store = self._frontier_store
        frontier = self.machine.frontier
        if store is None or frontier.changes == self._frontier_saved:
            return
        try:
            store.write(frontier.frontiers())
        except OSError as exc:
            self.quiet.error(("frontier", None), "cannot keep the frontier: %s", exc)
            return
        self._frontier_saved = frontier.changes

    def _write_eager(self) -> None:
        """Write what this step queued on idle connections, without waiting for
        their writer tasks (``_Link.write_now``)."""
        eager, self._eager = self._eager, set()
        for link in eager:
            link.write_now()

    def _on_received(self, mid: MsgId) -> None:
        """Note ``mid``'s arrival; the previous one, still undelivered, is held back."""
        if self._arrived is not None:
            self._received_at[self._arrived] = self._now
        self._arrived = mid

    def _handle_other(self, o: Output) -> None:
        if isinstance(o, Send):
            self._send(o)
        elif isinstance(o, Delivered):
            self._deliver(o)
        elif isinstance(o, Subscribed):
            self._trace_event("subscribed", o.topic, None, None)
            ev = self._subscribed.pop(o.topic, None)
            if ev is not None:
                ev.set()
        elif isinstance(o, RoundAcked):
            self._on_acked(o)
        elif isinstance(o, Received):
            if self.recorder is not None and not o.relay:
                self._on_received(o.id)
        elif isinstance(o, Published):
            self._on_published(o)
        elif isinstance(o, Dropped):
            log.warning("%d publications on %r dropped: %s", o.count, o.topic, o.reason)
        else:
            self._on_machine(o)

    def _on_machine(self, o: object) -> None:
        """Carry out one of the machine's membership outputs (``p2p.machine``)."""
        if isinstance(o, SendControl):
            if isinstance(o.msg, Resume):
                self.stats["resumes"] += 1
                log.info("asking %016x for what it published on %r after ordinal %d",
                         o.dest, o.msg.topic, o.msg.ordinal)  # fmt: skip
            self._link(o.dest).put_control(o.msg)
        elif isinstance(o, SendExchange):
            self._link(o.dest).put_exchange(list(o.records), reply=o.reply)
        elif isinstance(o, MemberUp):
            self._new_life(o.node, o.incarnation)
            self._membership_changed(MembershipEvent("joined", o.node, o.incarnation, o.reason))
        elif isinstance(o, MemberDown):
            self._member_down(o)
        elif isinstance(o, SuspicionCorrected):
            self.stats["corrections"] += 1
            log.info("%016x answers again; waiting for its new incarnation", o.node)
        elif isinstance(o, RoundStarted):
            self._follow_revocation_file(trio.current_time())
        elif isinstance(o, Release):
            self._released(o)
        elif isinstance(o, Reincarnated):
            self._reincarnated(o)
        elif isinstance(o, Stalled):
            self._stalled(o)
        elif isinstance(o, Superseded):
            self._superseded(o)

    def _member_down(self, o: MemberDown) -> None:
        """``o.node`` up to ``o.incarnation`` is over: if that ends the life in
        the view, forget its frame numbers, drop its link and tell."""
        if o.reason == "suspected":
            self.stats["suspicions"] += 1
            log.warning("suspect %016x (incarnation %d)", o.node, o.incarnation)
        if o.was_up:
            # Only for the life the frame numbers belong to: a verdict on an
            # older life, arriving after the newer one's link began, must not
            # erase them (a resend after a reset would then pass twice).
            self._received.forget(o.node)
            self._drop_link(o.node)
            self._membership_changed(MembershipEvent("left", o.node, o.incarnation, o.reason))

    def _send(self, o: Send) -> None:
        packets = list(o.packet.packets) if isinstance(o.packet, Bundle) else [o.packet]
        dest = o.dest
        if dest not in self._alive and self.core.believed_dead(dest):  # it repairs around it
            self.stats["sent_to_crashed"] += len(packets)
            return
        self._link(dest).put(packets)

    def _on_published(self, o: Published) -> None:
        if self._trace is not None:
            self._trace("publish", o.topic, o.id.source, o.id.seq, o.id.incarnation)
        if self.recorder is not None:
            self.recorder.published(o.topic)
            self._published_at[o.id] = self._now

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
        """The core delivers ``d``: on to the application unless the machine
        holds it (its source's earlier publications are asked for) or has
        delivered it already (``HELD``, ``SKIP``)."""
        if len(d.payload) < _HEAD:  # no honest member sends this
            self.stats["malformed_payload"] += 1
            log.error("publication %r on %r has no envelope: not delivered", d.id, d.topic)
            return
        if d.own:
            self._hand_on(d, 0)
            return
        missed = self.machine.hand(d, trio.current_time())
        if missed >= 0:
            self._hand_on(d, missed)

    def _released(self, o: Release) -> None:
        """A delivery the machine held, or one recovered from its source's
        history (whose payload no core checked: checked here as
        :meth:`_deliver` checks the core's)."""
        if o.recovered:
            if len(o.delivery.payload) < _HEAD:
                self.stats["malformed_payload"] += 1
                return
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
        if sub is None:
            return
        queue = sub._queue  # Subscription._put, inlined: once per delivery
        if len(queue) >= sub._capacity:
            sub.dropped += 1
            # One line per topic per interval, with the count: a stalled reader
            # under load dropped (and logged) tens of thousands a second.
            self.quiet.error(
                ("undelivered", d.topic),
                "subscription %r is not being read: deliveries dropped (%d in all)",
                d.topic,
                sub.dropped,
            )
            return
        queue.append(
            _new_delivery(d.topic, source, incarnation, seq, payload[_HEAD:], d.own, stamp, missed)
        )
        if sub._parked:
            sub._parked = False
            sub._waiting.unpark_all()

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

    def _link(self, dest: int) -> _Link:
        link = self._links.get(dest)
        if link is None:
            link = self._links[dest] = _Link(self, dest)
            assert self._nursery is not None
            self._nursery.start_soon(link.run)
        return link

    # ------------------------------------------------------------- liveness

    def _on_control(self, sender: int, control: tuple[Control, ...]) -> None:
        """Detector messages go to the detector, a leave makes ``sender`` leave.

        Raises :class:`RemoteDetectorError` (the connection is closed) on a
        message the detector refuses; a node without a detector ignores them.
        """
        now = trio.current_time()
        for c in control:
            if isinstance(c, Leave):
                self._on_leave(sender, c.incarnation, now)
            elif isinstance(c, Members):
                self._handle(self.machine.on_digest(sender, c.digest, now), now)
                self._compare_revocations(sender, c.revocations)
            elif isinstance(c, Revoked):
                self._on_revoked(sender, c.blob, now)
            elif isinstance(c, Resume | Replay):
                self._on_recovery(sender, c, now)
            else:
                self._handle(self.machine.control(sender, c, now), now)

    def _on_recovery(self, sender: int, c: Resume | Replay, now: float) -> None:
        """A RESUME or a part of a REPLAY from ``sender``: to the machine, with a
        log line for what it did not take (refused, or not asked for)."""
        stats = self.machine.recovery.stats
        before = stats["resumes_refused"], stats["replays_unasked"]
        out = self.machine.control(sender, c, now)
        if isinstance(c, Resume):
            if stats["resumes_refused"] > before[0]:
                self.quiet.warn(("resume refused", sender),
                                "resume of %016x on %r not answered (not a member, or "
                                "too many)", sender, c.topic)  # fmt: skip
            else:
                parts = sum(isinstance(o, SendControl) for o in out)
                log.info("answering %016x on %r after ordinal %d: %d part(s)",
                         sender, c.topic, c.ordinal, parts)  # fmt: skip
        elif stats["replays_unasked"] > before[1]:
            self.quiet.warn(("replay unasked", sender),
                            "replay of %016x on %r not taken (not asked for now)",
                            sender, c.topic)  # fmt: skip
        self._handle(out, now)

    # ---------------------------------------------------------- revocation

    def _compare_revocations(self, sender: int, theirs: int) -> None:
        """``sender`` holds revocation list ``theirs``: send ours if newer, ask
        for its own (our digest and serial) if older."""
        mine = self._revocations.serial if self._revocations else 0
        if theirs < mine and sender in self.peers:
            assert self._revocations is not None
            self._link(sender).put_control(Revoked(self._revocations.encode()))
        elif theirs > mine and sender in self.peers:
            self._link(sender).put_control(Members(records_digest(self.known_records()), mine))

    def _on_revoked(self, sender: int, blob: bytes, now: float) -> None:
        """A revocation list from ``sender``: adopted if the fleet issued it and it
        is newer.  A forged one closes the connection (raises SecurityError)."""
        rl = RevocationList.decode(blob)
        rl.verify(self.fleet)
        self._adopt_revocations(rl, now)

    def _adopt_revocations(self, rl: RevocationList, now: float) -> None:
        """Adopt ``rl`` if newer: its nodes leave at once (links dropped, refused
        from now on), and the list goes on to this node's VCube neighbours."""
        if self._revocations is not None and rl.serial <= self._revocations.serial:
            return
        self._revocations = rl
        self.machine.revocation_serial = rl.serial
        fresh = sorted(rl.nodes - self._revoked - {self.id})
        self._revoked.update(rl.nodes - {self.id})
        if self.id in rl.nodes:
            log.error("the fleet revoked this node: its peers refuse it from now on")
        for node in fresh:
            log.warning("%016x revoked by the fleet (list %d): dropped", node, rl.serial)
            self._handle(self.machine.revoke(node, now), now)
        blob = Revoked(rl.encode())
        for neighbour in self.core.overlay.children(self.id, self.id):
            self._link(neighbour).put_control(blob)

    def _follow_revocation_file(self, now: float) -> None:
        """Adopt the revocation file when it appears or changes (one stat a round)."""
        path = self._revocation_file
        if path is None:
            return
        try:
            st = path.stat()
        except OSError:
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self._revocation_seen:
            return
        self._revocation_seen = seen
        try:
            rl = load_revocations(path, self.fleet)
        except IdentityError as exc:
            log.error("revocation list not adopted: %s", exc)
            return
        if rl is not None:
            self._adopt_revocations(rl, now)

    def _on_leave(self, sender: int, inc: int, now: float) -> None:
        """``sender``'s incarnation ``inc`` leaves: forgotten, not suspected."""
        self._handle(self.machine.left(sender, inc, "left", now), now)

    async def _detect(self) -> None:
        """Run the machine's timer: detector rounds every ``detector_interval``
        seconds on a fixed grid, and between rounds each probe's expiry at its
        deadline, so a suspicion takes ``timeout`` per attempt, not a round.
        A hint that probes earlier moves the sleep (:meth:`_unreachable`)."""
        machine = self.machine
        with self._detecting:
            machine.start_rounds(trio.current_time())
            while (due := machine.get_timer()) is not None:
                with trio.move_on_at(due) as wake:
                    self._detector_wake = wake
                    await trio.sleep_forever()
                self._detector_wake = None
                now = trio.current_time()
                self._handle(machine.handle_timer(now), now)

    def _new_life(self, node: int, life: int) -> None:
        """``node`` runs as ``life`` now.  A connection to an older life of it is
        closed (:meth:`_Link.redial`), and that address is told, on a
        connection of its own, that ``life`` is alive: a process the identity
        was started again over then stops (:class:`Superseded`) instead of
        running on unheard.  To a crashed life the notice goes nowhere."""
        link = self._links.get(node)
        old = None if link is None else link.redial(life)
        notice = None if old is None else self.machine.newer_life_notice(node)
        if old is not None and notice is not None and self._nursery is not None:
            self._nursery.start_soon(self._send_control_once, old.host, old.port, notice)

    async def _send_control_once(self, host: str, port: int, msg: Control) -> None:
        try:
            with trio.move_on_after(self.config.handshake_timeout):
                async with self._dialled(host, port) as (stream, session):
                    packet = encode_packets([], control=(msg,))
                    await stream.send_all(frame(session.seal(packet)))
        except _ONE_OFF_ERRORS as exc:
            log.debug("notice for %s:%d not sent: %s", host, port, _why(exc))

    def _superseded(self, o: Superseded) -> None:
        """Another process runs this identity, started later (a copied node
        directory): it keeps the identity, this node stops with
        :class:`IdentityInUseError`, raised in the node's nursery so that it
        ends the ``open_node`` block (and ``p2p node`` exits 1 with the
        message).  No LEAVE: the id stays a member, as the other process."""
        msg = (
            f"node {self.id:016x} was started again elsewhere (incarnation "
            f"{o.incarnation}, newer than this process's {self.incarnation}): "
            "this process stops; give every process its own node directory "
            "(`p2p fleet add-node`)"
        )
        if self._nursery is not None:  # the error is its one report (p2p node: one line)
            self._nursery.start_soon(_raise, IdentityInUseError(msg))

    def _stalled(self, o: Stalled) -> None:
        """Lifeguard's local health: the timer fired ``o.lag`` seconds late, so
        this process was not running (a busy CPU, a suspended process); the
        machine gave its probes more time.  Counted in ``stats["loop_stalls"]``;
        one log line per 10 s."""
        self.stats["loop_stalls"] += 1
        self.quiet.warn(
            ("stalled", None),
            "this node stalled %.2f s: %d probes given more time, nobody accused",
            o.lag,
            o.moved,
        )

    def _unreachable(self, node: int) -> None:
        """A hint from a link: the connection to ``node`` broke and re-dialling
        failed (what a crashed process's peers see).  The detector probes it now
        rather than at its next round; only unanswered probes make a suspicion."""
        if self._closed:
            return
        now = trio.current_time()
        self._handle(self.machine.hint(node, now), now)
        due = self.machine.get_timer()
        wake = self._detector_wake
        if due is not None and wake is not None and due < wake.deadline:
            wake.deadline = due

    def _reincarnated(self, o: Reincarnated) -> None:
        """Others treated this incarnation as crashed; the machine restarted the
        core as ``o.incarnation`` and re-subscribes (the outputs after this one).

        Core packets still queued belong to the dead incarnation and are
        dropped; ``publish(wait_acked=True)`` calls waiting on it return.  The
        trace shows it as the simulator shows a crash and a recovery (``crash``,
        ``recover``, then ``subscribe`` per topic), so the trace checks require
        of the new life only what it subscribed to anew.
        """
        self._trace_event("crash", "", None, None, o.previous)  # the old life ends
        self.stats["reincarnations"] += 1
        log.warning("this node was suspected: back as incarnation %d", o.incarnation)
        for link in self._links.values():
            link.log.discard()  # the old life's frames: not sent again to anyone
            kept = [x for x in link.outbox if isinstance(x, _NOT_CORE)]
            self.stats["lost_to_crash"] += len(link.outbox) - len(kept)
            link.outbox = deque(kept)
        for ev in self._acked.values():
            ev.set()
        self._acked.clear()
        if self.port:
            self.record = self._sign_record()
            for link in self._links.values():  # the new life's record goes first
                link.introduce(self.record)
        self._trace_event("recover", "", None, None)
        for topic in sorted(self.machine.topics):
            self._subscribed.setdefault(topic, trio.Event())
            self._trace_event("subscribe", topic, None, None)


_HEAD = ENVELOPE_SIZE + _STAMP_SIZE
"""Bytes ahead of the application's payload: the machine's envelope, the publish stamp."""

_ONE_OFF_ERRORS = (
    OSError,
    SecurityError,
    WireError,
    EOFError,
    trio.TooSlowError,
    trio.BrokenResourceError,
)
"""What a one-off connection (a seed exchange, a leave) may fail with: logged, not raised."""


async def _raise(exc: BaseException) -> None:
    """A task that fails with ``exc``: ends the nursery it runs in."""
    raise exc
