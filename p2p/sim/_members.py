"""The simulator's detector mode: one :class:`NodeMachine` per node (see :class:`_Membership`).

It works on the shared state (``p2p.sim._world``: the machines, the lives of
the processes, the queue, deferred work) and hands core outputs to the node
path (``_World._emit``, ``_World.released``).  It reaches the reliable links
(``p2p.sim._links``) and the ids started twice (``p2p.sim._twin``, which
imports this module; typed as ``p2p.sim._process.ElderRouting``) through the
references the engine gives it when it makes them.  Every process, the
newest of an id (:class:`_Newest`) or an older one still running, is a
``p2p.sim._process.Process`` that one loop drives (:meth:`_Membership.feed`,
:meth:`_Membership.frame`, :meth:`_Membership.drive`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any, cast

from p2p._errors import P2PError
from p2p.machine import (
    ExchangeWithSeed,
    HistoryLimits,
    MachineOutput,
    MemberDown,
    MemberUp,
    NodeMachine,
    RecoveryConfig,
    Refused,
    Reincarnated,
    Release,
    SendControl,
    SendExchange,
    Superseded,
)
from p2p.sim._frames import Frame, control_body, packets_body
from p2p.sim._links import Links
from p2p.sim._process import (
    SEED_BACKOFF,
    SEED_INTERVAL,
    ElderRouting,
    Process,
    addressed,
    sim_record,
    sim_revocations,
    verify_sim_record,
    verify_sim_revocations,
)
from p2p.sim._recorder import summarize
from p2p.sim._world import _World
from topics import Output, RemoteProtocolError, VCubePS


class _Newest:
    """The newest process of ``node``: the one the engine's tables hold."""

    __slots__ = ("members", "node")

    def __init__(self, members: _Membership, node: int) -> None:
        self.members = members
        self.node = node

    @property
    def machine(self) -> NodeMachine:
        return self.members.sim.machines[self.node]

    def send(self, o: SendControl | SendExchange | ExchangeWithSeed, start: float) -> None:
        self.members._send(self.node, o, start)

    def up(self, o: MemberUp, at: float) -> None:
        self.members._up(self.node, o, at)

    def down(self, o: MemberDown, at: float) -> None:
        self.members._down(self.node, o, at)

    def reincarnated(self, o: Reincarnated, at: float) -> None:
        self.members._reincarnated(self.node, o, at)

    def superseded(self, at: float) -> bool:
        """Never stops: no process of an id is newer than the newest."""
        return False

    def released(self, o: Release, at: float) -> None:
        self.members.sim.released(self.node, at, o)

    def emit(self, at: float, ready: float, outputs: list[Output]) -> None:
        if outputs:
            sim = self.members.sim
            clock = sim.clocks[self.node]
            clock.cpu_free = max(clock.cpu_free, ready)
            sim._emit(self.node, at, ready, outputs)

    def emit_frame(self, done: float, outputs: list[Any]) -> None:
        """Through the engine's packet path (``_World._emit``), which hands the
        machine's own outputs back to :meth:`_Membership.carry_out`."""
        sim = self.members.sim
        sim._emit(self.node, done, done, cast(list[Output], outputs))
        sim.recorder.pending_max[self.node] = self.machine.core.pending_max

    def arm(self) -> None:
        self.members._arm(self.node)


class _Halt(Exception):  # noqa: N818 (control flow, not an error)
    """Out of a timer event to :meth:`Simulation.run`: only the detector's own
    timers and messages are left, and they change nothing any more."""


class _Membership:
    """The simulator's detector mode: one :class:`NodeMachine` per node, run with
    the real failure detector, its timer and control messages as events.

    Control messages take a propagation delay drawn from a random stream of
    their own (so a run's pub/sub draws are those it has without the
    detector) and no link or CPU time; the core outputs of a verdict cost one
    ``t_pc``, like the oracle's notifications.  A packet or control message
    that reaches a crashed node is refused, and its sender hears of it one
    propagation later (TCP's reset, the runtime's hint that makes the
    detector probe at once).  A reincarnation (a node refuting a suspicion)
    ends its old life as a crash does: what was in flight to it is lost.
    """

    def __init__(self, sim: _World) -> None:
        if sim.protocol != "vcube-ps":
            raise P2PError(f"protocol {sim.protocol} has no failure detector (vcube-ps has)")
        assert sim.detector is not None
        self.sim = sim
        self.cfg = sim.detector
        self.rng = random.Random(f"{sim.seed}/detector")
        self.events = 0
        """Detector events in the queue (the rest is the run's work)."""
        self.halted = False
        self.converged: bool | None = None
        self.timer_at: dict[int, float] = {}
        self.hinted: set[tuple[int, int, int]] = set()
        self.detections: list[tuple[float, int, int, int, float | None]] = []
        """``(time, observer, suspected, incarnation, its crash time or None)``."""
        self.revoked: dict[int, float] = {}
        """Revoked nodes (``REVOKE``) and when the first member got the list."""
        self.dropped: list[tuple[float, int, int]] = []
        """``(time, member, revoked node)``: when each member dropped a revoked node."""
        self.log: list[tuple[float, int, str, int, str]] = []
        """Membership events as the runtime's ``Node.membership()`` gives them:
        ``(time, node, "joined" | "left", about, reason)``."""
        self.counts = dict.fromkeys(("control_sent", "control_lost", "hints", "reincarnations"), 0)
        self._quiet_since: float | None = None
        self._checked = -float("inf")
        self.links: Links | None = None
        """The reliable links, once the engine made them (the first RESET or
        PARTITION scheduled): a member that leaves a view drops its link."""
        self.twins: ElderRouting | None = None
        """The ids started twice, once the engine made them (the first TWIN)."""
        self._newest: dict[int, _Newest] = {}

    def newest(self, node: int) -> _Newest:
        """``node``'s newest process, for :meth:`drive`, :meth:`feed` and :meth:`frame`."""
        p = self._newest.get(node)
        if p is None:
            p = self._newest[node] = _Newest(self, node)
        return p

    # ------------------------------------------------------------ machines --

    @property
    def recovery(self) -> RecoveryConfig:
        """The runtime's resume settings in the simulator's time unit (its
        detector interval stands for the runtime's 1 s), keeping
        ``Simulation.history`` publications."""
        unit = self.cfg.interval
        defaults = RecoveryConfig()
        history = defaults.history
        return RecoveryConfig(
            history=HistoryLimits(
                count=self.sim.history, size=history.size, age=history.age * unit
            ),
            timeout=defaults.timeout * unit,
            spacing=defaults.spacing * unit,
        )

    def _machine(
        self, node: int, inc: int, members: dict[int, int], first_seq: int = 0
    ) -> NodeMachine:
        return self.sim.new_machine(
            node,
            inc,
            members,
            first_seq,
            detector=self.cfg,
            verify=verify_sim_record,
            verify_revocations=verify_sim_revocations,
            recovery=self.recovery,
            seed_interval=SEED_INTERVAL * self.cfg.interval,
            seed_backoff=SEED_BACKOFF * self.cfg.interval,
        )

    def start(self) -> None:
        """Every node knows every other at incarnation 0, or (with introductions)
        only its seeds, and sends them its records at once (a seed exchange);
        rounds start at a random phase."""
        sim = self.sim
        intro = sim.introductions
        for n in sim.ids:
            if intro is None:
                m = self._machine(n, 0, dict.fromkeys((o for o in sim.ids if o != n), 0))
            else:
                m = self._machine(n, 0, {})
            self._install(n, m)
        if intro is not None:
            for n in sim.ids:
                self._introduce(n, intro.get(n, ()))

    def _introduce(self, node: int, seeds: Iterable[int]) -> None:
        """``node`` knows only its seeds' addresses (``p2p node --seed``): its
        machine exchanges records with each at once and every
        ``seed_interval``, backing off while a seed is down
        (``p2p.machine._seeds``), as in the runtime."""
        sim = self.sim
        m = sim.machines[node]
        m.set_record(sim_record(node, sim.incarnation[node]))
        for k in sorted(set(seeds) - {node}):
            if k not in sim.nodes:
                raise P2PError(f"node {node} is introduced to unknown node {k}")
            m.add_seed(str(k), sim.now)
        self._arm(node)

    def _seed_outcome(self, src: int, dest: int, msg: object, reached: bool) -> None:
        """A seed exchange of ``src`` reached its seed ``dest`` or failed: its
        machine hears of it (a failure one propagation later, as a refused
        dial is seen), and schedules the next."""
        sim = self.sim
        if type(msg) is not ExchangeWithSeed or src in sim.down:
            return
        if reached:
            self.carry_out(src, sim.now, sim.machines[src].seed_reached(msg.address, dest, sim.now))
            return
        item = (src, sim.incarnation[src], dest)
        self._push(sim.now + self._delay(dest, src), sim._SEED, item)

    def _install(self, node: int, m: NodeMachine) -> None:
        self.sim.older_lives.pop(node, None)  # a new process
        self.sim.machines[node] = m
        self.sim.nodes[node] = m.core
        m.start_rounds(self.sim.now + self.rng.uniform(0, self.cfg.interval))
        self.timer_at.pop(node, None)
        self._arm(node)

    def restart(self, node: int, *, keep: bool = False) -> None:
        """RECOVER: a new process, a new incarnation, the fleet's records at hand
        (crashed members included: its detector finds them); ``keep``
        (RESTART): with the delivery frontier its node directory kept.  Everyone knowing
        everyone models mDNS, so the others see the new record one propagation
        later (:meth:`_announce`); with introductions it goes to the seeds."""
        sim = self.sim
        old = cast(VCubePS, sim.nodes[node])
        sim.down.discard(node)
        inc = sim.incarnation[node] = sim.incarnation[node] + 1
        intro = sim.introductions
        members = {} if intro is not None else {n: sim.incarnation[n] for n in sim.ids if n != node}
        m = self._machine(node, inc, members, first_seq=old.next_seq)
        if keep:
            m.restore_frontier(sim.machines[node].frontier.frontiers())
        for n, i in members.items():
            if i:  # their records say they restarted: their older lives are over
                m.recovered(n, i, sim.now)
        sim.clocks[node].cpu_free = max(sim.clocks[node].cpu_free, sim.now)
        self._install(node, m)
        if intro is not None:
            self._introduce(node, intro.get(node, ()))
        else:
            self._announce(node, inc)

    def _announce(self, node: int, inc: int) -> None:
        """Every other node sees ``node``'s record for ``inc`` (its mDNS
        announcement) one propagation later.  Without it, a node that came
        back and crashed again before it spoke to anyone was known alive only
        to nodes that restarted meanwhile (whose records at hand named it),
        and nobody ever tested that life (found by the detector property)."""
        sim = self.sim
        for other in sim.ids:
            if other != node:
                item = (other, sim.incarnation[other], node, inc)
                self._push(sim.now + self._delay(node, other), sim._SEEN, item)

    # -------------------------------------------------------------- events --

    def _push(self, time: float, kind: int, item: object) -> None:
        self.events += 1
        self.sim._push(time, kind, item)

    def _arm(self, node: int) -> None:
        """Queue ``node``'s timer if the machine moved it (stale ones are skipped)."""
        t = self.sim.machines[node].get_timer()
        if t is None or self.timer_at.get(node) == t:
            return
        self.timer_at[node] = t
        sim = self.sim
        self._push(max(t, sim.now), sim._TIMER, (node, sim.incarnation[node], t))

    def dispatch(self, kind: int, item: object) -> None:
        self.events -= 1
        sim = self.sim
        if kind == sim._TIMER:
            node, life, t = cast(tuple[int, int, float], item)
            if node in sim.down or life != sim.incarnation[node] or self.timer_at.get(node) != t:
                return
            del self.timer_at[node]
            self._input(node, sim._TIMER, ())
            self._maybe_halt()
        elif kind == sim._CONTROL:
            src, dest, msg, life = cast(tuple[int, int, Any, int], item)
            if self.twins is not None and self.twins.catch(src, dest, life, (msg,)):
                pass  # to the older process of an id started twice: it runs
            elif sim.severed(src, dest):  # lost on the way: no reset comes back
                self.counts["control_lost"] += 1
                self._seed_outcome(src, dest, msg, False)
            elif dest in sim.down or (
                life != sim.incarnation[dest] and not sim._same_process(dest, life)
            ):
                self.counts["control_lost"] += 1
                self.refused(src, dest, life)
                self._seed_outcome(src, dest, msg, False)
            else:
                if self.twins is not None:
                    self.twins.seen_newer(dest, src, max(sim.now, sim.clocks[dest].cpu_free))
                self._seed_outcome(src, dest, msg, True)
                self._input(dest, sim._CONTROL, (src, msg))
        elif kind == sim._SEEN:
            node, life, about, inc = cast(tuple[int, int, int, int], item)
            if sim.severed(node, about):
                pass  # the announcement does not cross a partition
            elif node not in sim.down and life == sim.incarnation[node]:
                self.feed(self.newest(node), sim._SEEN, (about, inc), sim.now)
            elif self.twins is not None:  # an older process of an id started twice hears it
                self.twins.seen(node, life, about, inc)
        else:
            node, life, about = cast(tuple[int, int, int], item)
            if node in sim.down or life != sim.incarnation[node]:
                return
            if kind == sim._HINT:
                self._input(node, sim._HINT, (about,))
            else:  # a seed exchange that failed
                self.feed(self.newest(node), sim._SEED, (about,), sim.now)

    def _record_of(self, m: NodeMachine, sender: int, at: float) -> list[Any]:
        """Core packets from ``sender``, which ``m`` believes crashed: in the
        runtime the first frame of every connection carries its dialler's
        record, and a restarted node dials anew, so ``m`` learns the sender's
        current incarnation before the packets reach its core (a relay's
        packets too, not only rounds it started: a relayed round from an
        unknown life was dropped and its ACK wave never completed)."""
        sim = self.sim
        inc = sim.incarnation[sender]
        if sim.introductions is None:
            return m.learn(sender, inc, at)
        return m.add_peer(*verify_sim_record(sim_record(sender, inc)), at)[1]

    def honest(self, out: list[Any]) -> list[Any]:
        """``out`` of ``NodeMachine.receive``, after checking that no member broke
        the protocol (:class:`Refused`, always last): simulated peers are
        honest, so one that is not revoked means a bug, raised as the
        machine's reason."""
        if out and type(out[-1]) is Refused and out[-1].peer not in self.revoked:
            raise RemoteProtocolError(out[-1].reason)
        return out

    def revoke(self, node: int, other: int) -> None:
        """A scenario's REVOKE: the fleet's list, revoking ``other`` too, reaches
        ``node`` (if up) as a file copied into its directory; the trace ends
        ``other``'s part (``Recorder.revoked``)."""
        sim = self.sim
        self.revoked.setdefault(other, sim.now)
        blob = sim_revocations(len(self.revoked), self.revoked)
        if other not in sim.recorder.silenced:
            sim.recorder.revoked(sim.now, other)
        if node not in sim.down:
            m = sim.machines[node]
            self.carry_out(node, sim.now, m.adopt_revocations(blob, sim.now))

    def hint(self, node: int, about: int) -> None:
        """A scenario's HINT: ``node``, if up, hears ``about`` may be gone."""
        if node not in self.sim.down:
            self._input(node, self.sim._HINT, (about,))

    def refused(self, src: int, dest: int, life: int) -> None:
        """Something ``src`` sent reached ``dest``'s crashed life ``life``: ``src``
        hears of it (once per life) one propagation later."""
        sim = self.sim
        key = (src, dest, life)
        if src in sim.down or key in self.hinted:
            return
        self.hinted.add(key)
        self.counts["hints"] += 1
        self._push(sim.now + self._delay(dest, src), sim._HINT, (src, sim.incarnation[src], dest))

    def _delay(self, src: int, dest: int) -> float:
        return self.sim.delay(src, dest, self.rng)

    def _input(self, node: int, kind: int, args: tuple[Any, ...]) -> None:
        """Like a notification: it waits for the node's CPU if work is deferred
        or a crash may come first (``Simulation._defers``)."""
        sim = self.sim
        start = max(sim.now, sim.clocks[node].cpu_free)
        if start > sim.now and sim._defers(node, start):
            sim._defer(start, node, "machine", (node, kind, args, start))
            return
        self.run_input(node, kind, args, start)

    def run_input(self, node: int, kind: int, args: tuple[Any, ...], start: float) -> None:
        """An input to ``node``'s newest process (``_input``, or deferred by it)."""
        self.feed(self.newest(node), kind, args, start)

    def feed(self, p: Process, kind: int, args: tuple[Any, ...], start: float) -> None:
        """One input to process ``p``'s machine at ``start``: a timer, a control
        message, an announcement, a hint or a failed seed exchange (a link
        packet goes through :meth:`frame`).  Its outputs are carried out
        (:meth:`drive`) and its timer re-read, for every process alike."""
        sim, m = self.sim, p.machine
        if kind == sim._TIMER:
            out = m.handle_timer(start)
        elif kind == sim._CONTROL:
            sender, msg = args
            out = self.honest(m.receive(sender, control_body(msg), start))
        elif kind == sim._SEEN:
            out = m.learn(args[0], args[1], start)
        elif kind == sim._SEED:
            out = m.seed_failed(str(args[0]), start)
        else:
            out = m.hint(args[0], start)
        self.drive(p, start, out)
        p.arm()

    def frame(self, p: Process, sender: int, packet: Frame, done: float) -> None:
        """A link packet from ``sender`` reaches process ``p``, its CPU time paid
        by ``done``: ``NodeMachine.receive``, the runtime's door.  A sender
        ``p`` believes crashed shows its new life first (:meth:`_record_of`)."""
        m = p.machine
        if sender in m.dead and sender not in m.alive:
            self.drive(p, done, self._record_of(m, sender, done))
            if sender in m.dead and sender not in m.alive:  # still: the machine's own rule
                self.drive(p, done, self.honest(m.receive(sender, packets_body(packet), done)))
                p.arm()
                return
        p.emit_frame(done, self.honest(m.receive(sender, packets_body(packet), done)))

    def carry_out(self, node: int, start: float, out: list[Any]) -> None:
        """Carry out outputs of ``node``'s newest machine made outside :meth:`feed`
        (a call, a seed reached, a revocation list, the machine outputs of a
        link packet); its timer may have moved."""
        p = self.newest(node)
        self.drive(p, start, out)
        p.arm()

    def drive(self, p: Process, start: float, out: list[Any], ready: float | None = None) -> None:
        """The one loop over a machine's outputs, for every process of every id.

        Machine outputs are carried out in order at ``start``; core outputs go
        to ``p.emit`` (sends leave from ``ready``: one ``t_pc`` after
        ``start`` unless the caller's CPU time already counts it), those
        before a release or a reincarnation first.  A process that stops on
        :class:`Superseded` carries out nothing after it."""
        if ready is None:
            ready = start + self.sim.delays.tpc
        core_out: list[Output] = []
        for o in out:
            kind = type(o)
            if kind is SendControl or kind is SendExchange or kind is ExchangeWithSeed:
                p.send(o, start)
            elif kind is MemberDown:
                p.down(o, start)
            elif kind is MemberUp:
                p.up(o, start)
            elif kind is Release:
                p.emit(start, ready, core_out)  # what came before it first
                core_out = []
                p.released(o, start)
            elif kind is Reincarnated:
                p.emit(start, ready, core_out)  # the old life's last outputs
                core_out = []
                p.reincarnated(o, start)
            elif kind is Superseded:
                if p.superseded(start):
                    return
            elif not isinstance(o, MachineOutput):  # the rest of the machine's: nothing to do
                core_out.append(o)
        p.emit(start, ready, core_out)

    def _up(self, node: int, o: MemberUp, at: float) -> None:
        self.log.append((at, node, "joined", o.node, o.reason))
        if self.twins is not None:
            self.twins.new_life(node, o, at)

    def _send(
        self, src: int, o: SendControl | SendExchange | ExchangeWithSeed, start: float
    ) -> None:
        sim = self.sim
        self.counts["control_sent"] += 1
        dest, msg = addressed(o)
        if self.twins is not None and self.twins.divert_control(src, dest, msg, start):
            return
        item = (src, dest, msg, sim.incarnation[dest])
        self._push(start + self._delay(src, dest), sim._CONTROL, item)

    def _down(self, observer: int, o: MemberDown, at: float) -> None:
        links = self.links
        if links is not None and o.was_up:
            links.dropped(observer, o.node, o.incarnation)
        if o.was_up:
            self.log.append((at, observer, "left", o.node, o.reason))
        if o.reason == "revoked":
            self.dropped.append((at, observer, o.node))
        if o.reason == "suspected":
            crashed = self.sim._died.get((o.node, o.incarnation))
            self.detections.append((at, observer, o.node, o.incarnation, crashed))

    def _reincarnated(self, node: int, o: Reincarnated, at: float) -> None:
        """The trace shows a crash and a recovery; the old life's links die."""
        sim = self.sim
        self.counts["reincarnations"] += 1
        self.sim.older_lives.setdefault(node, set()).add(o.previous)
        # Its queued timer names the older life and is skipped: the next _arm
        # must queue one for this life even if the machine's time is the same
        # (else the detector never ran again: partial seed 702530).
        self.timer_at.pop(node, None)
        sim._died[(node, o.previous)] = at
        sim.incarnation[node] = o.incarnation
        m = sim.machines[node]
        if m.record:
            m.set_record(sim_record(node, o.incarnation))
        sim.nodes[node] = m.core
        if self.links is not None:
            self.links.reincarnated(node)
        for link in [k for k in sim._last_frame if node in k]:
            del sim._last_frame[link]
        clock = sim.clocks[node]
        clock.link_free = at
        clock.in_queue.clear()
        sim.recorder.failure(at, node, True)
        sim.recorder.failure(at, node, False)
        for topic in sorted(m.topics):
            sim.recorder.call(at, node, "SUB", topic)

    # ------------------------------------------------------------- the end --

    def _maybe_halt(self) -> None:
        """Stop the run once only detector events are left and, checked at most
        every half round, every node that is up agrees on who is up and its
        core is idle (or that did not come ``100`` rounds after the work ran
        out).  A core may still wait for a round that only a later detector
        verdict ends (a child it never knew, reported dead by a member's
        detector): halting at agreement alone left it waiting."""
        sim = self.sim
        if sim.pending_events() != self.events or sim.segment:  # a partition in force is no end
            self._quiet_since = None
            return
        now = sim.now
        if self._quiet_since is None:
            self._quiet_since = now
        elif now - self._checked < self.cfg.interval / 2:
            return
        self._checked = now
        if self.agreed() and self._idle():
            self.converged = True
        elif now - self._quiet_since > 100 * self.cfg.interval:
            self.converged = self.agreed()
        else:
            return
        self.halted = True
        raise _Halt

    def quiet_from_now(self) -> None:
        """Something was scheduled: the quiet that may end the run starts again."""
        self._quiet_since = None

    def _idle(self) -> bool:
        """Every core of a node that is up has nothing in flight or queued, and
        no machine holds a topic for a resume."""
        sim = self.sim
        up = [n for n in sim.nodes if n not in sim.down and n not in self.revoked]
        return all(sim.nodes[n].idle() and not sim.machines[n].recovery.holding for n in up)

    def agreed(self) -> bool:
        """Every node that is up and not revoked holds exactly the others that are
        up and not revoked, at their current incarnations, as members, and no
        id started twice still has its older process running (``p2p.sim._twin``)."""
        sim = self.sim
        if self.twins is not None and self.twins.any_running():
            return False
        up = set(sim.ids) - sim.down - self.revoked.keys()
        for n in up:
            m = sim.machines[n]
            if len(m.alive) != len(up) - 1 or not m.alive < up:
                return False
            if any(m.incs[x] != sim.incarnation[x] for x in m.alive):
                return False
        return True

    def metrics(self) -> dict[str, Any]:
        crashed = [(at - t) for at, _, _, _, t in self.detections if t is not None]
        false = [d for d in self.detections if d[4] is None]
        cfg = self.cfg
        return {
            "detector": {
                "interval": cfg.interval,
                "timeout": cfg.timeout,
                "max_timeout": cfg.max_timeout,
                "attempts": cfg.attempts,
            },
            "detection": summarize(crashed),
            "false_suspicions": len(false),
            **self.counts,
            "older_life_packets": self.sim.older_life_packets,
            "converged": self.converged,
            "agreed": self.agreed(),
            **self._revocation_metrics(),
        }

    def _revocation_metrics(self) -> dict[str, Any]:
        """With REVOKE in the run: how long after the first member got the list
        each member dropped the revoked node (absent otherwise)."""
        if not self.revoked:
            return {}
        after = [at - self.revoked[node] for at, _, node in self.dropped]
        return {"revocation": {"revoked": len(self.revoked), "dropped": summarize(after)}}
