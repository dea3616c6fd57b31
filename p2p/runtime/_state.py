"""The node's state: what one :class:`~p2p.runtime.Node` holds, and its
authenticated connections to peers.

:class:`_NodeState` creates the :class:`~p2p.machine.NodeMachine` and every
table, counter and queue of the node; the classes above it
(:mod:`~p2p.runtime._driver`, :mod:`~p2p.runtime._serve`,
:mod:`~p2p.runtime._node`) add behaviour, never state of their own.
Invariant: the membership tables (``peers``, ``_alive``, ``_incs``, ``_dead``,
``_revoked``) are the machine's own objects, read here on hot
paths and never reassigned; only the machine changes them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from causal import MsgId
from p2p._errors import NodeError, SecurityError
from p2p._identity import Fleet, NodeIdentity
from p2p._membership import Peer
from p2p._revocation import RevocationList
from p2p._secure import SecureSession, sign_record
from p2p._transport import Quiet, dial_secure, fd_budget, verified_peer
from p2p.machine import ENVELOPE_SIZE, HistoryLimits, LeaveSeed, NodeMachine, RecoveryConfig
from p2p.runtime._config import NodeConfig, TraceHook
from p2p.runtime._delivery import _STAMP_SIZE, MembershipEvent, Subscription
from p2p.runtime._frontier_file import FrontierStore
from p2p.runtime._link import _Link
from p2p.runtime._liveness import (
    INC_FIELD,
    detector_config,
    incarnation_of,
    new_incarnation,
    next_incarnation,
)
from p2p.wire import WireLimits
from topics import VCubePS
from vcube import Detector, Hypercube

if TYPE_CHECKING:  # the recorder is imported when a node records telemetry
    from p2p.machine import Release
    from p2p.telemetry._recorder import Recorder
    from topics import Delivered, DeliveredRun, Received

log = logging.getLogger("p2p.node")


@dataclass(slots=True)
class _Pending:
    """An accepted connection whose handshake is under way."""

    host: str
    scope: trio.CancelScope
    """Cancels the handshake (eviction)."""
    stream: trio.SocketStream
    since: float
    """When it was accepted (trio's clock)."""
    heard: bool = False
    """The peer's first handshake message was accepted: a member's dial sends it
    at once, so a pending connection that never spoke is the likeliest junk."""

    def hear(self) -> None:
        self.heard = True

    def silent(self) -> bool:
        return not self.heard and not self.stream.socket.is_readable()


class _NodeState:
    """The state of a :class:`~p2p.runtime.Node` and its secure connections."""

    def __init__(
        self,
        identity: NodeIdentity,
        fleet: Fleet,
        config: NodeConfig,
        trace: TraceHook | None = None,
    ) -> None:
        self.identity = identity
        self.fleet = fleet
        self.config = config
        self.id = identity.node_id
        self.port = 0
        # The core and the wire carry the payload behind the machine's envelope
        # and the 8-byte stamp (_STAMP), so they allow max_payload + 24 and the
        # application gets max_payload exactly.
        head = ENVELOPE_SIZE + _STAMP_SIZE
        stamped = replace(config.pubsub, max_payload=config.pubsub.max_payload + head)

        def make_core(incarnation: int) -> VCubePS:
            return VCubePS(
                self.id, overlay=Hypercube([self.id]), config=stamped, incarnation=incarnation
            )

        dcfg = None
        if config.detector:
            dcfg = detector_config(
                config.detector_interval,
                config.detector_timeout,
                config.detector_attempts,
                config.detector_stretch,
                config.detector_revive,
            )

        def verify(record: bytes) -> tuple[Peer, int]:
            peer = self.verify(record)
            return peer, incarnation_of(peer)

        def verify_revocations(blob: bytes) -> tuple[int, frozenset[int]]:
            rl = RevocationList.decode(blob)
            rl.verify(self.fleet)
            return rl.serial, frozenset(rl.nodes)

        self.machine = NodeMachine(
            self.id,
            new_incarnation(),
            make_core,
            detector=dcfg,
            incarnations=next_incarnation,
            verify=verify,
            verify_revocations=verify_revocations,
            seed_interval=config.seed_interval,
            recovery=RecoveryConfig(
                history=HistoryLimits(
                    count=config.history_count, size=config.history_bytes, age=config.history_age
                ),
                timeout=config.resume_timeout,
            ),
        )
        """Membership, the failure detector and the core, sans-IO (``p2p.machine``):
        this class carries out its outputs and feeds it frames, hints and timers."""
        self._alive = self.machine.alive
        """The machine's own tables, read on hot paths (never assigned here)."""
        self._incs = self.machine.incs
        self._dead = self.machine.dead
        self.quiet = Quiet(log)
        """Expected network failures: one warning per cause and peer per 10 s."""
        self._handshakes: dict[int, _Pending] = {}
        """Handshakes under way, oldest first (admission caps and eviction,
        ``_Server._admission_wait`` and ``_Server._make_room``)."""
        self._slot_freed = trio.Event()
        """Set when a handshake ends: the accept loop waits on it while full."""
        self._tickets = 0
        self._max_connections = min(config.max_connections, fd_budget())
        self._revoked = self.machine.revoked
        """Node ids the fleet revoked: refused at the handshake, in exchanges, on open links."""
        self._revocation_file: Path | None = None
        self._revocation_seen: tuple[int, int] | None = None
        """The revocation file's ``(st_mtime_ns, st_size)`` when it was last read."""
        self._frontier_store: FrontierStore | None = None
        """Where the delivery frontier is kept (``NodeConfig.frontier_file``)."""
        self._frontier_saved = 0
        """``frontier.changes`` when it was last written."""
        self._frontier_synced = 0
        """``frontier.changes`` when its last write was made durable."""
        self._timer_wake: trio.CancelScope | None = None
        """The timer task's sleep (``_Driver._timers``), moved by every call into the machine."""
        self._timing = trio.CancelScope()
        """The timer task; cancelled when the node starts leaving."""
        self._unmet_seeds: list[LeaveSeed] = []
        """The LEAVEs owed to seeds that never answered (``NodeMachine.leave``)."""
        self.leaving = False
        """A clean close has begun: peers that left too are expected to be unreachable."""
        self.peers = self.machine.peers
        """The newest verified record of each peer (the machine's table)."""
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "frames_sent",
                "packets_sent",
                "frames_received",
                "packets_received",
                "rejected_connections",
                "outbox_overflow",
                "oversize_dropped",
                "lost_on_disconnect",
                "undeliverable",
                "records_learned",
                "bytes_sent",
                "bytes_received",
                "malformed_payload",
                "control_dropped",
                "sent_to_crashed",
                "lost_to_crash",
                "missed",
                "resumes",
                "recovered",
                "detector_bytes_sent",
                "suspicions",
                "corrections",
                "reincarnations",
                "loop_stalls",
                "frames_resent",
                "packets_resent",
                "frames_duplicate",
                "acks_carried",
                "refused_connections",
            ),
            0,
        )
        self._trace = trace
        self._links: dict[int, _Link] = {}
        self._subs: dict[str, Subscription] = {}
        self._subscribed: dict[str, trio.Event] = {}
        self._acked: dict[MsgId, trio.Event] = {}
        self.acked_views: dict[MsgId, frozenset[int]] = {}
        """For ``publish(wait_acked=True)``: the topic's subscribers as the ACK wave
        completed (taken at that instant, before anything later in the same frame,
        such as a subscriber's leave).  The caller pops its entry."""
        self._watchers: list[trio.MemorySendChannel[MembershipEvent]] = []
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self._limits = WireLimits.from_config(stamped, max_frame=config.max_frame)
        self._room = trio.Event()
        self._eager: set[_Link] = set()
        """Links with packets queued on an idle connection, written at the end of
        the current step (:meth:`_write_eager`): one frame for all a step sends."""
        self._stepping = False
        """Set while a frame's packets are handled: the writes wait for its end."""
        self._later: list[Delivered | DeliveredRun | Received | Release] = []
        """Deliveries of the frame being read, handed on once its sends are written."""
        self.recorder: Recorder | None = None
        """Telemetry (``NodeConfig.telemetry_dir``), set by :func:`open_node`."""
        self.connections = 0
        """Open TCP connections (both directions)."""
        self._published_at: dict[MsgId, float] = {}
        self._received_at: dict[MsgId, float] = {}
        """Arrival time of each publication the causal buffer holds back (recording)."""
        self._arrived: MsgId | None = None
        """The last publication received in this batch, not yet delivered nor in
        ``_received_at``: most are delivered next, with no dict write at all."""
        self._streak = 0
        """Publications accepted since the last schedule point of :meth:`publish` or
        :meth:`publish_many` (one every :data:`PUBLISH_BATCH`)."""
        self._now = 0.0
        """The current batch's clock (:meth:`_handle`, when recording)."""
        self._wall_offset = 0.0
        """Wall clock minus trio's clock, set with the recorder and renewed each
        telemetry window (:meth:`_flush_telemetry`): latency from
        a publication's wall-clock stamp without a ``time.time()`` per delivery."""

    def __repr__(self) -> str:
        return f"Node({self.id:016x}, port={self.port}, members={len(self.peers) + 1})"

    @property
    def core(self) -> VCubePS:
        """The VCube-PS core of this node's current incarnation."""
        return self.machine.core

    @property
    def incarnation(self) -> int:
        """This process's incarnation (``p2p.runtime._liveness``), signed into its record."""
        return self.machine.incarnation

    @property
    def detector(self) -> Detector | None:
        """The failure detector (``NodeConfig.detector``)."""
        return self.machine.detector

    # -------------------------------------------------------------- plumbing

    def _check_open(self) -> None:
        if self._closed or self._nursery is None:
            raise NodeError("the node is closed (use it inside `async with open_node(...)`)")

    def _trace_event(
        self, event: str, topic: str, source: int | None, seq: int | None, inc: int | None = None
    ) -> None:
        if self._trace is not None:
            self._trace(event, topic, source, seq, self.incarnation if inc is None else inc)

    # ------------------------------------------------------------- network

    def verify(self, record: bytes) -> Peer:
        """Check a discovery record (fleet membership and signature) before dialling."""
        return verified_peer(self.fleet, record)

    @property
    def record(self) -> bytes:
        """This node's signed discovery record (set once it listens)."""
        return self.machine.record

    @record.setter
    def record(self, record: bytes) -> None:
        self.machine.set_record(record)

    def known_records(self) -> list[bytes]:
        """This node's record and those of the peers it believes up."""
        return self.machine.known_records()

    async def dial(self, peer: Peer) -> tuple[trio.SocketStream, SecureSession]:
        """Connect and authenticate; the peer must prove the id discovery announced."""
        stream, session = await self.dial_address(peer.host, peer.port)
        if session.peer_id != peer.node_id:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise SecurityError(f"dialled {peer.node_id:016x} but {session.peer_id:016x} answered")
        return stream, session

    async def dial_address(self, host: str, port: int) -> tuple[trio.SocketStream, SecureSession]:
        """Connect to ``host:port`` and authenticate whichever fleet member answers."""
        stream, session, _ = await dial_secure(
            host, port, self.identity, self.fleet, self.config.handshake_timeout, self._revoked
        )
        return stream, session

    @asynccontextmanager
    async def _dialled(
        self, host: str, port: int
    ) -> AsyncIterator[tuple[trio.SocketStream, SecureSession]]:
        """A one-off authenticated connection (no link), closed however the block ends."""
        stream, session = await self.dial_address(host, port)
        try:
            yield stream, session
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    def _sign_record(self) -> bytes:
        """This node's discovery record: its address and signed incarnation."""
        fields = {"host": self.config.interface, "port": self.port, INC_FIELD: self.incarnation}
        return sign_record(self.identity, fields, self.fleet)
