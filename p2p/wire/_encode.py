"""Packets to frame bodies (:func:`encode_packets`), written byte by byte, and
bodies to frames (:func:`frame`); the cache of recent rounds' encoded messages."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from causal import MsgId
from p2p.wire._cbor import (
    _BYTES_HEAD,
    _UINT,
    _e_array,
    _e_bool,
    _e_bytes,
    _e_int,
    _e_topic,
)
from p2p.wire._control import Control, PeerExchange, _e_control
from p2p.wire._limits import NODE_LIMIT, PREFIX_BYTES, PROTOCOL_VERSION, WireError
from topics import (
    Ack,
    Bound,
    Bundle,
    Chain,
    Fence,
    Packet,
    PubMessage,
    PubRound,
    RoundId,
    Sub,
    Uns,
    ViewEntry,
)


def _e_joins(v: int) -> bytes:
    """A message's ``op_joins``: an unsigned integer below 2**64, above that (a
    publication naming 64 ops or more) its big-endian bytes, shortest form:
    the wire format has no bignum tags."""
    if type(v) is int and v >= NODE_LIMIT:
        return _e_bytes(v.to_bytes((v.bit_length() + 7) // 8, "big"))
    return _e_int(v)


def _e_id(i: MsgId) -> bytes:
    return b"\x83" + _e_int(i.source) + _e_int(i.incarnation) + _e_int(i.seq)


def _e_round(r: RoundId) -> bytes:
    return b"\x83" + _e_int(r.source) + _e_int(r.incarnation) + _e_int(r.number)


def _e_op(e: ViewEntry) -> bytes:
    return b"\x84" + _e_int(e.node) + _e_int(e.incarnation) + _e_int(e.rc) + _e_bool(e.subscribed)


def _e_ints(values: Sequence[int]) -> bytes:
    return _e_array(len(values)) + b"".join(map(_e_int, values))


_UNSET: Final = object()
_SEQ16: Final = struct.Struct(">BH").pack
_SEQ32: Final = struct.Struct(">BI").pack


def _e_seq(seq: int) -> bytes:
    """A sequence number's CBOR: the sizes a node's counter has, without a call
    to :func:`~p2p.wire._cbor._e_int` (its bytes, for every value)."""
    if type(seq) is not int or not 0 <= seq < 0x1_0000_0000:
        return _e_int(seq)
    if seq < 0x100:
        return _UINT[seq]
    return _SEQ16(0x19, seq) if seq < 0x10000 else _SEQ32(0x1A, seq)


def _e_messages(messages: Sequence[PubMessage]) -> bytes:
    """The CBOR array of a round's publications.

    Ids mostly share their source and incarnation (the very same int objects:
    the core's, or the decoder's), so their encoding is kept while they do.
    """
    out = [_e_array(len(messages))]
    append = out.append
    source: object = _UNSET
    incarnation: object = _UNSET
    prefix = b""

    def e_id(i: MsgId) -> None:
        nonlocal source, incarnation, prefix
        s, inc, seq = i
        if s is not source or inc is not incarnation:
            source, incarnation = s, inc
            prefix = b"\x83" + _e_int(s) + _e_int(inc)
        append(prefix)
        append(_e_seq(seq))

    before: MsgId | None = None
    chain = type(messages) is Chain  # all but the first are followers: no test each
    for m in messages:
        joins = m.op_joins
        mid, payload, deps = m.id, m.payload, m.deps
        short = before is not None and (
            chain
            or (  # PubMessage.chains_on, inlined: once per publication
                not m.op_deps
                and m.prev == before[2]
                and len(deps) == 1
                and deps[0] == before
                and mid[0] == before[0]
                and mid[1] == before[1]
            )
        )
        if short:  # a chain's follower: [seq, payload]
            append(b"\x82")
            append(_e_seq(mid[2]))
        else:
            append(b"\x86" if joins else b"\x85")
            e_id(mid)
        before = mid
        if type(payload) is bytes and len(payload) < 0x100:
            append(_BYTES_HEAD[len(payload)])
            append(payload)
        else:
            append(_e_bytes(payload))
        if short:
            continue
        deps = m.deps
        append(_e_array(len(deps)))
        for i in deps:
            e_id(i)
        op_deps = m.op_deps
        append(_e_array(len(op_deps)))
        for i in op_deps:
            e_id(i)
        append(_e_int(m.prev))
        if joins:
            append(_e_joins(joins))
    return b"".join(out)


_ENCODED: dict[int, tuple[tuple[PubMessage, ...], bytes]] = {}
"""The CBOR of recent rounds' ``messages``, by identity of the tuple (which it keeps alive).

A round goes to each child with the same ``messages`` and another ``dests``,
and a relay forwards the ``messages`` it decoded: both are encoded once (a
relay not at all: :func:`decode_frame` files the bytes it read).  Valid
because the tuple and what it holds are immutable and the encoding is
canonical: the bytes filed are those :func:`_e_messages` would write.
"""

_CACHE_ROUNDS: Final = 8


def _remember(messages: tuple[PubMessage, ...], data: bytes) -> None:
    _ENCODED[id(messages)] = (messages, data)
    excess = len(_ENCODED) - _CACHE_ROUNDS
    if excess > 0:  # the oldest go (insertion order); list() is atomic, for threads
        for key in list(_ENCODED)[:excess]:
            _ENCODED.pop(key, None)


def _messages_cbor(messages: tuple[PubMessage, ...]) -> bytes:
    hit = _ENCODED.get(id(messages))
    if hit is not None and hit[0] is messages:
        return hit[1]
    data = _e_messages(messages)
    _remember(messages, data)
    return data


def _e_packet(p: Packet) -> bytes:
    if isinstance(p, PubRound):
        return (
            b"\x85\x00"
            + _e_round(p.round)
            + _e_topic(p.topic)
            + _messages_cbor(p.messages)
            + _e_ints(p.dests)
        )
    if isinstance(p, Sub):
        return b"\x84\x01" + _e_round(p.round) + _e_topic(p.topic) + _e_op(p.op)
    if isinstance(p, Uns):
        return (
            _e_head(p.predates, p.beyond, 2)
            + _e_round(p.round)
            + _e_topic(p.topic)
            + _e_op(p.op)
            + _e_ints(p.dests)
            + _e_extras(p.predates, p.beyond)
        )
    if isinstance(p, Ack):
        return (
            _e_head(p.predates, p.beyond, 3)
            + _e_round(p.round)
            + _e_topic(p.topic)
            + _e_array(len(p.view))
            + b"".join(map(_e_op, p.view))
            + _e_bounds(p.bounds)
            + _e_extras(p.predates, p.beyond)
        )
    if isinstance(p, Fence):  # the stream's value is sent plus one: -1 is "none"
        src, inc, value = p.stream
        marks = b""
        if p.marks:  # an eighth element only when there are marks
            marks = _e_array(len(p.marks)) + b"".join(
                _e_id(MsgId(n, i, q + 1)) for n, i, q in p.marks
            )
        return (
            (b"\x88\x08" if marks else b"\x87\x08")
            + _e_round(p.round)
            + _e_topic(p.topic)
            + _e_id(MsgId(src, inc, value + 1))
            + _e_int(p.step)
            + _e_messages(p.messages)
            + _e_messages(p.others)
            + marks
        )
    raise TypeError(f"not a packet: {type(p).__name__}")


def _e_bounds(bounds: tuple[Bound, ...]) -> bytes:
    return _e_array(len(bounds)) + b"".join(
        b"\x83" + _e_int(b.node) + _e_int(b.incarnation) + _e_int(b.first_owned) for b in bounds
    )


_HEADS = {tag: (bytes((0x85, tag)), bytes((0x86, tag)), bytes((0x87, tag))) for tag in (2, 3)}
"""Per UNS/ACK tag, the array heads of 5, 6 and 7 elements, built once: an ACK is
encoded for every round on every hop."""


def _e_head(predates: tuple[Bound, ...], beyond: tuple[Bound, ...], tag: int) -> bytes:
    """An ACK's or UNS's array head: 5 elements, 6 with ``predates``, 7 with ``beyond``."""
    return _HEADS[tag][2 if beyond else 1 if predates else 0]


def _e_extras(predates: tuple[Bound, ...], beyond: tuple[Bound, ...]) -> bytes:
    if beyond:
        return _e_bounds(predates) + _e_bounds(beyond)
    return _e_bounds(predates) if predates else b""


def encode_packets(
    packets: Sequence[Packet | Bundle],
    exchange: PeerExchange | None = None,
    control: Sequence[Control] = (),
    alive: int | None = None,
) -> bytes:
    """One frame body: the protocol version and ``packets``, bundles flattened in order,
    then the ``control`` packets, then ``alive`` (the sender's detector version)
    and ``exchange`` if given.

    The packets come from the local core and are trusted; :func:`decode_frame`
    is where the receiver checks them.
    """
    parts: list[bytes] = []
    for p in packets:
        if isinstance(p, Bundle):
            parts.extend(map(_e_packet, p.packets))
        else:
            parts.append(_e_packet(p))
    parts.extend(map(_e_control, control))
    body = [
        _e_array(2 + (alive is not None) + (exchange is not None)),
        _e_int(PROTOCOL_VERSION),
        _e_array(len(parts)),
    ]
    body += parts
    if alive is not None:
        body.append(_e_int(alive))
    if exchange is not None:
        records = exchange.records
        body += (b"\x82", _e_bool(exchange.reply), _e_array(len(records)))
        body += map(_e_bytes, records)
    return b"".join(body)


def uint_size(v: int) -> int:
    """Bytes of the shortest CBOR encoding of the unsigned integer ``v`` (what an
    *alive* element adds to a body)."""
    return len(_e_int(v))


def frame(body: bytes) -> bytes:
    """``body`` behind its 4-byte big-endian length prefix."""
    if len(body) >= 1 << (8 * PREFIX_BYTES):
        raise WireError(f"frame body of {len(body)} bytes does not fit the length prefix")
    return len(body).to_bytes(PREFIX_BYTES, "big") + body
