"""``NodeMachine``: one node's membership, failure detector and pub/sub core, sans-IO.

DESIGN.md §1 and §5.  Both drivers run this class unchanged: the trio runtime
(``p2p.runtime.Node``) and the simulator (``p2p.sim.Simulation`` with a
detector).  It never reads a clock, never does I/O and draws no randomness:
every input takes ``now``, and every effect is an *output* the driver carries
out (core outputs such as ``Send`` and ``Delivered``, plus the membership
outputs of this module).

What it owns:

* the VCube-PS core (replaced by a new one, same id, when this node refutes a
  suspicion with a new incarnation: :class:`Reincarnated`);
* the failure detector (optional), its round grid and probe deadlines, behind
  :meth:`NodeMachine.get_timer` / :meth:`NodeMachine.handle_timer`;
* the membership table: which incarnation of each peer is up (``alive``,
  ``incs``) and the newest one handed to the core as crashed (``dead``);
* the application's topics, replayed after a reincarnation.

Membership rules (DESIGN.md §5): evidence of a member (a verified record, a
restart seen in its packets) goes to the detector, which admits it; a
member leaves the view only by its own LEAVE, a revocation, or the
detector's verdict; a discovery goodbye or a broken connection is a *hint*
that makes the detector probe now (:meth:`NodeMachine.hint`), never an
eviction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from p2p._membership import Peer, RecordGossip, records_digest
from p2p.machine._frontier import ENVELOPE_SIZE, Frontier
from p2p.machine._recovery import Recovery, RecoveryConfig, Release
from p2p.wire import Control, Leave, Members, Replay, Resume
from topics import Delivered, LocalProtocolError, Published, VCubePS
from vcube import (
    Corrected,
    Detector,
    DetectorConfig,
    DetectorOutput,
    Entry,
    Hypercube,
    Joined,
    Left,
    Probe,
    Push,
    Reply,
    Reported,
    Restarted,
    SelfSuspected,
    SendDetector,
    Suspected,
)

# ------------------------------------------------------------------ outputs --


@dataclass(frozen=True, slots=True)
class SendControl:
    """Send the control message ``msg`` (a detector message or a LEAVE) to ``dest``."""

    dest: int
    msg: Control


@dataclass(frozen=True, slots=True)
class SendExchange:
    """Send signed membership ``records`` to ``dest`` (``reply``: it answers
    with its own)."""

    dest: int
    records: tuple[bytes, ...]
    reply: bool


@dataclass(frozen=True, slots=True)
class MemberUp:
    """``node`` joined this node's view as ``incarnation`` (``reason``:
    ``discovered`` or ``restarted``), or, up already, is now ``incarnation``
    (``restarted``: a connection to its old life must not carry more).  The
    core already knows it."""

    node: int
    incarnation: int
    reason: str


@dataclass(frozen=True, slots=True)
class MemberDown:
    """Incarnations of ``node`` up to ``incarnation`` are over (``reason``:
    ``suspected``, ``left``, ``revoked``, ``crashed``).  ``was_up``: it was in
    the view and left it now (a driver drops its link); otherwise only an
    older incarnation, or one never admitted, was declared over.  The outputs
    of the core's repair follow this one."""

    node: int
    incarnation: int
    reason: str
    was_up: bool


@dataclass(frozen=True, slots=True)
class SuspicionCorrected:
    """``node``, suspected by this node, answers again; it comes back as a new
    incarnation once it learns of the suspicion (the core treats a suspected
    incarnation as crashed for good)."""

    node: int


@dataclass(frozen=True, slots=True)
class Reincarnated:
    """This node was suspected: its core restarted as ``incarnation`` (it was
    ``previous``).  Core packets of the old life still queued must be dropped;
    the outputs that follow re-subscribe every topic of :attr:`NodeMachine.topics`."""

    previous: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Superseded:
    """Another process runs this node's identity as the newer ``incarnation``,
    alive (the detector holds it unsuspected): the identity was started twice
    (a copied node directory).  The newest start keeps it; this machine stops
    acting (no reincarnation above it, which would start a leapfrog of
    restarts, nor probes or accusations) and the driver should stop the node
    with an error.  Reported once."""

    incarnation: int


@dataclass(frozen=True, slots=True)
class Stalled:
    """The driver handled the timer ``lag`` seconds late (this process was not
    running): ``moved`` probes were given more time instead of accusing others
    of this node's own slowness (Lifeguard's local health)."""

    lag: float
    moved: int


@dataclass(frozen=True, slots=True)
class RoundStarted:
    """A detector round ran (once per ``interval``, on a fixed grid)."""


MachineOutput = (
    SendControl
    | SendExchange
    | MemberUp
    | MemberDown
    | SuspicionCorrected
    | Reincarnated
    | Superseded
    | Stalled
    | RoundStarted
    | Release
)
"""The outputs of this module; a machine's output lists mix them with the core's."""

Out = list[Any]
"""Outputs in the order the driver must carry them out: core outputs and
:data:`MachineOutput` items."""


def _plain_overlay(members: frozenset[int], version: int) -> Hypercube:
    return Hypercube(members, version=version)


def _no_records(record: bytes) -> tuple[Peer, int]:
    raise ValueError("this machine was given no record verifier")


Verify = Callable[[bytes], tuple[Peer, int]]
"""Checks a membership record's signature and fleet membership and returns the
peer it names with the incarnation it announces; raises on a forged record
(the driver closes the connection it came on)."""

DIGEST_REFRESH = 10
"""Rounds between repeats of an unchanged record digest to a monitored node."""
DIGEST_RESYNC = 3
"""Rounds before the same disagreement of digests is answered again."""


# ------------------------------------------------------------------ machine --


class NodeMachine:
    """One node's protocol state (see the module docstring).

    Membership invariant (kept by :meth:`_up` and :meth:`_down`): the core's
    overlay is ``alive`` plus this node, and a peer is in ``alive`` exactly
    when its newest known incarnation (``incs``) is above the newest one
    handed to ``core.crashed`` (``dead``).  So the core never routes a round
    through a node it treats as crashed, and a crashed incarnation comes back
    only as a newer one.

    ``make_core(incarnation)`` builds this node's core (overlay set by the
    machine); ``incarnations(above)`` picks the incarnation to refute a
    suspicion of ``above`` with (the runtime's is clock-based, the
    simulator's ``above + 1``); ``overlay(members, version)`` builds the
    overlay (the simulator shares one per member set).  ``members`` are
    peers known up from the start, admitted without events.
    """

    def __init__(
        self,
        node_id: int,
        incarnation: int,
        make_core: Callable[[int], VCubePS],
        *,
        detector: DetectorConfig | None = None,
        incarnations: Callable[[int], int] = lambda above: above + 1,
        overlay: Callable[[frozenset[int], int], Hypercube] = _plain_overlay,
        members: Mapping[int, int] | None = None,
        verify: Verify = _no_records,
        recovery: RecoveryConfig | None = None,
        now: float = 0.0,
    ) -> None:
        self.id = node_id
        self.incarnation = incarnation
        self._make_core = make_core
        self._incarnations = incarnations
        self._overlay = overlay
        self.detector: Detector | None = None
        if detector is not None:
            self.detector = Detector(node_id, incarnation, config=detector)
        self.alive: set[int] = set()
        self.incs: dict[int, int] = {}
        self.dead: dict[int, int] = {}
        self.heard: dict[int, int | None] = {}
        """Peers a frame came from since the detector last heard of them, with the
        newest detector version their frames carried (``None``: none did).  The
        driver writes it directly (one dict write per frame, its hot path); the
        machine hands it to the detector before any probe leaves or expires."""
        self.topics: set[str] = set()
        """The application's topics (subscribed and not unsubscribed)."""
        self.frontier = Frontier(incarnation)
        """Ordinals of this node's publications and what it delivered per
        source: kept across its incarnations, so a loss is counted."""
        self.recovery = Recovery(node_id, self.frontier, recovery or RecoveryConfig())
        """This node's history as a publisher and its resumes as a subscriber
        (with a detector only: without one nobody leaves the view to come back)."""
        self.pending: Out = []
        """Outputs of :meth:`hand` (a RESUME): the driver carries them out after
        the batch it is handling, and empties this list."""
        self.records_learned = 0
        self.record = b""
        """This node's own signed record (set by the driver; no record, no gossip)."""
        self.peers: dict[int, Peer] = {}
        """The newest verified record of each peer that has not left."""
        self.departed: dict[int, Peer] = {}
        """The record of each peer that left or was revoked (older ones stay out)."""
        self.revoked: set[int] = set()
        self.revocation_serial = 0
        """The fleet's revocation list this node holds (the driver keeps it)."""
        self._verify = verify
        interval = 1.0 if detector is None else detector.interval
        self.gossip = RecordGossip(
            refresh=DIGEST_REFRESH * interval, resync=DIGEST_RESYNC * interval
        )
        self._version = 0
        self._next_round: float | None = None
        self._armed: float | None = None
        self._leaving = False
        self.superseded: int | None = None
        """The newer incarnation of this id another process runs (:class:`Superseded`)."""
        self.core = make_core(incarnation)
        for node, inc in sorted((members or {}).items()):
            self._admit(node, inc, now)
        self.core.set_overlay(self._overlay(self.members(), self._version))

    def __repr__(self) -> str:
        return f"NodeMachine({self.id:x}, incarnation={self.incarnation}, alive={len(self.alive)})"

    def _admit(self, node: int, inc: int, now: float) -> None:
        self.alive.add(node)
        self.incs[node] = inc
        if self.detector is not None:
            self.detector.join(node, inc, now)  # a new node: Joined, no message

    def members(self) -> frozenset[int]:
        """The overlay members this node believes up, itself included."""
        return frozenset(self.alive) | {self.id}

    # ------------------------------------------------------ application --

    def subscribe(self, topic: str, now: float) -> Out:
        """Join ``topic`` (raises the core's ``LocalProtocolError`` on misuse)."""
        out: Out = self.core.subscribe(topic, now)
        self.topics.add(topic)
        if self.detector is not None:  # a topic taken up again: what it missed meanwhile
            for source in sorted(self.alive):
                out += self._sent(self.recovery.rejoined(source, {topic}, now))
        return out

    def unsubscribe(self, topic: str, now: float) -> Out:
        out: Out = self.core.unsubscribe(topic, now)
        self.topics.discard(topic)
        self.frontier.forget(topic)
        self.recovery.forget(topic)
        return out

    def publish(self, topic: str, payload: bytes, now: float) -> Out:
        """Publish ``payload`` behind its envelope (``p2p.machine._frontier``),
        which takes :data:`ENVELOPE_SIZE` bytes of the core's ``max_payload``
        (a driver that promises the application ``max_payload`` gives its
        cores that much more, as the runtime does)."""
        room = self.core.config.max_payload - ENVELOPE_SIZE
        if len(payload) > room:
            raise LocalProtocolError(
                f"payload of {len(payload)} bytes exceeds {room} (the core's max_payload "
                f"less the {ENVELOPE_SIZE}-byte envelope)"
            )
        full = self.frontier.envelope(topic) + payload
        out: Out = self.core.publish(topic, full, now)
        self.frontier.published(topic)
        first = out[0]  # the core's Published leads its outputs
        if type(first) is Published:
            self.recovery.kept(topic, first.id, full, now)
        return out

    def hand(self, d: Delivered, now: float) -> int:
        """The core delivers another node's publication ``d``: how many of its
        source's publications this node will not get before it (hand it to
        the application now), or ``SKIP`` / ``HELD`` (negative: not now; a
        :class:`Release` output hands a held one on).  A delivery behind a
        member source asks it for the rest (``p2p.machine._recovery``), into
        :attr:`pending`."""
        source = d.id.source
        member = self.detector is not None and source in self.alive
        missed, out = self.recovery.hand(d, member, now)
        if out:
            self.pending += self._sent(out)
        return missed

    def _sent(self, items: Iterable[Any]) -> Out:
        """Recovery's outputs as machine outputs: ``(dest, control)`` pairs become
        :class:`SendControl`; a :class:`Release` stays, and a recovered one
        counts as delivered in the core (``VCubePS.recovered``), followed by
        what that lets the core deliver."""
        out: Out = []
        for o in items:
            if type(o) is tuple:
                out.append(SendControl(*o))
                continue
            out.append(o)
            if type(o) is Release and o.recovered:
                out += self.core.recovered(o.delivery.topic, o.delivery.id)
        return out

    def receive(self, sender: int, packet: Any, now: float) -> Out:
        """A core packet from ``sender`` (an authenticated peer)."""
        out: Out = self.core.receive(sender, packet, now)
        return out

    def leave(self, now: float) -> Out:
        """This node leaves gracefully: a LEAVE to every member believed up; the
        detector stops (a leaving node accuses nobody)."""
        self._leaving = True
        leave = Leave(self.incarnation)
        return [SendControl(node, leave) for node in sorted(self.alive)]

    # ------------------------------------------------------- membership --

    def learn(self, node: int, inc: int, now: float) -> Out:
        """Evidence that ``node`` runs as ``inc`` (a verified record, its packets):
        the detector admits it (a new member, or a restart if ``inc`` is newer);
        without a detector it is up at once.  A crashed incarnation stays crashed."""
        if node == self.id or inc <= self.dead.get(node, -1):
            return []
        if self.detector is None:
            return self._up(node, inc, "discovered", now)
        return self._on_detector(self.detector.join(node, inc, now), now)

    def restarted_by(self, peer: int, incarnations: Iterable[int], now: float) -> Out:
        """Core packets from ``peer``, believed crashed, whose rounds name
        ``incarnations`` of it: a newer one than any known is a restart, learnt
        before the packets reach the core (else the answers to them, such as
        the ACK of a re-subscription, would be dropped as sent to a crashed node)."""
        inc = max(incarnations, default=-1)
        if inc > self.dead.get(peer, -1) and inc > self.incs.get(peer, -1):
            return self.learn(peer, inc, now)
        return []

    def control(self, sender: int, msg: Control, now: float) -> Out:
        """A LEAVE or a detector message from ``sender`` (other controls are the
        driver's).  Raises ``RemoteDetectorError`` on a message the detector
        refuses (the driver closes that connection); without a detector,
        detector messages are ignored."""
        if isinstance(msg, Leave):
            return self.left(sender, msg.incarnation, "left", now)
        if isinstance(msg, Resume):
            # A member of the fleet, not revoked: one this node admitted once or
            # holds a verified record of (an asker it still suspects after a
            # partition is one: its new life may not have reached this node).
            member = sender not in self.revoked and (sender in self.incs or sender in self.peers)
            return self._sent(self.recovery.answer(sender, msg, member, now))
        if isinstance(msg, Replay):
            return self._sent(self.recovery.replayed(sender, msg, now))
        if self.detector is None or not isinstance(msg, Probe | Reply | Push):
            return []
        # The frames heard so far first: whether an accusation is believed
        # depends on when its target was last heard from (Detector._doubt).
        out = self._flush(now)
        return out + self._on_detector(self.detector.receive(sender, msg, now), now)

    def left(self, node: int, inc: int, reason: str, now: float) -> Out:
        """``node``'s incarnation ``inc`` leaves (its LEAVE): forgotten, not suspected."""
        if inc >= self.incs.get(node, 0):
            self._depart(node)
        return self._over(node, inc, inc, reason, now)

    def revoke(self, node: int, now: float) -> Out:
        """The fleet revoked ``node``: every incarnation of it, known or not, is over."""
        self.revoked.add(node)
        self._depart(node)
        inc = self.incs.get(node, 0)
        return self._over(node, inc, max(inc, self.dead.get(node, -1) + 1), "revoked", now)

    def _depart(self, node: int) -> None:
        """Keep ``node``'s record as departed: an older or equal one stays out."""
        peer = self.peers.pop(node, None)
        if peer is not None:
            self.departed[node] = peer

    def _over(self, node: int, inc: int, dead: int, reason: str, now: float) -> Out:
        """``node`` leaves the detector as ``inc`` (no suspicion) and is over up to
        ``dead`` for the core."""
        out: Out = []
        if self.detector is not None:
            out = self._on_detector(self.detector.leave(node, inc, now), now)
        return out + self._down(node, dead, reason, now)

    def crashed(self, node: int, inc: int, now: float) -> Out:
        """An oracle's verdict (the simulator's thesis mode): ``node`` up to ``inc`` crashed."""
        return self._down(node, inc, "crashed", now)

    def recovered(self, node: int, inc: int, now: float) -> Out:
        """An oracle's verdict: ``node`` is back as ``inc``."""
        return self._up(node, inc, "restarted", now)

    @property
    def _stopped(self) -> bool:
        """Leaving, or superseded: no more probes, rounds or accusations."""
        return self._leaving or self.superseded is not None

    def newer_life_notice(self, node: int) -> Push | None:
        """What to tell a process that still runs ``node``'s previous life while
        the detector holds a newer one alive: this node's entry for ``node``,
        as a push.  A superseded process (the identity started twice) reads
        there that a newer start of its id is alive (:class:`Superseded`); a
        dead one reads nothing.  ``None`` without a detector or entry."""
        det = self.detector
        held = None if det is None else det.entry(node)
        if det is None or held is None or held[1] & 1:
            return None
        entry = Entry(node, *held)
        return Push(incarnation=self.incarnation, version=det.version, entries=(entry,))

    def hint(self, node: int, now: float) -> Out:
        """A hint that ``node`` may be gone (its connection broke and re-dialling
        failed, a discovery goodbye): the detector probes it now.  Only
        unanswered probes make a suspicion."""
        det = self.detector
        if det is None or self._stopped:
            return []
        out = self._flush(now)
        return out + self._on_detector(det.probe_now(node, now), now)

    # ---------------------------------------------------------- records --

    def add_peer(self, peer: Peer, inc: int, now: float) -> tuple[bool, Out]:
        """A verified record of ``peer`` announcing incarnation ``inc`` (discovery,
        a seed, an exchange): whether it told something new, and the outputs of
        learning it.  A record older than the one held, or than the departure
        last reported, changes nothing."""
        node = peer.node_id
        if node == self.id or node in self.revoked:
            return False, []
        for prior in (self.peers.get(node), self.departed.get(node)):
            if prior is not None and (
                peer.issued_at < prior.issued_at or peer.record == prior.record
            ):
                return False, []
        self.peers[node] = peer
        return True, self.learn(node, inc, now)

    def known_records(self) -> list[bytes]:
        """This node's record and those of the peers it believes up (what an
        exchange sends: a crashed peer's record would only make others dial it)."""
        alive = self.alive
        return [self.record, *(p.record for n, p in self.peers.items() if n in alive)]

    def introduce(self, dest: int) -> Out:
        """Ask ``dest`` (a seed) for its records, with ours."""
        return [SendExchange(dest, tuple(self.known_records()), True)]

    def exchange(self, sender: int, records: Iterable[bytes], reply: bool, now: float) -> Out:
        """Records from ``sender``: learn the verified new ones, answer if asked,
        and pass the news on to this node's VCube neighbours (not back to
        ``sender``), so a join floods the overlay once.  Raises what ``verify``
        raises on a forged record.  ``records_learned`` counts the news."""
        held = {p.record for p in self.peers.values()}  # known bytes need no check
        out: Out = []
        news = []
        for record in records:
            if record in held:
                continue
            new, learnt = self.add_peer(*self._verify(record), now)
            out += learnt
            if new:
                news.append(record)
        self.records_learned += len(news)
        if reply and sender in self.peers:
            out.append(SendExchange(sender, tuple(self.known_records()), False))
        return out + self.spread(news, sender)

    def spread(self, news: list[bytes], sender: int | None) -> Out:
        """Pass records new to this node on to its VCube neighbours (not back to
        ``sender``): each node forwards a record once.  Anti-entropy (the
        digests each round, :meth:`on_digest`) covers what a flood over
        differing views misses."""
        if not news:
            return []
        records = (self.record, *news)
        children = self.core.overlay.children(self.id, self.id)
        return [SendExchange(n, records, False) for n in children if n != sender]

    def on_digest(self, sender: int, digest: int, now: float) -> Out:
        """``sender`` holds records with ``digest``: if ours differ, send ours and
        ask for its own (both then hold the union, ``p2p._membership``)."""
        if sender not in self.peers:
            return []  # its introduction has not arrived: nowhere to answer yet
        mine = records_digest(self.known_records())
        if self.gossip.answer(sender, digest, mine, now):
            return [SendExchange(sender, tuple(self.known_records()), True)]
        return []

    def _digests(self, now: float) -> Out:
        """Tell the monitored nodes our records' digest, when it changed since we
        last told them or every ``DIGEST_REFRESH`` rounds."""
        if self.detector is None or not self.record:
            return []
        digest = records_digest(self.known_records())
        msg = Members(digest, self.revocation_serial)
        targets = self.gossip.due(self.detector.monitored(), digest, now)
        return [SendControl(n, msg) for n in targets if n in self.alive]

    # ----------------------------------------------------------- timers --

    def start_rounds(self, at: float) -> None:
        """Detector rounds run at ``at + k * interval`` (the driver's phase);
        until this is called the timer is unset."""
        self._next_round = at

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` is next due (``None``: no detector, rounds
        not started, leaving, or superseded).  The driver re-reads it after every input: a
        hint may move it earlier."""
        det, next_round = self.detector, self._next_round
        if det is None or next_round is None or self._stopped:
            self._armed = None
            return None
        due = min((t for t in (det.deadline(), self.recovery.deadline()) if t is not None),
                  default=None)  # fmt: skip
        self._armed = next_round if due is None else min(due, next_round)
        return self._armed

    def handle_timer(self, now: float) -> Out:
        """The timer fired: a detector round if one is due (rounds keep a fixed
        grid; missed ones are skipped, not run in a burst), else the probes
        whose deadline passed expire.  A timer handled late means this
        process stalled: :class:`Stalled`."""
        det, next_round = self.detector, self._next_round
        if det is None or next_round is None or self._stopped:
            return []
        out: Out = []
        armed, self._armed = self._armed, None
        if armed is not None and now - armed > det.config.timeout / 4:
            out.append(Stalled(now - armed, det.resumed(now)))
        out += self._flush(now)
        if now >= next_round:
            out += self._on_detector(det.tick(now), now)
            out.append(RoundStarted())
            out += self._digests(now)
            interval = det.config.interval
            next_round += interval
            if next_round < now:  # fell behind: skip the missed rounds
                next_round = now + interval - (now - next_round) % interval
            self._next_round = next_round
        else:
            out += self._on_detector(det.expire(now), now)
        return out + self._sent(self.recovery.expire(now))

    def _flush(self, now: float) -> Out:
        """Hand the peers heard from to the detector.

        Invariant: the detector hears of a frame before any probe leaves or
        expires after it arrived (every path that probes or expires flushes
        first), so traffic always answers a probe and never one that left
        after it."""
        det = self.detector
        if det is None or not self.heard:
            return []
        heard = list(self.heard.items())
        self.heard.clear()  # in place: drivers may hold this very dict
        out: Out = []
        for node, version in heard:
            out += self._on_detector(det.heard(node, now, version=version), now)
        return out

    # ---------------------------------------------------------- verdicts --

    def _on_detector(self, outputs: list[DetectorOutput], now: float) -> Out:
        """Carry out the detector's verdicts: they drive membership and the core."""
        out: Out = []
        for o in outputs:
            if isinstance(o, SendDetector):
                out.append(SendControl(o.dest, o.msg))
            elif isinstance(o, Joined):
                out += self._up(o.node, o.incarnation, "discovered", now)
            elif isinstance(o, Restarted):
                out += self._up(o.node, o.new, "restarted", now)
            elif isinstance(o, Suspected):
                out += self._down(o.node, o.incarnation, "suspected", now)
            elif isinstance(o, Left):
                out += self._down(o.node, o.incarnation, "left", now)
            elif isinstance(o, Corrected):
                out.append(SuspicionCorrected(o.node))
            elif isinstance(o, SelfSuspected):
                out += self._suspected_self(o, now)
            elif isinstance(o, Reported):
                # Not a member here, but another node's view may still name it.
                out += self._down(o.node, o.incarnation, "reported", now)
        return out

    def _up(self, node: int, inc: int, reason: str, now: float) -> Out:
        """``node`` is up as ``inc``: it joins the overlay, then the core learns it
        (which treats older incarnations as crashed and announces subscriptions)."""
        if inc <= self.dead.get(node, -1) or inc < self.incs.get(node, 0):
            return []
        before = self.incs.get(node)
        self.incs[node] = inc
        out: Out = []
        if node not in self.alive:
            self.alive.add(node)
            self._overlay_changed()
            out.append(MemberUp(node, inc, reason))
        elif before is not None and inc > before:
            out.append(MemberUp(node, inc, "restarted"))
        out += self.core.joined(node, inc, now)
        if out and type(out[0]) is MemberUp and self.detector is not None:
            # Back in the view, or a new life: what it published meanwhile.
            out += self._sent(self.recovery.rejoined(node, self.topics, now))
        return out

    def _down(self, node: int, inc: int, reason: str, now: float) -> Out:
        """``node`` up to ``inc`` crashed or left: out of the overlay first, then
        the core repairs around it."""
        if inc <= self.dead.get(node, -1):
            return []
        self.dead[node] = inc
        self.gossip.forget(node)
        was_up = node in self.alive and self.incs.get(node, 0) <= inc
        if was_up:
            self.alive.discard(node)
            self._overlay_changed()
        out: Out = [MemberDown(node, inc, reason, was_up)]
        out += self.core.crashed(node, inc, now)
        if was_up:
            out += self._sent(self.recovery.gone(node, now))
        return out

    def _overlay_changed(self) -> None:
        self._version += 1
        self.core.set_overlay(self._overlay(self.members(), self._version))

    def _suspected_self(self, o: SelfSuspected, now: float) -> Out:
        """Someone holds a newer entry about this node's id.  This incarnation
        suspected, or a newer one that is itself suspected (an earlier life of
        this id, newer only because the clock stepped back before the
        restart): come back above it.  A newer one held *alive* is another
        process with this identity: :class:`Superseded`, once."""
        if self.superseded is not None:
            return []
        if o.incarnation > self.incarnation and not o.counter & 1:
            self.superseded = o.incarnation
            return [Superseded(o.incarnation)]
        if o.incarnation >= self.incarnation:
            return self._reincarnate(o.incarnation, now)
        return []

    def _reincarnate(self, above: int, now: float) -> Out:
        """Others treat this incarnation as crashed: restart the core as a new one.

        The new core starts empty with every known crash and every member's
        newest incarnation (so their older ones count as crashed), numbers on
        from the old one (publication ids stay unique) and subscribes again to the
        application's topics, after :class:`Reincarnated` (so the driver drops
        the old life's queued packets before the new life's are queued).
        """
        assert self.detector is not None
        old = self.core
        previous, self.incarnation = self.incarnation, self._incarnations(above)
        out: Out = [Reincarnated(previous, self.incarnation)]
        out += self._on_detector(self.detector.reincarnate(self.incarnation, now), now)
        self.core = self._make_core(self.incarnation)
        self.core.set_overlay(old.overlay)
        self.core.first_seq(old.next_seq)
        for node, inc in self.dead.items():
            self.core.crashed(node, inc, now)  # nothing to repair yet
        for node, inc in sorted(self.incs.items()):
            if inc > max(0, self.dead.get(node, -1)):
                # Its older lives crashed: a late view entry of one is no member
                # (else it stays in the view for good: partial fuzz seed 404153).
                out += self.core.joined(node, inc, now)
        for topic in sorted(self.topics):
            out += self.core.subscribe(topic, now)
        return out


__all__ = [
    "DIGEST_REFRESH",
    "DIGEST_RESYNC",
    "MachineOutput",
    "MemberDown",
    "MemberUp",
    "NodeMachine",
    "Reincarnated",
    "RoundStarted",
    "SendControl",
    "SendExchange",
    "Stalled",
    "Superseded",
    "SuspicionCorrected",
    "Verify",
]
