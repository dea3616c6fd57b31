"""Connection resets in the simulator: the runtime's reliable links (``p2p._reliable``).

The runtime carries each sending direction to a peer on a *link* that
outlives its TCP connections (``p2p.runtime._link._Link``): frames are numbered and
kept in a :class:`~p2p._reliable.SendLog` until the peer acks them; a broken
connection is re-dialled at once (after a backoff if it confirmed nothing
and lasted under a second); the new connection opens with a
:class:`~p2p._reliable.Hello` and sends every unconfirmed frame again, oldest
first, before new ones; the receiver's :class:`~p2p._reliable.ReceiveLog`
drops those it handled already.  :class:`Links` drives those same classes
with simulated connections, for the scenario action ``RESET``.

It exists only once a RESET was scheduled (``Simulation.schedule``), so a
run without one is event-for-event what it was: no frame numbers, no acks,
no random draws.  With it, every frame sent from then on is *tracked*:

* a connection keeps TCP's order: a frame never arrives before the one sent
  before it on the same connection (its drawn arrival is clamped), so the
  receive log's "at or below the highest handled is a duplicate" holds;
* acks cost no events: each handled frame's ack gets its arrival time at the
  sender (``t_pp`` after the frame's processing ends, in order per
  connection) and is applied lazily, before the link next logs, resets or
  resends (the runtime acks when its reader caught up, or every
  ``ACK_EVERY`` frames; acking every frame confirms sooner, never wrongly);
* a RESET breaks both connections between two nodes: frames still
  propagating on them and acks not yet at their sender are lost; each
  sender re-dials (``dial_hops`` propagation draws, plus the runtime's
  backoff) and resends what is unconfirmed; a frame logged while the link
  is down waits for the new connection.  A reset between live nodes is no
  hint to the detector (the runtime hints only when the re-dial fails: here,
  when the peer is down at the dial);
* what the runtime counts lost is lost here too: a peer that came back as
  another incarnation (``SendLog.reconnected``), the sender's own
  reincarnation (its logs discarded), a peer that left the view (its link
  dropped) and a crash (the process and its logs are gone).

Random draws (acks, dials) come from a stream of their own,
``Random(f"{seed}/links")``.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from p2p._reliable import SendLog
from p2p.sim._frames import Frame
from p2p.sim._world import _World

if TYPE_CHECKING:
    from p2p._reliable import Hello

_Tracked = tuple[int, int, Frame, int, int, int, int]
"""``(sender, dest, frame, dest incarnation, sender incarnation, connection, lseq)``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkConfig:
    """How simulated links reconnect, in u.t. read as milliseconds (the runtime's defaults)."""

    dial_hops: int = 4
    """One-way trips before a new connection carries its first frame: TCP's
    SYN and SYN-ACK, then the handshake's two messages (``p2p._secure``)."""
    backoff: float = 50.0
    """First wait before re-dialling after a connection that confirmed nothing
    and lasted under :attr:`lasted` (the runtime's 0.05 s), doubled each time."""
    max_backoff: float = 5000.0
    """Ceiling of that wait (``NodeConfig.max_backoff``, 5 s)."""
    lasted: float = 1000.0
    """A connection open this long counts as working: re-dial at once (``_LASTED``, 1 s)."""
    unconfirmed_limit: int = 4096
    """Frames a link keeps unconfirmed (``NodeConfig.unconfirmed_limit``)."""


@dataclass(slots=True)
class _Link:
    """One node's sending direction to one peer.

    Invariants: ``held`` holds exactly the frames ``log`` holds, by ``lseq``,
    in order (the newest copy of each); ``conn`` is ``0`` while the link has
    no connection; ``acks`` are in arrival order.
    """

    log: SendLog
    serial: int
    conn: int = 0
    hello: Hello | None = None
    held: dict[int, Frame] = field(default_factory=dict)
    acks: deque[tuple[float, int, int]] = field(default_factory=deque)
    opened: float = 0.0
    confirmed: bool = False
    backoff: float = 0.0
    dialling: bool = False
    last_arrival: float = 0.0
    last_ack: float = 0.0


class Links:
    """The tracked links of one simulation (see the module docstring).

    It works on the shared state (``p2p.sim._world``) and hands the frames it
    lets through to the node path (``_World._arrive``); it knows nothing of
    the detector mode but the ``refused`` hint it is given.
    """

    ARRIVE, DIAL = 9, 10
    """Event kinds: a tracked frame arrives; a link's re-dial completes."""

    def __init__(
        self,
        sim: _World,
        config: LinkConfig | None = None,
        refused: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.sim = sim
        self.refused = refused
        """Who hears that a dial or a frame reached a crashed life
        ``(sender, dest, life)``: the detector mode's hint
        (``_Membership.refused``), ``None`` without a detector."""
        self.cfg = config or LinkConfig()
        self.rng = random.Random(f"{sim.seed}/links")
        self.out: dict[tuple[int, int], _Link] = {}
        """``(sender, receiver) -> link``: the sender's end, its send log
        (each receiver's receive log is its machine's)."""
        self.opened: dict[tuple[int, int], int] = {}
        """``(receiver, sender) -> connection`` whose hello the receiver read last."""
        self._serial = 0
        self.counts = dict.fromkeys(
            (
                "resets",
                "reconnects",
                "frames_lost_in_flight",
                "acks_lost",
                "frames_resent",
                "frames_duplicate",
                "lost_on_disconnect",
                "dial_failures",
            ),
            0,
        )

    # ------------------------------------------------------------ sending --

    def _link(self, src: int, dst: int) -> _Link:
        lk = self.out.get((src, dst))
        if lk is None:
            self._serial += 1
            log = SendLog(self.rng.getrandbits(63) | 1, limit=self.cfg.unconfirmed_limit)
            lk = self.out[(src, dst)] = _Link(log, self._serial, backoff=self.cfg.backoff)
            self._open(lk, src, dst)  # the run's first connections cost nothing (as untracked)
        return lk

    def send(self, src: int, dst: int, frame: Frame, ready: float) -> None:
        """Log ``frame`` on ``src``'s link to ``dst`` and put it on the wire, or
        keep it for the next connection if the link has none."""
        lk = self._link(src, dst)
        self._settle(lk)
        life = self.sim.incarnation[dst]
        if lk.log.peer_life != life:  # the peer is another life: what was logged is lost
            if lk.conn:
                self._open(lk, src, dst)  # and a new connection goes to the new life
            else:  # frames logged from here on are the new life's (``_Link.redial``)
                self._forgot(lk, lk.log.reconnected(life))
        lseq = lk.log.next_lseq
        self._forgot(lk, lk.log.sent(lseq.to_bytes(8, "big"), len(frame.parts)))
        lk.held[lseq] = frame
        self._trim(lk)
        if lk.conn:
            self._wire(lk, src, dst, frame, ready, lseq)
        elif not lk.dialling:
            self._dial(lk, src, dst, ready)

    def _wire(self, lk: _Link, src: int, dst: int, frame: Frame, ready: float, lseq: int) -> None:
        """Queue ``frame`` on the sender's link; it arrives in connection order."""
        sim = self.sim
        at = max(sim._wire(src, dst, frame, ready), lk.last_arrival)
        lk.last_arrival = at
        item = (src, dst, frame, sim.incarnation[dst], sim.incarnation[src], lk.conn, lseq)
        sim._push(at, self.ARRIVE, item)

    def _forgot(self, lk: _Link, lost: int) -> None:
        self.counts["lost_on_disconnect"] += lost
        self._trim(lk)

    @staticmethod
    def _trim(lk: _Link) -> None:
        """Keep ``held`` to the frames the log still holds (it forgets from the front)."""
        held = lk.held
        while len(held) > len(lk.log):
            del held[next(iter(held))]

    def _settle(self, lk: _Link) -> None:
        """Apply the acks that reached the sender by now (acks cost no events)."""
        now, acks = self.sim.now, lk.acks
        while acks and acks[0][0] <= now:
            _, conn, lseq = acks.popleft()
            if conn == lk.conn:
                lk.log.acked(lseq)
                lk.confirmed = True
        self._trim(lk)

    # ---------------------------------------------------------- connections --

    def _open(self, lk: _Link, src: int, dst: int) -> None:
        """A new connection to ``dst``'s current life: hello, then every
        unconfirmed frame again, oldest first (copies: a frame in flight on a
        broken connection stays what it was)."""
        sim = self.sim
        self._forgot(lk, lk.log.reconnected(sim.incarnation[dst]))
        self._serial += 1
        lk.conn, lk.hello, lk.opened, lk.confirmed = self._serial, lk.log.hello(), sim.now, False
        lk.last_arrival = lk.last_ack = sim.now
        lk.acks.clear()
        for body, _ in lk.log.unconfirmed():
            lseq = int.from_bytes(body, "big")
            frame = lk.held[lseq]
            copy = lk.held[lseq] = Frame(list(frame.parts), 0, frame.size)
            self.counts["frames_resent"] += 1
            self._wire(lk, src, dst, copy, sim.now, lseq)
        # A frame sent again is the same frame (the runtime resends its bytes):
        # nothing may join it.  The peer may have handled it already, its ack
        # lost with the connection, and then drops it whole as a duplicate,
        # with whatever joined it (the one-way property with resets under the
        # verify profile, seed 224: a SUB that joined a resent ACK was never
        # handled, and its round never completed).
        sim._last_frame.pop((src, dst), None)

    def _dial(self, lk: _Link, src: int, dst: int, start: float) -> None:
        lk.dialling = True
        sim = self.sim
        delay = sum(self._delay(src, dst) for _ in range(self.cfg.dial_hops))
        sim._push(start + delay, self.DIAL, (src, dst, lk.serial))

    def _delay(self, src: int, dst: int) -> float:
        return self.sim.delay(src, dst, self.rng)

    def reset(self, a: int, b: int) -> None:
        """RESET: both connections between ``a`` and ``b`` break now."""
        self.counts["resets"] += 1
        for src, dst in ((a, b), (b, a)):
            lk = self.out.get((src, dst))
            if lk is not None and lk.conn:
                self._break(lk, src, dst)

    def _break(self, lk: _Link, src: int, dst: int) -> None:
        """Frames and acks in flight on the connection are lost (they arrive on
        a dead connection); the sender re-dials like the runtime's ``_Link``."""
        sim = self.sim
        self._settle(lk)
        self.counts["acks_lost"] += len(lk.acks)
        lk.acks.clear()
        lk.conn = 0
        sim._last_frame.pop((src, dst), None)  # nothing joins a frame that may be lost
        wait = 0.0
        if lk.confirmed or sim.now - lk.opened >= self.cfg.lasted:
            lk.backoff = self.cfg.backoff
        else:  # closed as soon as opened: back off, no tight loop
            wait, lk.backoff = lk.backoff, min(2 * lk.backoff, self.cfg.max_backoff)
        if src not in sim.down:
            self._dial(lk, src, dst, sim.now + wait)

    def segments_changed(self) -> None:
        """PARTITION / HEAL: connections that now cross segments break (what was
        on them is lost, their senders re-dial and fail until the heal); a link
        left with unconfirmed frames and no connection dials again, as the
        runtime's links retry while their peer is a member."""
        sim = self.sim
        for (src, dst), lk in list(self.out.items()):
            if lk.conn and sim.severed(src, dst):
                self._break(lk, src, dst)
            elif not lk.conn and not lk.dialling and src not in sim.down:
                self._settle(lk)
                if len(lk.log):
                    self._dial(lk, src, dst, sim.now)

    def dispatch(self, kind: int, item: object) -> None:
        if kind == self.ARRIVE:
            self._arrive(cast(_Tracked, item))
        else:
            self._dialled(*cast(tuple[int, int, int], item))

    def _dialled(self, src: int, dst: int, serial: int) -> None:
        """A re-dial completes, unless the link is gone; a peer that is down
        refuses it: the sender gets the runtime's hint, and the link dials
        again when it has something to send."""
        lk = self.out.get((src, dst))
        if lk is None or lk.serial != serial or lk.conn or not lk.dialling:
            return
        lk.dialling = False
        sim = self.sim
        if src in sim.down:
            return
        if dst in sim.down or sim.severed(src, dst):
            self.counts["dial_failures"] += 1
            if self.refused is not None:
                self.refused(src, dst, sim.incarnation[dst])
            return
        self.counts["reconnects"] += 1
        self._open(lk, src, dst)

    # ---------------------------------------------------------- receiving --

    def _arrive(self, item: _Tracked) -> None:
        """A tracked frame reaches ``dst``: lost if its connection broke; else
        the crash rules of untracked frames, then the receive log: a
        duplicate is acked and dropped, a new frame goes to the node."""
        src, dst, frame, life, src_life, conn, lseq = item
        sim = self.sim
        lk = self.out.get((src, dst))
        if lk is None or lk.conn != conn:
            self.counts["frames_lost_in_flight"] += 1
            return
        died = sim._died.get((src, src_life)) if sim._died else None
        if died is not None and frame.start + sim.delays.tt > died:
            sim.unsent += 1
            return
        if dst in sim.down or (life != sim.incarnation[dst] and not sim._to_older_life(dst, life)):
            sim.lost += 1
            if self.refused is not None:
                self.refused(src, dst, life)
            return
        machine = sim.machines[dst]
        if self.opened.get((dst, src)) != conn and lk.hello is not None:
            self.opened[(dst, src)] = conn
            machine.link_opened(src, lk.hello)
        if not machine.frame_fresh(src, lk.log.link, lseq):
            self.counts["frames_duplicate"] += 1
            self._ack(lk, src, dst, conn, lseq, sim.now)
            return
        clock = sim.clocks[dst]
        self._ack(lk, src, dst, conn, lseq, max(sim.now, clock.cpu_free) + sim.delays.tpc)
        sim._arrive(src, dst, frame)

    def _ack(self, lk: _Link, src: int, dst: int, conn: int, lseq: int, at: float) -> None:
        """The receiver acks ``lseq`` at ``at``; it reaches the sender ``t_pp`` later."""
        t = max(at + self._delay(dst, src), lk.last_ack)
        lk.last_ack = t
        lk.acks.append((t, conn, lseq))

    # ------------------------------------------------------------- lives --

    def crashed(self, node: int) -> None:
        """``node``'s process ended: its links with it (its receive log is its
        machine's, replaced by the next process)."""
        for key in [k for k in self.out if k[0] == node]:
            del self.out[key]
        for key in [k for k in self.opened if k[0] == node]:
            del self.opened[key]

    def reincarnated(self, node: int) -> None:
        """``node`` came back as a new incarnation in the same process: its old
        life's frames are sent again to nobody (the runtime discards its logs)."""
        for (src, _), lk in self.out.items():
            if src == node:
                self._settle(lk)
                self._forgot(lk, lk.log.discard())

    def dropped(self, observer: int, node: int, incarnation: int) -> None:
        """``node`` up to ``incarnation`` left ``observer``'s view: the link to it
        is dropped (what it held is lost; its machine forgot its frame
        numbers), as the runtime does, unless the link already carries a newer life (the
        engine addresses the current life before the machine learns of it: a
        verdict on the old one must not cut what goes to the new one)."""
        lk = self.out.get((observer, node))
        if lk is not None and (lk.log.peer_life or 0) <= incarnation:
            del self.out[(observer, node)]
            self._settle(lk)
            self.counts["lost_on_disconnect"] += lk.log.discard()

    def metrics(self) -> dict[str, Any]:
        return dict(self.counts)


__all__ = ["LinkConfig", "Links"]
