"""What every part of the simulator shares: the world the nodes live in.

:class:`_World` holds the state the engine (``p2p.sim._engine``), the node
path (``p2p.sim._nodes``) and the parts that model the runtime's machinery
(``p2p.sim._members``, ``p2p.sim._links``, ``p2p.sim._twin``) all read and
write: the node ids, each node's core, machine and serial resources
(:class:`_NodeClock`), the event queue (:meth:`_World._push`), the lives of the
processes (``down``, ``incarnation``, ``_died``, ``older_lives``), the work a
scheduled crash may still stop (:meth:`_World._defers`), the outgoing links
(:meth:`_World._wire`), the network segments and the recorder.  It imports no
other part of the engine: every part depends on it, never the other way,
and what the parts ask of the node path (:meth:`_World._arrive`,
:meth:`_World._emit`, :meth:`_World.released`) is declared here and
implemented there.

Events are ordered by ``(time, sequence number)``; all randomness comes from one
seeded :class:`random.Random` (and streams of the parts' own, seeded from it),
so a run is a pure function of its inputs.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from causal import BroadcastConfig, MsgId, PacketLimits
from p2p._errors import P2PError
from p2p.machine import NodeMachine, Release
from p2p.sim._delay import DelayModel
from p2p.sim._frames import BroadcastCore, Frame
from p2p.sim._queue import EventQueue
from p2p.sim._recorder import Recorder
from p2p.wire import WireLimits
from topics import Output, PubSubConfig, SRPTNode, VCubePS
from vcube import DetectorConfig, Hypercube

PROTOCOLS = ("vcube-ps", "srpt", "causal-broadcast")
AGGREGATION = ("on", "causal", "off")
"""``off``: none; ``causal``: timer-free causal aggregation in the cores only
(Algorithm 2; for VCube-PS its barrier-based version); ``on``: that plus link
coalescing in the per-link outbox (thesis §6.2.2.2 hybrid)."""

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
    ``_World._defers``); while any waits, later inputs wait too, so the
    node still handles its inputs in order."""


def _bucket_width(delays: DelayModel) -> float:
    """The event calendar's bucket width: a fraction of the typical hop delay, so
    the bucket being consumed stays a small heap (it sets speed, never order)."""
    return max(delays.tpc, delays.tt, delays.tpp_mean / 100, 1e-9)


class _World:
    """The state every part of one simulation shares (see the module docstring).

    ``node_ids`` may be any distinct 64-bit ids; the trace names nodes by
    their position in ``node_ids`` (so ``range(N)`` gives the thesis' dense ids).
    """

    def __init__(
        self,
        node_ids: Sequence[int],
        *,
        protocol: str,
        delays: DelayModel | None,
        seed: int,
        config: PubSubConfig | None,
        link_delay: LinkDelay | None,
        record_trace: bool,
        aggregation: str,
        limits: PacketLimits | None,
        record_links: bool,
        detector: DetectorConfig | None,
        introductions: Mapping[int, Iterable[int]] | None,
        wire: bool,
        history: int,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise P2PError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
        if aggregation not in AGGREGATION:
            raise P2PError(f"unknown aggregation {aggregation!r}; choose one of {AGGREGATION}")
        self.aggregation = aggregation
        self.limits = limits or PacketLimits()
        self._last_frame: dict[tuple[int, int], Frame] = {}
        """The last link packet queued on each link ``(src, dst)``: parts join it
        while it has not started transmitting (``Simulation._ship``)."""
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
        self._overlays: dict[frozenset[int], Hypercube] = {frozenset(node_ids): self.overlay}
        """The machines' overlays, one per member set (a bounded cache)."""
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
        self.config = config
        self.down: set[int] = set()
        """Nodes crashed and not recovered."""
        self.incarnation = dict.fromkeys(node_ids, 0)
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
        self.older_lives: dict[int, set[int]] = {}
        """The incarnations a node's running process had before it reincarnated
        (``NodeMachine._reincarnate``, detector mode only; ``p2p.sim._members``
        fills it): a control message or a link packet sent to one of them
        still reaches it, as in the runtime, where it is the same process
        (:meth:`_same_process`)."""
        self.older_life_packets = 0
        """Link packets that reached a node's running process through an older
        life (``membership_metrics()["older_life_packets"]``)."""
        self.detector = detector
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
        self.segment: dict[int, str] = {}
        """Nodes moved off the unnamed network segment (PARTITION), by segment name."""

    def shared_overlay(self, members: frozenset[int], version: int) -> Hypercube:
        """One overlay per member set, shared by the machines that agree
        (``NodeMachine``'s ``overlay``; a bounded cache)."""
        got = self._overlays.get(members)
        if got is None:
            if len(self._overlays) > 64:
                self._overlays = {frozenset(self.ids): self.overlay}
            got = self._overlays[members] = Hypercube(members)
        return got

    def _make(self, node: int, config: PubSubConfig | None, incarnation: int = 0) -> Core:
        """A new core for ``node`` (for VCube-PS, what its machine's ``make_core`` builds)."""
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

    # ------------------------------------------------------------ the queue

    _ACTION, _ARRIVE, _NOTIFY, _PROCESS = 0, 1, 2, 3
    """Event kinds: a scheduled action, a link packet arriving, an oracle
    notice, deferred work (:meth:`_defer`).  ``Links`` and ``Twins`` use 9 to 14."""
    _TIMER, _CONTROL, _HINT, _SEED, _SEEN = 4, 5, 6, 7, 8
    """Detector events (with ``detector``): a machine's timer, a control message
    arriving, a refused connection's hint reaching the sender, a seed to try
    again, a recovered node's new record seen on discovery."""
    _SEGMENTS = 20
    """Network segments changed (PARTITION / HEAL) at this instant."""

    def _push(self, time: float, kind: int, item: object) -> None:
        self._heap.push((time, self._seq, kind, item))
        self._seq += 1

    def pending_events(self) -> int:
        return len(self._heap)

    # ------------------------------------------------- lives and deferred work

    def _same_process(self, node: int, life: int) -> bool:
        """Whether ``life`` is an older incarnation of ``node``'s running process
        (it reincarnated, ``NodeMachine._reincarnate``): what was on its way to
        that life reaches the new core, as in the runtime, where the process
        and its connections stay."""
        return life in self.older_lives.get(node, ())

    def _to_older_life(self, node: int, life: int) -> bool:
        """:meth:`_same_process` for a link packet, counted when it holds
        (``membership_metrics()["older_life_packets"]``)."""
        if not self._same_process(node, life):
            return False
        self.older_life_packets += 1
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

    def _busy_until(self, node: int, start: float, what: str, args: tuple[Any, ...]) -> bool:
        """A call or notice of ``node`` that waits for its CPU until ``start``: if
        it must wait in the heap (:meth:`_defers`), the CPU is taken for one
        ``t_pc`` from ``start`` and the work queued; whether it was."""
        if start > self.now and self._defers(node, start):
            self.clocks[node].cpu_free = start + self.delays.tpc
            self._defer(start, node, what, args)
            return True
        return False

    def delay(self, src: int, dst: int, rng: random.Random) -> float:
        """One propagation delay from ``src`` to ``dst`` drawn from ``rng`` (the
        scenario's per-link delays, else the delay model's)."""
        if self.link_delay is not None:
            return self.link_delay(src, dst, rng)
        return self.delays.propagation(rng)

    def new_machine(
        self, node: int, inc: int, members: dict[int, int], first_seq: int, **settings: Any
    ) -> NodeMachine:
        """A :class:`NodeMachine` for ``node``'s process ``inc``, its cores made as
        this simulation makes them, on the overlay cache every machine shares;
        ``settings``: the membership mode's (detector, recovery, seeds...)."""

        def make_core(incarnation: int) -> VCubePS:
            return cast(VCubePS, self._make(node, self.config, incarnation))

        return NodeMachine(
            node,
            inc,
            make_core,
            overlay=self.shared_overlay,
            members=members,
            first_seq=first_seq,
            **settings,
        )

    # ------------------------------------------------------- links, segments

    def severed(self, a: int, b: int) -> bool:
        """Whether ``a`` and ``b`` sit on different network segments now (PARTITION)."""
        segment = self.segment
        return bool(segment) and segment.get(a, "") != segment.get(b, "")

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

    # ------------------------------------------ what the node path implements

    def _arrive(self, sender: int, dest: int, packet: Frame) -> None:
        """A link packet arrives at ``dest`` (``Simulation._arrive``)."""
        raise NotImplementedError

    def _emit(self, node: int, at: float, ready: float, outputs: list[Output]) -> None:
        """Record ``node``'s core outputs at ``at``; queue its packets from ``ready``
        on (``Simulation._emit``)."""
        raise NotImplementedError

    def released(self, node: int, at: float, o: Release) -> None:
        """The machine hands on a recovered or held delivery (``Simulation.released``)."""
        raise NotImplementedError
