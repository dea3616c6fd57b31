"""The causal buffer's shortcuts (issue 21): the set of met dependencies and the
waiter heaps keyed like the frontiers.  Each test can fail if a shortcut
answers differently from the frontiers it stands in for."""

from __future__ import annotations

import random

from causal import CausalBuffer, MsgId


def test_delivered_ids_are_met_and_nothing_else() -> None:
    buf: CausalBuffer[str] = CausalBuffer()
    a2 = MsgId(1, 0, 2)
    assert buf.deliver(a2) == []
    assert buf.add("after a2", [a2])  # the exact id: the subset test answers
    assert buf.add("after a1", [MsgId(1, 0, 1)])  # older: the frontier answers
    assert not buf.add("after a3", [MsgId(1, 0, 3)])  # newer: held
    assert not buf.add("other life", [MsgId(1, 1, 2)])  # same seq, other incarnation
    assert buf.items() == ["after a3", "other life"]
    assert buf.deliver(MsgId(1, 0, 3)) == ["after a3"]
    assert buf.deliver(MsgId(1, 1, 2)) == ["other life"]


def test_a_delivery_wakes_exactly_its_waiters() -> None:
    buf: CausalBuffer[str] = CausalBuffer()
    x0, x1, y0 = MsgId(7, 0, 4), MsgId(7, 1, 4), MsgId(8, 0, 4)
    buf.add("x0", [x0])
    buf.add("x1", [x1])
    buf.add("y0", [y0])
    buf.add("x0 and y0", [x0, y0])
    assert buf.deliver(x1) == ["x1"]  # not the waiters of incarnation 0 of the same stream
    assert buf.deliver(x0) == ["x0"]
    assert buf.deliver(y0) == ["y0", "x0 and y0"]
    assert len(buf) == 0


def test_retire_below_finds_waiters_of_every_older_incarnation() -> None:
    buf: CausalBuffer[str] = CausalBuffer()
    buf.add("inc 0", [(-3, 0, 9)])  # keyed by the stream alone
    buf.add("inc 1", [(-3, 1, 9)])  # keyed by (stream, incarnation)
    buf.add("inc 2", [(-3, 2, 9)])
    buf.add("other stream", [(-4, 0, 9)])
    assert buf.retire_below(-3, 2) == ["inc 0", "inc 1"]
    assert buf.items() == ["inc 2", "other stream"]


def test_shortcuts_agree_with_the_frontiers() -> None:
    """Random deliveries, advances and additions: every answer of ``add`` and
    every release must be what the frontiers alone say."""
    rng = random.Random(21)
    for _ in range(200):
        buf: CausalBuffer[int] = CausalBuffer()
        frontier: dict[tuple[int, int], int] = {}
        held: dict[int, list[MsgId]] = {}
        ids = [MsgId(rng.randrange(3), rng.randrange(2), rng.randrange(6)) for _ in range(12)]

        def ok(dep: tuple[int, int, int], frontier: dict[tuple[int, int], int] = frontier) -> bool:
            return frontier.get((dep[0], dep[1]), -1) >= dep[2]

        for token in range(40):
            step = rng.random()
            if step < 0.3:
                mid = rng.choice(ids)
                got = buf.deliver(mid)
            elif step < 0.4:
                mid = MsgId(rng.randrange(-2, 3), rng.randrange(2), rng.randrange(6))
                got = buf.advance(*mid)
            else:
                deps = rng.sample(ids, rng.randrange(4))
                expect = all(ok(d) for d in deps)
                # a long barrier comes as a frozenset (PubMessage.dep_lookup)
                given = frozenset(deps) if rng.random() < 0.5 else deps
                assert buf.add(token, given) == expect
                if not expect:
                    held[token] = deps
                continue
            key = (mid[0], mid[1])
            frontier[key] = max(frontier.get(key, -1), mid[2])
            released = {t for t, deps in held.items() if all(ok(d) for d in deps)}
            assert set(got) == released
            for t in released:
                del held[t]
        assert sorted(buf.items()) == sorted(held)


def test_met_ids_stay_bounded_by_the_frontiers() -> None:
    """A long-lived node delivers without end: the shortcut's set is emptied
    when it outgrows the frontiers, and answers stay right across that."""
    buf: CausalBuffer[int] = CausalBuffer()
    for seq in range(5000):
        assert not buf.add(seq, [MsgId(1, 0, seq), MsgId(2, 0, seq)])
        if seq:
            assert buf.add(-seq, [MsgId(1, 0, seq - 1)])  # the previous one: met
        assert buf.deliver(MsgId(1, 0, seq)) == []
        assert buf.deliver(MsgId(2, 0, seq)) == [seq]
        assert len(buf._met) <= 2 * 2 + 256 + 1  # two frontiers: O(streams), not O(messages)
    assert buf.add(-1, [MsgId(1, 0, 10), MsgId(2, 0, 4999)])  # old and newest, both met
    assert not buf.add(-2, [MsgId(2, 0, 5000)])
    assert buf.items() == [-2]


def test_unmet_is_what_the_met_set_lacks_in_either_form() -> None:
    buf: CausalBuffer[str] = CausalBuffer()
    a, b, c = MsgId(1, 0, 1), MsgId(2, 0, 1), MsgId(3, 0, 1)
    buf.deliver(a)
    buf.deliver(c)
    assert list(buf.unmet([c, b, a])) == [b]
    assert buf.unmet(frozenset([a, b, c])) == frozenset([b])
    deps = (a, c)
    assert buf.add("after a and c", deps)
    assert buf.known_met(deps)  # the barrier just added: answered without a test
    for seq in range(600):  # the met set outgrows the frontiers and is emptied
        buf.deliver(MsgId(9, 0, seq))
    assert not buf.known_met(deps)  # the remembered barrier went with it
    assert buf.add("still satisfied", deps)  # by the frontiers
    assert buf.known_met(frozenset([a, c]))
    assert not buf.known_met(frozenset([a, b]))


def test_settle_above_releases_only_waits_past_the_value() -> None:
    """Waits beyond the value are met for good; waits up to it, and the
    frontier, stay as they were."""
    buf: CausalBuffer[str] = CausalBuffer()
    assert not buf.add("past", [MsgId(3, 0, 5)])
    assert not buf.add("both", [MsgId(3, 0, 5), MsgId(4, 0, 1)])
    assert not buf.add("within", [MsgId(3, 0, 2)])
    assert buf.settle_above(3, 0, 2) == ["past"]
    assert buf.frontier(3, 0) is None
    assert sorted(buf.items()) == ["both", "within"]
    assert buf.deliver(MsgId(4, 0, 1)) == ["both"]
    assert buf.advance(3, 0, 2) == ["within"]
    assert buf.settle_above(3, 0, 2) == []
    assert len(buf) == 0


def test_a_withdrawn_item_is_never_released_and_can_be_held_again() -> None:
    buf: CausalBuffer[str] = CausalBuffer()
    a, b = MsgId(1, 0, 1), MsgId(2, 0, 1)
    assert not buf.add("x", [a, b])
    assert not buf.add("y", [a])
    assert buf.withdraw("x")
    assert len(buf) == 1
    assert not buf.withdraw("x")  # not held any more
    assert buf.deliver(a) == ["y"]  # "x" waited on a too: its wait lapsed
    assert buf.deliver(b) == []
    assert buf.add("x", [b])  # held again with fewer waits: met already
    assert not buf.add("z", [MsgId(3, 0, 1)])
    assert buf.withdraw("z")
    assert buf.items() == []
