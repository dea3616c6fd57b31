"""``NodeMachine`` on its own: machines joined by a hand-driven link (h11's way
of testing a sans-IO protocol), no clock and no I/O."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import pytest

import p2p.machine._machine as machine_module
from p2p._errors import ForgedRecordError
from p2p._membership import Peer
from p2p.machine import (
    ENVELOPE_SIZE,
    ExchangeWithSeed,
    LeaveSeed,
    MemberDown,
    MemberUp,
    NodeMachine,
    NodeOutput,
    Refused,
    Reincarnated,
    RoundStarted,
    SendControl,
    SendExchange,
    Stalled,
    Superseded,
)
from p2p.wire import Body, Control, Leave, PeerExchange
from topics import (
    Bundle,
    Delivered,
    LocalProtocolError,
    Published,
    PublishedRun,
    PubSubConfig,
    Send,
    VCubePS,
)
from vcube import DetectorConfig, Entry, Hypercube, Probe, Push, Reply

CFG = DetectorConfig(interval=1.0, timeout=1.0, attempts=2, max_timeout=8.0)
PUBSUB = PubSubConfig(max_payload=100)


def _record(node: int, inc: int) -> bytes:
    return b"rec" + node.to_bytes(8, "big") + inc.to_bytes(8, "big")


def _verify(record: bytes) -> tuple[Peer, int]:
    if not record.startswith(b"rec"):
        raise ForgedRecordError("discovery record: signature does not verify")
    node, inc = int.from_bytes(record[3:11], "big"), int.from_bytes(record[11:], "big")
    return Peer(node, "h", 1, record, inc), inc


def _machine(node: int, members: dict[int, int] | None = None) -> NodeMachine:
    def make_core(inc: int) -> VCubePS:
        return VCubePS(node, overlay=Hypercube([node]), config=PUBSUB, incarnation=inc)

    m = NodeMachine(node, 1, make_core, detector=CFG, members=members, verify=_verify)
    m.record = _record(node, 1)
    return m


def _deliver(machines: dict[int, NodeMachine], src: int, out: Sequence[object], now: float) -> None:
    """Carry ``out`` from ``src`` to its destinations, and their answers, to the end."""
    queue = [(src, o) for o in out]
    while queue:
        sender, o = queue.pop(0)
        if isinstance(o, SendControl):
            more = machines[o.dest].receive(sender, _ctl(o.msg), now)
        elif isinstance(o, SendExchange):
            ex = PeerExchange(o.records, o.reply)
            more = machines[o.dest].receive(sender, Body([], exchange=ex), now)
        elif isinstance(o, Send):
            packets = list(o.packet.packets) if isinstance(o.packet, Bundle) else [o.packet]
            more = machines[o.dest].receive(sender, Body(packets), now)
        else:
            continue
        queue += [(o.dest, x) for x in more]


def _ctl(msg: Control) -> Body:
    """A frame holding one control message."""
    return Body([], control=(msg,))


def test_the_machine_module_is_sans_io() -> None:
    """DESIGN.md §1: no trio, socket, threading, time or random in p2p.machine."""
    banned = {"trio", "socket", "threading", "time", "random", "asyncio"}
    for path in Path(machine_module.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not {n.split(".")[0] for n in names} & banned, (path.name, names)


def test_a_hint_is_a_probe_never_an_eviction() -> None:
    m = _machine(1, {2: 1, 3: 1})
    m.start_rounds(0.0)
    m.handle_timer(0.0)
    out = m.hint(2, 0.5)
    assert all(isinstance(o, SendControl) and isinstance(o.msg, Probe) for o in out)
    assert m.alive == {2, 3}
    assert not [o for o in out if isinstance(o, MemberDown)]


def test_records_and_leave() -> None:
    """A seed exchange makes both know each other; a LEAVE makes the leaver
    ``left`` (not suspected) and its record departed, so it cannot come back
    through gossip with the same record."""
    a, b = _machine(1), _machine(2)
    machines = {1: a, 2: b}
    out = b.introduce(1)  # b knows a's address only: a seed
    assert b.add_peer(*_verify(_record(1, 1)), 0.0)[0]
    _deliver(machines, 2, out, 0.0)
    assert a.alive == {2}
    assert b.alive == {1}
    leave = b.leave(1.0)
    assert leave == [SendControl(1, Leave(1))]
    assert b.get_timer() is None  # a leaving node accuses nobody
    got = a.receive(2, _ctl(Leave(1)), 1.0)
    downs = [o for o in got if isinstance(o, MemberDown)]
    assert downs == [MemberDown(2, 1, "left", True)]
    assert a.alive == set()
    assert a.add_peer(*_verify(_record(2, 1)), 2.0) == (False, [])
    assert a.add_peer(*_verify(_record(2, 2)), 2.0)[0]  # a newer incarnation may come back


def test_join_emits_member_up_and_the_core_learns_it() -> None:
    a = _machine(1)
    new, out = a.add_peer(*_verify(_record(5, 3)), 0.0)
    assert new
    assert MemberUp(5, 3, "discovered") in out
    assert a.core.overlay.members == {1, 5}


def test_a_late_timer_is_a_stall_and_rounds_keep_their_grid() -> None:
    m = _machine(1, {2: 1, 3: 1})
    m.start_rounds(10.0)
    assert m.get_timer() == 10.0
    assert RoundStarted() in m.handle_timer(10.0)
    due = m.get_timer()
    assert due is not None
    late = m.handle_timer(due + 5.0)  # the process did not run for 5 s
    stalls = [o for o in late if isinstance(o, Stalled)]
    assert len(stalls) == 1
    assert stalls[0].lag == pytest.approx(5.0)
    assert m.detector is not None
    assert m.detector.health >= 1
    nxt = m.get_timer()
    assert nxt is not None
    assert nxt <= due + 5.0 + CFG.interval


def test_reincarnation_restarts_the_core_from_make_core_and_resubscribes() -> None:
    """Suspected by a peer: one Reincarnated, a new core built by ``make_core``
    (so it keeps the driver's config: before, the runtime's rebuilt core lost
    its larger payload limit), numbering on, and the topics subscribed again."""
    a = _machine(1, {2: 1})
    a.subscribe("t", 0.0)
    room = PUBSUB.max_payload - ENVELOPE_SIZE  # the machine's envelope takes the rest
    a.publish("t", b"x" * room, 0.0)
    old = a.core
    suspicion = Push(incarnation=1, version=5, entries=(Entry(1, 1, 1),))  # 2 says: 1 suspected
    out = a.receive(2, _ctl(suspicion), 1.0)
    re = [o for o in out if isinstance(o, Reincarnated)]
    assert re == [Reincarnated(1, 2)]
    assert a.incarnation == 2
    assert a.core is not old
    assert a.core.config.max_payload == PUBSUB.max_payload
    assert a.core.next_seq >= old.next_seq  # ids stay unique across lives
    assert a.topics == {"t"}
    assert a.core.is_subscribed("t")
    a.publish("t", b"y" * room, 1.5)  # the same limit as before
    with pytest.raises(LocalProtocolError, match="envelope"):
        a.publish("t", b"z" * (room + 1), 1.5)
    assert not [o for o in a.receive(2, _ctl(suspicion), 2.0) if isinstance(o, Reincarnated)]


def test_a_reincarnated_core_knows_which_lives_of_its_members_crashed() -> None:
    """The new core learns every member's newest incarnation, not only the
    crashes: node 3 restarted (it runs as incarnation 3 now), so its older lives
    are dead there too, and a late view entry of one is not taken as a
    member (``bench.failure_fuzz`` partial seed 404153: a reincarnated node
    kept a restarted node's old subscription in its view for good)."""
    a = _machine(1, {2: 1, 3: 1})
    a.subscribe("t", 0.0)
    a.learn(3, 3, 0.5)  # node 3 restarted
    old = a.core
    suspicion = Push(incarnation=1, version=5, entries=(Entry(1, 1, 1),))
    assert [o for o in a.receive(2, _ctl(suspicion), 1.0) if isinstance(o, Reincarnated)]
    assert a.core is not old
    for core in (old, a.core):
        assert core._is_dead(3, 2)
        assert not core._is_dead(3, 3)
        assert core._life[3] == 3


def test_a_newer_live_incarnation_of_its_own_id_supersedes_the_node() -> None:
    """The identity was started twice: a peer holds a newer incarnation of this
    id, alive (even counter).  This machine reports :class:`Superseded` once
    and goes quiet (no timer, no probes); it does not reincarnate above the
    other process, which would start a leapfrog of restarts."""
    a = _machine(1, {2: 1})
    a.start_rounds(0.0)
    twin = Push(incarnation=1, version=5, entries=(Entry(1, 7, 0),))  # 2 says: 1 runs as 7
    out = a.receive(2, _ctl(twin), 1.0)
    assert [o for o in out if isinstance(o, Superseded | Reincarnated)] == [Superseded(7)]
    assert a.incarnation == 1
    assert a.get_timer() is None
    assert a.handle_timer(5.0) == []
    assert a.hint(2, 5.0) == []
    again = Push(incarnation=1, version=6, entries=(Entry(1, 7, 2),))
    assert not [
        o for o in a.receive(2, _ctl(again), 6.0) if isinstance(o, Superseded | Reincarnated)
    ]


def test_a_newer_suspected_incarnation_of_its_own_id_is_an_earlier_life() -> None:
    """A newer incarnation of this id that is itself suspected (odd counter) is
    a dead earlier life, newer only because the clock stepped back before this
    restart (a Raspberry Pi without a clock): come back above it."""
    a = _machine(1, {2: 1})
    old_life = Push(incarnation=1, version=5, entries=(Entry(1, 7, 1),))
    out = a.receive(2, _ctl(old_life), 1.0)
    assert [o for o in out if isinstance(o, Superseded | Reincarnated)] == [Reincarnated(1, 8)]
    assert a.superseded is None


def test_a_reply_from_a_peer_answers_its_probe() -> None:
    m = _machine(1, {2: 1})
    m.start_rounds(0.0)
    out = m.handle_timer(0.0)
    probes = [o for o in out if isinstance(o, SendControl) and isinstance(o.msg, Probe)]
    assert [o.dest for o in probes] == [2]
    probe = probes[0].msg
    assert isinstance(probe, Probe)
    reply = Reply(round=probe.round, incarnation=1, version=0, entries=())
    assert m.receive(2, _ctl(reply), 0.1) == []
    assert m.detector is not None
    assert m.detector.deadline() is None


def test_leaving_while_a_seed_exchange_is_under_way_tells_that_seed() -> None:
    """A node that closes after its records went to a seed, before the exchange's
    outcome was reported (the seed may have learnt it already), sends that
    seed a LEAVE on a connection of its own: else the seed, whose record never
    came back, would suspect a node that left (real nodes: the seed dialled
    the closed joiner, failed, and suspected it)."""
    m = _machine(1)
    m.add_seed("seed:1", 0.0)
    started = [o for o in m.handle_timer(0.0) if isinstance(o, ExchangeWithSeed)]
    assert [o.address for o in started] == ["seed:1"]
    assert [(o.address, o.msg) for o in m.leave(0.5) if isinstance(o, LeaveSeed)] == [
        ("seed:1", Leave(1))
    ]


def test_a_seed_never_tried_or_known_up_gets_no_seed_leave() -> None:
    """No exchange started yet, or the seed is a member (it gets the members'
    LEAVE): no :class:`LeaveSeed`."""
    idle = _machine(1)
    idle.add_seed("seed:1", 5.0)  # due later: nothing under way at 0.5
    assert not [o for o in idle.leave(0.5) if isinstance(o, LeaveSeed)]
    m = _machine(1, members={2: 1})
    m.add_seed("seed:2", 0.0)
    m.handle_timer(0.0)
    m.seed_reached("seed:2", 2, 0.1)
    out = m.leave(0.5)
    assert not [o for o in out if isinstance(o, LeaveSeed)]
    assert SendControl(2, Leave(1)) in out


def _publishers() -> dict[int, NodeMachine]:
    """Nodes 1 and 2 of a fleet of two, both subscribed to ``t``, node 2's
    subscription confirmed at node 1 (so node 1's rounds go somewhere)."""
    ms = {1: _machine(1, members={2: 1}), 2: _machine(2, members={1: 1})}
    for n, m in ms.items():
        _deliver(ms, n, m.subscribe("t", 0.0), 0.0)
    return ms


def _in_order(outs: list[NodeOutput]) -> tuple[list[str], list[str]]:
    """The publications' own events, and the other outputs, each in order
    (a ``PublishedRun`` taken as the events it stands for)."""
    events = [e for o in outs for e in (o.expand() if isinstance(o, PublishedRun) else (o,))]
    mine = [isinstance(e, Published) or (isinstance(e, Delivered) and e.own) for e in events]
    return (
        [repr(e) for e, m in zip(events, mine, strict=True) if m],
        [repr(e) for e, m in zip(events, mine, strict=True) if not m],
    )


@pytest.mark.parametrize("bad", [None, 2])
def test_publish_many_is_publish_for_each_in_one_step(bad: int | None) -> None:
    """The same outputs (the publications' own events gathered in one
    ``PublishedRun``), history, ordinals and core state as one by one, with
    the first refused payload raising after those before it are published."""
    payloads = [b"p%d" % k for k in range(6)]
    if bad is not None:
        payloads[bad] = bytes(PUBSUB.max_payload)  # over the room the envelope leaves
    one, many = _publishers(), _publishers()
    for k in range(3):  # the first round leaves; the rest queue behind it
        by_one: list[NodeOutput] = []
        error_one = error_many = None
        try:
            for p in payloads:
                by_one += one[1].publish("t", p, float(k))
        except LocalProtocolError as e:
            error_one = str(e)
        by_many: list[NodeOutput] = []
        try:
            many[1].publish_many("t", payloads, float(k), by_many)
        except LocalProtocolError as e:
            error_many = str(e)
        assert _in_order(by_many) == _in_order(by_one)
        assert error_many == error_one
        assert (bad is None) == (error_one is None)
    a, b = one[1], many[1]
    assert list(a.recovery.history.since("t", 0, -1, 3.0)) == list(
        b.recovery.history.since("t", 0, -1, 3.0)
    )
    assert a.frontier.envelope("t") == b.frontier.envelope("t")
    assert a.core.queued("t") == b.core.queued("t") > 0


def test_a_frames_records_are_checked_before_its_packets() -> None:
    """``receive``'s order: a frame with a forged record is refused with none of
    its packets applied (the live fuzz test predicts the node's closings on it),
    and the same packet in a frame of its own is then new."""
    ms = _publishers()
    out = ms[2].publish("t", b"x", 1.0)
    (pkt,) = [o.packet for o in out if isinstance(o, Send) and o.dest == 1]
    assert not isinstance(pkt, Bundle)
    forged = Body([pkt], exchange=PeerExchange((b"forged",), False))
    refused = ms[1].receive(2, forged, 1.0)
    assert refused == [Refused(2, "discovery record: signature does not verify")]
    delivered = [o for o in ms[1].receive(2, Body([pkt]), 1.0) if isinstance(o, Delivered)]
    assert [d.payload[ENVELOPE_SIZE:] for d in delivered] == [b"x"]
