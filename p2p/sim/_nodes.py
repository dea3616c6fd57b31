"""The node path: what a simulated node does with its inputs and outputs.

Timing follows thesis §4.5.1: a node processes one input at a time (``t_pc``
each), then queues the packets it produced on its single outgoing link, which
transmits one packet per ``t_t``; each packet then propagates for ``t_pp``.
Propagation delays are drawn per packet, so links are not FIFO and a relayed
path can beat a direct one.

:class:`_Nodes` adds to the shared state (``p2p.sim._world``) a node's local
calls, the arrival of link packets (lost with a crashed endpoint), the
recording of its core's outputs and the per-link outbox that turns its sends
into link packets (``_ship``; through the reliable links once a RESET was
scheduled, ``p2p.sim._links``, or to the older process of an id started
twice, ``p2p.sim._twin``).  Work that would end after a scheduled crash
waits in the queue for its end instant (``_World._defers``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self, cast

from p2p._errors import P2PError
from p2p.machine import Frontier, MachineOutput, NodeMachine, Refused, Release
from p2p.sim._frames import Frame, Part, join_frame, pack_frames, packets_body, part_size, parts_of
from p2p.sim._links import Links
from p2p.sim._members import _Membership
from p2p.sim._twin import Twins
from p2p.sim._world import Core, _World
from p2p.wire import decode_body, encode_packets
from topics import (
    Bundle,
    Delivered,
    DeliveredRun,
    Dropped,
    Event,
    Held,
    LocalProtocolError,
    Output,
    Packet,
    Published,
    PublishedRun,
    Received,
    RemoteProtocolError,
    RoundAcked,
    Send,
    Subscribed,
    VCubePS,
)

_PacketItem = tuple[int, int, Frame, int, int]
"""``(sender, dest, frame, dest incarnation, sender incarnation)``."""


class _Nodes(_World):
    """Local calls, packet arrivals and core outputs of every node (see the module docstring)."""

    # Set by ``Simulation.__init__`` (their documentation is there).
    listeners: list[Callable[[Self, int, float, Event], None]]
    _frontiers: dict[int, Frontier]
    _partitioned: bool
    _members: _Membership | None
    _links: Links | None
    _twins: Twins | None

    # ---------------------------------------------------------------- inputs

    def _act(self, action: str, node: int, topic: str, payload: bytes) -> None:
        """A local call; it waits for the node's CPU so per-node time stays monotone."""
        clock = self.clocks[node]
        start = max(self.now, clock.cpu_free)
        if node in self.down:
            self.recorder.refused(start, node, action, topic, "node is crashed")
            return
        if node in self.recorder.silenced:
            self.recorder.refused(start, node, action, topic, "node is revoked")
            return
        if self._busy_until(node, start, "act", (action, node, topic, payload, start)):
            return
        self._call(action, node, topic, payload, start)

    def _call(self, action: str, node: int, topic: str, payload: bytes, start: float) -> None:
        """Make the call at ``start``; its sends leave one ``t_pc`` later."""
        machine = self.machines.get(node)
        core: Core | NodeMachine = machine or self.nodes[node]
        clock = self.clocks[node]
        try:
            if action == "SUB":
                out = core.subscribe(topic, start)
            elif action == "UNS":
                out = core.unsubscribe(topic, start)
                if machine is None:
                    self._frontier(node).forget(topic)
            elif machine is not None:
                out = machine.publish(topic, payload, start)
            else:  # the machine's envelope, so both membership modes carry the same bytes
                frontier = self._frontier(node)
                out = core.publish(topic, frontier.envelope(topic) + payload, start)
                frontier.published(topic)
        except LocalProtocolError as exc:
            self.recorder.refused(start, node, action, topic, str(exc))
            return
        self.recorder.call(start, node, action, topic)
        if self._members is not None and any(isinstance(o, MachineOutput) for o in out):
            self._members.carry_out(node, start, out)  # a SUB's resumes
            return
        clock.cpu_free = max(clock.cpu_free, start + self.delays.tpc)
        self._emit(node, start, start + self.delays.tpc, cast(list[Output], out))

    def _arrive(self, sender: int, dest: int, packet: Frame) -> None:
        """A link packet arrives: one ``t_pc`` for the packet, then each part in order."""
        clock = self.clocks[dest]
        done = max(self.now, clock.cpu_free) + self.delays.tpc
        clock.cpu_free = done
        if self._defers(dest, done):
            self._defer(done, dest, "arrive", (sender, dest, packet, done))
        else:
            self._receive(sender, dest, packet, done)

    def _receive(self, sender: int, dest: int, packet: Frame, done: float) -> None:
        """The core takes the packet's parts in order; results appear at ``done``."""
        self.recorder.arrived(dest, packet, sender, done)
        machine = self.machines.get(dest)
        if machine is not None:
            if self._members is not None:  # the detector mode's driver, every process alike
                self._members.frame(self._members.newest(dest), sender, packet, done)
                return
            got = machine.receive(sender, packets_body(packet), done)
            if got and type(got[-1]) is Refused:  # simulated peers are honest: a bug
                raise RemoteProtocolError(got[-1].reason)
            self._emit(dest, done, done, cast(list[Output], got))
            self.recorder.pending_max[dest] = machine.core.pending_max
            return
        core = self.nodes[dest]
        parts = packet.parts
        if len(parts) == 1:  # most link packets: the core's list as it is, no copy
            out = core.receive(sender, parts[0], done)
        else:
            out = []
            for part in parts:
                out.extend(core.receive(sender, part, done))
        self.recorder.pending_max[dest] = core.pending_max
        self._emit(dest, done, done, out)

    def _on_arrival(self, item: _PacketItem) -> None:
        """A packet reaches ``dest``, unless an endpoint crashed first.

        Like a TCP connection, a link dies with its endpoints: a packet to a
        crashed incarnation is lost, and one that was still on a crashed
        sender's link at its crash instant (not fully transmitted) never left.
        """
        sender, dest, packet, life, sender_life = item
        if not self._died and self._twins is None:  # a crash-free, twin-free run
            if dest in self.down or (
                life != self.incarnation[dest] and not self._to_older_life(dest, life)
            ):
                self.lost += 1
                if self._members is not None:
                    self._members.refused(sender, dest, life)
                return
            # _arrive, inlined (the per-packet path)
            clock = self.clocks[dest]
            free, now = clock.cpu_free, self.now
            done = (free if free > now else now) + self.delays.tpc
            clock.cpu_free = done
            if clock.deferred or (self._crashes and self._defers(dest, done)):
                self._defer(done, dest, "arrive", (sender, dest, packet, done))
            else:
                self._receive(sender, dest, packet, done)
            return
        died = self._died.get((sender, sender_life)) if self._died else None
        if died is not None and packet.start + self.delays.tt > died:
            self.unsent += 1
        elif dest in self.down or (
            life != self.incarnation[dest] and not self._to_older_life(dest, life)
        ):
            if self._twins is not None and self._twins.catch(sender, dest, life, (packet, 0)):
                return  # sent to the older process of an id started twice: it runs
            self.lost += 1
            if self._members is not None:
                self._members.refused(sender, dest, life)
        else:
            if self._twins is not None and sender_life >= 0:  # not from an older process
                self._twins.seen_newer(dest, sender, max(self.now, self.clocks[dest].cpu_free))
            self._arrive(sender, dest, packet)

    # --------------------------------------------------------------- outputs

    def _emit(self: Self, node: int, at: float, ready: float, outputs: list[Output]) -> None:
        """Record events at ``at``; queue the packets from ``ready`` on."""
        rec = self.recorder
        clock = self.clocks[node]
        if at > clock.committed:
            clock.committed = at
        listeners = self.listeners
        sends: list[Send] = []
        machine = self.machines.get(node)
        others: list[Any] = []  # a machine's own outputs: the membership driver's
        for o in outputs:
            if isinstance(o, Send):
                sends.append(o)
                continue
            if isinstance(o, Delivered):
                if not self._delivered(node, at, o, machine is None):
                    continue  # delivered already
            elif isinstance(o, Received):
                rec.received(at, node, o.topic, o.id, o.relay)
            elif isinstance(o, Published):
                rec.published(at, node, o.topic, o.id, self._view_of(node, o.topic))
            elif isinstance(o, Subscribed):
                rec.subscribed(at, node, o.topic)
            elif isinstance(o, RoundAcked):
                rec.round_acked(at, node, o.topic, o.kind, o.ids)
            elif isinstance(o, Dropped):
                rec.dropped(at, node, o.topic, o.count, o.reason)
            elif isinstance(o, Held):
                rec.held(at, node, o.child, o.ids)
            elif isinstance(o, (DeliveredRun, PublishedRun)):  # taken one by one
                self._emit_run(node, at, o, machine is None)
                continue
            elif type(o) is Release:  # after a gap (a machine's frontier counted it)
                self.released(node, at, o)
                continue
            elif isinstance(o, MachineOutput):
                others.append(o)
                continue
            if listeners:
                for listener in listeners:
                    listener(self, node, at, o)
        if sends:
            self._ship(node, ready, sends)
        if others and self._members is not None:  # a RESUME a gap calls for
            self._members.carry_out(node, at, others)

    def _delivered(self: Self, node: int, at: float, o: Delivered, frontier: bool) -> bool:
        """Record delivery ``o`` (``frontier``: through the simulator's own,
        when no machine keeps one); ``False`` if it was delivered already."""
        rec = self.recorder
        if not o.own and frontier:  # a gap before this delivery?
            missed = self._frontier(node).delivered(o.topic, o.id.source, o.payload)
            if missed < 0:
                return False
            if missed:
                rec.gap(at, node, o.topic, o.id.source, missed)
        rec.delivered(at, node, o.topic, o.id, o.own)
        return True

    def _emit_run(
        self: Self, node: int, at: float, run: DeliveredRun | PublishedRun, frontier: bool
    ) -> None:
        """A run's events, each as :meth:`_emit` takes it on its own."""
        rec, listeners = self.recorder, self.listeners
        for e in run.expand():
            if isinstance(e, Delivered):
                if not self._delivered(node, at, e, frontier):
                    continue
            elif isinstance(e, Received):
                rec.received(at, node, e.topic, e.id, e.relay)
            else:
                rec.published(at, node, e.topic, e.id, self._view_of(node, e.topic))
            for listener in listeners:
                listener(self, node, at, e)

    def released(self: Self, node: int, at: float, o: Release) -> None:
        """The machine hands on a recovered or held delivery."""
        d = o.delivery
        if o.missed:
            self.recorder.gap(at, node, d.topic, d.id.source, o.missed)
        self.recorder.delivered(at, node, d.topic, d.id, False)
        for listener in self.listeners:
            listener(self, node, at, d)

    def _view_of(self, node: int, topic: str) -> frozenset[int] | None:
        """With partial membership (``introductions``): the subscribers ``node``
        knows of on ``topic`` as their current incarnation (an entry of an
        older life owes the new one nothing), for the trace's publication."""
        if self.introductions is None and not self._partitioned:
            return None
        entries = cast(VCubePS, self.nodes[node]).subscriber_incarnations(topic)
        life = self.incarnation
        return frozenset(n for n, inc in entries.items() if inc == life[n])

    def _frontier(self, node: int) -> Frontier:
        """``node``'s ordinals and delivery frontier: its machine's, or (a protocol
        without machines) one per process of the engine's own."""
        machine = self.machines.get(node)
        if machine is not None:
            return machine.frontier
        frontier = self._frontiers.get(node)
        if frontier is None:
            frontier = self._frontiers[node] = Frontier(self.incarnation[node])
        return frontier

    # ------------------------------------------------------- the link outbox

    def _ship(self, src: int, ready: float, sends: list[Send]) -> None:
        """Turn one step's sends into link packets (the per-link outbox).

        ``off`` and ``causal``: one packet per send (a core's bundle stays one
        packet, split at the MTU).  ``on`` adds link coalescing: everything this
        step sends to a neighbour shares packets, and joins the last packet
        queued for it if that one has not started transmitting.  Nothing ever
        waits for company: a part only rides in a packet that leaves no later
        than a packet of its own would.
        """
        limits = self.limits
        if self.wire is not None:
            sends = [Send(s.dest, self._through_wire(s.packet)) for s in sends]
        if self.aggregation != "on":
            for send in sends:
                for frame in pack_frames(parts_of(send.packet), limits):
                    self._transmit(src, send.dest, frame, ready)
            return
        by_dest: dict[int, list[Part]] = {}
        for send in sends:
            got = by_dest.get(send.dest)
            if got is None:
                by_dest[send.dest] = parts_of(send.packet)  # a fresh list, ours to extend
            else:
                got.extend(parts_of(send.packet))
        last_frame, header = self._last_frame, limits.header
        for dst, parts in by_dest.items():
            last = last_frame.get((src, dst))
            if last is not None and last.start > ready:
                parts = join_frame(last, parts, limits)
                if not parts:
                    continue
            if len(parts) == 1:  # pack_frames' answer for one part, without its loop
                self._transmit(src, dst, Frame(parts, header, part_size(parts[0])), ready)
                continue
            for frame in pack_frames(parts, limits):
                self._transmit(src, dst, frame, ready)

    def _through_wire(self, packet: Packet | Bundle) -> Packet | Bundle:
        """``packet`` as the runtime's receiver reads it after the runtime's sender
        wrote it (``Simulation.wire``)."""
        assert self.wire is not None
        got = decode_body(encode_packets([packet]), self.wire).packets
        return got[0] if len(got) == 1 else Bundle(tuple(got))

    def _transmit(self, src: int, dst: int, packet: Frame, ready: float) -> None:
        """Queue one link packet: it waits for the link, takes ``t_t``, then ``t_pp``
        (on a reliable link once a RESET was scheduled: ``p2p.sim._links``)."""
        if dst not in self.nodes:
            raise P2PError(f"node {src} sent to unknown node {dst}")
        if src in self.down:
            return  # a crashed node sends nothing more
        if self._links is not None:
            self._links.send(src, dst, packet, ready)
            return
        if self._twins is not None and self._twins.divert(src, dst, packet, ready):
            return  # to the older process of an id started twice
        life = self.incarnation
        item = (src, dst, packet, life[dst], life[src])
        # _push, inlined (once per link packet)
        self._heap.push((self._wire(src, dst, packet, ready), self._seq, 1, item))
        self._seq += 1
