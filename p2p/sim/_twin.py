"""A node started twice with one identity (the scenario action ``TWIN``).

In the runtime, two processes can run from one node directory (a copied
directory, a redeploy that forgot the first).  The newer start announces a
newer (clock-based) incarnation; every member that learns it closes its
connection to the older process's address, tells that address on a one-off
connection that the newer life is alive (``p2p.runtime._driver``'s ``_new_life``,
``NodeMachine.newer_life_notice``), and dials the newer one.  The older
process's machine reads its own id held alive as a newer incarnation and
reports :class:`~p2p.machine.Superseded`; the runtime stops it
(``IdentityInUseError``).

:class:`Twins` models that with two processes under one id.  The engine's
tables (``machines``, ``nodes``, ``clocks``, ``incarnation``) hold the newest
process; each older one that still runs is an :class:`Elder` with its own
machine, CPU and link, run by the detector mode's one driver loop
(``_Membership.feed``, ``frame`` and ``drive``, as a
:class:`~p2p.sim._process.Process`); this module routes to it and says what
its outputs do.  Addressing follows the runtime: what a
node sends to the id goes to the process its link points at, the newest
incarnation of the id its machine holds (``machines[sender].incs``): the
elder while the sender still holds the elder's life (or older), the newest
process once it learnt the newer one.  An elder that stopped is gone like a
crashed process: what reaches it is lost and its sender gets the hint a
failed dial gives.

The newer start takes incarnation ``elder + gap`` (``gap`` large: the
runtime's incarnations are clock-based, so a later start is far above), and
the simulator's refutations stay ``above + 1``, so an elder that refutes a
suspicion stays below it (it cannot leapfrog in fewer than ``gap``
refutations).  The trace (and so the trace checks) shows the id's older life
end at the TWIN instant, as a ``crash`` followed by a ``recover`` (as a
refutation shows): the elder's later deliveries are its own, not the
newer life's, and are counted in :meth:`Twins.metrics`, never recorded.

Invariants: at most one elder per id runs at a time; an elder never becomes
the engine's process again; every event of an elder is checked against its
``stopped`` instant first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, cast

from p2p._errors import P2PError
from p2p.machine import (
    ExchangeWithSeed,
    MemberDown,
    MemberUp,
    NodeMachine,
    Reincarnated,
    Release,
    SendControl,
    SendExchange,
)
from p2p.sim._frames import Frame, pack_frames, parts_of
from p2p.sim._members import _Membership
from p2p.sim._process import addressed
from p2p.sim._world import _World
from topics import Delivered, DeliveredRun, Output, Send

TWIN_GAP = 1000
"""How far above the older process's incarnation a second start's is."""


@dataclass(slots=True)
class Elder:
    """The older process of an id started twice (see the module docstring): a
    :class:`~p2p.sim._process.Process` that the detector mode's driver loop
    runs like any other, whose outputs leave on its own link and whose
    deliveries and reincarnations are counted, never recorded."""

    twins: Twins = field(repr=False)
    node: int
    machine: NodeMachine
    incarnation: int
    serial: int
    cpu_free: float
    link_free: float
    stopped: float | None = None
    """When it read it was superseded and stopped (``None``: it runs)."""
    timer_at: float | None = None

    def send(self, o: SendControl | SendExchange | ExchangeWithSeed, start: float) -> None:
        self.twins._send(self, o, start)

    def up(self, o: MemberUp, at: float) -> None:
        self.twins._elder_learnt(self, o, at)

    def down(self, o: MemberDown, at: float) -> None:
        """Its view is not the fleet's: nothing is logged."""

    def reincarnated(self, o: Reincarnated, at: float) -> None:
        self.incarnation = o.incarnation
        self.twins.counts["elder_reincarnations"] += 1

    def superseded(self, at: float) -> bool:
        self.twins._stop(self, at)
        return True

    def released(self, o: Release, at: float) -> None:
        if self.stopped is None:
            self.twins.counts["elder_deliveries"] += 1

    def emit(self, at: float, ready: float, outputs: list[Output]) -> None:
        self.twins._emit(self, ready, outputs)

    def emit_frame(self, done: float, outputs: list[Any]) -> None:
        self.twins.members.drive(self, done, outputs, ready=done)
        self.arm()

    def arm(self) -> None:
        self.twins._arm(self)


class Twins:
    """Every id started twice in one simulation (see the module docstring).

    It works on the shared state (``p2p.sim._world``) and routes events to the
    elders, whose machines the detector mode's driver (``p2p.sim._members``)
    runs; that driver reaches it back through ``_Membership.twins`` (typed
    there as :class:`~p2p.sim._members.ElderRouting`).
    """

    TIMER, CONTROL, ARRIVE, SENT = 11, 12, 13, 14
    """Event kinds: an elder's timer; a control message to it; a frame to it;
    a control message from it."""

    def __init__(self, sim: _World, members: _Membership | None) -> None:
        if members is None:
            raise P2PError("TWIN needs the failure detector (--membership detector)")
        if sim.introductions is not None:
            raise P2PError("TWIN needs full membership (no introductions)")
        self.sim = sim
        self.members = members
        self.rng = random.Random(f"{sim.seed}/twins")
        self.elders: dict[int, Elder] = {}
        self.routed: dict[tuple[int, int], int] = {}
        """``(sender, id) -> incarnation`` the sender's link to the id last went to."""
        self.counts = dict.fromkeys(
            (
                "twins",
                "superseded",
                "elder_deliveries",
                "elder_reincarnations",
                "notices",
                "lost_to_elder",
            ),
            0,
        )
        self._serial = 0

    # -------------------------------------------------------------- start --

    def start(self, node: int) -> None:
        """TWIN: a second process starts with ``node``'s id (the runtime's new
        start: every member's record at hand, announced on discovery)."""
        sim, mem = self.sim, self.members
        if node in sim.down or self.running(node) is not None:
            why = "node is crashed" if node in sim.down else "already started twice"
            sim.recorder.refused(sim.now, node, "TWIN", "", why)
            return
        old = sim.clocks[node]
        at = max(sim.now, old.committed)  # after what the older life already stamped
        self._serial += 1
        elder = Elder(
            self,
            node,
            sim.machines[node],
            sim.incarnation[node],
            self._serial,
            max(old.cpu_free, sim.now),
            max(old.link_free, sim.now),
        )
        self.elders[node] = elder
        self.counts["twins"] += 1
        inc = sim.incarnation[node] = elder.incarnation + TWIN_GAP
        members = {n: sim.incarnation[n] for n in sim.ids if n != node}
        m = mem._machine(node, inc, members, first_seq=elder.machine.core.next_seq)
        for n, i in members.items():
            if i:
                m.recovered(n, i, sim.now)
        clock = type(old)(cpu_free=at, link_free=at, deferred=old.deferred, committed=at)
        sim.clocks[node] = clock
        for link in [k for k in sim._last_frame if node in k]:
            del sim._last_frame[link]
        sim.recorder.failure(at, node, True)  # the trace: the older life ends here
        sim.recorder.failure(at, node, False)
        mem._install(node, m)
        mem._announce(node, inc)
        self._arm(elder)

    def any_running(self) -> bool:
        """Whether an older process still runs (membership has not settled)."""
        return any(e.stopped is None for e in self.elders.values())

    def running(self, node: int) -> Elder | None:
        elder = self.elders.get(node)
        return elder if elder is not None and elder.stopped is None else None

    # ------------------------------------------------------------ routing --

    def _to_elder(self, sender: int, node: int) -> Elder | None:
        """The elder ``sender``'s link to ``node`` points at, if it does: the
        sender holds no newer life of ``node`` than the elder's."""
        elder = self.elders.get(node)
        if elder is None:
            return None
        held = self.sim.machines[sender].incs.get(node, -1)
        life = elder.incarnation if held <= elder.incarnation else self.sim.incarnation[node]
        self.routed[(sender, node)] = life
        return elder if life == elder.incarnation else None

    def divert(self, src: int, dst: int, frame: Frame, ready: float) -> bool:
        """A frame from ``src`` to id ``dst``: to the elder if ``src``'s link points there."""
        elder = self._to_elder(src, dst)
        if elder is None:
            return False
        sim = self.sim
        at = sim._wire(src, dst, frame, ready)
        sim._push(at, self.ARRIVE, (src, dst, frame, elder.serial, sim.incarnation[src]))
        return True

    def divert_control(self, src: int, dst: int, msg: Any, start: float) -> bool:
        """A control message from ``src`` to id ``dst``, likewise."""
        elder = self._to_elder(src, dst)
        if elder is None:
            return False
        at = start + self._delay(src, dst)
        self.members._push(at, self.CONTROL, (src, dst, msg, elder.serial))
        return True

    def catch(self, sender: int, node: int, life: int, what: tuple[Any, ...]) -> bool:
        """Something sent to ``node``'s older life before the TWIN arrives after
        it: the elder takes it (it is that life's process)."""
        elder = self.running(node)
        if elder is None or life != elder.incarnation:
            return False
        if len(what) == 1:
            self._control(elder, sender, what[0])
        else:
            self._arrive(elder, sender, cast(Frame, what[0]))
        return True

    def new_life(self, observer: int, o: MemberUp, at: float) -> None:
        """``observer`` learnt ``o.node`` runs as ``o.incarnation``: if its link
        pointed at a running elder, it tells that address the newer life is
        alive, on a connection of its own (the runtime's ``_new_life``)."""
        elder = self.running(o.node)
        if elder is None or o.incarnation <= elder.incarnation:
            return
        # The runtime's redial: what is still queued goes to the new connection,
        # so nothing more joins a frame bound for the older process.
        self.sim._last_frame.pop((observer, o.node), None)
        # Every member talks to the id (probes, rounds): its link had a
        # connection to the older life unless it moved since.
        if self.routed.get((observer, o.node), elder.incarnation) != elder.incarnation:
            return
        self.routed[(observer, o.node)] = o.incarnation
        notice = self.sim.machines[observer].newer_life_notice(o.node)
        if notice is not None:
            self.counts["notices"] += 1
            delay = sum(self._delay(observer, o.node) for _ in range(3))  # dial, then the notice
            self.members._push(at + delay, self.CONTROL, (observer, o.node, notice, elder.serial))

    def seen_newer(self, dest: int, src: int, start: float) -> None:
        """A frame or control message from the newer process of ``src`` reaches
        ``dest``: the runtime's first frame on a connection carries its
        dialler's record, read in the same step as its packets (before any
        answer leaves), so ``dest`` learns the newer life first."""
        sim = self.sim
        if src not in self.elders or dest in sim.down:
            return
        m, inc = sim.machines[dest], sim.incarnation[src]
        if m.incs.get(src, -1) < inc and m.dead.get(src, -1) < inc:
            self.members.carry_out(dest, start, m.learn(src, inc, start))

    def seen(self, node: int, life: int, about: int, inc: int) -> None:
        """A discovery announcement of ``about`` as ``inc`` reaches ``node``'s
        older process (the life it was sent to): it learns it too."""
        elder = self.running(node)
        if elder is not None and elder.incarnation == life:
            start = max(self.sim.now, elder.cpu_free)
            self.members.feed(elder, self.sim._SEEN, (about, inc), start)

    def _elder_learnt(self, elder: Elder, o: MemberUp, at: float) -> None:
        """An older process learnt ``o.node``'s newer life: if that id's own older
        process runs, it is told, as any member's redial tells it."""
        other = self.running(o.node)
        if other is None or o.incarnation <= other.incarnation:
            return
        notice = elder.machine.newer_life_notice(o.node)
        if notice is not None:
            self.counts["notices"] += 1
            delay = sum(self._delay(elder.node, o.node) for _ in range(3))
            self.members._push(at + delay, self.CONTROL, (elder.node, o.node, notice, other.serial))

    def _delay(self, src: int, dst: int) -> float:
        return self.sim.delay(src, dst, self.rng)

    # ------------------------------------------------------------- events --

    def dispatch(self, kind: int, item: object) -> None:
        """Run one event; timers and control messages count as the detector's
        (``_Membership.events``: they never end, so they do not hold a run)."""
        if kind != self.ARRIVE:
            self.members.events -= 1
        if kind == self.SENT:
            self._sent(*cast(tuple[int, int, Any, int], item))
            return
        if kind == self.TIMER:
            node, serial, t = cast(tuple[int, int, float], item)
            elder = self._live(node, serial)
            if elder is not None and elder.timer_at == t:
                elder.timer_at = None
                start = max(self.sim.now, elder.cpu_free)
                self.members.feed(elder, self.sim._TIMER, (), start)
            return
        src, dst, what, serial, *life = cast(tuple[Any, ...], item)
        elder = self._live(dst, serial)
        if life:  # a frame: lost if its sender crashed before it left
            died = self.sim._died.get((src, life[0]))
            if died is not None and what.start + self.sim.delays.tt > died:
                self.sim.unsent += 1
                return
        if elder is None:
            self._refused(src, dst, serial)
        elif kind == self.CONTROL:
            self._control(elder, src, what)
        else:
            self._arrive(elder, src, what)

    def _live(self, node: int, serial: int) -> Elder | None:
        elder = self.elders.get(node)
        if elder is None or elder.serial != serial or elder.stopped is not None:
            return None
        return elder

    def _refused(self, src: int, node: int, serial: int) -> None:
        """Sent to an elder that stopped: lost; the sender's dial fails (a hint)."""
        self.counts["lost_to_elder"] += 1
        if src not in self.sim.down:
            self.members.refused(src, node, -serial)  # one hint per stopped process

    def _control(self, elder: Elder, src: int, msg: Any) -> None:
        start = max(self.sim.now, elder.cpu_free)
        self.members.feed(elder, self.sim._CONTROL, (src, msg), start)

    def _arrive(self, elder: Elder, src: int, frame: Frame) -> None:
        """A frame reaches the elder: one ``t_pc``, then its machine takes it."""
        done = elder.cpu_free = max(self.sim.now, elder.cpu_free) + self.sim.delays.tpc
        self.members.frame(elder, src, frame, done)

    # ------------------------------------------------------------ outputs --

    def _send(
        self, elder: Elder, o: SendControl | SendExchange | ExchangeWithSeed, start: float
    ) -> None:
        """A control message from the elder (its own event kind: it carries the
        elder's record, nothing newer to learn)."""
        self.members.counts["control_sent"] += 1
        dest, msg = addressed(o)
        item = (elder.node, dest, msg, self.sim.incarnation[dest])
        self.members._push(start + self._delay(elder.node, dest), self.SENT, item)

    def _sent(self, src: int, dest: int, msg: Any, life: int) -> None:
        sim, mem = self.sim, self.members
        if dest in sim.down or life != sim.incarnation[dest]:
            mem.counts["control_lost"] += 1
            mem.refused(src, dest, life)
        else:
            mem._input(dest, sim._CONTROL, (src, msg))

    def _stop(self, elder: Elder, at: float) -> None:
        """Superseded: the older process stops (``IdentityInUseError``, exit 1)."""
        elder.stopped = at
        elder.timer_at = None
        self.sim._died[(elder.node, -elder.serial)] = at  # its frames not yet sent never leave
        self.counts["superseded"] += 1

    def _emit(self, elder: Elder, ready: float, outputs: list[Output]) -> None:
        """Sends leave on the elder's own link; its deliveries are counted only."""
        if elder.stopped is not None:
            return
        elder.cpu_free = max(elder.cpu_free, ready)
        for o in outputs:
            if isinstance(o, Send):
                for frame in pack_frames(parts_of(o.packet), self.sim.limits):
                    self._transmit(elder, o.dest, frame, ready)
            elif isinstance(o, Delivered):
                self.counts["elder_deliveries"] += 1
            elif type(o) is DeliveredRun:
                self.counts["elder_deliveries"] += len(o.messages)

    def _transmit(self, elder: Elder, dst: int, frame: Frame, ready: float) -> None:
        sim = self.sim
        frame.start = max(ready, elder.link_free)
        elder.link_free = frame.start + sim.delays.tt
        sim.recorder.sent(elder.node, frame, 0)
        item = (elder.node, dst, frame, sim.incarnation[dst], -elder.serial)
        sim._push(elder.link_free + self._delay(elder.node, dst), sim._ARRIVE, item)

    def _arm(self, elder: Elder) -> None:
        t = elder.machine.get_timer()
        if t is None or elder.timer_at == t or elder.stopped is not None:
            return
        elder.timer_at = t
        self.members._push(max(t, self.sim.now), self.TIMER, (elder.node, elder.serial, t))

    def metrics(self) -> dict[str, Any]:
        return dict(self.counts)


__all__ = ["TWIN_GAP", "Elder", "Twins"]
