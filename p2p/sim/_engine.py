"""A deterministic discrete-event network that runs the sans-IO cores.

Events are ordered by ``(time, sequence number)``; all randomness comes from one
seeded :class:`random.Random`, so a run is a pure function of its inputs and a
failing property test replays from its seed.

Timing follows thesis §4.5.1: a node processes one input at a time (``t_pc``
each), then queues the packets it produced on its single outgoing link, which
transmits one packet per ``t_t``; each packet then propagates for ``t_pp``.
Propagation delays are drawn per packet, so links are not FIFO and a relayed
path can beat a direct one.
"""

from __future__ import annotations

import gc
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from causal import BroadcastConfig, MsgId, PacketLimits
from p2p._errors import P2PError
from p2p.machine import (
    Frontier,
    HistoryLimits,
    MachineOutput,
    NodeMachine,
    RecoveryConfig,
    Refused,
    Release,
)
from p2p.sim._delay import DelayModel
from p2p.sim._frames import (
    BroadcastCore,
    Frame,
    Part,
    join_frame,
    pack_frames,
    packets_body,
    part_size,
    parts_of,
)
from p2p.sim._links import LinkConfig, Links
from p2p.sim._members import _Halt, _Membership
from p2p.sim._queue import Entry, EventQueue
from p2p.sim._recorder import Recorder
from p2p.sim._scenario import ACTIONS
from p2p.sim._twin import Twins
from p2p.wire import WireLimits, decode_body, encode_packets
from topics import (
    Bundle,
    Delivered,
    Dropped,
    Event,
    Held,
    LocalProtocolError,
    Output,
    Packet,
    Published,
    PubSubConfig,
    Received,
    RemoteProtocolError,
    RoundAcked,
    Send,
    SRPTNode,
    Subscribed,
    VCubePS,
    preset_view,
)
from vcube import DetectorConfig, Hypercube

PROTOCOLS = ("vcube-ps", "srpt", "causal-broadcast")
MEMBERSHIP = ("detector", "oracle")
"""``detector``: NodeMachine and the real failure detector; ``oracle``: bare cores
told of failures by an oracle (the thesis' model)."""
AGGREGATION = ("on", "causal", "off")
"""``off``: none; ``causal``: timer-free causal aggregation in the cores only
(Algorithm 2; for VCube-PS its barrier-based version); ``on``: that plus link
coalescing in the per-link outbox (thesis §6.2.2.2 hybrid)."""

_ActionItem = tuple[str, int, str, bytes]
_PacketItem = tuple[int, int, Frame, int, int]
"""``(sender, dest, frame, dest incarnation, sender incarnation)``."""
_Deferred = tuple[int, int, str, tuple[Any, ...]]
"""``(node, incarnation, "arrive" | "act" | "notify" | "machine", arguments)``."""

DETECTOR = DetectorConfig(
    interval=1000.0, timeout=1000.0, attempts=2, max_timeout=8000.0, revive=2, revive_rounds=600
)
"""The runtime's default detector (``NodeConfig``: 1 s rounds, 1 s timeout, 2
attempts, stretch 8, a suspected member probed every 2 rounds for 10 minutes)
in u.t. read as milliseconds (propagation 100 u.t.)."""

Listener = Callable[["Simulation", int, float, Event], None]

LinkDelay = Callable[[int, int, random.Random], float]
"""Optional override of propagation delay: ``(src, dst, rng) -> t_pp``."""


class Core(Protocol):
    """What the simulator needs from a protocol core."""

    id: int

    def subscribe(self, topic: str, now: float) -> list[Output]: ...
    def unsubscribe(self, topic: str, now: float) -> list[Output]: ...
    def publish(self, topic: str, payload: bytes, now: float) -> list[Output]: ...
    def receive(self, sender: int, packet: Any, now: float) -> list[Output]: ...
    def is_subscribed(self, topic: str) -> bool: ...
    def idle(self) -> bool: ...
    @property
    def pending_max(self) -> int: ...


@dataclass(slots=True)
class _NodeClock:
    """The serial resources of one simulated node."""

    cpu_free: float = 0.0
    link_free: float = 0.0
    in_queue: deque[float] = field(default_factory=deque)  # departure times
    committed: float = 0.0
    """Latest instant stamped on the node's results so far (deliveries, calls)."""
    deferred: int = 0
    """Inputs waiting in the heap for the instant their processing ends (see
    ``Simulation._defers``); while any waits, later inputs wait too, so the
    node still handles its inputs in order."""


def _bucket_width(delays: DelayModel) -> float:
    """The event calendar's bucket width: a fraction of the typical hop delay, so
    the bucket being consumed stays a small heap (it sets speed, never order)."""
    return max(delays.tpc, delays.tt, delays.tpp_mean / 100, 1e-9)


class Simulation:
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
        if protocol not in PROTOCOLS:
            raise P2PError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
        if aggregation not in AGGREGATION:
            raise P2PError(f"unknown aggregation {aggregation!r}; choose one of {AGGREGATION}")
        self.aggregation = aggregation
        self.limits = limits or PacketLimits()
        self._last_frame: dict[tuple[int, int], Frame] = {}
        self._labels: dict[MsgId, str] = {}
        if len(set(node_ids)) != len(node_ids) or not node_ids:
            raise P2PError("node ids must be distinct and non-empty")
        self.protocol = protocol
        self.delays = delays or DelayModel()
        self.seed = seed
        self.rng = random.Random(seed)
        self.link_delay = link_delay
        self.overlay = Hypercube(node_ids)
        self.ids = list(node_ids)
        self.index = {n: i for i, n in enumerate(node_ids)}
        self.nodes: dict[int, Core] = {}
        """Each node's core (a ``NodeMachine``'s, for VCube-PS), read for views and stats."""
        if protocol != "vcube-ps":  # else each node's machine builds its core
            self.nodes = {n: self._make(n, config) for n in node_ids}
        self.clocks = {n: _NodeClock() for n in node_ids}
        self.machines: dict[int, NodeMachine] = {}
        """VCube-PS: each node's :class:`NodeMachine` (its core is ``nodes[n]``);
        membership comes from the real failure detector (``detector``) or from
        the oracle's crash and recovery notices to the machine."""
        self._frontiers: dict[int, Frontier] = {}
        """Ordinals and frontiers of nodes without a machine (:meth:`_frontier`)."""
        if type(history) is not int or history < 0:
            raise P2PError(f"history must be an int >= 0, got {history!r}")
        self.history = history
        """Publications each node keeps for subscribers that resume (with a
        ``detector``: the machines resume; without, gaps are only counted)."""
        self.now = 0.0
        self._heap = EventQueue(_bucket_width(self.delays))
        self._seq = 0
        self.recorder = Recorder(
            self.index,
            record_trace=record_trace,
            header=self.limits.header,
            record_links=record_links,
        )
        if (
            not (math.isfinite(detect_delay) and math.isfinite(detect_jitter))
            or min(detect_delay, detect_jitter) < 0
        ):  # NaN would compare false everywhere and disorder the event heap
            raise P2PError(
                f"detect_delay and detect_jitter must be finite and >= 0, "
                f"got {detect_delay!r} and {detect_jitter!r}"
            )
        self.config = config
        self.detect_delay = detect_delay
        self.detect_jitter = detect_jitter
        self.down: set[int] = set()
        """Nodes crashed and not recovered."""
        self.incarnation = dict.fromkeys(node_ids, 0)
        self._overlays: dict[frozenset[int], Hypercube] = {frozenset(node_ids): self.overlay}
        """The oracle mode's overlays, one per member set (shared by the machines)."""
        self.lost = 0
        """Link packets that arrived at a crashed node, or reached it but were still
        waiting for (or in) its processing when it crashed."""
        self.unsent = 0
        """Link packets dropped because their sender crashed before they left its link."""
        self._crashes: dict[int, list[float]] = {}
        """Scheduled CRASH times per node not yet run: work that would end after one
        of them is deferred to its end instant, so the crash can still stop it."""
        self._died: dict[tuple[int, int], float] = {}
        """``(node, incarnation) -> crash time`` of every incarnation that crashed."""
        self.pause_gc = True
        """Pause the cyclic garbage collector while :meth:`run` loops (see there)."""
        self.listeners: list[Listener] = []
        """Called as ``listener(sim, node, time, event)`` for every event a core emits;
        a listener may :meth:`schedule` more actions (reactive scenarios)."""
        self.detector = detector
        if introductions is not None and detector is None:
            raise P2PError("introductions need the failure detector (detector=...)")
        self.introductions = introductions
        """With a ``detector``: each node's seeds, whose addresses it knows when
        it starts (``--seed``; tried again while down); everyone else it learns
        from the membership records the machines spread.  ``None``: everyone
        knows everyone from the start.  With partial membership, the trace's
        ``publish`` lines carry the publisher's view (see ``p2p.sim._checks``)."""
        self.wire = WireLimits() if wire else None
        """With ``wire``: every core packet is encoded and decoded by the runtime's
        codec (``p2p.wire``) on its way, so a packet the runtime could not send
        is found here (:class:`~p2p.wire.WireError` raised), and receivers get
        what the runtime's would."""
        self._links: Links | None = None
        """The runtime's reliable links, from the first RESET scheduled on (``p2p.sim._links``)."""
        self.link_config = LinkConfig()
        """How those links re-dial (read when the first RESET is scheduled)."""
        self.segment: dict[int, str] = {}
        """Nodes moved off the unnamed network segment (PARTITION), by segment name."""
        self._segments_pending = False
        self._partitioned = False
        """A PARTITION was scheduled: publications carry their publisher's view
        in the trace, as with partial membership (a side's publisher cannot
        send to a subscriber it has not heard of across the cut)."""
        self._twins: Twins | None = None
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

        def make_core(incarnation: int) -> VCubePS:
            return cast(VCubePS, self._make(node, self.config, incarnation))

        return NodeMachine(
            node,
            inc,
            make_core,
            overlay=self._oracle_overlay,
            members=members,
            recovery=RecoveryConfig(history=HistoryLimits(count=0)),
            first_seq=first_seq,
            packets_admit=False,
        )

    def _oracle_overlay(self, members: frozenset[int], version: int) -> Hypercube:
        """One overlay per member set, shared by the machines that agree."""
        got = self._overlays.get(members)
        if got is None:
            got = self._overlays[members] = Hypercube(members)
        return got

    def _install(self, node: int, machine: NodeMachine) -> None:
        self.machines[node] = machine
        self.nodes[node] = machine.core

    def _make(self, node: int, config: PubSubConfig | None, incarnation: int = 0) -> Core:
        rng = random.Random(f"{self.seed}/{node}")
        aggregate = self.aggregation != "off"
        if self.protocol == "causal-broadcast":
            bconf = BroadcastConfig(aggregation=aggregate, limits=self.limits)
            return BroadcastCore(node, overlay=self.overlay, config=bconf, topics=self._labels)
        if self.protocol == "srpt":
            salt = self.seed.to_bytes(8, "big", signed=True)
            return SRPTNode(node, overlay=self.overlay, config=config, rng=rng, salt=salt)
        config = replace(config or PubSubConfig(), aggregation=aggregate)
        return VCubePS(node, overlay=self.overlay, config=config, rng=rng, incarnation=incarnation)

    def __repr__(self) -> str:
        return f"Simulation(n={len(self.ids)}, protocol={self.protocol}, now={self.now})"

    # ------------------------------------------------------------- scheduling

    _ACTION, _ARRIVE, _NOTIFY, _PROCESS = 0, 1, 2, 3
    _TIMER, _CONTROL, _HINT, _SEED, _SEEN = 4, 5, 6, 7, 8
    _SEGMENTS = 20
    """Network segments changed (PARTITION / HEAL) at this instant."""
    """Detector events (with ``detector``): a machine's timer, a control message
    arriving, a refused connection's hint reaching the sender, a seed to try
    again, a recovered node's new record seen on discovery."""

    def _push(self, time: float, kind: int, item: object) -> None:
        self._heap.push((time, self._seq, kind, item))
        self._seq += 1

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
            self._links = Links(self, self.link_config)
        if action == "TWIN" and self._twins is None:
            self._twins = Twins(self)
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

    def pending_events(self) -> int:
        return len(self._heap)

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

    def severed(self, a: int, b: int) -> bool:
        """Whether ``a`` and ``b`` sit on different network segments now (PARTITION)."""
        segment = self.segment
        return bool(segment) and segment.get(a, "") != segment.get(b, "")

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

    def _same_process(self, node: int, life: int) -> bool:
        """Whether ``life`` is an older incarnation of ``node``'s running process
        (it reincarnated, ``NodeMachine._reincarnate``): what was on its way to
        that life reaches the new core, as in the runtime, where the process
        and its connections stay."""
        members = self._members
        return members is not None and life in members.older_lives.get(node, ())

    def _to_older_life(self, node: int, life: int) -> bool:
        """:meth:`_same_process` for a link packet, counted when it holds
        (``membership_metrics()["older_life_packets"]``)."""
        if not self._same_process(node, life):
            return False
        assert self._members is not None
        self._members.counts["older_life_packets"] += 1
        return True

    def _defers(self, node: int, end: float) -> bool:
        """Whether work of ``node`` that ends at ``end`` must wait in the heap until then.

        A node is inert from its crash instant, so work whose results (deliveries,
        sends) would appear after a crash must not run before that crash is
        known.  Running it at once is exact when no crash of ``node`` is scheduled
        up to ``end`` (see :meth:`schedule` for crashes scheduled later), and it keeps crash-free
        runs event-for-event what they were; otherwise it waits for ``end``.
        """
        if self.clocks[node].deferred:
            return True
        crashes = self._crashes.get(node)
        return crashes is not None and any(t <= end for t in crashes)

    def _defer(self, at: float, node: int, what: str, args: tuple[Any, ...]) -> None:
        self.clocks[node].deferred += 1
        self._push(at, self._PROCESS, (node, self.incarnation[node], what, args))

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
        if start > self.now and self._defers(node, start):
            clock.cpu_free = start + self.delays.tpc
            self._defer(start, node, "act", (action, node, topic, payload, start))
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
            if self._members is not None:
                self._machine_receive(machine, sender, dest, packet, done)
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

    def _machine_receive(
        self, m: NodeMachine, sender: int, dest: int, packet: Frame, done: float
    ) -> None:
        """The node's machine takes the link packet (``NodeMachine.receive``, the
        runtime's door); a sender it believes crashed shows its new life first,
        as the record of a connection's first frame does in the runtime."""
        members = self._members
        assert members is not None
        if sender in m.dead and sender not in m.alive:
            members.restart_seen(dest, sender, done)
            if sender in m.dead and sender not in m.alive:  # still: the machine's own rule
                out = members.honest(m.receive(sender, packets_body(packet), done))
                members.carry_out(dest, done, out)
                return
        out = members.honest(m.receive(sender, packets_body(packet), done))
        self._emit(dest, done, done, cast(list[Output], out))
        self.recorder.pending_max[dest] = m.core.pending_max

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
        if start > self.now and self._defers(node, start):
            clock.cpu_free = start + self.delays.tpc
            self._defer(start, node, "notify", (node, about, inc, crash, start))
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

    def _emit(self, node: int, at: float, ready: float, outputs: list[Output]) -> None:
        """Record events at ``at``; queue the packets from ``ready`` on."""
        rec = self.recorder
        clock = self.clocks[node]
        if at > clock.committed:
            clock.committed = at
        listeners = self.listeners
        sends: list[Send] = []
        for o in outputs:
            if isinstance(o, Send):
                sends.append(o)
                continue
            if isinstance(o, Delivered):
                if not o.own:  # the envelope's ordinal: a gap before this delivery?
                    missed = self._hand(node, o, at)
                    if missed < 0:
                        continue  # held, or delivered already
                    if missed:
                        rec.gap(at, node, o.topic, o.id.source, missed)
                rec.delivered(at, node, o.topic, o.id, o.own)
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
            if listeners:
                for listener in listeners:
                    listener(self, node, at, o)
        if sends:
            self._ship(node, ready, sends)
        machine = self.machines.get(node)
        if machine is not None and self._members is not None:
            pending = machine.take_pending()
            if pending:
                self._members.carry_out(node, at, pending)

    def _hand(self, node: int, d: Delivered, at: float) -> int:
        """What the node's machine makes of the core's delivery ``d`` (missed
        before it, or negative: held or skipped); without a machine, the
        engine's own frontier counts."""
        machine = self.machines.get(node)
        if machine is not None:
            return machine.hand(d, at)
        return self._frontier(node).delivered(d.topic, d.id.source, d.payload)

    def released(self, node: int, at: float, o: Release) -> None:
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

    def _wire(self, src: int, dst: int, packet: Frame, ready: float) -> float:
        """Queue ``packet`` on ``src``'s link; returns when it would arrive."""
        clock = self.clocks[src]
        q = clock.in_queue
        while q and q[0] <= ready:
            q.popleft()
        free = clock.link_free
        packet.start = start = ready if ready >= free else free  # max(), without the call
        depart = start + self.delays.tt
        clock.link_free = depart
        q.append(depart)
        if self.link_delay is not None:
            tpp = self.link_delay(src, dst, self.rng)
        else:
            tpp = self.delays.propagation(self.rng)
        self.recorder.sent(src, packet, len(q) - 1)
        self._last_frame[(src, dst)] = packet
        return depart + tpp


__all__ = ["DETECTOR", "MEMBERSHIP", "PROTOCOLS", "Core", "LinkDelay", "Listener", "Simulation"]
