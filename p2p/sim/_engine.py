"""A deterministic discrete-event network that runs the sans-IO cores.

Events are ordered by ``(time, sequence number)``; all randomness comes from one
seeded :class:`random.Random`, so a run is a pure function of its inputs and a
failing property test replays from its seed.

:class:`Simulation` is the top of the simulator's parts, each of which only
depends on those below it: the shared state (``p2p.sim._world``), the node
path (``p2p.sim._nodes``: calls, packet arrivals, outputs, the link outbox),
the detector mode (``p2p.sim._members``), the reliable links
(``p2p.sim._links``) and ids started twice (``p2p.sim._twin``).  It adds the
construction of a run, the scenario actions (:meth:`Simulation.schedule`),
the event loop and its dispatch, the failure actions with the oracle mode's
detector, and the metrics.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from causal import PacketLimits
from p2p._errors import P2PError
from p2p.machine import HistoryLimits, NodeMachine, RecoveryConfig
from p2p.sim._delay import DelayModel
from p2p.sim._links import LinkConfig, Links
from p2p.sim._members import _Halt, _Membership
from p2p.sim._nodes import _Nodes, _PacketItem
from p2p.sim._queue import Entry
from p2p.sim._scenario import ACTIONS
from p2p.sim._twin import Twins
from p2p.sim._world import AGGREGATION, PROTOCOLS, Core, LinkDelay
from topics import Event, Output, PubSubConfig, preset_view
from vcube import DetectorConfig

MEMBERSHIP = ("detector", "oracle")
"""``detector``: NodeMachine and the real failure detector; ``oracle``: bare cores
told of failures by an oracle (the thesis' model)."""

_ActionItem = tuple[str, int, str, bytes]
_Deferred = tuple[int, int, str, tuple[Any, ...]]
"""``(node, incarnation, "arrive" | "act" | "notify" | "machine", arguments)``."""

DETECTOR = DetectorConfig(
    interval=1000.0, timeout=1000.0, attempts=2, max_timeout=8000.0, revive=2, revive_rounds=600
)
"""The runtime's default detector (``NodeConfig``: 1 s rounds, 1 s timeout, 2
attempts, stretch 8, a suspected member probed every 2 rounds for 10 minutes)
in u.t. read as milliseconds (propagation 100 u.t.)."""

Listener = Callable[["Simulation", int, float, Event], None]


class Simulation(_Nodes):
    """Runs one protocol core per node over a simulated network.

    ``node_ids`` may be any distinct 64-bit ids; the trace names nodes by
    their position in ``node_ids`` (so ``range(N)`` gives the thesis' dense ids).
    """

    def __init__(
        self,
        node_ids: Sequence[int],
        *,
        protocol: str = "vcube-ps",
        delays: DelayModel | None = None,
        seed: int = 0,
        config: PubSubConfig | None = None,
        link_delay: LinkDelay | None = None,
        record_trace: bool = True,
        aggregation: str = "on",
        limits: PacketLimits | None = None,
        record_links: bool = False,
        detect_delay: float = 1000.0,
        detect_jitter: float = 500.0,
        detector: DetectorConfig | None = None,
        introductions: Mapping[int, Iterable[int]] | None = None,
        wire: bool = False,
        history: int = 1000,
    ) -> None:
        super().__init__(
            node_ids,
            protocol=protocol,
            delays=delays,
            seed=seed,
            config=config,
            link_delay=link_delay,
            record_trace=record_trace,
            aggregation=aggregation,
            limits=limits,
            record_links=record_links,
            detector=detector,
            introductions=introductions,
            wire=wire,
            history=history,
        )
        self._frontiers = {}
        """Ordinals and frontiers of nodes without a machine (:meth:`_frontier`)."""
        if (
            not (math.isfinite(detect_delay) and math.isfinite(detect_jitter))
            or min(detect_delay, detect_jitter) < 0
        ):  # NaN would compare false everywhere and disorder the event heap
            raise P2PError(
                f"detect_delay and detect_jitter must be finite and >= 0, "
                f"got {detect_delay!r} and {detect_jitter!r}"
            )
        self.detect_delay = detect_delay
        self.detect_jitter = detect_jitter
        self.pause_gc = True
        """Pause the cyclic garbage collector while :meth:`run` loops (see there)."""
        self.listeners = []
        """Called as ``listener(sim, node, time, event)`` for every event a core emits;
        a listener may :meth:`schedule` more actions (reactive scenarios)."""
        if introductions is not None and detector is None:
            raise P2PError("introductions need the failure detector (detector=...)")
        self._links = None
        """The runtime's reliable links, from the first RESET scheduled on (``p2p.sim._links``)."""
        self.link_config = LinkConfig()
        """How those links re-dial (read when the first RESET is scheduled)."""
        self._segments_pending = False
        self._partitioned = False
        """A PARTITION was scheduled: publications carry their publisher's view
        in the trace, as with partial membership (a side's publisher cannot
        send to a subscriber it has not heard of across the cut)."""
        self._twins = None
        """Ids started twice (``p2p.sim._twin``), from the first TWIN scheduled on."""
        self._members = _Membership(self) if detector is not None else None
        if self._members is not None:
            self._members.start()
        elif protocol == "vcube-ps":
            for n in node_ids:
                others = {o: 0 for o in node_ids if o != n}
                self._install(n, self._oracle_machine(n, 0, others))

    def _oracle_machine(
        self, node: int, inc: int, members: dict[int, int], first_seq: int = 0
    ) -> NodeMachine:
        """A machine for the oracle mode: no detector, membership from the
        oracle's notices alone, no history (nobody resumes without a detector)."""

        return self.new_machine(
            node,
            inc,
            members,
            first_seq,
            recovery=RecoveryConfig(history=HistoryLimits(count=0)),
            packets_admit=False,
        )

    def _install(self, node: int, machine: NodeMachine) -> None:
        self.machines[node] = machine
        self.nodes[node] = machine.core

    def __repr__(self) -> str:
        return f"Simulation(n={len(self.ids)}, protocol={self.protocol}, now={self.now})"

    # ------------------------------------------------------------- scheduling

    def schedule(
        self, time: float, action: str, node: int, topic: str, payload: bytes = b""
    ) -> float:
        """Make ``node`` (an id) call SUB, UNS or PUB on ``topic`` at ``time``, or
        CRASH, RECOVER or RESTART (``topic`` ignored), or HINT: ``node`` hears that node
        ``int(topic)`` (an id) may be gone, as from a spoofed mDNS goodbye
        (needs the ``detector``), or RESET: the connections between ``node`` and
        node ``int(topic)`` break (``p2p.sim._links``; the first RESET
        scheduled switches every link to the runtime's reliable links), or
        TWIN: a second process starts with ``node``'s id (``p2p.sim._twin``;
        needs the ``detector`` and full membership; not with RESET).

        Crashes scheduled before the run starts are exact (see :meth:`_defers`);
        one scheduled mid-run (by a listener or a test stepping the run) for an
        instant the node's processed work already passed takes effect at the end
        of that work.  Returns the instant the action is scheduled for."""
        if action not in ACTIONS:
            raise P2PError(f"unknown action {action!r}")
        if node not in self.nodes:
            raise P2PError(f"unknown node {node}")
        # Checked here, not when the event runs: a NaN time disordered the
        # event heap, and a str payload failed deep inside the run.
        if not isinstance(time, int | float) or not math.isfinite(time):
            raise P2PError(f"time must be a finite number, got {time!r}")
        if action in ("SUB", "UNS", "PUB") and (not isinstance(topic, str) or not topic):
            raise P2PError(f"{action} needs a topic, got {topic!r}")
        if action == "PUB" and not isinstance(payload, bytes):
            raise P2PError(f"PUB payload must be bytes, got {type(payload).__name__}")
        if action in ("HINT", "REVOKE") and self._members is None:
            raise P2PError(f"{action} needs the failure detector (--membership detector)")
        other = int(topic) if topic.isdigit() else None
        if action in ("HINT", "RESET", "REVOKE") and other not in self.nodes:
            raise P2PError(f"{action} names unknown node {topic!r}")
        if action == "RESET" and other == node:
            raise P2PError(f"RESET of node {node}'s connection to itself")
        if action in ("PARTITION", "HEAL") and self._members is None:
            raise P2PError(f"{action} needs the failure detector (--membership detector)")
        if action == "PARTITION":
            self._partitioned = True
        if action in ("RESET", "PARTITION") and self._links is None:
            members = self._members
            self._links = Links(
                self, self.link_config, None if members is None else members.refused
            )
            if members is not None:
                members.links = self._links
        if action == "TWIN" and self._twins is None:
            self._twins = Twins(self, self._members)  # it needs the detector mode
            assert self._members is not None
            self._members.twins = self._twins
        if self._links is not None and self._twins is not None:
            raise P2PError("RESET and TWIN (or PARTITION and TWIN) in one run are not modelled yet")
        at = max(time, self.now)
        if self._members is not None:
            self._members.halted = False
            self._members.quiet_from_now()
        if action == "CRASH":
            # Scheduled mid-run, a crash cannot undo results already stamped
            # later than ``time``: it happens right after them.
            at = max(at, self.clocks[node].committed)
            self._crashes.setdefault(node, []).append(at)
        self._push(at, self._ACTION, (action, node, topic, payload))
        return at

    def preset_subscriptions(self, topic: str, subscribers: Iterable[int]) -> None:
        """Oracle start: every node already knows ``subscribers`` of ``topic``."""
        subs = list(subscribers)
        if self.protocol == "causal-broadcast":  # no subscriptions: only the trace needs it
            for n in subs:
                self.recorder.preset(n, topic)
            return
        shared = preset_view(subs)
        for n, core in self.nodes.items():
            machine = self.machines.get(n)
            if machine is not None:
                machine.preset_subscription(topic, subs, shared)
            else:
                core.preset_subscription(topic, subs, shared=shared)  # type: ignore[attr-defined]
        for n in subs:
            self.recorder.preset(n, topic)

    # ---------------------------------------------------------------- running

    def step(self) -> bool:
        """Process the next event; ``False`` when nothing is left to do."""
        entry = self._heap.pop_until(None)
        if entry is None or (self._members is not None and self._members.halted):
            return False
        try:
            self._dispatch(entry)
        except _Halt:
            return False
        return True

    def link_metrics(self) -> dict[str, Any]:
        """What the reliable links did (empty if no RESET was scheduled): resets,
        re-dials, frames lost in flight and resent, duplicates dropped."""
        return {} if self._links is None else self._links.metrics()

    def twin_metrics(self) -> dict[str, Any]:
        """What ids started twice did (empty if no TWIN was scheduled): second
        starts, older processes superseded (stopped), their reincarnations and
        deliveries, notices sent to them, what reached them after they stopped."""
        return {} if self._twins is None else self._twins.metrics()

    def membership_metrics(self) -> dict[str, Any]:
        """What the failure detector did (empty without ``detector``): detection
        latency of each crash at each node that was up, false suspicions,
        reincarnations, control messages, and whether membership converged."""
        return {} if self._members is None else self._members.metrics()

    def membership_events(self) -> list[tuple[float, int, str, int, str]]:
        """Every node's membership events, as the runtime's ``Node.membership()``
        gives them: ``(time, node, "joined" | "left", about, reason)`` (empty
        without ``detector``)."""
        return [] if self._members is None else list(self._members.log)

    def detection_bound(self) -> float:
        """How long after a crash every node that is up suspects it, at most, when
        one-way delays stay below ``tpp_mean + 4 tpp_stdev + t_pc`` (``vcube``'s
        completeness with adaptive timeouts): the checker probes within two
        rounds, suspects ``attempts + 1`` timeouts of at most ``max_timeout``
        later (plus ``2 max_timeout`` if it heard from nobody meanwhile: the
        isolation hold), and the push reaches everyone in one walk down a tree
        of depth ``ceil(log2 N)``.  ``inf`` without a detector."""
        cfg = self.detector
        if cfg is None:
            return math.inf
        d = self.delays
        delta = d.tpp_mean + 4 * d.tpp_stdev + d.tpc
        depth = math.ceil(math.log2(max(2, len(self.ids))))
        ceiling = cfg.max_timeout or cfg.timeout
        probe = (cfg.attempts + 1) * ceiling + (2 * ceiling if cfg.max_timeout else 0.0)
        return 2 * cfg.interval + probe + depth * delta

    def _dispatch(self, entry: Entry) -> None:
        """Run one event popped from the queue (packet arrivals, the bulk, first)."""
        time, _, kind, item = entry
        self.now = time
        if kind == 1:  # _ARRIVE, the bulk: a literal, not a class attribute look-up
            self._on_arrival(cast(_PacketItem, item))
        elif kind == self._ACTION:
            action, node, topic, payload = cast(_ActionItem, item)
            if action in ("CRASH", "RECOVER", "RESTART"):
                if action == "CRASH":
                    self._crashes[node].remove(time)
                self._fail(action, node)
            elif action == "HINT":
                assert self._members is not None
                self._members.hint(node, int(topic))
            elif action == "REVOKE":
                assert self._members is not None
                self._members.revoke(node, int(topic))
            elif action == "RESET":
                assert self._links is not None
                self._links.reset(node, int(topic))
            elif action == "TWIN":
                assert self._twins is not None
                self._twins.start(node)
            elif action in ("PARTITION", "HEAL"):
                self._move(node, topic if action == "PARTITION" else "")
            else:
                self._act(action, node, topic, payload)
        elif kind == self._NOTIFY:
            self._notify(*cast(tuple[int, int, int, bool], item))
        elif kind == self._PROCESS:
            self._run_deferred(cast(_Deferred, item))
        elif kind == self._SEGMENTS:
            self._segments_changed()
        elif kind >= Twins.TIMER:
            assert self._twins is not None
            self._twins.dispatch(kind, item)
        elif kind >= Links.ARRIVE:
            assert self._links is not None
            self._links.dispatch(kind, item)
        else:
            assert self._members is not None
            self._members.dispatch(kind, item)

    def _move(self, node: int, side: str) -> None:
        """PARTITION / HEAL: ``node`` is on segment ``side`` from now on.  The
        links are looked at once every move of this instant is made (an event
        queued behind them), so nodes that move together keep their connections."""
        if side:
            self.segment[node] = side
        else:
            self.segment.pop(node, None)
        if not self._segments_pending:
            self._segments_pending = True
            self._push(self.now, self._SEGMENTS, None)

    def _segments_changed(self) -> None:
        self._segments_pending = False
        assert self._links is not None
        self._links.segments_changed()

    def _run_deferred(self, item: _Deferred) -> None:
        """Do deferred work now, at its end instant, if its incarnation still runs."""
        node, life, what, args = item
        self.clocks[node].deferred -= 1
        if node in self.down or life != self.incarnation[node]:
            if what == "arrive":
                self.lost += 1  # it was still being processed when the node crashed
            elif what == "act":
                self.recorder.refused(self.now, node, args[0], args[2], "node crashed first")
            return
        if what == "arrive":
            self._receive(*args)
        elif what == "act":
            self._call(*args)
        elif what == "machine":
            assert self._members is not None
            self._members.run_input(*args)
        else:
            self._detected(*args)

    def run(self, until: float | None = None, max_events: int | None = None) -> int:
        """Run until no event is left (or ``until`` / ``max_events``); returns events run.

        With :attr:`pause_gc`, Python's cyclic garbage collector is off while the
        loop runs (and back on after).  The run keeps O(N^2) live objects (what
        each node received), so every collection scans more of them as N grows:
        at 256 nodes it took a third of the wall time.  The engine and the cores
        build no reference cycles (a run leaves no cyclic garbage); reference
        counting still frees everything else at once.
        """
        if self._members is not None and self._members.halted:
            return 0
        paused = self.pause_gc and gc.isenabled()
        if paused:
            gc.disable()
        pop, dispatch, arrival = self._heap.pop_until, self._dispatch, self._on_arrival
        limit = float("inf") if max_events is None else max_events
        done = 0
        try:
            while done < limit:
                entry = pop(until)
                if entry is None:
                    break
                if entry[2] == 1:  # _ARRIVE, the bulk: _dispatch's first branch, inlined
                    self.now = entry[0]
                    arrival(cast(_PacketItem, entry[3]))
                else:
                    dispatch(entry)
                done += 1
        except _Halt:  # the detector's timers alone are left, and membership converged
            done += 1
        finally:
            if paused:
                gc.enable()
        if until is not None and self.now < until and not self._heap:
            self.now = until
        return done

    @property
    def out(self) -> set[int]:
        """Nodes out of the fleet: crashed, or revoked (``REVOKE``: still running,
        refused by the members)."""
        return self.down | self.recorder.silenced

    def quiescent(self) -> bool:
        """No packet in flight and every member that is up idle (the detector's own
        timers and messages never end, so they do not count)."""
        detector = 0 if self._members is None else self._members.events
        out = self.out
        idle = all(c.idle() for n, c in self.nodes.items() if n not in out)
        idle = idle and not any(
            m.recovery.holding for n, m in self.machines.items() if n not in out
        )
        return len(self._heap) == detector and idle

    # --------------------------------------------------------------- failures

    def _fail(self, action: str, node: int) -> None:
        """CRASH: ``node`` stops at once (packets to it are lost, its calls refused).
        RECOVER: it restarts empty as a new incarnation (counters continue, so
        trace ids stay unique).  RESTART: the same, with what its node
        directory keeps (its delivery frontier, so it resumes).  Every other
        node hears of either after
        ``detect_delay`` plus a per-node uniform ``detect_jitter``: an oracle
        failure detector, eventually perfect, with the timing the real one has."""
        if self.protocol != "vcube-ps":
            raise P2PError(f"protocol {self.protocol} does not handle failures")
        crash = action == "CRASH"
        if (node in self.down) == crash:
            self.recorder.refused(self.now, node, action, "", "already " + action.lower() + "ed")
            return
        if crash:
            self.down.add(node)
            self._died[(node, self.incarnation[node])] = self.now
            if self._links is not None:
                self._links.crashed(node)
            # Work reserved beyond this instant is abandoned (see _run_deferred).
            clock = self.clocks[node]
            clock.cpu_free = clock.link_free = self.now
            clock.in_queue.clear()
        elif self._members is not None:
            self._members.restart(node, keep=action == "RESTART")
        else:
            self._oracle_restart(node, keep=action == "RESTART")
        # A frame queued to or from the old incarnation is lost with it: later
        # parts must not ride in it (see _ship).
        for link in [k for k in self._last_frame if node in k]:
            del self._last_frame[link]
        self.recorder.failure(self.now, node, crash)
        if self._members is not None:
            return  # the other nodes' detectors find out
        inc = self.incarnation[node]
        for other in self.ids:
            if other != node:
                delay = self.detect_delay + self.rng.uniform(0, self.detect_jitter)
                self._push(self.now + delay, self._NOTIFY, (other, node, inc, crash))

    def _oracle_restart(self, node: int, *, keep: bool = False) -> None:
        """RECOVER (or RESTART, ``keep``: its frontier kept) in the oracle mode: a
        new process, whose detector tells it at once who is down and the
        current incarnation of who came back (so their older lives are dead)."""
        old = self.machines[node]
        self.down.discard(node)
        inc = self.incarnation[node] = self.incarnation[node] + 1
        up = {n: self.incarnation[n] for n in self.ids if n != node and n not in self.down}
        m = self._oracle_machine(node, inc, up, first_seq=old.core.next_seq)
        if keep:  # what its node directory kept
            m.restore_frontier(old.frontier.frontiers())
        for n in self.down:
            m.crashed(n, self.incarnation[n], self.now)  # nothing to repair yet
        for n, i in up.items():
            if i:
                m.recovered(n, i, self.now)  # nothing subscribed to announce
        self._install(node, m)
        self.clocks[node].cpu_free = max(self.clocks[node].cpu_free, self.now)

    def _notify(self, node: int, about: int, inc: int, crash: bool) -> None:
        """``node``'s failure detector reports ``about`` crashed (or back)."""
        if node in self.down or self.machines[node].stale(about, inc, crash):
            return
        clock = self.clocks[node]
        start = max(self.now, clock.cpu_free)
        if self._busy_until(node, start, "notify", (node, about, inc, crash, start)):
            return
        self._detected(node, about, inc, crash, start)

    def _detected(self, node: int, about: int, inc: int, crash: bool, start: float) -> None:
        """The node's machine takes the oracle's notice at ``start`` (a node back
        with a new incarnation means the previous one crashed, whether or not
        that news came first)."""
        machine = self.machines[node]
        if machine.stale(about, inc, crash):
            return
        out = machine.crashed(about, inc, start) if crash else machine.recovered(about, inc, start)
        clock = self.clocks[node]
        clock.cpu_free = max(clock.cpu_free, start + self.delays.tpc)
        self._emit(node, start, start + self.delays.tpc, cast(list[Output], out))


__all__ = [
    "AGGREGATION",
    "DETECTOR",
    "MEMBERSHIP",
    "PROTOCOLS",
    "Core",
    "LinkDelay",
    "Listener",
    "Simulation",
]
