"""The VCube failure detector as a sans-IO core (DESIGN.md §5, "Detection").

Model
-----
A node is ``(node_id, incarnation)``.  Every detector keeps one *entry* per
known node, ``(incarnation, counter)``: an even counter means "believed
correct", an odd one "suspected" (VCube's event counters).  An entry is
*newer* than another when its incarnation is higher, or the incarnation is the
same and the counter higher; entries only ever move to newer ones, so merging
is a join (max) and order, duplication and staleness of messages never undo
knowledge.  A node raises another's counter from even to odd when a probe to
it times out (a suspicion) and from odd to even when it hears from it again (a
correction); a restarted node comes back with a higher incarnation, which
supersedes everything said about the old one.

Membership (who exists) comes from the driver through :meth:`Detector.join` and
:meth:`Detector.leave` (discovery, overlay join/leave); the detector never adds
a node it only read about in an entry, so a node that left cannot come back
through stale gossip.

Testing rounds
--------------
The driver calls :meth:`Detector.tick` every ``interval``.  With *correct*
meaning "believed correct by this node", node ``i`` checks two sets of nodes:

* **pull targets** ``P_i``: for each non-empty cluster ``c(i, s)``, its first
  correct node, ``FIRSTCHILD(i, s)`` (DESIGN.md §2).  These are ``i``'s children
  in its own spanning tree, so information anywhere reaches ``i`` by following
  its tree bottom-up, one hop per round: after a crash, about ``depth`` rounds.
* **designated nodes** ``D_i``: the nodes ``j`` for which ``i`` is the first
  correct node of ``c(j, s)``, the cluster of ``j`` holding ``i``.  This is the
  original VCube assignment (Duarte, Bona and Ruoso 2014): every node has
  exactly one designated tester per non-empty cluster, so a batch of crashes
  is detected in parallel instead of one node per round by a puller walking a
  cluster whose first nodes are all dead.  When views agree, ``j`` is in
  ``D_i`` exactly when ``i`` is in ``P_j``: in steady state the ``D`` checks
  are paid for by the ``P`` probes flowing the other way, so a designated node
  is probed only after a whole interval of silence.

Tests per round: each pull uses one (prober, cluster) pair and each designated
check one (target, cluster) pair, and without false suspicions a pair has one
live designated tester, so a round sends at most ``2T`` probes, ``T`` the number
of non-empty (node, cluster) pairs; round 0 sends exactly ``T``, steady state
about ``T / 2``.  ``T = N log2 N`` for a dense cube; on random 64-bit ids it is
about ``N (log2 N + 0.3)``, and can exceed ``N ceil(log2 N)`` (ids 0, 1, 2, 4:
``T = 9 > 8``), whatever the assignment, since every non-empty cluster needs a
test.

A check costs nothing when the node was heard from since the previous tick
(any message, or data traffic reported with :meth:`Detector.heard`), except
that a pull target must also show a state version no newer than the one ``i``
already has.  Otherwise ``i`` sends a :class:`Probe`; if no message from the
node arrives within ``timeout`` (strictly after the probe left), ``i`` probes
again, up to ``attempts`` probes in a row, then suspects it and moves on to
the next correct node of that cluster.  Probes expire at ticks, or exactly at
their deadline when the driver calls :meth:`Detector.expire` at
:meth:`Detector.deadline` (the runtime and ``p2p.sim._detsim`` do).

Pushes: eager dissemination
---------------------------
Pulls alone carry a change up every node's tree one round per hop.  So every
change a node makes *itself* (a suspicion on timeout, a correction on hearing
from a suspected node, a restart it learns first-hand, its own refutation or
new incarnation) is also sent at once as a :class:`Push` to its first correct
node of every cluster, and a node receiving a push from ``j`` merges it and
forwards it to its first correct node of every cluster below
``CLUSTER(self, j)``: the VCube hierarchical broadcast over the origin's tree,
``N - 1`` messages per change when views agree.  Entries learnt from a message
are not pushed again (a change causes one wave per node that made it, not one
per node that learnt it).  Entries are monotone facts merged by max, so a push
that is late, duplicated, lost or routed by a stale view does no harm: pulls
still deliver every change, within the pull-only bound.

The transport's hint
--------------------
:meth:`Detector.probe_now` lets the driver probe a node at once when its
connection broke and re-dialling failed (what a crashed process's peers see),
instead of waiting for a check.  It is only a probe: the suspicion still
takes ``attempts`` unanswered probes of ``timeout`` each.

Which entries a tester takes
----------------------------
A tester takes from the tested node only *newer* entries (the VCube
timestamp rule), but every newer entry, not only those of the tested cluster
``c(i, s)`` (the Hi-ADSD rule, which the thesis' wording suggests).  With the
cluster-only rule, ``i`` learns that nodes of ``c(i, s)`` crashed only from
``c(i, s)`` itself, so a cluster whose first nodes are all dead is walked one
node per round: in ``p2p.sim._detsim``, a dense 128-node cube losing one half
takes 66 rounds (beyond ``log2(N)^2 = 49``) with it, 7 with this rule.  Taking
every newer entry is safe because entries are monotone facts and merging is a
max; the cost is that a change reaches a node once from each node it pulls
from after that one learnt it, about ``log2 N`` copies of ~12 bytes per node
and event.

Cheap steady state: versions and deltas
---------------------------------------
Every local entry change bumps the node's state ``version`` and stamps the
entry with it (an entry learnt by :meth:`Detector.join` for a new node is
stamped 0: membership is the driver's business).  A probe carries ``since``,
the prober's copy of the target's version (for the target's incarnation it
knows); the reply carries the target's current ``version`` and only the entries
stamped after ``since`` (at most ``max_entries``, oldest first; a partial reply
brings ``since`` up to the last entry it holds, and the next probe goes on).
Every message carries the sender's version, and a driver may piggyback the
version on data frames (``heard(node, now, version=v)``): a pull target whose
known version equals ``since`` and that was heard from needs no probe at all.

Bytes, with the CBOR arrays of :func:`encode_detector` (uint ``x`` costs 1 byte below
24, 2 below 256, 3 below 65536, 5 below 2^32, else 9; node ids are 64-bit, so
9 bytes): a probe ``[0, round, incarnation, version, target, since]`` is 8 to
~16 bytes, an empty reply ``[1, round, incarnation, version, []]`` 6 to ~13
bytes, a push ``[2, incarnation, version, [...]]`` 5 to ~12 bytes, and each
entry adds ``node, incarnation, counter``, ~11 bytes.  When nothing changes
and links are idle, each checked pair costs about one probe and one empty
reply per round; when data covers a link in both directions it costs only the
piggybacked version (1 to 3 bytes per data frame).  Each change costs one push
wave, ``N - 1`` pushes of ~25 bytes, plus the pulls that would carry it anyway.

Adaptive timeouts
-----------------
With ``max_timeout`` above ``timeout`` (the runtime's default), each probe
gets its own timeout from :mod:`vcube._timing`: round-trip estimates per node
(RFC 6298), a conservative first one for a node never answered yet, and
Lifeguard's local health multiplier, raised by evidence of false suspicions
(a suspected node heard from, or back right after; this node suspected
itself) and lowered after calm rounds.  Also Lifeguard's self-doubt: when
one expiry would suspect several nodes at once, the prober is the likelier
culprit, so it raises its score and probes each of them once more first.
A retry without a hint from the transport backs off to ``max_timeout``;
a hinted one (:meth:`Detector.probe_now`) keeps the ordinary timeout.
Read ``timeout`` below as "the probe's timeout", which stays within
``[timeout, max_timeout]``; a suspicion may take one attempt more.

Guarantees (no message loss)
----------------------------
* **Accuracy**: a node is suspected only when ``attempts`` probes in a row to
  it each got no message at all from it within ``timeout`` of leaving (a
  message counts for a probe only if it arrived strictly after the probe
  left); if round trips stay below ``timeout``, no correct node is ever
  suspected, and with ``attempts = a`` not while they stay below
  ``a * timeout`` either (a late answer to one attempt answers the next).
  Pushes and hints change when probes leave and how fast suspicions spread,
  never what makes one.
* **Completeness**: a crashed node stops sending, so whoever checks it probes
  it at the latest at its second tick after the crashed node's last message
  arrived (at once on the transport's hint) and suspects it ``attempts``
  timeouts later with expiry at deadlines (``attempts`` rounds with expiry at
  ticks, ``timeout <= interval``); with adaptive timeouts, at most
  ``(attempts + 1) * max_timeout`` later, plus up to ``2 * max_timeout`` when
  the prober heard from no node at all meanwhile (isolation: it suspects its
  own traffic first, ``Detector._isolated``).  The suspicion is then pushed down its
  tree: with one crash and agreeing views, every correct node knows it one
  tree walk (depth times the one-way delay) later.  ``tests/test_detector.py``
  asserts ``2 + (delta + attempts * timeout + depth * delta) / interval``
  rounds for one-way delays up to ``delta``.  Without pushes (lost, or
  several crashes at once breaking the trees) the suspicion travels up every
  node's spanning tree one pull (one round plus a round trip) per hop, and the
  tests assert the published bound ``B = ceil(log2 N)^2`` plus two rounds plus
  the delays (``delta (2B + 1)``), plus one round per extra ``attempts``.
* **Doubt**: a node that reads an accusation of a node it heard from
  within ``timeout`` holds it (:meth:`Detector._doubt`) and adopts it only
  once a ``timeout`` passes without a word from that node, so a crash
  reaches such a node at most one ``timeout`` later than the bounds above.
* **Revival**: with ``revive``, a suspected node is probed every ``revive``
  rounds for ``revive_rounds`` rounds; after a partition heals within that
  time, both sides hear each other again within ``revive`` rounds plus a
  round trip.
* **Self-suspicion**: a node that reads an entry about itself with its own
  incarnation and a higher counter was suspected: it emits
  :class:`SelfSuspected` (the library treats a suspected incarnation as crashed,
  so the driver restarts the upper layers and calls :meth:`Detector.reincarnate`)
  and meanwhile refutes with the next even counter, which spreads like any
  correction.

Layout
------
The messages and their wire format live in :mod:`vcube._detmsg`, the outputs
and :class:`~vcube._detout.DetectorStats` in :mod:`vcube._detout`; this
module keeps the configuration and the state machine.  :class:`Detector`
stays one class (about 700 lines): probing, expiry, gossip and verdicts read
and write the same per-node tables.  An entry change (:meth:`Detector._set`)
drops the node's pending probe, sync point and round-trip estimate and
invalidates the view the probes follow; an expiry ends in such a change; a
merged accusation may send a probe (:meth:`Detector._doubt`).  A base class
holding one half would have to call back into the other through abstract
methods: the two halves would depend on each other.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

from vcube._detmsg import DetectorMessage, Entry, Probe, Push, Reply, _check_message, _is_uint
from vcube._detout import (
    _CHECKS,
    _DOUBTS,
    _PROBES,
    _PUSHES,
    _RECEIVED,
    _REPLIES,
    _REVIVALS,
    _ROUNDS,
    _SENT,
    _TIMEOUTS,
    Corrected,
    DetectorOutput,
    DetectorStats,
    Joined,
    Left,
    Reported,
    Restarted,
    SelfSuspected,
    SendDetector,
    Suspected,
)
from vcube._errors import DetectorError, RemoteDetectorError
from vcube._hot import hot, replace
from vcube._timing import ProbeTimeouts
from vcube._topology import ID_BITS, MAX_ID, cluster, partition_sorted

_EPS = 1e-9
"""Tolerance on ``age >= timeout``: ticks computed as ``phase + k * interval``
must expire a probe whose age is ``timeout`` up to rounding."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DetectorConfig:
    """Timing and limits of a detector; validated on construction.

    ``interval`` is the period at which the driver calls :meth:`Detector.tick`;
    ``timeout`` the age at which an unanswered probe means a suspicion (keep it
    above the worst round trip, or correct nodes get suspected); probes are
    expired at ticks, so an effective timeout is rounded up to a tick.
    ``max_entries`` bounds the entries of one reply, sent and accepted.
    ``attempts`` is how many probes in a row must go unanswered before a
    suspicion (the next attempt leaves when the previous one expires): each
    further attempt costs one ``timeout`` of detection latency and makes a
    delay spike on one exchange harmless.  ``push``: send every change this
    node makes itself down its VCube broadcast tree at once (:class:`Push`),
    and forward the pushes it receives; ``False`` leaves dissemination to pulls.
    """

    interval: float = 1.0
    timeout: float = 0.5
    max_entries: int = 4096
    attempts: int = 1
    push: bool = True
    max_timeout: float | None = None
    """Adaptive timeouts (:mod:`vcube._timing`): a probe's timeout follows the
    measured round trips and the local health score, between ``timeout`` and
    this.  ``None`` (or ``timeout``): every probe gets exactly ``timeout``."""
    revive: int = 0
    """Rounds between probes of a suspected node, for :attr:`revive_rounds`
    rounds after the suspicion (0: never).  A node cut off by a partition is
    suspected by every node of the other side and, once suspected, is never
    probed again; after the heal no message would cross, and both sides would
    stay apart for good.  A revival probe that is answered corrects the
    suspicion and shows each side the other's accusation, so both come back
    as new incarnations and merge (serf's reconnect of failed members)."""
    revive_rounds: int = 600
    """How long, in rounds, a suspected node is still probed (``revive``)."""

    def __post_init__(self) -> None:
        adaptive = () if self.max_timeout is None else ("max_timeout",)
        for name in ("interval", "timeout", *adaptive):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DetectorError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise DetectorError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("revive", "revive_rounds"):
            value = getattr(self, name)
            if not _is_uint(value):
                raise DetectorError(f"{name} must be an integer >= 0, got {value!r}")
        for name in ("max_entries", "attempts"):
            value = getattr(self, name)
            if not _is_uint(value) or value < 1:
                raise DetectorError(f"{name} must be an integer >= 1, got {value!r}")
        if type(self.push) is not bool:
            raise DetectorError(f"push must be a bool, got {self.push!r}")
        if self.max_timeout is not None and self.max_timeout < self.timeout:
            raise DetectorError(f"max_timeout must be >= timeout, got {self.max_timeout!r}")


# ----------------------------------------------------------------- detector --


@hot
class _Pending:
    """An unanswered probe: its round, send time, the target's incarnation it
    was meant for, the sync epoch it was sent in, which attempt it is and how
    long it may go unanswered, whether it is the extra attempt of self-doubt
    and whether the transport hinted at a crash (:meth:`Detector.probe_now`)."""

    round: int
    sent: float
    target: int
    epoch: int
    attempt: int
    timeout: float
    spared: bool = False
    hinted: bool = False


@hot
class _View:
    """What one believed-correct set implies: pull targets and monitored nodes."""

    pulls: frozenset[int]
    monitored: tuple[int, ...]


def _designated(me: int, j: int, nonempty: int) -> bool:
    """Whether ``me`` is the first correct node of ``c(j, cluster(me, j))``.

    That cluster is ``me``'s half at level ``s``; a node ``y`` of ``c(me, t)``,
    ``t < s``, is XOR-closer to ``j`` than ``me`` exactly when bit ``t-1`` of
    ``me ^ j`` is set.  So ``me`` is first iff every such bit falls on a level
    with no correct node: ``nonempty`` has bit ``t-1`` set for non-empty ``c(me, t)``.
    """
    d = me ^ j
    return d & ((1 << (d.bit_length() - 1)) - 1) & nonempty == 0


class Detector:
    """One node's VCube failure detector (see the module docstring).

    Invariants between calls: every entry only moved to newer ones; every
    local entry change is stamped with a fresh ``version``; a node has at most
    one unanswered probe; the cached view matches the current believed-correct
    set, and ``_correct`` lists that set sorted; every change this node made
    itself (not merged from a message) has been pushed (``config.push``) by
    the call that made it.  Nothing reads a clock or global randomness: every
    call takes ``now``.
    """

    __slots__ = (
        "_cfg",
        "_correct",
        "_doubted",
        "_entries",
        "_epoch",
        "_heard",
        "_heard_any",
        "_heard_at",
        "_last_tick",
        "_log",
        "_me",
        "_news",
        "_pending",
        "_previous",
        "_pulls",
        "_reported",
        "_round",
        "_stamp",
        "_stats",
        "_suspected_in",
        "_sync",
        "_timeouts",
        "_version",
        "_view",
    )

    def __init__(self, me: int, incarnation: int, *, config: DetectorConfig | None = None) -> None:
        _check_local(me, incarnation)
        self._me = me
        self._cfg = config or DetectorConfig()
        self._entries: dict[int, tuple[int, int]] = {me: (incarnation, 0)}
        self._correct: list[int] = [me]
        """The believed-correct nodes, this one included, sorted (kept with ``_entries``)."""
        self._stamp: dict[int, int] = {}
        self._log: list[tuple[int, int]] = []
        self._version = 0
        self._round = 0
        self._pending: dict[int, _Pending] = {}
        self._sync: dict[int, tuple[int, int]] = {}
        self._epoch = 0
        self._heard: dict[int, int | None] = {}
        self._heard_at: dict[int, float] = {}
        self._heard_any = -math.inf
        """When a sign of life last came from any node (isolation, :meth:`_expire`)."""
        self._reported: dict[int, tuple[int, int]] = {}
        """Per unknown node, the newest suspected entry heard of (:class:`Reported`),
        stamped like an entry so that pulls pass it on (:meth:`_note_reported`)."""
        self._last_tick = -math.inf
        self._view: _View | None = None
        self._pulls: tuple[int, ...] | None = None
        self._previous: frozenset[int] = frozenset()
        self._stats = [0] * (_DOUBTS + 1)
        self._news: list[int] = []
        self._doubted: dict[int, tuple[int, int]] = {}
        """Accusations of nodes heard from too recently to believe them (:meth:`_doubt`)."""
        self._suspected_in: dict[int, int] = {}
        """Per suspected node, the round its suspicion began (revival probes)."""
        cfg = self._cfg
        self._timeouts = ProbeTimeouts(cfg.timeout, cfg.max_timeout or cfg.timeout)

    def __repr__(self) -> str:
        return (
            f"Detector(me={self._me}, incarnation={self.incarnation}, known={len(self._entries)}, "
            f"suspected={len(self.suspected())}, version={self._version})"
        )

    # ------------------------------------------------------------ queries --

    @property
    def me(self) -> int:
        """This node's id."""
        return self._me

    @property
    def incarnation(self) -> int:
        """This node's current incarnation."""
        return self._entries[self._me][0]

    @property
    def version(self) -> int:
        """Version of this node's diagnostic state: piggyback it on data frames."""
        return self._version

    @property
    def config(self) -> DetectorConfig:
        """The configuration this detector runs with."""
        return self._cfg

    @property
    def stats(self) -> DetectorStats:
        """Cumulative counters (see :class:`DetectorStats`)."""
        return DetectorStats(*self._stats)

    @property
    def health(self) -> int:
        """The local health score (0: healthy); see :mod:`vcube._timing`."""
        return self._timeouts.health

    def timeout_for(self, node: int) -> float:
        """The timeout a probe to ``node`` leaving now would get."""
        return self._timeouts.timeout(node)

    def entry(self, node: int) -> tuple[int, int] | None:
        """``(incarnation, counter)`` known for ``node``, or ``None`` if unknown."""
        return self._entries.get(node)

    def correct(self) -> frozenset[int]:
        """Known nodes believed correct, this node included."""
        return frozenset(n for n, (_, c) in self._entries.items() if not c & 1)

    def suspected(self) -> frozenset[int]:
        """Known nodes currently suspected."""
        return frozenset(n for n, (_, c) in self._entries.items() if c & 1)

    def monitored(self) -> tuple[int, ...]:
        """The nodes checked each round (pull targets and designated nodes),
        sorted: the links the detector wants alive."""
        return self._current_view().monitored

    # --------------------------------------------------------- membership --

    def join(self, node: int, incarnation: int, now: float) -> list[DetectorOutput]:
        """Membership learnt ``node`` at ``incarnation`` (discovery, overlay join).

        A new node enters believed correct, unstamped; an existing node with a
        higher incarnation restarted (stamped, spreads); anything else is a no-op.
        A new member resets every pull to a full one, since entries about it
        read before it was known were skipped.
        """
        _check_local(node, incarnation)
        if node == self._me:
            raise DetectorError("a detector cannot join itself")
        known = self._entries.get(node)
        if known is None:
            if self._reported.pop(node, None) is not None:
                self._stamp.pop(node, None)  # a member now: its entry starts unstamped
            self._entries[node] = (incarnation, 0)
            insort(self._correct, node)
            self._invalidate_view()
            self._reset_sync()
            return [Joined(node, incarnation)]
        out: list[DetectorOutput] = []
        if incarnation > known[0]:
            self._set(node, (incarnation, 0), out, news=True)
        self._push_news(out)
        return out

    def leave(self, node: int, incarnation: int, now: float) -> list[DetectorOutput]:
        """``node`` announced a graceful leave: forget it (no suspicion).

        Ignored for an older incarnation than the one known (a stale
        announcement must not remove a restarted node).
        """
        _check_local(node, incarnation)
        known = self._entries.get(node)
        if node == self._me or known is None or incarnation < known[0]:
            return []
        del self._entries[node]
        for table in (self._stamp, self._pending, self._sync, self._heard, self._heard_at):
            table.pop(node, None)
        self._timeouts.forget(node)
        if not known[1] & 1:
            del self._correct[bisect_left(self._correct, node)]
        self._invalidate_view()
        return [Left(node, incarnation)]

    def reincarnate(self, incarnation: int, now: float) -> list[DetectorOutput]:
        """This node restarts its upper layers as ``incarnation`` (after
        :class:`SelfSuspected`); the new incarnation spreads like any entry."""
        _check_local(self._me, incarnation)
        if incarnation <= self.incarnation:
            raise DetectorError(f"new incarnation {incarnation} <= {self.incarnation}")
        self._entries[self._me] = (incarnation, 0)
        self._bump(self._me)
        self._news.append(self._me)
        out: list[DetectorOutput] = []
        self._push_news(out)
        return out

    # ------------------------------------------------------------- rounds --

    def tick(self, now: float) -> list[DetectorOutput]:
        """Start one testing round; the driver calls it every ``interval``.

        First expires probes older than ``timeout`` (as :meth:`expire`), then
        checks every monitored node of the updated view: a probe unless it was
        heard from since the previous tick (and, for a pull target, showed no
        newer version) or a probe to it is still pending.
        """
        if now < self._last_tick:
            raise DetectorError(f"time went backwards: {now} < {self._last_tick}")
        out = self._expire(now)
        self._round += 1
        self._timeouts.round()
        view = self._current_view()
        for node in view.monitored:
            if self._needs_probe(node, view):
                out.append(self._probe(node, now))
        if self._suspected_in and self._cfg.revive:
            self._revive(now, out)
        self._stats[_ROUNDS] += 1
        self._stats[_CHECKS] += len(view.monitored)
        self._heard.clear()
        self._previous = frozenset(view.monitored)
        self._last_tick = now
        self._push_news(out)
        return out

    def _revive(self, now: float, out: list[DetectorOutput]) -> None:
        """Probe every ``revive`` rounds each node suspected within the last
        ``revive_rounds`` rounds (:attr:`DetectorConfig.revive`).  Such a probe
        never makes a suspicion (its expiry finds the node suspected already);
        an answer is a sign of life like any other."""
        cfg, rnd = self._cfg, self._round
        for node, since in list(self._suspected_in.items()):
            age = rnd - since
            if age > cfg.revive_rounds:
                del self._suspected_in[node]
            elif age and age % cfg.revive == 0 and node not in self._pending:
                out.append(self._probe(node, now))
                self._stats[_REVIVALS] += 1

    def deadline(self) -> float | None:
        """When the oldest unanswered probe expires (``None``: no probe pending).

        A driver that calls :meth:`expire` then (rather than waiting for the
        next tick) suspects after exactly ``timeout`` per attempt.
        """
        if not self._pending:
            return None
        return min(p.sent + p.timeout for p in self._pending.values())

    def resumed(self, now: float) -> int:
        """The driver was not running for a while before ``now`` (its event loop
        lagged: a busy CPU, a suspended process), measured by the driver.

        Lifeguard's rule (memberlist): a node does not accuse others of its own
        slowness.  Their answers may be waiting unread in its socket buffers,
        so every unanswered probe gets at least half a ``timeout`` from ``now``
        before it expires, and (adaptive timeouts) the health score rises, so
        the next probes get more time too.  Returns how many probes were
        given more time.
        Accuracy only gains; completeness is delayed by at most half a
        timeout per stall.
        """
        self._timeouts.stalled()
        moved = 0
        for node, p in list(self._pending.items()):
            answered = self._heard_at.get(node, -math.inf) > p.sent
            floor = now - p.timeout / 2
            if p.sent < floor and not answered:
                self._pending[node] = replace(p, sent=floor)
                moved += 1
        return moved

    def expire(self, now: float) -> list[DetectorOutput]:
        """Expire the probes sent ``timeout`` or more before ``now``.

        For each, unless its target was heard from after it left (strictly
        later: what arrived by then was reported before the probe left) or
        changed incarnation meanwhile: probe again if attempts remain, else
        suspect the target (and push the suspicion).
        """
        out = self._expire(now)
        self._push_news(out)
        return out

    def probe_now(self, node: int, now: float) -> list[DetectorOutput]:
        """A hint from the transport (the connection to ``node`` broke and could
        not be re-established): probe ``node`` now instead of at the next tick.

        Only a probe: the suspicion still needs ``attempts`` unanswered probes
        of ``timeout`` each, and any message from ``node`` arriving after a
        probe left answers it (and spends the hint).  A no-op for an unknown or
        suspected node, or while an unanswered probe to it is pending (it
        already counts); a pending probe that was answered is replaced.
        """
        _check_local(node, 0)
        known = self._entries.get(node)
        if node == self._me or known is None or known[1] & 1:
            return []
        p = self._pending.get(node)
        if p is not None and self._heard_at.get(node, -math.inf) <= p.sent:
            self._pending[node] = replace(p, hinted=True)  # its retry need not back off
            return []
        return [self._probe(node, now, hinted=True)]

    def heard(self, node: int, now: float, *, version: int | None = None) -> list[DetectorOutput]:
        """Traffic from ``node``'s known incarnation arrived (``version``: its
        detector version if the frame carried it).  A sign of life: it answers
        any pending check and corrects a suspicion."""
        if version is not None and not _is_uint(version):
            raise DetectorError(f"version must be a uint64, got {version!r}")
        out: list[DetectorOutput] = []
        if node in self._entries and node != self._me:
            self._alive(node, version, now, out)
        self._push_news(out)
        return out

    def receive(self, sender: int, msg: DetectorMessage, now: float) -> list[DetectorOutput]:
        """Handle a detector message from ``sender``.

        Raises :class:`RemoteDetectorError`, with no state change, on a malformed
        message.  A message from an older incarnation than the known one is
        ignored; one from a newer incarnation is a restart.  A probe is answered
        with the entries stamped after its ``since``; a reply's entries are
        merged; a push's entries are merged and forwarded down the tree.
        """
        if not _is_uint(sender) or sender == self._me:
            raise RemoteDetectorError(f"bad detector sender {sender!r}")
        _check_message(msg, self._cfg.max_entries)
        out: list[DetectorOutput] = []
        known = self._entries.get(sender)
        if known is not None:
            if msg.incarnation < known[0]:
                return out
            if msg.incarnation > known[0]:
                self._set(sender, (msg.incarnation, 0), out, news=True)
            self._alive(sender, _shown_version(msg, self._cfg.max_entries), now, out)
        if isinstance(msg, Probe):
            out.append(SendDetector(sender, self._answer(msg)))
        elif isinstance(msg, Push):
            self._forward(sender, msg, now, out)
        else:
            self._take(sender, msg, now, out)
        self._push_news(out)
        return out

    # ----------------------------------------------------------- internals --

    def _current_view(self) -> _View:
        """The cached view, recomputed after any change of the correct set."""
        if self._view is None:
            me = self._me
            pulls = self._current_pulls()
            nonempty = 0
            for child in pulls:
                nonempty |= 1 << (cluster(me, child) - 1)
            chosen = {j for j in self._correct if j != me and _designated(me, j, nonempty)}
            self._view = _View(frozenset(pulls), tuple(sorted(chosen.union(pulls))))
        return self._view

    def _current_pulls(self) -> tuple[int, ...]:
        """``FIRSTCHILD(me, s)`` of every non-empty cluster, by ``s``: the pull
        targets, and the children of this node in every broadcast tree it roots.
        Cached like the view, but cheaper: a push needs no designated nodes."""
        if self._pulls is None:
            self._pulls = tuple(child for child, _ in partition_sorted(self._me, self._correct))
        return self._pulls

    def _invalidate_view(self) -> None:
        """The believed-correct set changed: recompute the view when next needed."""
        self._view = None
        self._pulls = None

    def _needs_probe(self, node: int, view: _View) -> bool:
        """No probe while one is pending, or if ``node`` was heard from since the
        last tick and (pull targets only) showed a version we already have.  A
        designated node that is not a pull target is probed only once it has
        been monitored for a whole interval without a word: its own pulls to us
        are the expected sign of life, and they need a round to show up."""
        if node in self._pending:
            return False
        if node not in view.pulls:
            return node not in self._heard and node in self._previous
        if node not in self._heard:
            return True
        seen, synced = self._heard[node], self._synced(node)
        return seen is None or synced is None or seen > synced

    def _synced(self, node: int) -> int | None:
        """The version of ``node`` we hold, for its currently known incarnation."""
        sync = self._sync.get(node)
        return sync[1] if sync is not None and sync[0] == self._entries[node][0] else None

    def _probe(
        self,
        node: int,
        now: float,
        attempt: int = 1,
        *,
        spared: bool = False,
        hinted: bool = False,
    ) -> SendDetector:
        """A probe to ``node``, recorded as pending (``spared``: the extra
        attempt of self-doubt, see :meth:`_expire`; ``hinted``: the transport
        saw the peer's process gone).  A retry without a hint backs off to the
        longest timeout (:meth:`ProbeTimeouts.retry`); a hinted one does not,
        so a crash the transport saw is still suspected in ``attempts``
        ordinary timeouts."""
        target = self._entries[node][0]
        since = self._synced(node) or 0
        timeouts = self._timeouts
        timeout = timeouts.timeout(node) if attempt == 1 or hinted else timeouts.retry()
        self._pending[node] = _Pending(
            self._round, now, target, self._epoch, attempt, timeout, spared, hinted
        )
        self._stats[_PROBES] += 1
        msg = Probe(
            round=self._round,
            incarnation=self.incarnation,
            version=self._version,
            target=target,
            since=since,
        )
        return SendDetector(node, msg)

    def _expire(self, now: float) -> list[DetectorOutput]:
        """Drop probes older than their timeout; suspect their targets (or,
        before the last attempt, probe them again) unless they were heard from
        after the probe left or changed incarnation meanwhile.  Pushes nothing.

        With adaptive timeouts, Lifeguard's self-doubt: when several nodes
        would be suspected at once, this node is the likelier culprit (its
        answers unread behind a busy loop), so it raises its health score and
        probes each of them once more before suspecting it (never twice, so a
        crash is still suspected, one timeout later).  Held accusations are
        settled first (:meth:`_settle_doubts`)."""
        out: list[DetectorOutput] = []
        if self._doubted:
            self._settle_doubts(now, out)
        due: list[tuple[int, _Pending]] = []
        for node, p in list(self._pending.items()):
            if now - p.sent < p.timeout - _EPS:
                continue
            del self._pending[node]
            inc, counter = self._entries[node]
            if inc != p.target or counter & 1 or self._heard_at.get(node, -math.inf) > p.sent:
                continue
            if p.attempt < self._cfg.attempts:
                out.append(self._probe(node, now, p.attempt + 1, hinted=p.hinted))
            else:
                due.append((node, p))
        if due and self._isolated(now, due):
            self._timeouts.false_suspicion()
            return out + [self._probe(n, now, p.attempt, spared=p.spared) for n, p in due]
        doubt = len(due) > 1 and self._timeouts.adaptive
        if doubt:
            self._timeouts.false_suspicion()
        for node, p in due:
            if doubt and not p.spared:
                out.append(self._probe(node, now, p.attempt, spared=True, hinted=p.hinted))
            else:
                inc, counter = self._entries[node]
                self._stats[_TIMEOUTS] += 1
                self._set(node, (inc, counter + 1), out, news=True)
        return out

    def _isolated(self, now: float, due: list[tuple[int, _Pending]]) -> bool:
        """Whether this node, not the ones it would suspect, is the likelier
        culprit: with adaptive timeouts, at least two others believed correct,
        no transport hint, and no sign of life from *any* node since the
        oldest due probe left (its own messages may be what is not getting
        through: everyone else talking to each other and not to it means they
        suspect it).  It then probes them again instead of accusing them,
        for at most ``2 * max_timeout`` of silence, so completeness holds with
        that much more delay.  Without it, a node whose outgoing traffic was
        held up accused every node it monitors, the fleet adopted those
        accusations, and healthy nodes had to come back as new incarnations."""
        t = self._timeouts
        if not t.adaptive or len(self._correct) < 3 or any(p.hinted for _, p in due):
            return False
        oldest = min(p.sent for _, p in due)
        return self._heard_any <= oldest and now - self._heard_any < 2 * t.ceiling

    def _alive(self, node: int, version: int | None, now: float, out: list[DetectorOutput]) -> None:
        """Record a sign of life from known ``node``; correct it if suspected."""
        prev = self._heard.get(node)
        self._heard[node] = version if prev is None else max(prev, version or 0)
        self._heard_at[node] = now
        self._heard_any = now
        inc, counter = self._entries[node]
        if counter & 1:
            self._set(node, (inc, counter + 1), out, news=True)

    def _answer(self, probe: Probe) -> Reply:
        """The entries stamped after ``probe.since`` (all stamped ones if the
        probe was meant for another incarnation or claims a future version)."""
        since = probe.since
        if probe.target != self.incarnation or since > self._version:
            since = 0
        start = bisect_right(self._log, (since, MAX_ID + 1))
        picked: list[Entry] = []
        version = self._version
        entries, reported = self._entries, self._reported
        for stamped, node in self._log[start:]:
            if self._stamp.get(node) != stamped:
                continue  # superseded by a later stamp, or the node left
            picked.append(Entry(node, *(entries.get(node) or reported[node])))
            if len(picked) == self._cfg.max_entries:
                version = stamped
                break
        self._stats[_REPLIES] += 1
        self._stats[_SENT] += len(picked)
        return Reply(
            round=probe.round, incarnation=self.incarnation, version=version, entries=tuple(picked)
        )

    def _take(self, sender: int, reply: Reply, now: float, out: list[DetectorOutput]) -> None:
        """Merge a reply; if it answers our pending probe (same round, same sync
        epoch), we now hold the sender's state up to ``reply.version``, and an
        answered first attempt is a round-trip sample."""
        p = self._pending.get(sender)
        if p is not None and p.round == reply.round and sender in self._entries:
            del self._pending[sender]
            if p.attempt == 1:  # Karn: a retried probe's answer is ambiguous
                self._timeouts.sample(sender, now - p.sent)
            if p.epoch == self._epoch and reply.incarnation == self._entries[sender][0]:
                self._sync[sender] = (reply.incarnation, reply.version)
        self._stats[_RECEIVED] += len(reply.entries)
        for e in reply.entries:
            self._merge(e, now, out)

    def _forward(self, sender: int, push: Push, now: float, out: list[DetectorOutput]) -> None:
        """Merge a push, then pass it on to our first correct node of every
        cluster below ``CLUSTER(me, sender)`` (the VCube broadcast: those
        clusters split the cluster of ``sender`` holding us, so the tree rooted
        at the origin reaches every node once when views agree).  What goes on
        is our entry for each node, newer than or equal to the one received."""
        self._stats[_RECEIVED] += len(push.entries)
        for e in push.entries:
            self._merge(e, now, out)
        if not self._cfg.push:
            return
        entries = self._entries
        onward = tuple(
            e if e.node not in entries else Entry(e.node, *entries[e.node]) for e in push.entries
        )
        self._send_push(onward, cluster(self._me, sender), out)

    def _push_news(self, out: list[DetectorOutput]) -> None:
        """Push the entries this node changed itself since the last push to its
        first correct node of every cluster (the root of a VCube broadcast)."""
        if not self._news:
            return
        news, self._news = dict.fromkeys(self._news), []
        if not self._cfg.push:
            return
        entries = [Entry(n, *self._entries[n]) for n in news if n in self._entries]
        step = self._cfg.max_entries
        for k in range(0, len(entries), step):
            self._send_push(tuple(entries[k : k + step]), ID_BITS + 1, out)

    def _send_push(self, entries: tuple[Entry, ...], below: int, out: list[DetectorOutput]) -> None:
        """One :class:`Push` of ``entries`` to each pull target in a cluster below ``below``."""
        if not entries:
            return
        me = self._me
        msg = Push(incarnation=self.incarnation, version=self._version, entries=entries)
        for child in self._current_pulls():
            if cluster(me, child) < below:
                out.append(SendDetector(child, msg))
                self._stats[_PUSHES] += 1
                self._stats[_SENT] += len(entries)

    def _merge(self, e: Entry, now: float, out: list[DetectorOutput]) -> None:
        """Adopt ``e`` if it is about a known node and newer than ours, unless it
        accuses a node this one heard from too recently to believe it (:meth:`_doubt`)."""
        if e.node == self._me:
            self._about_me(e, out)
            return
        known = self._entries.get(e.node)
        if known is not None:
            new = (e.incarnation, e.counter)
            if new <= known:
                return
            if new[0] == known[0] and new[1] & 1 and not known[1] & 1 and self._fresh(e.node, now):
                self._doubt(e, now, out)
            else:
                self._set(e.node, new, out)
        elif e.counter & 1:
            self._note_reported(e, out)

    def _fresh(self, node: int, now: float) -> bool:
        """Whether ``node`` was heard from within the last ``timeout``: no prober
        can have waited a whole timeout for an answer it did not get since."""
        return now - self._heard_at.get(node, -math.inf) < self._cfg.timeout

    def _doubt(self, e: Entry, now: float, out: list[DetectorOutput]) -> None:
        """Another node accuses ``e.node``, which this node heard from within a
        timeout (a partition that heals shows each side the other's
        accusations, including of members this side heard all along).  The
        accusation is not adopted (this core keeps the member) but held:
        the accused is told it, so it refutes as a new incarnation; this node
        probes it for first-hand evidence; and the accusation is adopted after
        all once a timeout passes without a word from it (:meth:`_settle_doubts`),
        so a crash is still learnt, at most one timeout late."""
        node, accusation = e.node, (e.incarnation, e.counter)
        held = self._doubted.get(node)
        if held is not None and accusation <= held:
            return
        self._doubted[node] = accusation
        self._stats[_DOUBTS] += 1
        tell = Push(incarnation=self.incarnation, version=self._version, entries=(e,))
        out.append(SendDetector(node, tell))
        if node not in self._pending:
            out.append(self._probe(node, now))

    def _settle_doubts(self, now: float, out: list[DetectorOutput]) -> None:
        """Drop the held accusations that the accused answered (a newer entry:
        it refuted, restarted, or this node suspected it itself); adopt those
        whose node stayed silent for a timeout."""
        for node, accusation in list(self._doubted.items()):
            known = self._entries.get(node)
            if known is None or known[0] != accusation[0] or known[1] >= accusation[1]:
                del self._doubted[node]
            elif not self._fresh(node, now):
                del self._doubted[node]
                self._set(node, accusation, out)

    def _note_reported(self, e: Entry, out: list[DetectorOutput]) -> None:
        """Keep the suspected entry ``e`` of a node this detector does not know,
        stamped, so that it goes on in answers to pulls; report each newer
        incarnation once (:class:`Reported`).

        A node can know a member its pull targets never knew (a peer record
        came to it alone): if those targets only reported the member's
        suspicion and kept nothing, their answers never carried it, the
        member's designated testers were other nodes, and the node held the
        crashed member alive for good (the one-way property under the verify
        profile, seed 26: membership never converged)."""
        old = self._reported.get(e.node)
        new = (e.incarnation, e.counter)
        if old is not None and new <= old:
            return
        self._reported[e.node] = new
        self._bump(e.node)
        if old is None or e.incarnation > old[0]:
            out.append(Reported(e.node, e.incarnation))

    def _about_me(self, e: Entry, out: list[DetectorOutput]) -> None:
        """Someone holds a newer entry about us: we were suspected (refute with
        the next even counter) or a newer incarnation of our id exists."""
        inc, counter = self._entries[self._me]
        if (e.incarnation, e.counter) > (inc, counter):
            self._timeouts.false_suspicion()  # we were suspected, and we are alive
        if e.incarnation > inc:
            out.append(SelfSuspected(e.incarnation, e.counter))
        elif e.incarnation == inc and e.counter > counter:
            out.append(SelfSuspected(e.incarnation, e.counter))
            self._entries[self._me] = (inc, e.counter + (e.counter & 1))
            self._bump(self._me)
            self._news.append(self._me)

    def _set(
        self, node: int, new: tuple[int, int], out: list[DetectorOutput], *, news: bool = False
    ) -> None:
        """Replace ``node``'s entry by the newer ``new``, stamp it, report the
        change; ``news``: this node's own finding (not merged), to be pushed."""
        old = self._entries[node]
        self._entries[node] = new
        self._bump(node)
        if old[1] & 1 and (new[0] != old[0] or not new[1] & 1):
            self._timeouts.false_suspicion()  # a suspected node is back: likely never down
        if news:
            self._news.append(node)
        if new[1] & 1 != old[1] & 1:
            if new[1] & 1:
                del self._correct[bisect_left(self._correct, node)]
                self._suspected_in[node] = self._round
            else:
                insort(self._correct, node)
                self._suspected_in.pop(node, None)
        if new[1] & 1 != old[1] & 1 or new[0] != old[0]:
            self._invalidate_view()
        if new[0] != old[0]:
            self._pending.pop(node, None)
            self._sync.pop(node, None)
            self._timeouts.forget(node)
            out.append(Restarted(node, old[0], new[0]))
            if new[1] & 1:
                out.append(Suspected(node, new[0]))
        elif new[1] & 1 and not old[1] & 1:
            out.append(Suspected(node, new[0]))
        elif old[1] & 1 and not new[1] & 1:
            out.append(Corrected(node, new[0]))

    def _bump(self, node: int) -> None:
        """Stamp ``node``'s entry with a fresh version; compact the log when it
        holds more than twice as many records as live stamps."""
        self._version += 1
        self._stamp[node] = self._version
        self._log.append((self._version, node))
        if len(self._log) > 2 * len(self._stamp) + 64:
            self._log = sorted((v, n) for n, v in self._stamp.items())

    def _reset_sync(self) -> None:
        """Forget every held version: the next pull from anyone is a full one."""
        self._sync.clear()
        self._epoch += 1


def _shown_version(msg: DetectorMessage, max_entries: int) -> int | None:
    """The sender's state version a message proves, if it proves one: a full
    reply may be a partial one, whose version is not the sender's latest (a
    probe's or a push's version is the sender's current one)."""
    if isinstance(msg, Reply) and len(msg.entries) >= max_entries:
        return None
    return msg.version


def _check_local(node: object, incarnation: object) -> None:
    """Driver-side arguments: a 64-bit id and a uint64 incarnation."""
    if not _is_uint(node) or not _is_uint(incarnation):
        raise DetectorError(f"bad node {node!r} or incarnation {incarnation!r}")
