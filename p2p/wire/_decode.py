"""Frame bodies to packets: :func:`decode_body` and its two decoders, the direct
one for the frames exchanged all the time and the checked one, the reference."""

from __future__ import annotations

import struct
from itertools import pairwise
from typing import Any, Final

import cbor2

from causal import MsgId
from p2p.wire._cbor import _CACHE_TOPICS, _array, _ctr, _d_topic, _int, _node, _scan
from p2p.wire._control import Control, PeerExchange, _d_control, _d_exchange
from p2p.wire._encode import _remember
from p2p.wire._limits import (
    _ACK,
    _CONTROL_TAGS,
    _FENCE,
    _PUB,
    _SUB,
    _UNS,
    COUNTER_LIMIT,
    MAX_DEPTH,
    NODE_LIMIT,
    PROTOCOL_VERSION,
    WireError,
    WireLimits,
)
from topics import (
    Ack,
    Bound,
    Chain,
    Fence,
    Packet,
    PubMessage,
    PubRound,
    RoundId,
    Sub,
    Uns,
    ViewEntry,
    chain_of,
)
from vcube._hot import hot

# ------------------------------------------------------------------ decoding
#
# Two decoders.  The *checked* one (:func:`_decode_tree`) is the reference:
# it scans the raw bytes, lets ``cbor2`` build the tree, checks every value
# against the schema, and its errors say what is wrong.  The *direct* one
# (:func:`_decode_direct`) reads the frames the runtime exchanges all the time
# (PUB rounds and plain ACKs, no peer exchange) from the bytes straight into
# packets, in one pass, by the same rules (shortest heads, types, ranges,
# sizes, item count, no trailing bytes); on anything else, or anything wrong,
# it gives up and the checked decoder decides.  So the direct decoder only
# ever accepts a body the checked one accepts, with the same packets
# (``tests/test_wire.py`` runs both on every fuzzed body), and every error
# comes from the checked one.


class _GiveUpError(Exception):
    """The direct decoder leaves this body to the checked one."""


_U16: Final = struct.Struct(">H").unpack_from
_U32: Final = struct.Struct(">I").unpack_from
_U64: Final = struct.Struct(">Q").unpack_from


def _arg(b: bytes, p: int, major: int) -> tuple[int, int]:
    """The argument of the head at ``b[p]`` if it has type ``major`` and its shortest
    form, and the position after the head; :class:`_GiveUpError` otherwise.

    A head cut short by the end of ``b`` raises ``IndexError`` or ``struct.error``.
    """
    info = b[p] - major
    if 0 <= info < 24:
        return info, p + 1
    if info == 24:
        v = b[p + 1]
        if v >= 24:
            return v, p + 2
    elif info == 25:
        (v,) = _U16(b, p + 1)
        if v >= 0x100:
            return v, p + 3
    elif info == 26:
        (v,) = _U32(b, p + 1)
        if v >= 0x10000:
            return v, p + 5
    elif info == 27:
        (v,) = _U64(b, p + 1)
        if v >= 0x1_0000_0000:
            return v, p + 9
    raise _GiveUpError


def _ctr_at(b: bytes, p: int) -> tuple[int, int]:
    v, p = _arg(b, p, 0x00)
    if v >= COUNTER_LIMIT:
        raise _GiveUpError
    return v, p


_new_tuple = tuple.__new__


_TOPIC_NAMES: dict[bytes, str] = {}
"""Decoded topic names by their UTF-8 bytes (cleared when it holds :data:`_CACHE_TOPICS`)."""


def _id_at(b: bytes, p: int, last: list[Any]) -> tuple[MsgId, int]:
    """The id at ``b[p]``.  ``last`` is ``[head, source, incarnation]`` of the previous
    id read: ids of a round mostly share them, and the bytes ``head`` (array
    head, source, incarnation) were already checked, so they are not read again."""
    head = last[0]
    if head and b.startswith(head, p):
        p += len(head)
        source, incarnation = last[1], last[2]
    else:
        if b[p] != 0x83:
            raise _GiveUpError
        source, q = _arg(b, p + 1, 0x00)
        incarnation, q = _ctr_at(b, q)
        last[:] = (b[p:q], source, incarnation)
        p = q
    seq, p = _seq_at(b, p)
    return _new_tuple(MsgId, (source, incarnation, seq)), p


def _seq_at(b: bytes, p: int) -> tuple[int, int]:
    """The sequence number at ``b[p]`` (a counter), its usual heads inline."""
    h = b[p]
    if h < 24:
        return h, p + 1
    if h == 0x19:
        (seq,) = _U16(b, p + 1)
        if seq < 0x100:
            raise _GiveUpError
        return seq, p + 3
    if h == 0x1A:
        (seq,) = _U32(b, p + 1)
        if seq < 0x10000:
            raise _GiveUpError
        return seq, p + 5
    return _ctr_at(b, p)


def _ids_at(b: bytes, p: int, last: list[Any], limit: int) -> tuple[tuple[MsgId, ...], int]:
    h = b[p]
    if h == 0x80:
        return (), p + 1
    if h == 0x81:
        mid, p = _id_at(b, p + 1, last)
        return (mid,), p
    n, p = _arg(b, p, 0x80)
    if n > limit:
        raise _GiveUpError
    ids = []
    for _ in range(n):
        mid, p = _id_at(b, p, last)
        ids.append(mid)
    return tuple(ids), p


def _messages_at(
    b: bytes, p: int, lim: WireLimits, budget: int
) -> tuple[tuple[PubMessage, ...], int, int]:
    """A PUB's messages array at ``b[p]``: the messages, the position after them and
    their CBOR item count, at most ``budget`` (checked as it goes, so that no more
    objects are built than ``max_items`` allows).  The messages are a
    :class:`~topics.Chain` when all but the first are followers in increasing
    order (as :func:`~topics.chain_of` would find)."""
    n, p = _arg(b, p, 0x80)
    if n > lim.max_round_messages:
        raise _GiveUpError
    max_payload, max_barrier = lim.max_payload, lim.max_barrier
    last: list[Any] = [b"", 0, 0]
    messages = []
    items = total = 0
    make = PubMessage
    id_at = _id_at
    before: MsgId | None = None
    chained = before  # the id a follower names (set only with head 0x82)
    chain = n > 1  # so far, all but the first are followers in increasing order
    for _ in range(n):
        head = b[p]
        if head == 0x82:  # a chain's follower: [seq, payload]
            if before is None:
                raise _GiveUpError
            chained = before
            seq, p = _seq_at(b, p + 1)
            if seq <= before[2]:
                chain = False
            mid = _new_tuple(MsgId, (before[0], before[1], seq))
        elif head == 0x85 or head == 0x86:
            if before is not None:
                chain = False
            mid, p = id_at(b, p + 1, last)
        else:
            raise _GiveUpError
        h = b[p]
        if 0x40 <= h < 0x58:
            size = h - 0x40
            p += 1
        elif h == 0x58:
            size = b[p + 1]
            if size < 24:
                raise _GiveUpError
            p += 2
        else:
            size, p = _arg(b, p, 0x40)
        if size > max_payload:
            raise _GiveUpError
        payload = b[p : p + size]
        p += size
        if head == 0x82:
            items += 13  # as the long form with one id in the barrier
            if items > budget:
                raise _GiveUpError
            assert chained is not None
            messages.append(make(mid, payload, (chained,), (), chained[2], 0))
            total += size
            before = mid
            continue
        h = b[p]
        if h == 0x81:
            dep, p = id_at(b, p + 1, last)
            deps: tuple[MsgId, ...] = (dep,)
        else:
            deps, p = _ids_at(b, p, last, max_barrier)
        if b[p] == 0x80:
            op_deps: tuple[MsgId, ...] = ()
            p += 1
        else:
            op_deps, p = _ids_at(b, p, last, max_barrier)
        barrier = len(deps) + len(op_deps)
        if barrier > max_barrier:
            raise _GiveUpError
        h = b[p]
        if h == 0x20:
            prev = -1
            p += 1
        elif h == 0x19:
            (prev,) = _U16(b, p + 1)
            if prev < 0x100:
                raise _GiveUpError
            p += 3
        else:
            prev, p = _ctr_at(b, p)
        joins = 0
        if head == 0x86:
            joins, p = _arg(b, p, 0x00)
            if not 0 < joins < 1 << len(op_deps):
                raise _GiveUpError
        items += 9 + 4 * barrier + (head - 0x85)  # a joins item with 0x86
        if items > budget:
            raise _GiveUpError
        msg = make(mid, payload, deps, op_deps, prev, joins)
        if before is not None and msg.chains_on(before):
            raise _GiveUpError  # the long form of a follower: not canonical
        messages.append(msg)
        total += size
        before = mid
    if n > 1 and total > lim.max_round_bytes:
        raise _GiveUpError
    return (Chain(messages) if chain else tuple(messages)), p, items


def _round_at(b: bytes, p: int) -> tuple[RoundId, int]:
    if b[p] != 0x83:
        raise _GiveUpError
    source, p = _arg(b, p + 1, 0x00)
    incarnation, p = _ctr_at(b, p)
    number, p = _ctr_at(b, p)
    return RoundId(source, incarnation, number), p


def _topic_at(b: bytes, p: int, lim: WireLimits) -> tuple[str, int]:
    size, p = _arg(b, p, 0x60)
    if not 0 < size <= lim.max_topic_len:
        raise _GiveUpError
    raw = b[p : p + size]
    topic = _TOPIC_NAMES.get(raw)
    if topic is None:
        topic = raw.decode()  # strict UTF-8, as cbor2's; an error means: give up
        if len(_TOPIC_NAMES) >= _CACHE_TOPICS:
            _TOPIC_NAMES.clear()
        _TOPIC_NAMES[raw] = topic
    return topic, p + size


def _dests_at(b: bytes, p: int, lim: WireLimits) -> tuple[tuple[int, ...], int]:
    n, p = _arg(b, p, 0x80)
    if n > lim.max_dests:
        raise _GiveUpError
    dests = []
    before = -1
    for _ in range(n):
        node, p = _arg(b, p, 0x00)
        if node <= before:
            raise _GiveUpError
        dests.append(node)
        before = node
    return tuple(dests), p


def _decode_direct(body: bytes, lim: WireLimits) -> Body | None:
    """The packets and *alive* of ``body`` if it holds only PUB rounds and plain ACKs
    (no view, no bounds) and no peer exchange, all valid; ``None``: leave it to
    the checked decoder."""
    if type(body) is not bytes:
        return None
    try:
        return _direct(body, lim)
    except Exception:  # _GiveUpError, a read past the end, bad UTF-8: the checked decoder decides
        return None


def _direct(b: bytes, lim: WireLimits) -> Body:
    # [version, packets] or [version, packets, alive]: no exchange
    if b[1] != PROTOCOL_VERSION or not 0x82 <= b[0] <= 0x83:
        raise _GiveUpError
    count, p = _arg(b, 2, 0x80)
    if not 0 < count <= lim.max_packets:
        raise _GiveUpError
    items = 3  # the body, the version, the packets array
    packets: list[Packet] = []
    spans = []
    for _ in range(count):
        if b[p] != 0x85:
            raise _GiveUpError
        tag = b[p + 1]
        rid, p = _round_at(b, p + 2)
        topic, p = _topic_at(b, p, lim)
        if tag == _PUB:
            start = p
            messages, p, msg_items = _messages_at(b, p, lim, lim.max_items - items)
            spans.append((messages, start, p))
            dests, p = _dests_at(b, p, lim)
            items += 9 + msg_items + len(dests)
            packets.append(PubRound(rid, topic, messages, dests))
        elif tag == _ACK and b[p] == 0x80 and b[p + 1] == 0x80:  # no view, no bounds
            p += 2
            items += 9
            packets.append(Ack(rid, topic))
        else:
            raise _GiveUpError
        if items > lim.max_items:
            raise _GiveUpError
    alive = None
    if b[0] == 0x83:
        alive, p = _arg(b, p, 0x00)
        items += 1
        if items > lim.max_items:
            raise _GiveUpError
    if p != len(b):
        raise _GiveUpError
    for messages, start, stop in spans:  # a relay forwards them as they came
        _remember(messages, b[start:stop])
    return Body(packets, alive=alive)


def _d_extras(
    fields: list[object], what: str, limit: int
) -> tuple[tuple[Bound, ...], tuple[Bound, ...]]:
    """The optional sixth and seventh elements of an ACK or UNS (``predates``,
    ``beyond``): each left out when it and what follows are empty, so that
    every packet has one encoding (an empty last element is refused)."""
    if len(fields) == 5:
        return (), ()
    predates = _d_bounds(fields[5], what + ".predates", limit)
    if len(fields) == 6:
        if not predates:
            raise WireError(f"{what}.predates: empty (the 5-element form is the encoding)")
        return predates, ()
    beyond = _d_bounds(fields[6], what + ".beyond", limit)
    if not beyond:
        raise WireError(f"{what}.beyond: empty (the 6-element form is the encoding)")
    return predates, beyond


def _extras_size(raw: object) -> int:
    """How many elements an ACK or UNS array may have: 5, 6 or 7 (checked by ``_array``)."""
    return len(raw) if type(raw) is list and len(raw) in (6, 7) else 5


def _d_bounds(raw: object, what: str, limit: int) -> tuple[Bound, ...]:
    out = []
    for b in _array(raw, what, limit=limit):
        node, inc, first = _array(b, what + "[]", 3)
        out.append(
            Bound(
                _node(node, "bound.node"),
                _ctr(inc, "bound.incarnation"),
                _ctr(first, "bound.first_owned"),
            )
        )
    return tuple(out)


def _d_round(v: object) -> RoundId:
    s, i, n = _array(v, "round", 3)
    return RoundId(_node(s, "round.source"), _ctr(i, "round.incarnation"), _ctr(n, "round.number"))


def _d_id(v: object, what: str) -> MsgId:
    s, i, q = _array(v, what, 3)
    return MsgId(_node(s, what + ".source"), _ctr(i, what + ".incarnation"), _ctr(q, what + ".seq"))


def _d_op(v: object, what: str) -> ViewEntry:
    n, i, rc, sub = _array(v, what, 4)
    if type(sub) is not bool:
        raise WireError(f"{what}.subscribed: expected a bool, got {type(sub).__name__}")
    return ViewEntry(
        _node(n, what + ".node"), _ctr(i, what + ".incarnation"), _ctr(rc, what + ".rc"), sub
    )


def _d_dests(v: object, lim: WireLimits) -> tuple[int, ...]:
    raw = _array(v, "dests", limit=lim.max_dests)
    dests = tuple(_node(d, "dests[]") for d in raw)
    for a, b in pairwise(dests):
        if a >= b:
            raise WireError(f"dests: not strictly increasing ({a} then {b})")
    return dests


def _d_messages(v: object, what: str, lim: WireLimits) -> tuple[PubMessage, ...]:
    """A messages array: each in long form, or a chain's follower in short form
    (``[seq, payload]``: it names only the message before it, in its stream,
    :meth:`~topics.PubMessage.chains_on`), which it must be when it can."""
    out: list[PubMessage] = []
    for raw in _array(v, what, limit=lim.max_round_messages):
        before = out[-1].id if out else None
        if type(raw) is list and len(raw) == 2:
            if before is None:
                raise WireError(f"{what}: a chain's follower ([seq, payload]) comes first")
            seq = _ctr(raw[0], "message.seq")
            payload = _payload(raw[1], lim)
            mid = MsgId(before[0], before[1], seq)
            out.append(PubMessage(mid, payload, (before,), (), before[2]))
            continue
        msg = _d_message(raw, lim)
        if before is not None and msg.chains_on(before):
            raise WireError(f"{what}: {msg.id!r} follows the message before it in long form")
        out.append(msg)
    return chain_of(out)


def _payload(v: object, lim: WireLimits) -> bytes:
    if type(v) is not bytes:
        raise WireError(f"message.payload: expected a byte string, got {type(v).__name__}")
    if len(v) > lim.max_payload:
        raise WireError(f"message.payload: {len(v)} bytes exceed max_payload={lim.max_payload}")
    return v


def _d_message(v: object, lim: WireLimits) -> PubMessage:
    fields = _array(v, "message")
    if len(fields) not in (5, 6):
        raise WireError(f"message: expected 2, 5 or 6 elements, got {len(fields)}")
    mid, payload, deps, op_deps, prev = fields[:5]
    msg_id = _d_id(mid, "message.id")
    payload = _payload(payload, lim)
    d = _array(deps, "message.deps")
    o = _array(op_deps, "message.op_deps")
    if len(d) + len(o) > lim.max_barrier:
        raise WireError(
            f"message: barrier of {len(d) + len(o)} exceeds max_barrier={lim.max_barrier}"
        )
    return PubMessage(
        msg_id,
        payload,
        tuple(_d_id(x, "message.deps[]") for x in d),
        tuple(_d_id(x, "message.op_deps[]") for x in o),
        _int(prev, "message.prev", -1, COUNTER_LIMIT),
        _joins(fields[5], len(o)) if len(fields) == 6 else 0,
    )


def _joins(v: object, ops: int) -> int:
    """``op_joins`` read back (:func:`_e_joins`): 1 .. 2**ops - 1, as an integer
    below 2**64 or as the shortest big-endian bytes of one at or above it."""
    if type(v) is bytes:
        if not v or v[0] == 0:
            raise WireError("message.joins: bytes not in their shortest form")
        value = int.from_bytes(v, "big")
        if value < NODE_LIMIT:
            raise WireError("message.joins: bytes for a value that fits an integer")
        return _int(value, "message.joins", 1, 1 << ops)
    return _int(v, "message.joins", 1, 1 << ops)


def _d_packet(v: object, lim: WireLimits) -> Packet:
    raw = _array(v, "packet")
    if not raw:
        raise WireError("packet: empty array")
    tag = raw[0]
    if type(tag) is not int:
        raise WireError(f"packet: type tag must be an integer, got {type(tag).__name__}")
    if tag == _PUB:
        _, rid, topic, msgs, dests = _array(raw, "PUB", 5)
        messages = _d_messages(msgs, "PUB.messages", lim)
        total = sum(len(m.payload) for m in messages)
        if len(messages) > 1 and total > lim.max_round_bytes:
            raise WireError(
                f"PUB: {total} payload bytes exceed max_round_bytes={lim.max_round_bytes}"
            )
        return PubRound(_d_round(rid), _d_topic(topic, lim), messages, _d_dests(dests, lim))
    if tag == _SUB:
        _, rid, topic, op = _array(raw, "SUB", 4)
        return Sub(_d_round(rid), _d_topic(topic, lim), _d_op(op, "SUB.op"))
    if tag == _UNS:
        fields = _array(raw, "UNS", _extras_size(raw))
        rid, topic, op, dests = fields[1:5]
        predates, beyond = _d_extras(fields, "UNS", lim.max_view_entries)
        return Uns(
            _d_round(rid),
            _d_topic(topic, lim),
            _d_op(op, "UNS.op"),
            _d_dests(dests, lim),
            predates,
            beyond,
        )
    if tag == _ACK:
        fields = _array(raw, "ACK", _extras_size(raw))
        rid, topic, view, bounds = fields[1:5]
        n = lim.max_view_entries
        entries = tuple(_d_op(e, "ACK.view[]") for e in _array(view, "ACK.view", limit=n))
        predates, beyond = _d_extras(fields, "ACK", n)
        bnds = _d_bounds(bounds, "ACK.bounds", n)
        return Ack(_d_round(rid), _d_topic(topic, lim), entries, bnds, predates, beyond)
    if tag == _FENCE:
        return _d_fence(raw, lim)
    raise WireError(f"packet: unknown type tag {tag}")


def _d_fence(raw: list[object], lim: WireLimits) -> Fence:
    if len(raw) not in (7, 8):
        raise WireError(f"FENCE: expected 7 or 8 elements, got {len(raw)}")
    _, rid, topic, stream, step, msgs, others = raw[:7]
    src, inc, value = _d_id(stream, "FENCE.stream")
    marks: list[MsgId] = []
    if len(raw) == 8:
        for m in _array(raw[7], "FENCE.marks", limit=lim.max_view_entries):
            n, i, q = _d_id(m, "FENCE.marks[]")
            marks.append(MsgId(n, i, q - 1))
    return Fence(
        _d_round(rid),
        _d_topic(topic, lim),
        MsgId(src, inc, value - 1),
        _int(step, "FENCE.step", 0, 5),
        _d_messages(msgs, "FENCE.messages", lim),
        _d_messages(others, "FENCE.others", lim),
        tuple(marks),
    )


def decode_packets(body: bytes, limits: WireLimits) -> list[Packet]:
    """The packets of one frame body, in order; :class:`WireError` on any deviation
    (a body with a peer exchange included: see :func:`decode_frame`)."""
    packets, exchange = decode_frame(body, limits)
    if exchange is not None:
        raise WireError("unexpected peer exchange in a packets-only body")
    return packets


@hot
class Body:
    """A decoded frame body: core packets, control packets, a peer exchange and
    the sender's detector version (*alive*, ``None`` if the frame has none)."""

    packets: list[Packet]
    exchange: PeerExchange | None = None
    control: tuple[Control, ...] = ()
    alive: int | None = None


def decode_frame(body: bytes, limits: WireLimits) -> tuple[list[Packet], PeerExchange | None]:
    """The packets of one frame body, in order, and its peer exchange if any.

    Raises :class:`WireError` on any deviation, control packets included (see
    :func:`decode_body`); a body holds at least one packet or an exchange.
    """
    decoded = decode_body(body, limits)
    if decoded.control:
        raise WireError("unexpected control packet in a packets-only body")
    return decoded.packets, decoded.exchange


def decode_body(body: bytes, limits: WireLimits) -> Body:
    """Everything one frame body holds; :class:`WireError` on any deviation.

    Frames of PUB rounds and plain ACKs take the direct decoder; anything
    else (control packets included) the checked one, so a detector message
    is validated by the reference rules and ``vcube.decode_detector``.
    """
    if len(body) > limits.max_frame:
        raise WireError(f"body of {len(body)} bytes exceeds max_frame={limits.max_frame}")
    decoded = _decode_direct(body, limits)
    if decoded is not None:
        return decoded
    return _decode_tree(body, limits)


def _decode_tree(body: bytes, limits: WireLimits) -> Body:
    """:func:`decode_body` by the reference rules: scan, ``cbor2``, schema checks."""
    _scan(body, limits.max_items)
    try:
        tree: object = cbor2.loads(body, allow_indefinite=False, max_depth=MAX_DEPTH + 1)
    except (cbor2.CBORDecodeError, ValueError) as exc:  # e.g. a text string that is not UTF-8
        raise WireError(f"undecodable body: {exc}") from None
    parts = _array(tree, "body")
    if len(parts) not in (2, 3, 4):
        raise WireError(f"body: expected 2 to 4 elements, got {len(parts)}")
    version = parts[0]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise WireError(
            f"unsupported protocol version {version!r} (this node speaks {PROTOCOL_VERSION})"
        )
    raw = _array(parts[1], "packets", limit=limits.max_packets)
    alive, exchange = _d_tail(parts[2:], limits)
    if not raw and exchange is None:
        raise WireError("frame without packets")
    packets: list[Packet] = []
    control: list[Control] = []
    for p in raw:
        if type(p) is list and p and p[0] in _CONTROL_TAGS and type(p[0]) is int:
            control.append(_d_control(p, limits))
        else:
            packets.append(_d_packet(p, limits))
    return Body(packets, exchange, tuple(control), alive)


def _d_tail(tail: list[object], lim: WireLimits) -> tuple[int | None, PeerExchange | None]:
    """*alive* and the exchange after the packets: ``[]``, ``[alive]``, ``[exchange]``
    or ``[alive, exchange]``."""
    alive = None
    if len(tail) == 2 or (tail and type(tail[0]) is not list):
        alive, tail = _node(tail[0], "alive"), tail[1:]
    return alive, _d_exchange(tail[0], lim) if tail else None
