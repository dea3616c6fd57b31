"""Membership records spread over the overlay (``p2p._membership``, issue 19).

Unit tests of the digest and of :class:`RecordGossip`, and a Hypothesis model
of the runtime's rules (introductions on connect, digests to the monitored
nodes each round, records in answer to a differing digest) that checks the
convergence the module docstring argues: from any start in which the
"knows" graph is connected, every node holds every record within a bounded
number of rounds.
"""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from p2p._membership import RecordGossip, records_digest
from vcube import partition_sorted


def test_digest_ignores_order_and_tells_sets_apart() -> None:
    a, b, c = b"record-a", b"record-b", b"record-c"
    assert records_digest([a, b, c]) == records_digest([c, a, b])
    assert records_digest([a, b]) != records_digest([a, c])
    assert records_digest([a, b]) != records_digest([a, b, c])
    assert records_digest([]) == 0


def test_due_tells_a_digest_once_until_it_changes_or_refresh_passes() -> None:
    g = RecordGossip(refresh=10.0, resync=3.0)
    assert g.due([1, 2], 7, now=0.0) == [1, 2]
    assert g.due([1, 2], 7, now=5.0) == []
    assert g.due([1, 2, 3], 8, now=6.0) == [1, 2, 3]  # changed, and a new target
    assert g.due([1], 8, now=15.9) == []
    assert g.due([1], 8, now=16.0) == [1]
    g.forget(1)
    assert g.due([1], 8, now=16.5) == [1]


def test_answer_only_a_differing_digest_at_most_once_per_resync() -> None:
    g = RecordGossip(refresh=10.0, resync=3.0)
    assert not g.answer(5, theirs=1, mine=1, now=0.0)
    assert g.answer(5, theirs=1, mine=2, now=0.0)
    assert not g.answer(5, theirs=1, mine=2, now=2.9)
    assert g.answer(6, theirs=1, mine=2, now=2.9)  # another sender
    assert g.answer(5, theirs=1, mine=2, now=3.0)
    assert g.answer(5, theirs=4, mine=2, now=3.1)  # the sender learnt something: answered
    assert g.answer(5, theirs=4, mine=9, now=3.2)  # so did we: answered
    assert not g.answer(5, theirs=4, mine=9, now=3.3)  # a repeat: held back


def test_gossip_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="refresh"):
        RecordGossip(refresh=0.0, resync=1.0)


# ------------------------------------------------------------ the model


class _Model:
    """Nodes that know records (here: node ids) and run the runtime's rules.

    Each round every node sends its digest to its pull targets (the first
    known node of each VCube cluster, a subset of what the detector
    monitors); on connecting, a node introduces itself; a receiver whose
    digest differs answers with its records and asks for the sender's.
    """

    def __init__(self, known: dict[int, set[int]]) -> None:
        self.known = known
        self.gossip = {n: RecordGossip(refresh=10.0, resync=3.0) for n in known}

    def digest(self, n: int) -> int:
        return records_digest(i.to_bytes(8, "big") for i in sorted(self.known[n]))

    def round(self, now: float) -> None:
        for n in sorted(self.known):
            view = sorted(self.known[n])
            targets = [child for child, _ in partition_sorted(n, view)]
            for t in self.gossip[n].due(targets, self.digest(n), now):
                self.known[t].add(n)  # the introduction on the connection's first frame
                if self.gossip[t].answer(n, self.digest(n), self.digest(t), now):
                    self.known[n] |= self.known[t]  # t's records, asking for n's
                    self.known[t] |= self.known[n]  # n's answer


def _connected(known: dict[int, set[int]]) -> bool:
    start = next(iter(known))
    seen, todo = {start}, [start]
    while todo:
        n = todo.pop()
        for m in known:
            if m not in seen and (m in known[n] or n in known[m]):
                seen.add(m)
                todo.append(m)
    return len(seen) == len(known)


@st.composite
def _starts(draw: st.DrawFn) -> dict[int, set[int]]:
    ids = draw(st.sets(st.integers(0, (1 << 64) - 1), min_size=2, max_size=40))
    nodes = sorted(ids)
    known = {n: {n} for n in nodes}
    for n in nodes:  # a chain keeps the knows graph connected; extra edges at random
        others = draw(st.sets(st.sampled_from(nodes), max_size=3))
        known[n] |= others
    order = draw(st.permutations(nodes))
    for a, b in pairwise(order):
        known[a].add(b)  # one-way: a knows b, b may not know a
    return known


@given(_starts())
# Found by Hypothesis: node 0's digest stopped changing after node 1 answered
# it, node 1 learnt more, and its next answer was held back for ``resync``.
@example({0: {0, 1}, 1: {1, 2}, 2: {2, 4}, 3: {3, 5}, 4: {3, 4}, 5: {5}})
def test_records_converge_from_any_connected_start(known: dict[int, set[int]]) -> None:
    assert _connected(known)
    model = _Model(known)
    everyone = set(known)
    bound = 2 * math.ceil(math.log2(len(known))) + 2
    for r in range(bound):
        model.round(float(r))
        if all(k == everyone for k in model.known.values()):
            return
    lagging = {n: len(everyone - k) for n, k in model.known.items() if k != everyone}
    pytest.fail(f"not converged in {bound} rounds; missing records per node: {lagging}")
