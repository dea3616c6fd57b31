"""Links that lose nothing when a connection breaks (DESIGN.md §5), sans-IO.

A *link* is one node's sending direction to one peer; it outlives the TCP
connections that carry it (a Wi-Fi flap, a NAT timeout, a reset).  Each frame
a link sends gets a link sequence number (``lseq``, from 1); the sender keeps
every frame until the peer confirms it (:class:`SendLog`), and when a new
connection opens it starts with a *hello* naming the link and the ``lseq`` of
the first frame that follows, then sends again every unconfirmed frame, in
order, before new ones.  The receiver numbers the frames of a connection from
the hello on (TCP keeps their order, so no per-frame header is needed), drops
those at or below the highest it already handled for that link
(:class:`ReceiveLog`), and confirms on the same connection with an *ack*: the
highest ``lseq`` handled, sent whenever it has read everything that arrived
(and every :data:`ACK_EVERY` frames under load), without a timer.  When the
receiver writes to the sender in the same step anyway (a leaf's round ACK
goes back to its parent at once), the ack rides in front of that frame on its
own link's connection instead, as a *carried ack* naming the link it
confirms: one write and one wake-up fewer per frame.  A carried ack is not a
frame of the link that carries it (neither side numbers it, it is never sent
again), and one that names a link the sender no longer has is ignored.

Invariants: a frame is handed to the receiver's core at most once per link;
every frame a sender logged is either confirmed, sent again on the next
connection, or counted as lost (the peer restarted as another incarnation, or
the log overflowed); the receiver's state per peer is one ``(link, lseq)``.

Records: hello = CBOR ``["link", link_id: uint64, first: uint64]`` and carried
ack = CBOR ``["ack", link_id: uint64, lseq: uint64]`` (never valid frame
bodies, whose first element is the protocol version); ack = 8 bytes, the
big-endian ``lseq``.  All are sealed like every record.
"""

from __future__ import annotations

from collections import deque

import cbor2

from p2p.wire import WireError
from vcube._hot import hot

__all__ = [
    "ACK_EVERY",
    "CARRIED_HEAD",
    "CarriedAck",
    "Hello",
    "ReceiveLog",
    "SendLog",
    "decode_ack",
    "encode_ack",
]

ACK_EVERY = 64
"""Frames a receiver handles at most before it confirms, even while more are queued."""

_HELLO_HEAD = b"\x83\x64link"
CARRIED_HEAD = b"\x83\x63ack"
"""How a carried ack's record starts (a frame body never does)."""
_LIMIT = 1 << 64


@hot
class Hello:
    """The first record of a link's connection: which link, and the ``lseq`` of the next frame."""

    link: int
    first: int

    def encode(self) -> bytes:
        return cbor2.dumps(["link", self.link, self.first])

    @staticmethod
    def parse(plaintext: bytes) -> Hello | None:
        """The hello in ``plaintext``, ``None`` if it is not one (a plain frame
        body); :class:`WireError` if it starts like a hello but is malformed."""
        if not plaintext.startswith(_HELLO_HEAD):
            return None
        return Hello(*_tagged_pair(plaintext, "link", "link hello"))


@hot
class CarriedAck:
    """An ack of link ``link`` (up to ``lseq``) written on a connection of the
    receiver's own link to its sender, ahead of a frame (see the module docstring)."""

    link: int
    lseq: int

    def encode(self) -> bytes:
        return cbor2.dumps(["ack", self.link, self.lseq])

    @staticmethod
    def parse(plaintext: bytes) -> CarriedAck:
        """The carried ack ``plaintext`` holds (it starts with :data:`CARRIED_HEAD`);
        :class:`WireError` if it is malformed."""
        return CarriedAck(*_tagged_pair(plaintext, "ack", "carried ack"))


def _tagged_pair(plaintext: bytes, tag: str, what: str) -> tuple[int, int]:
    """The two numbers of the CBOR record ``[tag, a, b]`` (each in 1..2**64-1);
    :class:`WireError`, naming ``what``, for anything else."""
    try:
        got, a, b = cbor2.loads(plaintext)
    except (cbor2.CBORDecodeError, ValueError, TypeError) as exc:
        raise WireError(f"malformed {what}: {exc}") from None
    if got != tag or not all(type(v) is int and 0 < v < _LIMIT for v in (a, b)):
        raise WireError(f"malformed {what}")
    return a, b


def encode_ack(lseq: int) -> bytes:
    """An ack record: frames up to ``lseq`` of the link were handled."""
    return lseq.to_bytes(8, "big")


def decode_ack(plaintext: bytes) -> int:
    """The ``lseq`` an ack confirms; :class:`WireError` if it is not an ack."""
    if len(plaintext) != 8:
        raise WireError(f"link ack of {len(plaintext)} bytes, expected 8")
    return int.from_bytes(plaintext, "big")


class SendLog:
    """The frames one link sent that its peer has not confirmed yet.

    ``peer_life`` is the peer incarnation the logged frames were meant for: a
    peer that came back as another incarnation lost them with its process,
    and they are not sent again (the core repairs what crashed with it).
    """

    __slots__ = ("_frames", "_limit", "link", "next_lseq", "peer_life")

    def __init__(self, link: int, *, limit: int) -> None:
        if not 0 < link < _LIMIT or limit <= 0:
            raise ValueError(f"bad link id {link} or limit {limit}")
        self.link = link
        self.next_lseq = 1
        self.peer_life: int | None = None
        self._limit = limit
        self._frames: deque[tuple[int, bytes, int]] = deque()

    def __len__(self) -> int:
        return len(self._frames)

    def sent(self, body: bytes, packets: int) -> int:
        """Log a frame about to be written; returns the packets of frames the
        log had to forget to stay within ``limit`` (lost, to be counted)."""
        self._frames.append((self.next_lseq, body, packets))
        self.next_lseq += 1
        lost = 0
        while len(self._frames) > self._limit:
            lost += self._frames.popleft()[2]
        return lost

    def acked(self, lseq: int) -> None:
        """The peer handled every frame up to ``lseq``: forget them."""
        if lseq >= self.next_lseq:
            raise WireError(f"ack of frame {lseq}, never sent (next is {self.next_lseq})")
        frames = self._frames
        while frames and frames[0][0] <= lseq:
            frames.popleft()

    def hello(self) -> Hello:
        """What opens a new connection: the first frame that follows is the
        oldest unconfirmed one (or the next new one)."""
        return Hello(self.link, self._frames[0][0] if self._frames else self.next_lseq)

    def unconfirmed(self) -> list[tuple[bytes, int]]:
        """The frames to send again, oldest first, with their packet counts."""
        return [(body, packets) for _, body, packets in self._frames]

    def reconnected(self, peer_life: int) -> int:
        """A connection to the peer's incarnation ``peer_life`` opened; returns
        the packets lost if the logged frames were for another incarnation."""
        lost = 0
        if self.peer_life is not None and peer_life != self.peer_life:
            lost = self.discard()
        self.peer_life = peer_life
        return lost

    def discard(self) -> int:
        """Forget every logged frame; returns their packets."""
        lost = sum(packets for _, _, packets in self._frames)
        self._frames.clear()
        return lost


class ReceiveLog:
    """Per peer, the link and the highest ``lseq`` handled: what a receiver
    needs to drop frames a sender sends again after a reconnection."""

    __slots__ = ("_handled",)

    def __init__(self) -> None:
        self._handled: dict[int, tuple[int, int]] = {}

    def opened(self, peer: int, hello: Hello) -> None:
        """A connection from ``peer`` opened with ``hello``: a new link (the
        peer restarted or dropped its link) starts afresh before ``first``."""
        known = self._handled.get(peer)
        if known is None or known[0] != hello.link:
            self._handled[peer] = (hello.link, hello.first - 1)

    def fresh(self, peer: int, link: int, lseq: int) -> bool:
        """Whether frame ``lseq`` of ``link`` is new; if so it counts as handled."""
        known = self._handled.get(peer)
        if known is not None and known[0] == link and lseq <= known[1]:
            return False
        self._handled[peer] = (link, lseq)
        return True

    def forget(self, peer: int) -> None:
        """``peer`` crashed or left: its next link starts afresh."""
        self._handled.pop(peer, None)
