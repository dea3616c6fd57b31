"""The VCube-PS core and the causal helpers, driven by hand (h11 style).

A few :class:`~topics.VCubePS` cores are joined by a tiny in-test network,
:class:`Net`, that holds every :class:`~topics.Send` on a "wire" until the test
decides which packet arrives next.  Reordering packets on purpose is how the
hold-back, FIFO, batching, relay and thesis-counterexample cases are built.

Tree shapes used below (ids are small so the trees can be read off):
``partition(0, [1, 2])`` gives ``0`` two children, ``1`` (bucket 1) and ``2``
(bucket 2); ``partition(0, [2, 3])`` gives one child ``2`` that relays to
``3``.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from causal import CausalBarrier, CausalBuffer, MsgId
from topics import (
    Ack,
    AlreadySubscribedError,
    Bundle,
    Delivered,
    DeliveredRun,
    Dropped,
    Event,
    LocalProtocolError,
    NotSubscribedError,
    Output,
    Packet,
    PubMessage,
    PubRound,
    PubSubConfig,
    Received,
    RemoteProtocolError,
    RoundAcked,
    RoundId,
    Send,
    Sub,
    Subscribed,
    Uns,
    VCubePS,
    ViewEntry,
)
from vcube import Hypercube, partition
from vcube._hot import replace as hot_replace

T = "t"


@dataclass(slots=True)
class Wire:
    """One packet in flight."""

    src: int
    dst: int
    packet: Packet

    def __repr__(self) -> str:
        return f"{self.packet.kind} {self.src}->{self.dst} {self.packet.round!r}"


@dataclass
class Net:
    """Cores joined by a wire the test controls."""

    ids: list[int]
    config: PubSubConfig | None = None
    cores: dict[int, VCubePS] = field(init=False)
    wire: list[Wire] = field(init=False, default_factory=list)
    events: dict[int, list[Event]] = field(init=False)
    sent: list[Wire] = field(init=False, default_factory=list)
    now: float = 0.0

    def __post_init__(self) -> None:
        overlay = Hypercube(self.ids)
        self.cores = {i: VCubePS(i, overlay=overlay, config=self.config) for i in self.ids}
        self.events = {i: [] for i in self.ids}

    def _take(self, node: int, outputs: list[Output]) -> list[Output]:
        for o in outputs:
            if isinstance(o, Send):
                packets = o.packet.packets if isinstance(o.packet, Bundle) else (o.packet,)
                for p in packets:  # a bundle is link-level: its packets arrive in order
                    w = Wire(node, o.dest, p)
                    self.wire.append(w)
                    self.sent.append(w)
            elif isinstance(o, DeliveredRun):  # a round's chain: its events one by one
                self.events[node].extend(o.expand())
            else:
                self.events[node].append(o)
        return outputs

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    def subscribe(self, node: int, topic: str = T) -> list[Output]:
        return self._take(node, self.cores[node].subscribe(topic, self._tick()))

    def unsubscribe(self, node: int, topic: str = T) -> list[Output]:
        return self._take(node, self.cores[node].unsubscribe(topic, self._tick()))

    def publish(self, node: int, payload: bytes = b"x", topic: str = T) -> MsgId:
        out = self._take(node, self.cores[node].publish(topic, payload, self._tick()))
        return next(o.id for o in out if isinstance(o, Delivered))

    def find(
        self, *, kind: str | None = None, src: int | None = None, dst: int | None = None
    ) -> int:
        """Index on the wire of the first packet matching every given field."""
        for k, w in enumerate(self.wire):
            if (
                (kind is None or w.packet.kind == kind)
                and (src is None or w.src == src)
                and (dst is None or w.dst == dst)
            ):
                return k
        raise AssertionError(f"no {kind} {src}->{dst} on the wire: {self.wire}")

    def step(self, index: int = 0) -> list[Output]:
        """Deliver the ``index``-th packet on the wire."""
        w = self.wire.pop(index)
        return self._take(w.dst, self.cores[w.dst].receive(w.src, w.packet, self._tick()))

    def deliver(
        self, *, kind: str | None = None, src: int | None = None, dst: int | None = None
    ) -> list[Output]:
        return self.step(self.find(kind=kind, src=src, dst=dst))

    def run(self) -> None:
        """Deliver everything, oldest first."""
        while self.wire:
            self.step()

    def delivered(self, node: int, topic: str = T) -> list[MsgId]:
        return [e.id for e in self.events[node] if isinstance(e, Delivered) and e.topic == topic]

    def of(self, node: int, kind: type[Event]) -> list[Event]:
        return [e for e in self.events[node] if isinstance(e, kind)]

    def quiet(self) -> bool:
        return not self.wire and all(c.idle() for c in self.cores.values())


def subscribed_net(
    ids: list[int], subscribers: list[int] | None = None, *, config: PubSubConfig | None = None
) -> Net:
    """A net in which ``subscribers`` (default: everyone) subscribed one after the other."""
    net = Net(ids, config)
    for n in ids if subscribers is None else subscribers:
        net.subscribe(n)
        net.run()
        assert net.cores[n].is_confirmed(T)
    for e in net.events.values():
        e.clear()
    net.sent.clear()
    return net


def snapshot(core: VCubePS) -> dict[str, bytes]:
    """The node's whole state, field by field (so a failing comparison names the
    field that changed), minus the shared, lazily cached overlay."""
    out: dict[str, bytes] = {}
    # A compiled core (``make compiled``) has no __dict__: mypyc lists its attributes.
    names = getattr(type(core), "__mypyc_attrs__", None) or tuple(vars(core))
    for name in names:
        value = getattr(core, name)
        if name == "_topics":
            for topic, state in value.items():
                for f in dataclasses.fields(state):
                    out[f"{topic}.{f.name}"] = pickle.dumps(getattr(state, f.name))
        elif name != "overlay":
            out[name] = pickle.dumps(value)
    return out


# ------------------------------------------------------------ local misuse


def test_publish_refused_unless_subscribed() -> None:
    net = Net([0, 1])
    with pytest.raises(NotSubscribedError):
        net.publish(0)
    net.subscribe(0)
    net.run()
    net.publish(0)
    net.unsubscribe(0)
    with pytest.raises(NotSubscribedError):
        net.publish(0)
    with pytest.raises(NotSubscribedError):
        net.unsubscribe(0)


def test_publish_allowed_before_confirmation() -> None:
    """Publishing needs a subscription, not its confirmation; it waits in the queue."""
    net = Net([0, 1])
    net.subscribe(0)
    mid = net.publish(0)
    assert net.cores[0].queued(T) == 1
    net.run()
    assert net.delivered(0) == [mid]
    assert net.quiet()


def test_double_subscribe() -> None:
    net = Net([0, 1])
    net.subscribe(0)
    before = snapshot(net.cores[0])
    with pytest.raises(AlreadySubscribedError):
        net.subscribe(0)
    assert snapshot(net.cores[0]) == before
    net.run()
    with pytest.raises(AlreadySubscribedError):
        net.subscribe(0)


def test_payload_too_large() -> None:
    net = subscribed_net([0, 1], config=PubSubConfig(max_payload=8))
    before = snapshot(net.cores[0])
    with pytest.raises(LocalProtocolError, match="max_payload"):
        net.publish(0, b"123456789")
    assert snapshot(net.cores[0]) == before
    net.publish(0, b"12345678")
    net.run()
    assert len(net.delivered(1)) == 1


def test_topic_name_too_long_or_empty() -> None:
    net = Net([0, 1], config=PubSubConfig(max_topic_len=4))
    with pytest.raises(LocalProtocolError, match="longer"):
        net.subscribe(0, "abcde")
    with pytest.raises(LocalProtocolError, match="longer"):
        net.subscribe(0, "ééé")  # 6 bytes in UTF-8
    with pytest.raises(LocalProtocolError, match="non-empty"):
        net.subscribe(0, "")
    assert not net.wire
    net.subscribe(0, "abcd")
    assert net.cores[0].is_subscribed("abcd")


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_payload"):
        PubSubConfig(max_payload=0)
    # max_barrier, max_view_entries and max_queued_ops were not checked at all,
    # and NaN passed the "<= 0" test of the others.
    for name in ("max_barrier", "max_view_entries", "max_queued_ops", "max_held"):
        for bad in (0, -1):
            with pytest.raises(ValueError, match=f"{name} must be a positive int"):
                PubSubConfig(**cast(dict[str, Any], {name: bad}))
        for wrong in (float("nan"), 2.5):
            # The compiled build's typed fields refuse a float before the check runs.
            with pytest.raises((ValueError, TypeError), match=f"{name} must be|int object"):
                PubSubConfig(**cast(dict[str, Any], {name: wrong}))


# -------------------------------------------------------- SUB and ACK wave


def test_sub_spreads_to_every_node_and_the_ack_wave_gathers_the_view() -> None:
    """a and b subscribe, but their own SUBs are held back: c learns them from the
    ACK wave of its SUB only."""
    ids = [0x3, 0x5A, 0x77, 0x1_0000_0000, 0xFFFF_FFFF_FFFF_FFFF, 0x8000_0000_0000_0001]
    a, b, c = ids[1], ids[3], ids[4]
    net = Net(ids)
    net.subscribe(a)
    net.subscribe(b)
    net.subscribe(c)
    assert net.cores[c].view(T) == {c}
    reached: list[int] = []
    while not net.cores[c].is_confirmed(T):
        assert not net.of(c, Subscribed), "confirmed before the ACK wave came back"
        k = next(k for k, w in enumerate(net.wire) if w.packet.round.source == c)
        w = net.wire[k]
        if isinstance(w.packet, Sub):
            reached.append(w.dst)
        net.step(k)
    # Every other node got the SUB exactly once, subscriber or not.
    assert sorted(reached) == sorted(set(ids) - {c})
    assert not any(w.packet.round.source == c for w in net.wire)
    assert net.of(c, Subscribed) == [Subscribed(T)]
    assert net.cores[c].view(T) == {a, b, c}
    # The others learned c from the SUB itself.
    for n in ids:
        assert c in net.cores[n].view(T)
    acked = net.of(c, RoundAcked)
    assert len(acked) == 1
    assert isinstance(acked[0], RoundAcked)
    assert acked[0].kind == "SUB"
    net.run()
    assert net.quiet()
    for n in ids:
        assert net.cores[n].view(T) == {a, b, c}


def test_concurrent_subscriptions_learn_each_other() -> None:
    net = Net([0, 1, 2, 3])
    for n in (0, 1, 2, 3):
        net.subscribe(n)
    net.run()
    for n in (0, 1, 2, 3):
        assert net.cores[n].view(T) == {0, 1, 2, 3}
        assert net.cores[n].is_confirmed(T)


def test_alone_a_subscription_confirms_at_once() -> None:
    net = Net([7])
    out = net.subscribe(7)
    assert Subscribed(T) in out
    assert not net.wire


# ------------------------------------------------------------------- PUB


def test_pub_reaches_exactly_the_subscribers() -> None:
    ids = [1, 2, 4, 6, 9, 13, 40, 41]
    subs = [2, 6, 13, 41]
    net = subscribed_net(ids, subs)
    mid = net.publish(6, b"hello")
    net.run()
    got = sorted(w.dst for w in net.sent if isinstance(w.packet, PubRound))
    assert got == sorted(set(subs) - {6})
    for n in ids:
        expected = [mid] if n in subs else []
        assert net.delivered(n) == expected
        for e in net.of(n, Received):
            assert isinstance(e, Received)
            assert not e.relay
    assert net.quiet()


def test_publisher_delivers_its_own_publication_at_once() -> None:
    net = subscribed_net([0, 1])
    out = net.cores[0].publish(T, b"p", 5.0)
    own = [o for o in out if isinstance(o, Delivered)]
    assert len(own) == 1
    assert own[0].own


def test_late_joiner_does_not_wait_for_earlier_publications() -> None:
    """m1 is published before 2 subscribes; m2, after it, depends on m1.  2 delivers
    m2 at once and never m1 (which never comes)."""
    net = subscribed_net([0, 1, 2], [0, 1])
    m1 = net.publish(0)
    assert [w.dst for w in net.wire] == [1]  # 2 is not a subscriber yet
    net.subscribe(2)
    while any(w.packet.kind != "PUB" for w in net.wire):
        net.step(next(k for k, w in enumerate(net.wire) if w.packet.kind != "PUB"))
    assert net.cores[2].is_confirmed(T)
    net.deliver(kind="PUB", src=0, dst=1)  # m1 reaches 1 only now
    assert net.delivered(1) == [m1]
    m2 = net.publish(1)
    net.deliver(kind="PUB", src=1, dst=2)
    assert net.delivered(2) == [m2]
    net.run()
    assert net.delivered(2) == [m2]
    assert net.cores[2].held_back(T) == 0
    assert net.quiet()


def test_hold_back_until_the_causal_predecessor_arrives() -> None:
    net = subscribed_net([0, 1, 2])
    m1 = net.publish(0)  # to 1 and to 2, separately
    net.deliver(kind="PUB", src=0, dst=1)
    m2 = net.publish(1)  # after delivering m1
    net.deliver(kind="PUB", src=1, dst=2)
    assert net.delivered(2) == []
    assert net.cores[2].held_back(T) == 1
    assert len(net.of(2, Received)) == 1
    net.deliver(kind="PUB", src=0, dst=2)
    assert net.delivered(2) == [m1, m2]
    assert net.cores[2].held_back(T) == 0
    net.run()
    assert net.quiet()


def test_fifo_delivery_and_one_round_at_a_time() -> None:
    net = subscribed_net([0, 1, 2])
    m1 = net.publish(0)
    m2 = net.publish(0)
    m3 = net.publish(0)
    # Only the first round is on the wire; the rest waits for its ACK wave.
    assert {w.packet.round for w in net.wire} == {net.wire[0].packet.round}
    assert net.cores[0].queued(T) == 2
    net.run()
    for n in (0, 1, 2):
        assert net.delivered(n) == [m1, m2, m3]


def test_source_batching_sends_what_queued_in_one_round() -> None:
    net = subscribed_net([0, 1, 2])
    m1 = net.publish(0)
    queued = [net.publish(0, bytes([k])) for k in range(5)]
    assert net.cores[0].queued(T) == 5
    net.run()
    rounds = [e for e in net.of(0, RoundAcked) if isinstance(e, RoundAcked)]
    assert [r.ids for r in rounds] == [(m1,), tuple(queued)]
    pub_packets = [w.packet for w in net.sent if w.src == 0 and isinstance(w.packet, PubRound)]
    assert [len(p.messages) for p in pub_packets] == [1, 1, 5, 5]  # two children, two rounds
    for n in (1, 2):
        assert net.delivered(n) == [m1, *queued]


def test_batches_respect_the_round_limit() -> None:
    net = subscribed_net([0, 1], config=PubSubConfig(max_round_messages=2))
    net.publish(0)
    for _ in range(5):
        net.publish(0)
    net.run()
    sizes = [len(e.ids) for e in net.of(0, RoundAcked) if isinstance(e, RoundAcked)]
    assert sizes == [1, 2, 2, 1]


def test_unsubscribed_node_in_dests_relays_and_acks() -> None:
    """0's round goes to 2, which relays to 3; 2 unsubscribes while the round is
    in flight and still forwards it and acknowledges."""
    net = subscribed_net([0, 2, 3])
    assert partition(0, [2, 3]) == [(2, (3,))]
    mid = net.publish(0)
    out = net.unsubscribe(2)
    assert not any(isinstance(o, Dropped) for o in out)
    uns_packets = [w for w in net.wire if isinstance(w.packet, Uns)]
    assert sorted(w.dst for w in uns_packets) == [0, 3]
    net.deliver(kind="PUB", src=0, dst=2)
    received = net.of(2, Received)
    assert len(received) == 1
    assert isinstance(received[0], Received)
    assert received[0].relay
    assert net.delivered(2) == []
    net.deliver(kind="PUB", src=2, dst=3)
    assert net.delivered(3) == [mid]
    net.deliver(kind="ACK", src=3, dst=2)
    assert not net.of(0, RoundAcked)
    net.deliver(kind="ACK", src=2, dst=0)
    acked = net.of(0, RoundAcked)
    assert len(acked) == 1
    assert isinstance(acked[0], RoundAcked)
    assert acked[0].ids == (mid,)
    net.run()
    assert net.quiet()
    for n in (0, 3):
        assert net.cores[n].view(T) == {0, 3}
    later = net.publish(3)
    net.run()
    assert net.delivered(0)[-1] == later
    assert later not in net.delivered(2)
    assert not any(w.dst == 2 for w in net.sent if w.packet.kind == "PUB" and w.src == 3)


def test_unsubscribe_drops_what_is_held_back() -> None:
    net = subscribed_net([0, 1, 2])
    net.publish(0)
    net.deliver(kind="PUB", src=0, dst=1)
    net.publish(1)
    net.deliver(kind="PUB", src=1, dst=2)
    assert net.cores[2].held_back(T) == 1
    out = net.unsubscribe(2)
    assert Dropped(T, 1, "unsubscribed before their predecessors arrived") in out
    assert net.cores[2].held_back(T) == 0
    net.run()
    assert net.delivered(2) == []
    assert net.quiet()


# ------------------------------------------------- the thesis counterexample


def test_late_joiner_waits_for_a_predecessor_from_an_unheard_source() -> None:
    """Thesis §5.4.2 (``first_rec``) would let 2 deliver m2 here: it has never
    received anything from 0, so it would not wait for m1.  But m1 was published
    after 0 learned of 2's subscription, so m1 is on its way to 2 and must be
    delivered first."""
    net = subscribed_net([0, 1, 2], [0, 1])
    net.subscribe(2)
    net.run()
    assert net.cores[2].is_confirmed(T)
    m1 = net.publish(0)  # to 1 and to 2 on separate branches
    net.deliver(kind="PUB", src=0, dst=1)
    m2 = net.publish(1)
    net.deliver(kind="PUB", src=1, dst=2)  # m2 overtakes m1
    # 2 has received nothing from 0, ever: first_rec would not make it wait.
    assert [e.id for e in net.of(2, Received) if isinstance(e, Received)] == [m2]
    assert net.delivered(2) == []
    assert net.cores[2].held_back(T) == 1
    net.deliver(kind="PUB", src=0, dst=2)
    assert net.delivered(2) == [m1, m2]
    net.run()
    assert net.quiet()


def test_unconfirmed_joiner_holds_everything_until_confirmation() -> None:
    """Same race while 2's own SUB is still being acknowledged."""
    net = subscribed_net([0, 1, 2], [0, 1])
    net.subscribe(2)
    # The SUB reaches 0 (which relays it to 1) and 1, but no ACK comes back yet.
    net.deliver(kind="SUB", src=2, dst=0)
    net.deliver(kind="SUB", src=0, dst=1)
    m1 = net.publish(0)
    assert sorted(w.dst for w in net.wire if w.packet.kind == "PUB") == [1, 2]
    net.deliver(kind="PUB", src=0, dst=1)
    m2 = net.publish(1)
    net.deliver(kind="PUB", src=1, dst=2)
    net.deliver(kind="PUB", src=0, dst=2)
    assert net.delivered(2) == []
    assert net.cores[2].held_back(T) == 2
    while not net.cores[2].is_confirmed(T):
        net.deliver(kind="ACK")
    assert net.delivered(2) == [m1, m2]
    net.run()
    assert net.quiet()


# ------------------------------------------------------- remote garbage


def test_ack_from_a_non_child_is_rejected_without_state_change() -> None:
    net = subscribed_net([0, 2, 3])
    net.publish(0)
    net.deliver(kind="PUB", src=0, dst=2)  # 2 now waits for 3's ACK
    rid = net.wire[0].packet.round
    for core, sender in ((net.cores[2], 0), (net.cores[2], 2), (net.cores[0], 3)):
        before = snapshot(core)
        with pytest.raises(RemoteProtocolError, match="unexpected ACK"):
            core.receive(sender, Ack(rid, T), 50.0)
        assert snapshot(core) == before
    with pytest.raises(RemoteProtocolError):
        net.cores[2].receive(3, Ack(rid, "other-topic"), 50.0)
    net.run()  # the honest ACKs still complete the round
    assert net.quiet()
    assert len(net.of(0, RoundAcked)) == 1


def test_ack_for_an_unknown_or_finished_round_is_rejected() -> None:
    net = subscribed_net([0, 1])
    net.publish(0)
    net.step()  # PUB 0->1, 1 is a leaf and acks at once
    ack_wire = net.wire[0]
    net.run()
    before = snapshot(net.cores[0])
    with pytest.raises(RemoteProtocolError):
        net.cores[0].receive(1, ack_wire.packet, 60.0)
    assert snapshot(net.cores[0]) == before


def test_pub_round_received_twice_by_a_relay_is_rejected() -> None:
    net = subscribed_net([0, 2, 3])
    net.publish(0)
    dup = net.wire[0]
    net.step()
    before = snapshot(net.cores[2])
    with pytest.raises(RemoteProtocolError, match="twice"):
        net.cores[2].receive(dup.src, dup.packet, 70.0)
    assert snapshot(net.cores[2]) == before
    net.run()
    assert net.quiet()
    assert len(net.delivered(3)) == 1


def test_pub_round_received_again_by_a_subscribed_leaf_is_dropped_by_id() -> None:
    """A completed round arriving again (a retransmission after a repair) is
    acknowledged again but delivers nothing twice."""
    net = subscribed_net([0, 1])
    net.publish(0)
    dup = net.wire[0]
    net.step()
    out = net.cores[1].receive(dup.src, dup.packet, 70.0)
    assert [type(o).__name__ for o in out] == ["Send"]
    assert isinstance(out[0], Send)
    assert isinstance(out[0].packet, Ack)
    assert net.cores[1].duplicates == 1
    assert len(net.delivered(1)) == 1


def test_sub_round_received_twice_by_a_relay_is_rejected() -> None:
    """A repeated SUB must not be forwarded again (it would make the children ACK
    twice, and the error would then be blamed on an honest child)."""
    net = Net([0, 2, 3])
    net.subscribe(0)
    dup = net.wire[net.find(kind="SUB", dst=2)]
    net.deliver(kind="SUB", dst=2)  # 2 relays to 3
    before = snapshot(net.cores[2])
    on_wire = len(net.wire)
    with pytest.raises(RemoteProtocolError):
        net.cores[2].receive(dup.src, dup.packet, 80.0)
    assert snapshot(net.cores[2]) == before
    assert len(net.wire) == on_wire


def test_round_mixing_new_and_duplicate_publications_changes_nothing() -> None:
    """``receive`` promises that a packet which raises has not changed the node:
    a round carrying a new publication and an already delivered one must not
    deliver the new one and then raise (its Delivered event would be lost)."""
    net = subscribed_net([0, 1])
    net.publish(0)
    first = net.wire[0].packet
    net.run()
    net.publish(0)
    second = net.wire[0].packet
    assert isinstance(first, PubRound)
    assert isinstance(second, PubRound)
    bad = PubRound(second.round, T, (second.messages[0], first.messages[0]), ())
    before = snapshot(net.cores[1])
    with pytest.raises(RemoteProtocolError, match="out of order"):
        net.cores[1].receive(0, bad, 90.0)
    assert snapshot(net.cores[1]) == before
    net.run()  # the honest round is then accepted
    assert net.delivered(1) == [first.messages[0].id, second.messages[0].id]


def test_rejected_round_on_an_unknown_topic_leaves_no_state() -> None:
    """A rejected packet must not even allocate state for the topic it names
    (else garbage rounds grow a node's memory one topic at a time)."""
    net = subscribed_net([0, 1, 2])
    core = net.cores[1]
    before = snapshot(core)
    first = PubMessage(MsgId(0, 0, 50), b"a")
    mixed = PubMessage(MsgId(2, 0, 51), b"another stream in the same round")
    with pytest.raises(RemoteProtocolError):
        core.receive(0, PubRound(RoundId(0, 0, 99), "fresh-topic", (first, mixed), ()), 99.0)
    assert snapshot(core) == before
    assert core.view("fresh-topic") == frozenset()


def test_a_relayed_stream_is_delivered_once_and_its_original_dropped() -> None:
    """A round may carry another source's publications (a relay after that
    source crashed); they are delivered once, and the original, arriving
    later, is dropped by id.  Forgery is the transport's to stop: only fleet
    members can send anything at all."""
    net = subscribed_net([0, 1, 2])
    net.publish(0)
    pkt, dst = net.wire[0].packet, net.wire[0].dst
    assert isinstance(pkt, PubRound)
    core = net.cores[dst]
    relay = PubRound(RoundId(3 - dst, 0, 7), T, pkt.messages, ())
    out = core.receive(3 - dst, relay, 99.0)
    assert [o.id for o in out if isinstance(o, Delivered)] == [pkt.messages[0].id]
    net.run()
    assert net.delivered(dst) == []  # the original round delivered nothing more
    assert core.duplicates == 1


def test_malformed_rounds_are_rejected() -> None:
    net = subscribed_net([0, 1, 2])
    net.publish(0)
    pkt = net.wire[0].packet
    assert isinstance(pkt, PubRound)
    core = net.cores[1]
    before = snapshot(core)
    with pytest.raises(RemoteProtocolError):
        core.receive(1, pkt, 99.0)  # from itself
    with pytest.raises(RemoteProtocolError):
        core.receive(0, PubRound(pkt.round, T, pkt.messages, (1,)), 99.0)  # itself in dests
    with pytest.raises(RemoteProtocolError):  # the op is not the round source's
        core.receive(0, Sub(pkt.round, T, ViewEntry(2, 0, 0, True)), 99.0)
    with pytest.raises(RemoteProtocolError):  # not a packet at all
        core.receive(0, "garbage", 99.0)
    assert snapshot(core) == before


# ------------------------------------------------------ causal primitives


def test_buffer_releases_items_when_frontiers_reach_them() -> None:
    x, y, z = (1, 0), (2, 0), (3, 0)  # (stream, incarnation)
    buf: CausalBuffer[str] = CausalBuffer()
    assert buf.add("free", [])
    assert not buf.add("b", [(*x, 1), (*y, 0)])
    assert not buf.add("c", [(*x, 2)])
    assert len(buf) == 2
    assert buf.items() == ["b", "c"]
    assert buf.advance(*x, 1) == []  # b still waits for y
    assert buf.satisfied((*x, 1))
    assert not buf.satisfied((*x, 2))
    assert buf.frontier(*x) == 1
    assert buf.frontier(*z) is None
    assert buf.advance(*y, 5) == ["b"]
    assert buf.advance(*x, 0) == []  # frontiers never go back
    assert buf.frontier(*x) == 1
    assert buf.advance(*x, 7) == ["c"]
    assert len(buf) == 0
    assert buf.add("d", [(*x, 3)])  # already satisfied


def test_buffer_takes_msg_ids_as_dependencies() -> None:
    buf: CausalBuffer[str] = CausalBuffer()
    assert not buf.add("m", [MsgId(4, 2, 9)])
    assert buf.advance(4, 1, 100) == []  # another incarnation of source 4
    assert buf.advance(4, 2, 9) == ["m"]


def test_buffer_releases_in_need_order() -> None:
    buf: CausalBuffer[int] = CausalBuffer()
    for need in (5, 1, 3):
        buf.add(need, [(0, 0, need)])
    assert buf.advance(0, 0, 4) == [1, 3]
    assert buf.advance(0, 0, 9) == [5]


def test_buffer_retires_older_incarnations() -> None:
    buf: CausalBuffer[str] = CausalBuffer()
    buf.add("old", [(-8, 0, 5)])
    buf.add("new", [(-8, 2, 1)])
    assert buf.retire_below(-8, 1) == ["old"]
    assert buf.items() == ["new"]


def test_barrier_keeps_direct_predecessors_only() -> None:
    a1, b1, c1 = MsgId(1, 0, 1), MsgId(2, 0, 1), MsgId(3, 0, 1)
    op = MsgId(9, 0, 4)
    bar = CausalBarrier()
    assert len(bar) == 0
    bar.delivered(a1, (), ())
    bar.delivered(b1, (a1,), ())  # b1 follows a1: a1 becomes indirect
    assert bar.pubs == (b1,)
    bar.learned_op(op)
    bar.learned_op(MsgId(9, 0, 2))  # one op per node: the last learned replaces it
    bar.learned_op(op)
    assert bar.ops == (op,)
    bar.delivered(c1, (), (op,))  # c1 follows the op
    assert list(bar.ops) == []
    assert list(bar.pubs) == [b1, c1]
    own = MsgId(5, 0, 7)
    bar.published(own)
    assert list(bar.pubs) == [own]
    assert list(bar.ops) == []
    assert "CausalBarrier" in repr(bar)


def test_publication_carries_the_barrier() -> None:
    net = subscribed_net([0, 1, 2])
    m1 = net.publish(0)
    net.run()
    assert net.cores[1].barrier(T).pubs == (m1,)
    m2 = net.publish(1)
    pkt = net.wire[0].packet
    assert isinstance(pkt, PubRound)
    (msg,) = pkt.messages
    assert msg.id == m2
    assert msg.deps == (m1,)
    assert net.cores[1].barrier(T).pubs == (m2,)


def test_hold_back_buffer_is_bounded_per_topic() -> None:
    """Publications a node cannot deliver yet are held back up to ``max_held``; a round
    that would add to a full buffer is refused without any state change, while the
    predecessor that drains it is still accepted (the bound never blocks honest traffic).
    """
    source = subscribed_net([0, 1, 2, 3])
    for publisher in (0, 3, 3):  # 3 delivers 0's publication before publishing
        source.publish(publisher)
        source.run()
    to_1 = [w for w in source.sent if w.dst == 1 and isinstance(w.packet, PubRound)]
    assert [w.src for w in to_1] == [0, 3, 3]
    a, b1, b2 = (w.packet for w in to_1)
    assert isinstance(a, PubRound)
    assert isinstance(b1, PubRound)
    assert isinstance(b2, PubRound)
    core = subscribed_net([0, 1, 2, 3], config=PubSubConfig(max_held=1)).cores[1]
    core.receive(3, b1, 10.0)  # held: it depends on `a`, which has not arrived
    assert core.held_back(T) == 1
    before = snapshot(core)
    with pytest.raises(RemoteProtocolError, match="max_held"):
        core.receive(3, b2, 11.0)
    assert snapshot(core) == before
    out = core.receive(0, a, 12.0)  # the buffer is full, but `a` is deliverable
    assert [o.id for o in out if isinstance(o, Delivered)] == [
        a.messages[0].id,
        b1.messages[0].id,
    ]
    out = core.receive(3, b2, 13.0)
    assert [o.id for o in out if isinstance(o, Delivered)] == [b2.messages[0].id]


def test_rounds_awaiting_acknowledgement_are_bounded() -> None:
    net = Net([0, 1, 2, 3], PubSubConfig(max_pending_rounds=1))
    net.subscribe(0)
    sub = net.wire[net.find(kind="SUB", dst=2)]
    net.deliver(kind="SUB", dst=2)  # 2 relays to 3 and waits for its ACK
    assert isinstance(sub.packet, Sub)
    other = hot_replace(sub.packet, round=RoundId(0, 0, 7), topic="other")
    before = snapshot(net.cores[2])
    with pytest.raises(RemoteProtocolError, match="awaiting"):
        net.cores[2].receive(sub.src, other, 50.0)
    assert snapshot(net.cores[2]) == before


def test_a_frontier_mark_follows_a_chain_through_the_members_own_publication() -> None:
    """Node 0 gets node 2's publication, which names node 3's op, before it
    knows that op (node 1's copy of the SUB is late): a frontier for node 3
    must stop there.  Node 0 then publishes after it, and node 1 publishes
    after node 0's: that one follows node 3's op through node 0's own
    publication, so node 0's frontier for node 3 stops before it too
    (``VCubePS._note_own``; without it node 0's own publications carried no
    marks and the frontier covered node 1's, which may be owed to node 3)."""
    net = subscribed_net([0, 1, 2, 3], [0, 1, 2])
    net.subscribe(3)

    def run_unless(held: Callable[[Wire], bool]) -> None:
        while ready := [k for k, w in enumerate(net.wire) if not held(w)]:
            net.step(ready[0])

    run_unless(lambda w: w.dst == 0)  # node 1's copy of node 3's SUB waits
    p2 = net.publish(2)
    run_unless(lambda w: w.dst == 0 and w.packet.kind == "SUB")
    net.run()
    p0 = net.publish(0)
    run_unless(lambda w: w.dst == 0)
    p1 = net.publish(1)
    net.run()
    assert net.delivered(0) == [p2, p0, p1]
    core = net.cores[0]
    first, beyond = core._sync_frontier(core._topics[T], 3)
    assert first == {(2, 0): p2.seq, (1, 0): p1.seq}
    assert beyond == {}


def test_a_frontier_stops_before_what_names_a_publication_in_a_gap() -> None:
    """A publication that names one this member never received (in a gap of
    another stream, or below where it first received that stream) may follow
    an op it does not know: its frontier must stop before it.  Failure_fuzz
    partial seed 1102671: node 5 first received node 4's stream at (4, 2),
    then (7, 1), which names (4, 1) and so node 2's op; node 5's frontier
    covered (7, 1), and node 2, to which it was owed, skipped it."""
    net = subscribed_net([0, 1, 2, 3], [0, 1, 3])
    core = net.cores[0]
    state = core._topics[T]

    def took(msg: PubMessage) -> None:
        core._took(state, (msg,))
        state.last_rx[msg.id.source] = msg.id.seq  # a first life's stream key: its source

    took(PubMessage(MsgId(1, 0, 5), b"", prev=3))  # (1, 3) and below never came
    took(PubMessage(MsgId(3, 0, 7), b"", deps=(MsgId(1, 0, 3),)))
    took(PubMessage(MsgId(1, 0, 9), b"", prev=5))
    took(PubMessage(MsgId(1, 0, 12), b"", prev=11))  # (1, 10) and (1, 11) never came
    took(PubMessage(MsgId(3, 0, 13), b"", deps=(MsgId(1, 0, 11),), prev=7))
    first, _ = core._sync_frontier(state, 2)
    assert first[(3, 0)] == 7
    assert first[(1, 0)] == 5  # its own gaps stop it: GAP at (1, 5)


def _steps_except(net: Net, src: int, dst: int) -> None:
    """Deliver everything on the wire but the packets from ``src`` to ``dst``."""
    while True:
        rest = [k for k, w in enumerate(net.wire) if (w.src, w.dst) != (src, dst)]
        if not rest:
            return
        net.step(rest[0])


def test_an_announce_bound_keeps_fifo_below_it() -> None:
    """Node 0 subscribes while nodes 2 and 3 leave node 3 out of its SUB round,
    so it gets no bound for node 3's stream.  Node 3 publishes (3, 2), which
    names node 2's (2, 1), still on its way to node 0, then a publication on
    another topic (seq 3), then (3, 4).  Node 0 holds both of node 3's
    publications when its announce to node 3 brings the bound 5.  Their
    sequence numbers are not contiguous, so they were taken for a run with a
    gap, and the stream jumped to 4 at once: (3, 4) went before (3, 2)."""
    a, m, n = 0, 2, 3
    net = Net([a, m, n])
    net.cores[a].set_overlay(Hypercube([a, m]))
    for node in (m, n):
        net.subscribe(node)
        net.run()
    net.subscribe(n, "u")
    net.run()
    net.cores[m].set_overlay(Hypercube([a, m]))
    net.subscribe(a)
    net.run()
    net.cores[m].set_overlay(Hypercube([a, m, n]))
    assert (n, 0) not in net.cores[a]._topics[T].bounds
    first = net.publish(m)  # its copy to node 0 stays on the wire until the end
    net.deliver(src=m, dst=n)
    older = net.publish(n)
    _steps_except(net, m, a)
    net.publish(n, topic="u")
    _steps_except(net, m, a)
    newer = net.publish(n)
    _steps_except(net, m, a)
    held = [msg.id for msg in net.cores[a]._topics[T].buffer.items()]
    assert sorted(held) == [older, newer]
    assert (older.seq, newer.seq) == (2, 4)
    net.cores[a].set_overlay(Hypercube([a, m, n]))
    net._take(a, net.cores[a].joined(n, 0, net._tick()))
    _steps_except(net, m, a)
    assert net.cores[a]._topics[T].bounds[(n, 0)] == 5  # the announce's ACK came
    assert net.delivered(a) == []
    net.run()
    assert net.delivered(a) == [first, older, newer]
