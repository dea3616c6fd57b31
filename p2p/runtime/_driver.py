"""The driver of the sans-IO :class:`~p2p.machine.NodeMachine`: it carries out
the machine's and the core's outputs and feeds it timers, control packets,
revocations and hints.

:meth:`_Driver._handle` is the one place outputs are carried out: packets go
to links, deliveries to subscriptions (the hand-off, ``p2p.runtime._handoff``;
while a frame is read, after the frame's sends are written), membership
changes to links and watchers.  Invariants: outputs are carried out
synchronously and in order (the machine stays single-threaded); a packet for a node the core
treats as crashed is counted, never queued; a peer that leaves the view has
its link dropped and what it held counted as lost; a revoked node is dropped
at once and the list goes on to this node's VCube neighbours.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import trio

from p2p._errors import IdentityError, IdentityInUseError, SecurityError
from p2p._revocation import load_revocations
from p2p._transport import parse_address
from p2p.machine import (
    ExchangeWithSeed,
    LeaveSeed,
    MemberDown,
    MemberUp,
    NodeOutput,
    Refused,
    Reincarnated,
    Release,
    RevocationsAdopted,
    RoundStarted,
    SendControl,
    SendExchange,
    Stalled,
    Superseded,
    SuspicionCorrected,
)
from p2p.runtime._delivery import MembershipEvent
from p2p.runtime._handoff import _HandOff
from p2p.runtime._link import _NOT_CORE, EXCHANGE_CHUNK, _Link, _why
from p2p.wire import (
    Control,
    PeerExchange,
    Replay,
    Resume,
    WireError,
    encode_packets,
    frame,
)
from topics import (
    Bundle,
    Delivered,
    DeliveredRun,
    Dropped,
    Held,
    Published,
    PublishedRun,
    Received,
    RoundAcked,
    Send,
    Subscribed,
)

_HANDED_ON = (Delivered, DeliveredRun, Received, Release)
"""The outputs that hand publications on (or time them): after a frame's sends."""
log = logging.getLogger("p2p.node")


class _Driver(_HandOff):
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

    def _handle(self, outputs: Sequence[NodeOutput], now: float | None = None) -> None:
        """Carry out a machine call's outputs, in order (synchronously: the machine
        stays single-threaded): the one dispatch of this driver.

        The per-publication outputs are tested first, on the exact type (a
        received round yields two per publication); every other type of the
        closed union :data:`~p2p.machine.NodeOutput` has its handler in
        :meth:`_on`.  A ``Delivered`` has been through the machine's frontier
        and holds already (nothing missed before it); a :class:`Release`
        carries what was missed, or was held or recovered.
        """
        recording = self.recorder is not None
        if recording:  # one clock read per batch (``now``, if the caller has one)
            self._now = trio.current_time() if now is None else now
        handlers = self._on
        later = self._later if self._stepping else None
        for o in outputs:
            if isinstance(o, _HANDED_ON):
                if later is not None:  # after the frame's sends (Serving._read_loop)
                    later.append(o)
                else:
                    self._hand(o, recording)
            elif type(o) is Send:
                self._send(o)
            else:
                handlers[type(o)](o)
        if later is None:
            self._settled()
        if self._eager and not self._stepping:
            self._write_eager()
        if later is None and self._frontier_store is not None:
            # once per batch, after its hand-off (a frame's: _read_loop, after
            # _hand_later): a process killed between the two then hands a
            # delivery on again, never skips one
            self._write_frontier()
        if self._timer_wake is not None:
            self._rewake(self._timer_wake)

    def _rewake(self, wake: trio.CancelScope) -> None:
        """The timer contract (``NodeMachine.get_timer``): after every call into the
        machine the one wake-up is its timer, earlier or later."""
        due = self.machine.get_timer()
        wake.deadline = math.inf if due is None else due

    @cached_property
    def _on(self) -> dict[type, Callable[[Any], None]]:
        """The handler of each output type but the three :meth:`_handle` inlines."""
        return {
            Published: self._on_published,
            PublishedRun: self._on_published_run,
            Subscribed: self._on_subscribed,
            RoundAcked: self._on_acked,
            Dropped: self._on_dropped,
            Held: _ignore,
            SendControl: self._send_control,
            SendExchange: self._send_exchange,
            MemberUp: self._member_up,
            MemberDown: self._member_down,
            SuspicionCorrected: self._corrected,
            RoundStarted: self._round_started,
            Reincarnated: self._reincarnated,
            Stalled: self._stalled,
            Superseded: self._superseded,
            Refused: _ignore,  # the reader that called the machine closes the connection
            RevocationsAdopted: self._revocations_adopted,
            ExchangeWithSeed: self._exchange_with_seed,
            LeaveSeed: self._unmet_seeds.append,
        }

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

    def _on_subscribed(self, o: Subscribed) -> None:
        self._trace_event("subscribed", o.topic, None, None)
        ev = self._subscribed.pop(o.topic, None)
        if ev is not None:
            ev.set()

    def _on_dropped(self, o: Dropped) -> None:
        log.warning("%d publications on %r dropped: %s", o.count, o.topic, o.reason)

    def _send_control(self, o: SendControl) -> None:
        msg = o.msg
        if type(msg) is Resume:
            self.stats["resumes"] += 1
            log.info("asking %016x for what it published on %r after ordinal %d",
                     o.dest, msg.topic, msg.ordinal)  # fmt: skip
        elif type(msg) is Replay and msg.part == 0:
            log.info("answering %016x on %r after ordinal %d: %d part(s)",
                     o.dest, msg.topic, msg.ordinal, msg.parts)  # fmt: skip
        self._link(o.dest).put_control(msg)

    def _send_exchange(self, o: SendExchange) -> None:
        self._link(o.dest).put_exchange(list(o.records), reply=o.reply)

    def _member_up(self, o: MemberUp) -> None:
        self._new_life(o.node, o.incarnation)
        self._membership_changed(MembershipEvent("joined", o.node, o.incarnation, o.reason))

    def _corrected(self, o: SuspicionCorrected) -> None:
        self.stats["corrections"] += 1
        log.info("%016x answers again; waiting for its new incarnation", o.node)

    def _exchange_with_seed(self, o: ExchangeWithSeed) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._seed_exchange, o)

    async def _seed_exchange(self, o: ExchangeWithSeed) -> None:
        """Carry out one exchange with a seed (``NodeMachine`` schedules them, now
        and every ``seed_interval``, backing off after failures) and report
        how it went."""
        host, port = parse_address(o.address)
        try:
            peer = await self._exchange_with(host, port, o.records)
        except _ONE_OFF_ERRORS as exc:
            self.quiet.warn(("seed", o.address), "seed %s unreachable: %s", o.address, _why(exc))
            now = trio.current_time()
            self._handle(self.machine.seed_failed(o.address, now), now)
            return
        now = trio.current_time()
        self._handle(self.machine.seed_reached(o.address, peer, now), now)

    async def _exchange_with(self, host: str, port: int, records: tuple[bytes, ...]) -> int:
        """Send ``records`` to ``host:port`` asking for its own (it answers on its
        link): the seed's node id."""
        async with self._dialled(host, port) as (stream, session):
            if session.peer_id == self.id:
                return self.id  # the seed list names this node itself
            for i in range(0, len(records), EXCHANGE_CHUNK):
                last = i + EXCHANGE_CHUNK >= len(records)
                ex = PeerExchange(tuple(records[i : i + EXCHANGE_CHUNK]), reply=last)
                await stream.send_all(frame(session.seal(encode_packets([], ex))))
            return session.peer_id

    def _round_started(self, o: RoundStarted) -> None:
        self._follow_revocation_file(trio.current_time())

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
            self._drop_link(o.node)
            self._membership_changed(MembershipEvent("left", o.node, o.incarnation, o.reason))

    def _send(self, o: Send) -> None:
        packets = list(o.packet.packets) if isinstance(o.packet, Bundle) else [o.packet]
        dest = o.dest
        if dest not in self._alive and self.core.believed_dead(dest):  # it repairs around it
            self.stats["sent_to_crashed"] += len(packets)
            return
        self._link(dest).put(packets)

    def _link(self, dest: int) -> _Link:
        link = self._links.get(dest)
        if link is None:
            link = self._links[dest] = _Link(self, dest)
            assert self._nursery is not None
            self._nursery.start_soon(link.run)
        return link

    # ---------------------------------------------------------- revocation

    def _revocations_adopted(self, o: RevocationsAdopted) -> None:
        """The machine adopted the fleet's list ``o.serial`` (its nodes' departures follow)."""
        if o.self_revoked:
            log.error("the fleet revoked this node: its peers refuse it from now on")
        for node in o.fresh:
            log.warning("%016x revoked by the fleet (list %d): dropped", node, o.serial)

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
            try:
                self._handle(self.machine.adopt_revocations(rl.encode(), now), now)
            except SecurityError as exc:  # checked by load_revocations already
                log.error("revocation list not adopted: %s", exc)

    async def _timers(self) -> None:
        """Run the machine's one timer (``NodeMachine.get_timer``): detector rounds
        every ``detector_interval`` seconds on a fixed grid, each probe's
        expiry at its deadline (so a suspicion takes ``timeout`` per attempt,
        not a round), resumes and seed exchanges.  Any call into the machine
        moves the sleep (:meth:`_rewake`); none due, it sleeps until one is."""
        machine = self.machine
        with self._timing:
            if self.detector is not None:
                machine.start_rounds(trio.current_time())
            while True:
                due = machine.get_timer()
                with trio.move_on_at(math.inf if due is None else due) as wake:
                    self._timer_wake = wake
                    await trio.sleep_forever()
                self._timer_wake = None
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
        self._handle(self.machine.hint(node, now), now)  # moves the timer (_rewake)

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


_ONE_OFF_ERRORS = (
    OSError,
    SecurityError,
    WireError,
    EOFError,
    trio.TooSlowError,
    trio.BrokenResourceError,
)
"""What a one-off connection (a seed exchange, a leave) may fail with: logged, not raised."""


def _ignore(o: object) -> None:
    """An output this driver has nothing to do for."""


async def _raise(exc: BaseException) -> None:
    """A task that fails with ``exc``: ends the nursery it runs in."""
    raise exc
