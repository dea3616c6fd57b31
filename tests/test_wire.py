"""The wire format (``p2p/wire/``): round trips, strict rejection, de-framing, fuzzing.

Round trips are Hypothesis properties over every packet type (sparse 64-bit
ids, empty and maximal fields, bundles).  Each rule of the schema has a
focused rejection case built from hand-written CBOR.  The fuzz tests throw
seeded random bytes and mutations of valid frames at :func:`decode_packets`
and :class:`FrameReader`: they may only ever raise :class:`WireError`.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable
from itertools import pairwise

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from causal import MsgId
from p2p._build import build_kind
from p2p._errors import P2PError
from p2p.wire import (
    COUNTER_LIMIT,
    NODE_LIMIT,
    PROTOCOL_VERSION,
    Body,
    FrameReader,
    Members,
    PeerExchange,
    Revoked,
    WireError,
    WireLimits,
    decode_body,
    decode_frame,
    decode_packets,
    encode_packets,
    frame,
    uint_size,
)
from p2p.wire._decode import _decode_direct, _decode_tree
from p2p.wire._encode import _ENCODED
from topics import (
    Ack,
    Bound,
    Bundle,
    Chain,
    Fence,
    Packet,
    PubMessage,
    PubRound,
    PubSubConfig,
    Received,
    RoundId,
    Sub,
    Uns,
    VCubePS,
    ViewEntry,
    chain_of,
)
from topics._messages import DEP_SET_MIN
from vcube import Hypercube
from vcube._hot import replace as hot_replace

LIMITS = WireLimits()
SMALL = WireLimits(
    max_frame=4096,
    max_items=400,
    max_packets=4,
    max_topic_len=8,
    max_payload=16,
    max_round_messages=3,
    max_round_bytes=20,
    max_barrier=4,
    max_view_entries=3,
    max_dests=3,
    max_records=3,
    max_record=100,
)
"""Tight limits, so that each can be broken by a small hand-written frame."""

# ---------------------------------------------------------------- strategies

nodes = st.one_of(
    st.integers(0, 40), st.integers(0, NODE_LIMIT - 1), st.sampled_from([0, NODE_LIMIT - 1])
)
counters = st.one_of(
    st.integers(0, 40), st.integers(0, COUNTER_LIMIT - 1), st.just(COUNTER_LIMIT - 1)
)
topics = st.text(min_size=1, max_size=24).filter(lambda t: len(t.encode()) <= 256)
round_ids = st.builds(RoundId, nodes, counters, counters)
msg_ids = st.builds(MsgId, nodes, counters, counters)
ops = st.builds(ViewEntry, nodes, counters, counters, st.booleans())
dests = st.lists(nodes, max_size=6, unique=True).map(lambda d: tuple(sorted(d)))


def _with_joins(msg: PubMessage) -> st.SearchStrategy[PubMessage]:
    """``msg`` with any ``op_joins`` its ``op_deps`` allow."""
    joins = st.integers(0, (1 << len(msg.op_deps)) - 1)
    return joins.map(lambda j: hot_replace(msg, op_joins=j))


messages = st.builds(
    PubMessage,
    msg_ids,
    st.binary(max_size=80),
    st.lists(msg_ids, max_size=4).map(tuple),
    st.one_of(st.lists(msg_ids, max_size=3), st.lists(msg_ids, min_size=62, max_size=70)).map(
        tuple
    ),
    st.one_of(st.just(-1), counters),
).flatmap(_with_joins)


@st.composite
def chains(draw: st.DrawFn) -> tuple[PubMessage, ...]:
    """A round as sources send them: publications each naming only the one
    before it (``chains_on``, short form on the wire), now and then one that
    names more, or an op."""
    first = draw(messages)
    out = [first]
    for _ in range(draw(st.integers(1, 5))):
        before = out[-1].id
        seq = before.seq + draw(st.integers(1, 3))
        if before.seq + 3 >= COUNTER_LIMIT:
            break
        mid = MsgId(before.source, before.incarnation, seq)
        payload = draw(st.binary(max_size=40))
        extra = draw(st.sampled_from([(), (), (), (MsgId(1, 0, 1),)]))
        out.append(PubMessage(mid, payload, (before, *extra), (), before.seq))
    return tuple(out)


bound_lists = st.lists(st.builds(Bound, nodes, counters, counters), max_size=4).map(tuple)
packets: st.SearchStrategy[Packet] = st.one_of(
    st.builds(PubRound, round_ids, topics, st.lists(messages, max_size=4).map(tuple), dests),
    st.builds(PubRound, round_ids, topics, chains(), dests),
    st.builds(Sub, round_ids, topics, ops),
    st.builds(Uns, round_ids, topics, ops, dests, bound_lists, bound_lists),
    st.builds(
        Ack,
        round_ids,
        topics,
        st.lists(ops, max_size=4).map(tuple),
        bound_lists,
        bound_lists,
        bound_lists,
    ),
    st.builds(
        Fence,
        round_ids,
        topics,
        st.builds(MsgId, nodes, counters, st.integers(-1, COUNTER_LIMIT - 2)),
        st.integers(0, 4),
        st.lists(messages, max_size=3).map(tuple),
        st.lists(messages, max_size=2).map(tuple),
        st.lists(
            st.builds(MsgId, nodes, counters, st.integers(-1, COUNTER_LIMIT - 2)), max_size=3
        ).map(tuple),
    ),
)
items = st.one_of(packets, st.lists(packets, min_size=1, max_size=4).map(tuple).map(Bundle))


def flatten(seq: list[Packet | Bundle]) -> list[Packet]:
    return [q for p in seq for q in (p.packets if isinstance(p, Bundle) else (p,))]


def assert_chains_marked(packets: list[Packet]) -> None:
    """Every decoded round's publications are a ``Chain`` exactly when they are one
    (``chain_of``'s test), whichever decoder read them."""
    for p in packets:
        if isinstance(p, PubRound):
            assert (type(p.messages) is Chain) == (type(chain_of(p.messages)) is Chain)


def pub(payload: bytes = b"x" * 64, deps: tuple[MsgId, ...] = (MsgId(5, 1, 2),)) -> PubRound:
    msg = PubMessage(MsgId(3, 1, 9), payload, deps, (), 8)
    return PubRound(RoundId(3, 1, 7), "sensors/temp", (msg,), (4, 6, 9))


# ---------------------------------------------------------------- round trips


@given(st.lists(items, min_size=1, max_size=5), st.none() | st.integers(0, NODE_LIMIT - 1))
def test_round_trip(seq: list[Packet | Bundle], alive: int | None) -> None:
    body = encode_packets(seq, alive=alive)
    assert decode_body(body, LIMITS) == Body(flatten(seq), alive=alive)
    assert FrameReader(LIMITS).feed(frame(body)) == [body]
    direct = _decode_direct(body, LIMITS)
    assert direct is None or direct == Body(flatten(seq), alive=alive)
    assert_chains_marked(decode_body(body, LIMITS).packets)
    if direct is not None:
        assert_chains_marked(direct.packets)
    if all(isinstance(p, PubRound) or p == Ack(p.round, p.topic) for p in flatten(seq)):
        assert direct is not None  # the runtime's usual frames take the direct decoder
    if alive is not None:
        assert len(body) == len(encode_packets(seq)) + uint_size(alive)


@pytest.mark.parametrize("count", [0, 2, DEP_SET_MIN - 1, DEP_SET_MIN, 40])
def test_a_decoded_publication_tests_its_barrier_as_a_set_when_long(count: int) -> None:
    """Both decoders build messages whose cached dependency set is ``deps``'
    (the direct one fills the slots itself, so it must leave the cache empty)."""
    deps = tuple(MsgId(i, 0, i % 5) for i in range(count))
    body = encode_packets([pub(deps=deps)])
    direct = _decode_direct(body, LIMITS)
    assert direct is not None
    for decoded in (decode_body(body, LIMITS), direct):
        (packet,) = decoded.packets
        assert isinstance(packet, PubRound)
        (msg,) = packet.messages
        assert msg.dep_set() == frozenset(deps)
        assert msg.dep_set() is msg.dep_set()
        lookup = msg.dep_lookup()
        assert lookup is msg.deps if count < DEP_SET_MIN else lookup is msg.dep_set()


def cbor_tree(p: Packet) -> list[object]:
    """``p`` as the documented tree of CBOR arrays (what ``cbor2.dumps`` encodes)."""

    def ids(v: tuple[MsgId, ...]) -> list[object]:
        return [list(i) for i in v]

    def op(e: ViewEntry) -> list[object]:
        return [e.node, e.incarnation, e.rc, e.subscribed]

    def joins(v: int) -> int | bytes:  # 64 ops or more: big-endian bytes, no tag
        return v if v < NODE_LIMIT else v.to_bytes((v.bit_length() + 7) // 8, "big")

    def msgs(v: tuple[PubMessage, ...]) -> list[list[object]]:
        return [
            [m.id.seq, m.payload]  # a chain's follower
            if i and m.chains_on(v[i - 1].id)
            else [list(m.id), m.payload, ids(m.deps), ids(m.op_deps), m.prev, joins(m.op_joins)][
                : 6 if m.op_joins else 5
            ]
            for i, m in enumerate(v)
        ]

    r = [p.round.source, p.round.incarnation, p.round.number]
    if isinstance(p, PubRound):
        return [0, r, p.topic, msgs(p.messages), list(p.dests)]
    if isinstance(p, Fence):  # the value goes plus one (-1 is "none")
        stream = [p.stream.source, p.stream.incarnation, p.stream.seq + 1]
        fence = [8, r, p.topic, stream, p.step, msgs(p.messages), msgs(p.others)]
        marks = [[m.source, m.incarnation, m.seq + 1] for m in p.marks]
        return [*fence, marks] if marks else fence  # marks only when there are some
    if isinstance(p, Sub):
        return [1, r, p.topic, op(p.op)]

    def bounds(v: tuple[Bound, ...]) -> list[object]:
        return [[b.node, b.incarnation, b.first_owned] for b in v]

    # predates and beyond: each left out when it and what follows are empty
    extras = [bounds(p.predates), bounds(p.beyond)] if isinstance(p, (Uns, Ack)) else []
    while extras and not extras[-1]:
        extras.pop()
    if isinstance(p, Uns):
        return [2, r, p.topic, op(p.op), list(p.dests), *extras]
    return [3, r, p.topic, [op(e) for e in p.view], bounds(p.bounds), *extras]


@given(
    st.lists(items, max_size=5),
    st.none()
    | st.builds(
        PeerExchange, st.lists(st.binary(), min_size=1, max_size=3).map(tuple), st.booleans()
    ),
    st.none() | st.integers(0, NODE_LIMIT - 1),
)
def test_encoding_is_cbor2s(
    seq: list[Packet | Bundle], exchange: PeerExchange | None, alive: int | None
) -> None:
    """The hand-written encoder writes exactly the bytes ``cbor2.dumps`` writes for the tree,
    whether a round's messages were encoded before (cached) or not."""
    tree: list[object] = [PROTOCOL_VERSION, [cbor_tree(p) for p in flatten(seq)]]
    if alive is not None:
        tree.append(alive)
    if exchange is not None:
        tree.append([exchange.reply, list(exchange.records)])
    _ENCODED.clear()
    assert encode_packets(seq, exchange, alive=alive) == cbor2.dumps(tree)
    assert encode_packets(seq, exchange, alive=alive) == cbor2.dumps(tree)


def test_encoding_of_values_the_core_never_sends_is_cbor2s() -> None:
    """A bool or a bignum where an int belongs, a bytearray payload: still cbor2's
    bytes.  The compiled build (``make compiled``) refuses such a message with a
    ``TypeError`` (its compiled encoder reads the fields as the types they have)."""
    odd = PubMessage(MsgId(True, 1 << 70, -(1 << 70)), bytearray(b"ab"), (), (), False)  # type: ignore[arg-type]
    packet = PubRound(RoundId(1, 2, 3), "t", (odd,), (0, 1 << 64))
    tree = [PROTOCOL_VERSION, [cbor_tree(packet)]]
    try:
        encoded = encode_packets([packet])
    except TypeError:
        assert build_kind() == "mypyc"
        return
    assert encoded == cbor2.dumps(tree)


def test_relay_forwards_the_bytes_it_decoded() -> None:
    """A decoded round's messages are encoded again from the bytes that carried them
    (the core forwards the same tuple with other ``dests``): the same bytes."""
    msgs = (
        PubMessage(
            MsgId(NODE_LIMIT - 1, 3, 300), b"x" * 72, (MsgId(NODE_LIMIT - 1, 3, 299),), (), 299
        ),
        PubMessage(
            MsgId(NODE_LIMIT - 1, 3, 301), b"", (MsgId(7, 0, 1 << 40),), (MsgId(9, 1, 2),), 300
        ),
    )
    body = encode_packets([PubRound(RoundId(NODE_LIMIT - 1, 3, 9), "t", msgs, (4, 6))])
    _ENCODED.clear()
    [got] = decode_packets(body, LIMITS)
    assert isinstance(got, PubRound)
    assert id(got.messages) in _ENCODED
    forward = PubRound(got.round, got.topic, got.messages, (6,))
    relayed = encode_packets([forward])
    _ENCODED.clear()
    assert relayed == encode_packets([forward])


@given(packets)
def test_body_is_the_documented_cbor(packet: Packet) -> None:
    """A body is plain CBOR any decoder reads: ``[version, [[tag, round, topic, ...]]]``."""
    version, [raw] = cbor2.loads(encode_packets([packet]))
    assert version == PROTOCOL_VERSION
    tag = {"PUB": 0, "SUB": 1, "UNS": 2, "ACK": 3, "FENCE": 8}[packet.kind]
    r = packet.round
    assert raw[:3] == [tag, [r.source, r.incarnation, r.number], packet.topic]


def test_max_size_fields_round_trip() -> None:
    """Every field at its default limit (and empty where it may be) passes."""
    cfg = PubSubConfig()
    topic = "é" * (cfg.max_topic_len // 2)
    ids = tuple(MsgId(NODE_LIMIT - 1 - i, COUNTER_LIMIT - 1, i) for i in range(cfg.max_barrier))
    big = PubMessage(MsgId(NODE_LIMIT - 1, 0, 1), b"\xff" * cfg.max_payload, ids[:10], ids[10:])
    empty = PubMessage(MsgId(0, 0, 0), b"")
    rid = RoundId(NODE_LIMIT - 1, COUNTER_LIMIT - 1, COUNTER_LIMIT - 1)
    route = tuple(range(0, 1 << 64, 1 << 48))
    seq: list[Packet] = [
        PubRound(rid, topic, (big, empty), route),
        PubRound(rid, "t", (), ()),
        Ack(rid, "t"),
        Ack(rid, topic, (ViewEntry(1, 2, 3, True),) * cfg.max_view_entries),
    ]
    body = encode_packets(seq)
    assert len(body) <= LIMITS.max_frame
    assert decode_packets(body, WireLimits.from_config(cfg)) == seq


@pytest.mark.parametrize("kind", ["ACK", "UNS"])
def test_predates_are_sent_only_when_there_are_some(kind: str) -> None:
    """A SUB ACK's or an announce's ``predates`` is a sixth element, left out
    when empty, so every packet has one encoding and the 5-element form still
    decodes; more than ``max_view_entries`` of them is refused."""
    rid, op = RoundId(3, 0, 1), ViewEntry(3, 0, 0, True)
    some = (Bound(2, 1, 7),)
    with_some: Packet
    without: Packet
    if kind == "ACK":
        with_some, without = Ack(rid, "t", (), (), some), Ack(rid, "t", (), ())
    else:
        with_some, without = Uns(rid, "t", op, (), some), Uns(rid, "t", op, ())
    assert decode_packets(encode_packets([with_some]), LIMITS) == [with_some]
    assert decode_packets(encode_packets([without]), LIMITS) == [without]
    assert len(encode_packets([with_some])) > len(encode_packets([without]))
    # the same packet with an empty sixth element is not its encoding: refused
    raw = cbor2.loads(encode_packets([without]))
    raw[1][0].append([])
    with pytest.raises(WireError, match="predates"):
        decode_packets(cbor2.dumps(raw), LIMITS)
    many = hot_replace(with_some, predates=some * 3)
    with pytest.raises(WireError, match="limit"):
        decode_packets(encode_packets([many]), dataclasses.replace(LIMITS, max_view_entries=2))


@pytest.mark.parametrize("kind", ["ACK", "UNS"])
def test_a_frontier_past_its_gaps_is_a_seventh_element(kind: str) -> None:
    """An announce's or its ACK's ``beyond`` is a seventh element, sent only
    when there is some (``predates`` is then sent even if empty): one
    encoding per packet; an empty seventh element is refused."""
    rid, op = RoundId(3, 0, 1), ViewEntry(3, 0, 0, True)
    first, past = (Bound(2, 1, 7),), (Bound(2, 1, 9),)
    both: Packet
    only: Packet
    if kind == "ACK":
        both, only = Ack(rid, "t", (), (), first, past), Ack(rid, "t", (), (), (), past)
    else:
        both, only = Uns(rid, "t", op, (), first, past), Uns(rid, "t", op, (), (), past)
    for packet in (both, only):
        assert decode_packets(encode_packets([packet]), LIMITS) == [packet]
    assert len(cbor2.loads(encode_packets([only]))[1][0]) == 7
    raw = cbor2.loads(encode_packets([hot_replace(both, beyond=())]))
    raw[1][0].append([])
    with pytest.raises(WireError, match="beyond"):
        decode_packets(cbor2.dumps(raw), LIMITS)
    many = hot_replace(both, beyond=past * 3)
    with pytest.raises(WireError, match="limit"):
        decode_packets(encode_packets([many]), dataclasses.replace(LIMITS, max_view_entries=2))


def test_which_named_ops_are_subscriptions_is_a_sixth_element() -> None:
    """A message's ``op_joins`` (which of its ``op_deps`` are subscriptions) is
    a sixth element, left out when 0: one encoding per message, and a
    message naming only unsubscriptions is the 5-element form of before."""
    ops = (MsgId(4, 0, 1), MsgId(6, 2, 3))
    plain = PubMessage(MsgId(3, 1, 9), b"p", (), ops, 8)
    for joins in range(4):
        msg = hot_replace(plain, op_joins=joins)
        packet = PubRound(RoundId(3, 1, 7), "t", (msg,), ())
        raw = encode_packets([packet])
        assert len(cbor2.loads(raw)[1][0][3][0]) == (6 if joins else 5)
        assert decode_packets(raw, LIMITS) == [packet]
        direct = _decode_direct(raw, LIMITS)
        assert direct is not None
        assert direct.packets == [packet]
    named = hot_replace(plain, op_joins=2).named_ops()
    assert list(named) == [ViewEntry(4, 0, 1, False), ViewEntry(6, 2, 3, True)]


def test_a_publication_naming_more_than_64_subscriptions_goes_on_the_wire() -> None:
    """A publisher that subscribes knowing 127 subscribers names all their ops
    in its first publication, every one a subscription: ``op_joins`` is then
    2**127 - 1, past CBOR's 64-bit integers.  It went out as a bignum tag,
    which every receiver refused as garbage (a boot storm of 128 nodes
    delivered nothing); it goes as bytes, and only in their shortest form."""
    ops = tuple(MsgId(1000 + k, 0, 0) for k in range(127))
    msg = PubMessage(MsgId(3, 1, 1), b"p", (), ops, -1, (1 << 127) - 1)
    packet = PubRound(RoundId(3, 1, 1), "t", (msg,), ())
    limits = dataclasses.replace(LIMITS, max_barrier=200)
    raw = encode_packets([packet])
    assert decode_packets(raw, limits) == [packet]
    assert cbor2.loads(raw)[1][0][3][0][5] == b"\x7f" + b"\xff" * 15
    short = pub_raw(messages=[[*msg_raw(op_deps=[ID] * 65), b"\x01" + bytes(8)]])
    [got] = decode_packets(body(short), limits)
    assert isinstance(got, PubRound)
    assert got.messages[0].op_joins == 1 << 64
    for bad in (b"\x00" + b"\x01" + bytes(8), b"\x01", b"\x02" + bytes(8)):
        raw_bad = body(pub_raw(messages=[[*msg_raw(op_deps=[ID] * 65), bad]]))
        with pytest.raises(WireError, match="joins"):
            decode_packets(raw_bad, limits)


def test_from_config() -> None:
    cfg = PubSubConfig(max_topic_len=9, max_payload=99, max_barrier=7, max_view_entries=5)
    lim = WireLimits.from_config(cfg, max_frame=1000)
    assert (lim.max_frame, lim.max_topic_len, lim.max_payload) == (1000, 9, 99)
    assert (lim.max_barrier, lim.max_view_entries, lim.max_dests) == (7, 5, 5)
    assert WireLimits.from_config(PubSubConfig()).max_payload == LIMITS.max_payload
    with pytest.raises(ValueError, match="max_frame"):
        WireLimits(max_frame=0)
    with pytest.raises(ValueError, match="prefix"):
        WireLimits(max_frame=1 << 32)
    assert issubclass(WireError, P2PError)


def test_a_frame_at_every_limit_is_accepted_by_the_core() -> None:
    """What passes :func:`decode_packets` does not trip the core's own size checks."""
    cfg = PubSubConfig(
        max_topic_len=8, max_payload=16, max_round_messages=3, max_round_bytes=48, max_barrier=4
    )
    deps = (MsgId(2, 0, 1),) * 2
    msgs = tuple(PubMessage(MsgId(0, 0, s), b"x" * 16, deps, deps, s - 1) for s in range(3))
    [packet] = decode_packets(
        encode_packets([PubRound(RoundId(0, 0, 1), "é" * 4, msgs, ())]),
        WireLimits.from_config(cfg),
    )
    core = VCubePS(1, overlay=Hypercube([0, 1, 2, 3]), config=cfg)
    assert [o.id for o in core.receive(0, packet, 0.0) if isinstance(o, Received)] == [
        m.id for m in msgs
    ]


# ---------------------------------------------------------------- rejection

ID = [3, 1, 9]
RID = [3, 1, 7]
OP = [3, 1, 2, True]
MSG = [ID, b"ab", [], [], -1]


def body(*packets: object, version: object = PROTOCOL_VERSION) -> bytes:
    return cbor2.dumps([version, list(packets)])


def pub_raw(**kw: object) -> list[object]:
    f: dict[str, object] = {"round": RID, "topic": "t", "messages": [MSG], "dests": [4, 6]}
    f.update(kw)
    return [0, f["round"], f["topic"], f["messages"], f["dests"]]


def msg_raw(**kw: object) -> list[object]:
    f: dict[str, object] = {"id": ID, "payload": b"ab", "deps": [], "op_deps": [], "prev": -1}
    f.update(kw)
    return [f["id"], f["payload"], f["deps"], f["op_deps"], f["prev"]]


def test_a_follower_is_the_publication_that_names_only_the_one_before_it() -> None:
    """``[seq, payload]`` after a message stands for the publication of its
    stream that names that message alone, as barrier and as ``prev``; both
    decoders read it so, and the encoder writes it so."""
    raw = body(pub_raw(messages=[msg_raw(prev=0), [12, b"cd"]]))
    first = PubMessage(MsgId(3, 1, 9), b"ab", (), (), 0)
    second = PubMessage(MsgId(3, 1, 12), b"cd", (MsgId(3, 1, 9),), (), 9)
    want = PubRound(RoundId(3, 1, 7), "t", (first, second), (4, 6))
    assert decode_packets(raw, SMALL) == [want]
    assert _decode_direct(raw, SMALL) == Body([want])
    assert encode_packets([want]) == raw
    direct = _decode_direct(raw, SMALL)
    assert direct is not None
    for packets in (decode_packets(raw, SMALL), direct.packets):
        assert type(packets[0].messages) is Chain  # type: ignore[union-attr]
    _ENCODED.clear()
    assert encode_packets([hot_replace(want, messages=chain_of(want.messages))]) == raw


@pytest.mark.parametrize("seqs", [[9, 12, 10], [9, 9], [9, 8, 12]])
def test_followers_out_of_order_are_no_chain(seqs: list[int]) -> None:
    """A follower's sequence number at or below the one before it reads as the
    publication it stands for, but the round is no ``Chain`` (the core then
    checks its order publication by publication, and refuses it)."""
    raw = body(pub_raw(messages=[msg_raw(id=[3, 1, seqs[0]]), *[[s, b"cd"] for s in seqs[1:]]]))
    direct = _decode_direct(raw, SMALL)
    assert direct is not None
    for packets in (decode_packets(raw, SMALL), direct.packets):
        (packet,) = packets
        assert isinstance(packet, PubRound)
        assert [m.id.seq for m in packet.messages] == seqs
        assert type(packet.messages) is tuple


@pytest.mark.parametrize("seq", [23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32])
def test_a_followers_sequence_number_is_cbor2s_in_every_head_size(seq: int) -> None:
    first = PubMessage(MsgId(3, 1, seq - 1), b"ab", (), (), -1)
    follower = PubMessage(MsgId(3, 1, seq), b"cd", (first.id,), (), seq - 1)
    packet = PubRound(RoundId(3, 1, 7), "t", (first, follower), (4,))
    _ENCODED.clear()
    assert encode_packets([packet]) == cbor2.dumps([PROTOCOL_VERSION, [cbor_tree(packet)]])
    assert decode_packets(encode_packets([packet]), LIMITS) == [packet]


def test_hand_written_bodies_are_valid() -> None:
    """The baselines below are accepted: each rejection case breaks exactly one rule."""
    ack = [3, RID, "t", [OP], [[1, 2, 3]]]
    got = decode_packets(body(pub_raw(), [1, RID, "t", OP], [2, RID, "t", OP, []], ack), SMALL)
    assert [p.kind for p in got] == ["PUB", "SUB", "UNS", "ACK"]
    assert decode_packets(body(pub_raw(messages=[msg_raw(prev=0)] * 1)), SMALL)[0] == PubRound(
        RoundId(3, 1, 7), "t", (PubMessage(MsgId(3, 1, 9), b"ab", (), (), 0),), (4, 6)
    )


V = PROTOCOL_VERSION

REJECT: dict[str, tuple[bytes, str]] = {
    # framing of the body itself
    "empty body": (b"", "truncated"),
    "truncated": (body(pub_raw())[:-1], "truncated|exceeds"),
    "truncated head": (b"\x82\x02\x19\x01", "truncated"),
    "trailing garbage": (body(pub_raw()) + b"\x00", "trailing"),
    "not an array": (cbor2.dumps(1), "body"),
    "body of 5": (cbor2.dumps([V, [pub_raw()], 0, [False, [b"r"]], 0]), "body"),
    "alive after exchange": (cbor2.dumps([V, [pub_raw()], [False, [b"r"]], 0]), "alive"),
    "alive negative": (cbor2.dumps([V, [pub_raw()], -1]), "alive"),
    "alive too big": (cbor2.dumps([V, [pub_raw()], 1 << 64]), "tag"),
    "alive not an int": (cbor2.dumps([V, [pub_raw()], "1"]), "alive"),
    "alive a bool": (cbor2.dumps([V, [pub_raw()], True]), "alive"),
    "alive, no packets": (cbor2.dumps([V, [], 3]), "without packets"),
    "exchange not an array": (cbor2.dumps([V, [pub_raw()], 0, 0]), "exchange"),
    "exchange reply not bool": (cbor2.dumps([V, [], [1, [b"r"]]]), "exchange.reply"),
    "exchange without records": (cbor2.dumps([V, [], [True, []]]), "without records"),
    "exchange record not bytes": (cbor2.dumps([V, [], [True, ["r"]]]), "exchange.record"),
    "exchange record empty": (cbor2.dumps([V, [], [True, [b""]]]), "exchange.record"),
    "exchange record too big": (cbor2.dumps([V, [], [True, [b"r" * 101]]]), "exchange.record"),
    "exchange too many records": (cbor2.dumps([V, [], [True, [b"r"] * 4]]), "limit of 3"),
    "unknown version": (body(pub_raw(), version=V + 1), "version"),
    "version 1 (no alive)": (body(pub_raw(), version=1), "version"),
    "bool version": (body(pub_raw(), version=True), "version"),
    "no packets": (body(), "without packets"),
    "too many packets": (body(*[pub_raw()] * 5), "packets"),
    # CBOR outside the subset
    "map": (cbor2.dumps([V, [{"k": 1}]]), "map"),
    "tag": (cbor2.dumps([V, [cbor2.CBORTag(6, 1)]]), "tag"),
    "bignum tag": (b"\x82\x02\x81\x85\xc2\x41\x00" + body(pub_raw())[4:], "tag"),
    "float": (cbor2.dumps([1.0, [pub_raw()]]), "float"),
    "null": (cbor2.dumps([V, [None]]), "simple"),
    "indefinite array": (b"\x9f\x01\xff", "indefinite"),
    "indefinite bytes": (b"\x82\x02\x81\x5f\x41\x00\xff", "indefinite"),
    "non-shortest int": (b"\x82\x18\x01\x80", "shortest"),
    "non-shortest length": (b"\x82\x02\x98\x01" + cbor2.dumps(pub_raw()), "shortest"),
    "length beyond body": (b"\x82\x02\x9a\x00\x01\x00\x00\x00", "exceeds"),
    "string beyond body": (b"\x82\x02\x5a\xff\xff\xff\xff", "exceeds"),
    "too deep": (cbor2.dumps([V, [pub_raw(messages=[msg_raw(deps=[[[1]]])])]]), "deeper"),
    "invalid utf-8": (
        b"\x82\x02\x81\x84\x01\x83\x03\x01\x07\x61\xff" + cbor2.dumps(OP),
        "undecodable",
    ),
    "too many items": (body(pub_raw(dests=list(range(500)))), "max_items"),
    # packet shapes
    "empty packet": (body([]), "empty"),
    "unknown type tag": (body([99, RID, "t"]), "unknown type"),
    "bool type tag": (body([True, RID, "t", OP]), "type tag"),
    "packet too short": (body([1, RID, "t"]), "SUB"),
    "packet too long": (body([1, RID, "t", OP, 0]), "SUB"),
    "packet not an array": (body(b"ab"), "packet"),
    # integers
    "bool for int": (body(pub_raw(round=[3, True, 7])), "round.incarnation"),
    "negative node id": (body(pub_raw(round=[-3, 1, 7])), "round.source"),
    "node id over 64 bits": (body(pub_raw(dests=[NODE_LIMIT])), "tag"),  # a bignum
    "negative dest": (body(pub_raw(dests=[-1, 4])), "dests"),
    "counter at 2**63": (body(pub_raw(round=[3, 1, COUNTER_LIMIT])), "round.number"),
    "negative counter": (body(pub_raw(messages=[msg_raw(id=[3, -1, 9])])), "incarnation"),
    "prev below -1": (body(pub_raw(messages=[msg_raw(prev=-2)])), "prev"),
    "string for int": (body(pub_raw(round=[3, "1", 7])), "round.incarnation"),
    "int for bool": (body([1, RID, "t", [3, 1, 2, 1]]), "subscribed"),
    # strings and sizes
    "bytes topic": (body(pub_raw(topic=b"t")), "topic"),
    "empty topic": (body(pub_raw(topic="")), "topic"),
    "topic too long (utf-8 bytes)": (body(pub_raw(topic="ééééé")), "max_topic_len"),
    "text payload": (body(pub_raw(messages=[msg_raw(payload="ab")])), "payload"),
    "payload too large": (body(pub_raw(messages=[msg_raw(payload=b"x" * 17)])), "max_payload"),
    "too many messages": (body(pub_raw(messages=[msg_raw()] * 4)), "PUB.messages"),
    "round too many bytes": (body(pub_raw(messages=[msg_raw(payload=b"x" * 11)] * 2)), "round"),
    "barrier too large": (
        body(pub_raw(messages=[msg_raw(deps=[ID] * 3, op_deps=[ID] * 2)])),
        "max_barrier",
    ),
    "msg id of 2": (body(pub_raw(messages=[msg_raw(deps=[[3, 1]])])), "deps"),
    "message of 4": (body(pub_raw(messages=[msg_raw()[:4]])), "message"),
    "follower first": (body(pub_raw(messages=[[10, b"ab"]])), "follower .* comes first"),
    "follower in long form": (
        body(pub_raw(messages=[msg_raw(), msg_raw(id=[3, 1, 10], deps=[ID], prev=9)])),
        "follows the message before it in long form",
    ),
    "follower payload not bytes": (
        body(pub_raw(messages=[msg_raw(), [10, "ab"]])),
        "payload: expected a byte string",
    ),
    "follower payload too long": (
        body(pub_raw(messages=[msg_raw(), [10, b"x" * 17]])),
        "exceed max_payload",
    ),
    "follower seq not a counter": (body(pub_raw(messages=[msg_raw(), [-1, b"ab"]])), "seq"),
    "message of 7": (body(pub_raw(messages=[[*msg_raw(op_deps=[ID]), 1, 1]])), "message"),
    "joins of 0": (body(pub_raw(messages=[[*msg_raw(op_deps=[ID]), 0]])), "joins"),
    "joins past the ops": (body(pub_raw(messages=[[*msg_raw(op_deps=[ID]), 2]])), "joins"),
    "joins without ops": (body(pub_raw(messages=[[*msg_raw(), 1]])), "joins"),
    "bool joins": (body(pub_raw(messages=[[*msg_raw(op_deps=[ID]), True]])), "joins"),
    "view too large": (body([3, RID, "t", [OP] * 4, []]), "ACK.view"),
    "bounds too large": (body([3, RID, "t", [], [[1, 2, 3]] * 4]), "ACK.bounds"),
    "bound of 4": (body([3, RID, "t", [], [[1, 2, 3, 4]]]), "bounds"),
    # routes
    "unsorted dests": (body(pub_raw(dests=[6, 4])), "increasing"),
    "duplicate dests": (body([2, RID, "t", OP, [4, 4]]), "increasing"),
    "too many dests": (body(pub_raw(dests=[1, 2, 3, 4])), "dests"),
    "dests not an array": (body(pub_raw(dests=4)), "dests"),
}


@pytest.mark.parametrize(("raw", "match"), REJECT.values(), ids=REJECT.keys())
def test_decode_rejects(raw: bytes, match: str) -> None:
    assert _decode_direct(raw, SMALL) is None  # the direct decoder gives up, too
    with pytest.raises(WireError, match=match):
        decode_frame(raw, SMALL)
    with pytest.raises(WireError, match=match):
        decode_packets(raw, SMALL)


def test_peer_exchange_round_trip() -> None:
    ex = PeerExchange((b"a" * 1200, b"b"), reply=True)
    packets = [pub()]
    assert decode_frame(encode_packets(packets, ex), LIMITS) == (packets, ex)
    assert decode_frame(encode_packets([], ex), LIMITS) == ([], ex)
    assert cbor2.loads(encode_packets([], ex)) == [V, [], [True, [b"a" * 1200, b"b"]]]
    assert decode_body(encode_packets([], ex, alive=7), LIMITS) == Body([], ex, alive=7)
    with pytest.raises(WireError, match="unexpected peer exchange"):
        decode_packets(encode_packets(packets, ex), LIMITS)


@pytest.mark.parametrize("digest", [0, 23, 24, 255, 1 << 32, NODE_LIMIT - 1])
def test_members_digest_round_trip(digest: int) -> None:
    raw = encode_packets([], control=[Members(digest, 3)], alive=3)
    assert cbor2.loads(raw) == [V, [[6, digest, 3]], 3]
    assert decode_body(raw, LIMITS) == Body([], None, (Members(digest, 3),), 3)


def test_revoked_list_round_trip() -> None:
    raw = encode_packets([], control=[Revoked(b"x" * 300)])
    assert cbor2.loads(raw) == [V, [[7, b"x" * 300]]]
    assert decode_body(raw, LIMITS).control == (Revoked(b"x" * 300),)


@pytest.mark.parametrize(
    ("control", "match"),
    [
        ([6, 1], "MEMBERS"),
        ([6, 1, 2, 3], "MEMBERS"),
        ([6, -1, 0], "MEMBERS.digest"),
        ([6, NODE_LIMIT, 0], "CBOR tag"),  # a bignum: refused by the scan
        ([6, True, 0], "MEMBERS.digest"),
        ([6, b"x", 0], "MEMBERS.digest"),
        ([6, 1, COUNTER_LIMIT], "MEMBERS.revocations"),
        ([7], "REVOKED"),
        ([7, b""], "REVOKED"),
        ([7, "text"], "REVOKED"),
        ([7, b"x" * (64 * 1024 + 1)], "REVOKED"),
    ],
)
def test_membership_controls_reject(control: list[object], match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode_body(body(control), LIMITS)


def test_decode_rejects_oversize_body() -> None:
    raw = body(pub_raw())
    with pytest.raises(WireError, match="max_frame"):
        decode_packets(raw, WireLimits(max_frame=len(raw) - 1))


# ---------------------------------------------------------------- framing


@given(
    st.lists(st.lists(packets, min_size=1, max_size=3), min_size=1, max_size=4),
    st.lists(st.integers(0, 2000), max_size=12),
)
def test_reader_reassembles_split_frames(batches: list[list[Packet]], cuts: list[int]) -> None:
    bodies = [encode_packets(b) for b in batches]
    stream = b"".join(frame(b) for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = FrameReader(LIMITS)
    got: list[bytes] = []
    for a, b in pairwise(points):
        got.extend(reader.feed(stream[a:b]))
    assert got == bodies
    assert reader.buffered == 0
    assert [decode_packets(b, LIMITS) for b in got] == batches


def test_reader_byte_by_byte() -> None:
    bodies = [encode_packets([pub()]), encode_packets([pub(b"")])]
    reader = FrameReader(LIMITS)
    got = [f for byte in b"".join(map(frame, bodies)) for f in reader.feed(bytes([byte]))]
    assert got == bodies


def test_reader_rejects_oversize_length_before_buffering() -> None:
    reader = FrameReader(WireLimits(max_frame=1000))
    assert reader.feed(b"\x00\x00") == []
    with pytest.raises(WireError, match="max_frame"):
        reader.feed(b"\x03\xe9" + b"x" * 500)  # length 1001, then data that is never kept
    assert reader.buffered == 0
    with pytest.raises(WireError):  # stays failed
        reader.feed(frame(b"\x00"))
    huge = FrameReader(LIMITS)
    with pytest.raises(WireError, match="4294967295"):
        huge.feed(b"\xff\xff\xff\xff")
    assert huge.buffered == 0


def test_reader_rejects_empty_frame_and_keeps_frames_before_error() -> None:
    reader = FrameReader(LIMITS)
    with pytest.raises(WireError, match="outside"):
        reader.feed(b"\x00\x00\x00\x00")
    ok = frame(b"\x01\x02")
    reader = FrameReader(LIMITS)
    assert reader.feed(ok + ok[:3]) == [b"\x01\x02"]
    assert reader.buffered == 3
    assert reader.feed(ok[3:] + ok) == [b"\x01\x02", b"\x01\x02"]


def test_frame_prefix() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"


# ---------------------------------------------------------------- fuzzing

FUZZ_LIMITS = WireLimits(max_frame=1 << 16)


def seeds() -> list[bytes]:
    """Valid frames of every packet type, the material the mutations start from."""
    rid = RoundId(7, 2, 5)
    op = ViewEntry(9, 1, 4, True)
    sample: list[list[Packet | Bundle]] = [
        [pub()],
        [pub(b"", (MsgId(1 << 63, 3, 1 << 40), MsgId(2, 0, 0)))],
        [Sub(rid, "a/b", op), Uns(rid, "ü", op, (1, 1 << 60))],
        [Ack(rid, "t", (op, ViewEntry(1, 0, 0, False)), (Bound(1, 2, 3),))],
        [Ack(rid, "t", (op,), (), (Bound(5, 0, 2), Bound(1 << 63, 4, 9)))],
        [Uns(rid, "t", op, (), (Bound(5, 0, 2),))],
        [Bundle((pub(), Ack(rid, "t"))), Sub(rid, "z", op)],
    ]
    alives = (None, 0, 23, 300, 1 << 40)  # the piggybacked detector version, in each head size
    return [frame(encode_packets(s, alive=a)) for s in sample for a in alives]


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        i = rng.randrange(len(b) + 1)
        if kind == 0 and b:  # bit flip
            j = rng.randrange(len(b))
            b[j] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncation
            del b[i:]
        elif kind == 2:  # insertion
            b[i:i] = rng.randbytes(rng.randint(1, 4))
        elif kind == 3 and b:  # duplication of a slice
            j = rng.randrange(len(b))
            b[i:i] = b[j : j + rng.randint(1, 16)]
        elif kind == 4 and b:  # deletion of a slice
            del b[i : i + rng.randint(1, 8)]
        elif b:  # overwrite a byte with an interesting CBOR head
            b[rng.randrange(len(b))] = rng.choice([0x1B, 0x3B, 0x5F, 0x9F, 0xBF, 0xC2, 0xF6, 0xFB])
    return bytes(b)


def only_wire_errors(data: bytes, limits: WireLimits = FUZZ_LIMITS) -> int:
    """Throw ``data`` at the body decoder and at a stream reader; count accepted bodies."""
    accepted = 0
    for candidate in (data, data[4:]):
        direct = _decode_direct(candidate, limits)
        try:
            checked: Body | None = _decode_tree(candidate, limits)
        except WireError:
            checked = None
        # the direct decoder accepts only what the checked one accepts, as the same packets
        assert direct is None or checked == direct
        if direct is not None:
            assert_chains_marked(direct.packets)
        try:
            decoded = decode_body(candidate, limits)
        except WireError:
            continue
        if decoded.control or decoded.exchange is not None:
            continue
        accepted += 1
        # strictness: an accepted body is the one canonical encoding of its packets
        # (encoded from the packets, not from the bytes the decoder filed for relaying)
        _ENCODED.clear()
        assert encode_packets(decoded.packets, alive=decoded.alive) == candidate
    reader = FrameReader(limits)
    try:
        for i in range(0, len(data), 7):
            for b in reader.feed(data[i : i + 7]):
                decode_packets(b, limits)
    except WireError:
        pass
    return accepted


def fuzz(
    count: int, make: Callable[[random.Random], bytes], limits: WireLimits = FUZZ_LIMITS
) -> int:
    rng = random.Random(0x5EED)
    return sum(only_wire_errors(make(rng), limits) for _ in range(count))


def test_fuzz_random_bytes() -> None:
    prefix = [b"", b"\x82\x02", b"\x82\x02\x81", b"\x82\x02\x81\x85\x00"]

    def make(rng: random.Random) -> bytes:
        return rng.choice(prefix) + rng.randbytes(rng.randint(0, 64))

    fuzz(10_000, make)


def test_fuzz_mutated_frames() -> None:
    valid = seeds()
    accepted = fuzz(10_000, lambda rng: mutate(rng, rng.choice(valid)))
    assert accepted > 0  # some mutations (e.g. of a payload byte) stay valid


ODD_VALUES: list[object] = [
    True, False, 0, -1, -2, 1, COUNTER_LIMIT, NODE_LIMIT - 1, -NODE_LIMIT, b"", b"x" * 20,
    "", "t", "é" * 9, [], [0], [[]], [1, 2, 3], [3, 1, 2, True], [-1] * 5,
]  # fmt: skip


def mutate_tree(rng: random.Random, data: bytes) -> bytes:
    """Replace, drop or duplicate one element somewhere in the decoded body, re-encode it."""
    tree = cbor2.loads(data[4:])
    for _ in range(rng.randint(1, 3)):
        node = tree
        while True:  # walk down to a random array
            kids = [k for k in node if isinstance(k, list)]
            if not kids or rng.random() < 0.3:
                break
            node = rng.choice(kids)
        i = rng.randrange(len(node) + 1)
        op = rng.randrange(3)
        if op == 0 and i < len(node):
            node[i] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif op == 1 and i < len(node):
            del node[i]
        else:
            pick = rng.choice(node) if node and rng.random() < 0.5 else rng.choice(ODD_VALUES)
            node.insert(i, copy.deepcopy(pick))
    return cbor2.dumps(tree)


def test_fuzz_mutated_trees() -> None:
    """Well-formed CBOR of the wrong shape: this reaches the schema checks, not the scanner."""
    valid = seeds()
    fuzz(10_000, lambda rng: b"\x00\x00\x00\x00" + mutate_tree(rng, rng.choice(valid)))


@given(st.binary(max_size=200))
def test_fuzz_hypothesis_bytes(data: bytes) -> None:
    only_wire_errors(data)


def direct_seeds() -> list[bytes]:
    """Valid frames of PUB rounds and plain ACKs only: what the direct decoder reads."""
    big = NODE_LIMIT - 1
    rid = RoundId(big, 2, 5)

    def msg(seq: int, payload: bytes, prev: int, *, ops: int = 0) -> PubMessage:
        op_deps = tuple(MsgId(9, 1, 4 + k) for k in range(ops))
        return PubMessage(MsgId(big, 2, seq), payload, (MsgId(big, 2, seq - 1),), op_deps, prev)

    round_ = tuple(msg(s, bytes([s % 256]) * (s % 30), s - 1) for s in range(250, 262))
    mixed = (msg(1, b"", -1, ops=2), msg(1 << 40, b"y" * 24, 1), msg(70000, b"z" * 300, 1 << 40))
    sample: list[list[Packet | Bundle]] = [
        [PubRound(rid, "t", round_, (3, 1 << 33))],
        [PubRound(rid, "é/b", mixed, ()), Ack(RoundId(4, 0, 23), "t")],
        [Ack(rid, "abc"), PubRound(RoundId(0, 0, 0), "t", (), (0,))],
    ]
    alives = (None, 0, 23, 300, 1 << 40)  # the piggybacked detector version, in each head size
    return [frame(encode_packets(s, alive=a)) for s in sample for a in alives]


DIRECT_LIMITS = WireLimits(
    max_frame=1 << 16,
    max_items=200,
    max_topic_len=4,
    max_payload=300,
    max_round_messages=12,
    max_round_bytes=400,
    max_barrier=3,
    max_dests=2,
)
"""Limits that the seeds above reach, so that mutations cross them."""


def test_fuzz_direct_decoder_agrees_with_checked() -> None:
    """Mutations of the frames the direct decoder reads, byte- and tree-wise: wherever it
    accepts, the checked decoder accepts the same packets (asserted in only_wire_errors)."""
    valid = direct_seeds()
    assert all(_decode_direct(v[4:], DIRECT_LIMITS) is not None for v in valid)
    accepted = fuzz(10_000, lambda rng: mutate(rng, rng.choice(valid)), DIRECT_LIMITS)
    accepted += fuzz(
        10_000,
        lambda rng: b"\x00\x00\x00\x00" + mutate_tree(rng, rng.choice(valid)),
        DIRECT_LIMITS,
    )
    assert accepted > 100


def test_the_wire_defaults_are_the_cores_own() -> None:
    """One source for the core's limits: a default ``WireLimits`` and one made
    from a default ``PubSubConfig`` agree."""
    from dataclasses import asdict

    from topics import PubSubConfig

    made = asdict(WireLimits.from_config(PubSubConfig()))
    default = asdict(WireLimits())
    assert made == default
