"""What :func:`~p2p.runtime.open_node` is given besides an identity: the node's
settings (:class:`NodeConfig`) and the trace hook of ``p2p node``.

Invariant: a :class:`NodeConfig` that exists is valid: its limits are positive
and its timeouts not negative, the detector settings are consistent, and every
address it names parses (``__post_init__`` raises :class:`~p2p.NodeError` otherwise), so
the rest of the runtime never checks a setting again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from p2p._errors import NodeError
from p2p._secure import MAX_PLAINTEXT
from p2p._transport import parse_address
from p2p.runtime._discovery import SERVICE_TYPE
from p2p.runtime._liveness import detector_config
from topics import PubSubConfig
from vcube import DetectorError


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """Runtime settings; every limit on outside input has a default."""

    interface: str = "127.0.0.1"
    port: int = 0
    discovery: bool = True
    service_type: str = SERVICE_TYPE
    pubsub: PubSubConfig = field(default_factory=PubSubConfig)
    max_frame: int = MAX_PLAINTEXT
    outbox_limit: int = 100_000
    """Most packets queued for one peer; beyond it packets are dropped and counted."""
    overflow: str = "drop"
    """Policy for a slow peer: ``drop`` (the outbox limit drops and counts) or
    ``backpressure`` (``publish`` also waits while any outbox is over half full,
    so a local publisher slows down instead of losing; relayed traffic can
    still only be dropped at the limit)."""
    delivery_buffer: int = 10_000
    max_connections: int = 1024
    """Most TCP connections open at once (both directions); more are refused."""
    max_handshakes: int = 1024
    """Most unauthenticated connections (handshakes under way) at once; more
    wait in the listen backlog, queued, unless the oldest of them never spoke
    (evicted for them).  Each costs a task and at most a 2 KiB buffer."""
    max_handshakes_per_host: int = 8
    """Most handshakes under way from one source address (loopback excepted: a
    host's own nodes); a LAN outsider cannot take every slot."""
    unconfirmed_limit: int = 4096
    """Most frames a link keeps until its peer confirms them (sent again after a
    reconnection, ``p2p._reliable``); beyond it the oldest are counted as lost."""
    handshake_timeout: float = 10.0
    drain_timeout: float = 2.0
    max_backoff: float = 5.0
    seeds: tuple[str, ...] = ()
    """``host:port`` of members to exchange peers with (networks without multicast)."""
    seed_interval: float = 30.0
    """Seconds between peer exchanges with each seed (after the first succeeds)."""
    telemetry_dir: str | Path | None = None
    """Spool telemetry records here (``p2p.telemetry``); ``None``: record nothing."""
    telemetry_window: float = 10.0
    """Seconds per telemetry window (one node record, one record per active topic)."""
    telemetry_max_bytes: int = 64 << 20
    """Disk cap of the telemetry spool; the oldest files go first (and are counted)."""
    telemetry_collector: str | None = None
    """``host:port`` of a telemetry collector to upload the spool to (needs ``telemetry_dir``)."""
    telemetry_upload_interval: float = 30.0
    """Seconds between uploads to the collector."""
    revocation_file: str | Path | None = None
    """The fleet's revocation list to follow (read at start and whenever it
    changes; ``p2p fleet revoke --to``); ``open_node(NODE_DIR)`` follows
    ``NODE_DIR/revoked.cbor`` when this is ``None``."""
    frontier_file: str | Path | None = None
    """Where the delivery frontier is kept (what was delivered last per topic
    and source: two files, this path with ``.0`` and ``.1`` appended), so that
    after a restart the publications missed while the node was down are
    counted (``Delivery.missed``); ``open_node(NODE_DIR)`` keeps
    ``NODE_DIR/frontier`` when this is ``None``."""
    frontier_interval: float = 1.0
    """Seconds between fsyncs of the frontier, which is written (without one)
    after each batch of deliveries: a killed process loses none of it, a
    power loss at most this interval's."""
    history_count: int = 1000
    """Most of its own recent publications a node keeps, over all topics, for
    subscribers that were away to resume from (0: none kept; they are told
    the count they missed)."""
    history_bytes: int = 4 * 1024 * 1024
    """Most payload bytes of that history."""
    history_age: float = 120.0
    """Seconds a publication stays in that history."""
    resume_timeout: float = 5.0
    """Seconds a topic's deliveries wait for a publisher's answer to a resume
    before it is asked once more, and then before they go on (what did not
    come is then counted as missed)."""
    gc_young: int | None = 10_000
    """The cyclic garbage collector's young-generation threshold (``gc.set_threshold``'s
    first value) the node raises the process's to when it starts, if lower
    (``None``: left as it is).  A node makes several objects per publication
    it handles, freed by reference counting, while a round's are alive
    together: at Python's 700 a node at full load runs a young collection
    every few hundred publications, each walking the round in hand; 10,000
    saves about a sixth of its CPU in the fan-out benchmark.  Process-wide,
    as the collector is: cyclic garbage waits longer to be collected, never
    more than this many objects' worth."""
    detector: bool = True
    """Run the failure detector (``False``: a crashed peer is never noticed and
    the rounds that wait for it stall, the behaviour before issue 5)."""
    detector_interval: float = 1.0
    """Seconds between the detector's testing rounds."""
    detector_timeout: float | None = None
    """Age at which an unanswered probe counts as missed (``None``: the
    interval; probes expire at this deadline, not at the next round)."""
    detector_attempts: int = 2
    """Probes in a row that must go unanswered before a suspicion (2: one
    delayed probe or reply on a busy host is not a false suspicion)."""
    detector_stretch: float = 8.0
    """How far a probe's timeout may stretch on a loaded host: up to this many
    times ``detector_timeout``, following measured round trips and evidence
    of false suspicions (Lifeguard's local health; ``vcube._timing``).  1
    keeps every timeout fixed."""
    detector_revive: int = 2
    """Rounds between probes of a suspected member, for ten minutes after its
    suspicion (0: never).  After a partition heals, nothing else makes the two
    sides talk again: this is how they merge back (``DetectorConfig.revive``)."""

    def __post_init__(self) -> None:
        if self.overflow not in ("drop", "backpressure"):
            raise NodeError(f"overflow must be 'drop' or 'backpressure', got {self.overflow!r}")
        if self.interface in ("", "0.0.0.0", "::"):
            raise NodeError(
                f"interface {self.interface!r}: give the address peers should dial (e.g. 127.0.0.1)"
            )
        for seed in self.seeds:
            parse_address(seed)
        if self.telemetry_collector is not None:
            parse_address(self.telemetry_collector)
            if self.telemetry_dir is None:
                raise NodeError("telemetry_collector needs telemetry_dir (the spool to upload)")
        if type(self.port) is not int or not 0 <= self.port < 65536:
            raise NodeError(f"port must be an int in 0..65535, got {self.port!r}")
        counts = (
            "max_frame",
            "max_connections",
            "max_handshakes",
            "max_handshakes_per_host",
            "outbox_limit",
            "unconfirmed_limit",
            "delivery_buffer",
            "telemetry_max_bytes",
        )
        for name in counts:  # a float or NaN here broke later comparisons and slicing
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise NodeError(f"{name} must be a positive int, got {value!r}")
        if self.gc_young is not None and (type(self.gc_young) is not int or self.gc_young <= 0):
            raise NodeError(f"gc_young must be a positive int or None, got {self.gc_young!r}")
        for name in ("history_count", "history_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise NodeError(f"{name} must be an int >= 0, got {value!r}")
        if self.max_frame > MAX_PLAINTEXT:
            raise NodeError(f"max_frame must be at most {MAX_PLAINTEXT}, got {self.max_frame}")
        positive = ("handshake_timeout", "seed_interval", "telemetry_window",
                    "telemetry_upload_interval", "frontier_interval", "resume_timeout")  # fmt: skip
        for name in (*positive, "drain_timeout", "max_backoff", "history_age"):
            value = getattr(self, name)
            # "not >= 0" also refuses NaN, which passed "< 0" and became a trio deadline
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0) or (
                name in positive and value == 0
            ):
                raise NodeError(f"{name} must be a finite positive number, got {value!r}")
        if not self.detector_stretch >= 1:  # also refuses NaN
            raise NodeError(f"detector_stretch must be >= 1, got {self.detector_stretch}")
        try:
            detector_config(
                self.detector_interval,
                self.detector_timeout,
                self.detector_attempts,
                self.detector_stretch,
                self.detector_revive,
            )
        except DetectorError as exc:
            raise NodeError(f"detector settings: {exc}") from None
        timeout = self.detector_timeout
        if timeout is not None and timeout > self.detector_interval:
            raise NodeError("detector_timeout must not exceed detector_interval")


TraceHook = Callable[[str, str, int | None, int | None, int], None]
"""``(event, topic, source, seq, incarnation)`` for the trace writer of ``p2p node``.

``incarnation`` is the source's for ``publish`` and ``deliver`` (a publication
is ``(source, incarnation, seq)``: a restarted process numbers from 0 again) and
the node's own for membership events."""
