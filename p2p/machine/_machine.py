"""``NodeMachine``: one node's membership, failure detector and pub/sub core, sans-IO.

DESIGN.md §1 and §5.  Both drivers run this class unchanged: the trio runtime
(``p2p.runtime.Node``) and the simulator (``p2p.sim.Simulation`` with a
detector).  It never reads a clock, never does I/O and draws no randomness:
every input takes ``now``, and every effect is an *output* the driver carries
out (one typed union, ``p2p.machine._outputs``).  A decoded frame enters by
:meth:`NodeMachine.receive` only, whatever it holds.

What it owns:

* the VCube-PS core (replaced by a new one, same id, when this node refutes a
  suspicion with a new incarnation: :class:`Reincarnated`);
* the failure detector (optional), its round grid and probe deadlines, behind
  :meth:`NodeMachine.get_timer` / :meth:`NodeMachine.handle_timer`;
* the membership table: which incarnation of each peer is up (``alive``,
  ``incs``) and the newest one handed to the core as crashed (``dead``);
* the application's topics, replayed after a reincarnation;
* its history and resumes (``p2p.machine._recovery``);
* records, revocations and seeds (``p2p.machine._fleet``, its base class).

This module is one class, and it stays one file past the usual 600 lines:
its parts (the door, the timer, the verdicts that move membership) all
keep the one membership invariant stated on :class:`NodeMachine`, which
reads best in one place; what does not (the outputs, the fleet's records,
revocations and seeds, history and resumes) lives in modules of its own.

Membership rules (DESIGN.md §5): evidence of a member (a verified record, a
restart seen in its packets) goes to the detector, which admits it; a
member leaves the view only by its own LEAVE, a revocation, or the
detector's verdict; a discovery goodbye or a broken connection is a *hint*
that makes the detector probe now (:meth:`NodeMachine.hint`), never an
eviction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from causal import MsgId
from p2p._errors import SecurityError
from p2p._membership import Peer, RecordGossip
from p2p._reliable import Hello, ReceiveLog
from p2p.machine._fleet import _Fleet
from p2p.machine._frontier import ENVELOPE_SIZE, Frontier
from p2p.machine._outputs import (
    ExchangeWithSeed,
    LeaveSeed,
    MemberDown,
    MemberUp,
    Out,
    Refused,
    Reincarnated,
    RoundStarted,
    SendControl,
    Stalled,
    Superseded,
    SuspicionCorrected,
    Verify,
    VerifyRevocations,
)
from p2p.machine._recovery import Recovery, RecoveryConfig, Release
from p2p.machine._seeds import Seeds
from p2p.wire import Body, Control, Leave, Members, Replay, Resume, Revoked
from topics import (
    Delivered,
    DeliveredRun,
    LocalProtocolError,
    PresetView,
    Published,
    PublishedRun,
    RemoteProtocolError,
    VCubePS,
)
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
    RemoteDetectorError,
    Reply,
    Reported,
    Restarted,
    SelfSuspected,
    SendDetector,
    Suspected,
)

_REMOTE_ERRORS = (RemoteProtocolError, RemoteDetectorError, SecurityError)
"""What a peer's frame can make the core, the detector or a verifier raise
(a forged record or revocation list, a refused message): :class:`Refused`."""


def _plain_overlay(members: frozenset[int], version: int) -> Hypercube:
    return Hypercube(members, version=version)


def _no_records(record: bytes) -> tuple[Peer, int]:
    raise ValueError("this machine was given no record verifier")


def _no_revocations(blob: bytes) -> tuple[int, frozenset[int]]:
    raise ValueError("this machine was given no revocation verifier")


DIGEST_REFRESH = 10
"""Rounds between repeats of an unchanged record digest to a monitored node."""
DIGEST_RESYNC = 3
"""Rounds before the same disagreement of digests is answered again."""


# ------------------------------------------------------------------ machine --


class NodeMachine(_Fleet):
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
    peers known up from the start, admitted without events; ``first_seq``
    the sequence number a new process of this node publishes from;
    ``seed_interval`` and ``seed_backoff`` the seed exchanges' period and first
    retry delay (``p2p.machine._seeds``); ``packets_admit=False`` leaves
    membership to :meth:`crashed` and :meth:`recovered` alone (an oracle's:
    core packets of a newer life admit nobody).
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
        verify_revocations: VerifyRevocations = _no_revocations,
        recovery: RecoveryConfig | None = None,
        seed_interval: float = 30.0,
        seed_backoff: float = 0.25,
        first_seq: int = 0,
        packets_admit: bool = True,
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
        newest detector version their frames carried (``None``: none did):
        one dict write per frame in :meth:`receive`, handed to the detector
        before any probe leaves or expires."""
        self.topics: set[str] = set()
        """The application's topics (subscribed and not unsubscribed)."""
        self.frontier = Frontier(incarnation)
        """Ordinals of this node's publications and what it delivered per
        source: kept across its incarnations, so a loss is counted."""
        self.recovery = Recovery(node_id, self.frontier, recovery or RecoveryConfig())
        """This node's history as a publisher and its resumes as a subscriber
        (with a detector only: without one nobody leaves the view to come back)."""
        self.frames = ReceiveLog()
        """Per peer, the link and the last frame number handled: a frame sent again
        after a reconnection is dropped (:meth:`frame_fresh`)."""
        self.records_learned = 0
        self.record = b""
        """This node's own signed record (set by the driver; no record, no gossip)."""
        self.peers: dict[int, Peer] = {}
        """The newest verified record of each peer that has not left."""
        self.seeds = Seeds(seed_interval, seed_backoff)
        """The seed addresses and their exchange schedule (``p2p.machine._seeds``)."""
        self.departed: dict[int, Peer] = {}
        """The record of each peer that left or was revoked (older ones stay out)."""
        self.revoked: set[int] = set()
        self.revocation_serial = 0
        self.revocations = b""
        """The fleet's revocation list this node holds (encoded; serial 0: none)."""
        self._verify = verify
        self._verify_revocations = verify_revocations
        self._packets_admit = packets_admit
        interval = 1.0 if detector is None else detector.interval
        self.gossip = RecordGossip(
            refresh=DIGEST_REFRESH * interval, resync=DIGEST_RESYNC * interval
        )
        self._version = 0
        self._next_round: float | None = None
        self._leaving = False
        self.superseded: int | None = None
        """The newer incarnation of this id another process runs (:class:`Superseded`)."""
        self.core = make_core(incarnation)
        if first_seq:  # a new process of a node: its publication ids stay unique
            self.core.first_seq(first_seq)
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
        out = self._handed(cast(Out, self.core.subscribe(topic, now)), now)
        self.topics.add(topic)
        if self.detector is not None:  # a topic taken up again: what it missed meanwhile
            for source in sorted(self.alive):
                out += self._sent(self.recovery.rejoined(source, {topic}, now), now)
        return out

    def preset_subscription(self, topic: str, subscribers: list[int], shared: PresetView) -> None:
        """An oracle's start (the thesis' experiments): ``subscribers`` of ``topic``
        are known to every node already, this one's subscription included if
        it is one of them (``VCubePS.preset_subscription``)."""
        self.core.preset_subscription(topic, subscribers, shared=shared)
        if self.id in subscribers:
            self.topics.add(topic)  # replayed after a reincarnation

    def unsubscribe(self, topic: str, now: float) -> Out:
        out = self._handed(cast(Out, self.core.unsubscribe(topic, now)), now)
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
        out = self._handed(cast(Out, self.core.publish(topic, full, now)), now)
        self.frontier.published(topic)
        first = out[0]  # the core's Published leads its outputs
        if type(first) is Published:
            self.recovery.kept(topic, first.id, full, now)
        return out

    def publish_many(self, topic: str, payloads: Sequence[bytes], now: float, out: Out) -> None:
        """:meth:`publish` for each of ``payloads``, in order, with each one's
        outputs appended to ``out`` as it is accepted: the same outputs and
        state, in one step where the core can take them all at once.  Raises
        as :meth:`publish` at the first one refused (those before it are
        published, their outputs in ``out``)."""
        room = self.core.config.max_payload - ENVELOPE_SIZE
        batch = None
        if max(map(len, payloads), default=0) <= room:
            full = self.frontier.enveloped(topic, payloads)
            batch = self.core.publish_many(topic, full, now)
        if batch is None:
            for payload in payloads:
                out += self.publish(topic, payload, now)
            return
        out += self._handed(cast(Out, batch), now)
        self.frontier.published(topic, len(payloads))
        run = batch[0]  # the core's PublishedRun leads its outputs
        assert type(run) is PublishedRun
        self.recovery.kept_many(topic, [m.id for m in run.messages], full, now)

    def _handed(self, out: Out, now: float) -> Out:
        """The core's deliveries of other nodes' publications, each through the
        frontier and the holds (``Recovery.hand``) as the core makes it, so in
        the core's order, before anything later in the same call moves either.

        One to hand on now stays a ``Delivered`` (nothing missed before it) or
        becomes a :class:`Release` (after ``missed`` publications of its source
        this node will not get); one held for a resume, or delivered already,
        goes; the RESUME a gap calls for follows it.  A payload too short for
        the envelope stays as it is (no honest member sends one: the driver
        drops it)."""
        for o in out:
            if (type(o) is Delivered and not o.own) or type(o) is DeliveredRun:
                break
        else:
            return out
        result: Out = []
        recovery, alive, detector = self.recovery, self.alive, self.detector
        for o in out:
            if type(o) is DeliveredRun:
                if recovery.hand_run(o):
                    result.append(o)  # nothing missed, nothing held: on as it is
                else:
                    result += self._handed(cast(Out, o.expand()), now)
                continue
            if type(o) is not Delivered or o.own or len(o.payload) < ENVELOPE_SIZE:
                result.append(o)
                continue
            member = detector is not None and o.id.source in alive
            missed, more = recovery.hand(o, member, now)
            if missed >= 0:
                recovery.followed(o)
                result.append(o if missed == 0 else Release(o, missed))
            if more:
                result += self._sent(more, now)
        return result

    def _sent(self, items: Iterable[Any], now: float) -> Out:
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
                out += self._handed(
                    cast(Out, self.core.recovered(o.delivery.topic, o.delivery.id)), now
                )
        return out

    def link_opened(self, peer: int, hello: Hello) -> None:
        """A connection from ``peer`` opened with ``hello`` (per-link reliability,
        ``p2p._reliable``): a new link starts afresh before ``hello.first``."""
        self.frames.opened(peer, hello)

    def frame_fresh(self, peer: int, link: int, lseq: int) -> bool:
        """Whether frame ``lseq`` of ``peer``'s ``link`` is new (then it counts as
        handled, and goes to :meth:`receive`); one sent again after a
        reconnection is not."""
        return self.frames.fresh(peer, link, lseq)

    def receive(self, peer: int, body: Body, now: float) -> Out:
        """A decoded frame from ``peer`` (authenticated by the driver): the one door
        by which a frame's content reaches this node.

        In order: its records (a peer back as a new incarnation sends its new
        record ahead of its new life's packets, and an answer to a life taken
        for dead is lost), a restart its packets show, the sign of life (with
        the detector version the frame carries), the core packets, then the
        control messages.  A part that breaks the protocol stops the frame:
        the outputs of what came before it, then :class:`Refused`."""
        if peer in self.revoked:
            return [Refused(peer, f"{peer:016x} was revoked by the fleet")]
        packets, alive = body.packets, body.alive
        if self.detector is not None:  # a sign of life, for the detector
            heard = self.heard
            if alive is None:
                heard.setdefault(peer, None)
            else:
                seen = heard.get(peer)
                heard[peer] = alive if seen is None or seen < alive else seen
        if (
            len(packets) == 1  # the hot path: one packet of a peer in the view
            and body.exchange is None
            and not body.control
            and (peer not in self.dead or peer in self.alive)
        ):
            try:
                return self._handed(cast(Out, self.core.receive(peer, packets[0], now)), now)
            except _REMOTE_ERRORS as exc:
                return [Refused(peer, str(exc))]
        out: Out = []
        try:
            if body.exchange is not None:
                ex = body.exchange
                out += self.exchange(peer, ex.records, ex.reply, now)
            if packets and self._packets_admit and peer in self.dead and peer not in self.alive:
                incs = [p.round.incarnation for p in packets if p.round.source == peer]
                out += self.restarted_by(peer, incs, now)
            core = self.core
            for packet in packets:
                out += self._handed(cast(Out, core.receive(peer, packet, now)), now)
            for msg in body.control:
                out += self._control(peer, msg, now)
        except _REMOTE_ERRORS as exc:
            out.append(Refused(peer, str(exc)))
        return out

    def leave(self, now: float) -> Out:
        """This node leaves gracefully: a LEAVE to every member believed up, and to
        every seed that learnt this node, or may have (an exchange under way),
        but whose own record never came (:class:`LeaveSeed`); the detector and
        the seed exchanges stop (a leaving node accuses nobody)."""
        self._leaving = True
        leave = Leave(self.incarnation)
        out: Out = [SendControl(node, leave) for node in sorted(self.alive)]
        for node, address in sorted(self.seeds.met().items()):
            if node not in self.alive and node not in self.dead:
                out.append(LeaveSeed(address, leave))
        out += [LeaveSeed(address, leave) for address in self.seeds.under_way()]
        return out

    # ------------------------------------------------------- membership --

    def learn(self, node: int, inc: int, now: float) -> Out:
        """Evidence that ``node`` runs as ``inc`` (a verified record, its packets):
        the detector admits it (a new member, or a restart if ``inc`` is newer);
        without a detector it is up at once.  A crashed incarnation stays
        crashed, and a revoked node out."""
        if node == self.id or inc <= self.dead.get(node, -1) or node in self.revoked:
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

    def _control(self, sender: int, msg: Control, now: float) -> Out:
        """A control message from ``sender``.  Raises ``RemoteDetectorError`` on a
        message the detector refuses, ``SecurityError`` on a forged revocation
        list (:meth:`receive` makes either :class:`Refused`); without a
        detector, detector messages are ignored."""
        if isinstance(msg, Leave):
            return self.left(sender, msg.incarnation, "left", now)
        if isinstance(msg, Members):
            return self.on_digest(sender, msg.digest, now) + self._compare(sender, msg.revocations)
        if isinstance(msg, Revoked):
            return self.adopt_revocations(msg.blob, now)
        if isinstance(msg, Resume):
            # A member of the fleet, not revoked: one this node admitted once or
            # holds a verified record of (an asker it still suspects after a
            # partition is one: its new life may not have reached this node).
            member = sender not in self.revoked and (sender in self.incs or sender in self.peers)
            found = self.core.unsettled(msg.topic, sender, self.incs.get(sender, -1))
            if found is None:
                return self._sent(self.recovery.answer(sender, msg, member, now), now)
            first, owed = found
            unsettled = MsgId(self.id, self.incarnation, first)
            return self._sent(
                self.recovery.answer(sender, msg, member, now, unsettled, not owed), now
            )
        if isinstance(msg, Replay):
            return self._sent(self.recovery.replayed(sender, msg, now), now)
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

    def _over(self, node: int, inc: int, dead: int, reason: str, now: float) -> Out:
        """``node`` is over up to ``dead`` for the core (with ``reason``, which the
        detector's own ``Left`` would not carry) and leaves the detector as
        ``inc`` (no suspicion)."""
        out = self._down(node, dead, reason, now)
        if self.detector is not None:
            out += self._on_detector(self.detector.leave(node, inc, now), now)
        return out

    def stale(self, node: int, inc: int, crashed: bool) -> bool:
        """Whether an oracle's verdict on ``node`` (``inc`` crashed, or up) is no
        news: the newest the machine holds of it, ``(incarnation, crashed)``,
        is at or past it (verdicts may arrive in any order)."""
        held = max((self.incs.get(node, 0), 0), (self.dead.get(node, -1), 1))
        return (inc, 1 if crashed else 0) <= held

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

    def restore_frontier(self, frontiers: dict[str, dict[int, tuple[int, int]]]) -> None:
        """What this node delivered before its process restarted (kept in its node
        directory): its resumes and gap counts start from there."""
        self.frontier.restore(frontiers)

    # ----------------------------------------------------------- timers --

    def start_rounds(self, at: float) -> None:
        """Detector rounds run at ``at + k * interval`` (the driver's phase);
        until this is called the timer is unset."""
        self._next_round = at

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` is next due (``None``: nothing to wake for:
        no detector round or probe, resume or seed exchange due, or leaving,
        or superseded); a pure query.

        The timer contract, the same for every driver: after each call into
        the machine, the driver's one wake-up is ``get_timer()`` (an input may
        move it earlier or later), and when that time comes it calls
        :meth:`handle_timer` with the time it actually runs."""
        if self._stopped:
            return None
        det, next_round = self.detector, self._next_round
        times = [self.seeds.deadline()]
        if det is not None and next_round is not None:
            times += (next_round, det.deadline(), self.recovery.deadline())
        return min((t for t in times if t is not None), default=None)

    def handle_timer(self, now: float) -> Out:
        """The timer fired: a detector round if one is due (rounds keep a fixed
        grid; missed ones are skipped, not run in a burst), else the probes
        whose deadline passed expire; the resumes and seed exchanges due.  A
        timer handled late means this process stalled: :class:`Stalled`."""
        if self._stopped:
            return []
        out = self._detector_timer(now)
        for address in self.seeds.due(now):
            out.append(ExchangeWithSeed(address, tuple(self.known_records())))
        return out

    def _detector_timer(self, now: float) -> Out:
        """:meth:`handle_timer`'s detector round or probe expiry, and resumes."""
        det, next_round = self.detector, self._next_round
        if det is None or next_round is None:
            return []
        out: Out = []
        due = self.get_timer()  # what the driver was woken for (the contract)
        if due is not None and now - due > det.config.timeout / 4:
            out.append(Stalled(now - due, det.resumed(now)))
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
        return out + self._sent(self.recovery.expire(now), now)

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
        if inc <= self.dead.get(node, -1) or inc < self.incs.get(node, 0) or node in self.revoked:
            return []  # a revoked node's every life is over, whoever reports a new one
        before = self.incs.get(node)
        self.incs[node] = inc
        out: Out = []
        if node not in self.alive:
            self.alive.add(node)
            self._overlay_changed()
            out.append(MemberUp(node, inc, reason))
        elif before is not None and inc > before:
            out.append(MemberUp(node, inc, "restarted"))
        out += self._handed(cast(Out, self.core.joined(node, inc, now)), now)
        if out and type(out[0]) is MemberUp and self.detector is not None:
            # Back in the view, or a new life: what it published meanwhile.
            out += self._sent(self.recovery.rejoined(node, self.topics, now), now)
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
        if was_up:  # only the life its frame numbers belong to: a newer one's link keeps them
            self.frames.forget(node)
        out: Out = [MemberDown(node, inc, reason, was_up)]
        out += self._handed(cast(Out, self.core.crashed(node, inc, now)), now)
        if was_up:
            out += self._sent(self.recovery.gone(node, now), now)
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
                out += self._handed(cast(Out, self.core.joined(node, inc, now)), now)
        for topic in sorted(self.topics):
            out += self._handed(cast(Out, self.core.subscribe(topic, now)), now)
        return out


__all__ = ["DIGEST_REFRESH", "DIGEST_RESYNC", "NodeMachine"]
