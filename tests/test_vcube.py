"""Tests of :mod:`vcube` against the thesis (de Araujo 2019, §2.4 and §5.5) and DESIGN.md §2.

The worked examples (Fig. 2.6 table, CLUSTER/FIRSTCHILD examples, Fig. 2.8 trees,
the §2.4.1 CHILDREN walk, Fig. 5.4 and the §5.5.1 examples) are hard-coded from
the thesis text, not derived from the code.  Property tests then check the same
structure on sparse 64-bit populations with faulty nodes, and against a literal
transcription of the thesis' recursive definitions on small cubes.
"""

from __future__ import annotations

import functools
import math
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import vcube
from vcube import Hypercube, cluster

Tree = dict[int, tuple[int, ...]]

ID64 = st.integers(min_value=0, max_value=vcube.MAX_ID)
SMALL_ID = st.integers(min_value=0, max_value=255)

# --------------------------------------------------------------------------- #
# Thesis oracle: literal transcription of §2.4 (independent of the XOR trick). #
# --------------------------------------------------------------------------- #


@functools.cache
def thesis_c(i: int, s: int) -> tuple[int, ...]:
    """``c(i,s) = i xor 2^(s-1) || c(i xor 2^(s-1), k) | k = 1..s-1`` (§2.4)."""
    j = i ^ (1 << (s - 1))
    out = [j]
    for k in range(1, s):
        out.extend(thesis_c(j, k))
    return tuple(out)


def thesis_cluster(d: int, j: int, k: int) -> int:
    """CLUSTER(j, k): the index s of the cluster of j holding k, by list search."""
    for s in range(1, d + 1):
        if k in thesis_c(j, s):
            return s
    raise AssertionError(f"{k} is in no cluster of {j} for d={d}")


def thesis_first_child(correct: frozenset[int], j: int, s: int) -> int | None:
    """FIRSTCHILD(j, s): the first correct node of c(j, s), or None."""
    return next((x for x in thesis_c(j, s) if x in correct), None)


def thesis_children(d: int, correct: frozenset[int], i: int, r: int, h: int) -> tuple[int, ...]:
    """Algorithm 1, evaluated at node ``i``: CHILDREN(r, h)."""
    if i == r:
        found = (thesis_first_child(correct, i, s) for s in range(1, h + 1))
        return tuple(c for c in found if c is not None)
    s = thesis_cluster(d, r, i)
    nxt = thesis_first_child(correct, r, s)
    assert nxt is not None  # i itself is a correct node of c(r, s)
    return thesis_children(d, correct, i, nxt, s - 1)


def thesis_tree(d: int, correct: frozenset[int], root: int) -> Tree:
    """The broadcast tree of §2.4.1: the root uses h = d, a child j of i uses CLUSTER(i,j)-1."""
    out: Tree = {}
    stack = [(root, d)]
    while stack:
        node, h = stack.pop()
        found = (thesis_first_child(correct, node, s) for s in range(1, h + 1))
        kids = tuple(c for c in found if c is not None)
        out[node] = kids
        stack.extend((k, thesis_cluster(d, node, k) - 1) for k in kids)
    return out


# --------------------------------------------------------------------------- #
# Helpers                                                                      #
# --------------------------------------------------------------------------- #


def xor_sorted(i: int, ys: Iterable[int]) -> list[int]:
    return sorted(ys, key=lambda y: y ^ i)


def bucket(members: Iterable[int], i: int, s: int) -> list[int]:
    """Brute force: members y with bit_length(y xor i) == s, in XOR order."""
    return xor_sorted(i, (y for y in members if (y ^ i).bit_length() == s))


def edges(tree: Tree) -> set[tuple[int, int]]:
    return {(p, k) for p, kids in tree.items() for k in kids}


def subtrees(tree: Tree, root: int) -> dict[int, frozenset[int]]:
    """Every node's descendants (itself excluded); asserts the tree is acyclic."""
    out: dict[int, frozenset[int]] = {}
    order: list[int] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        assert node not in seen, f"node {node} reached twice"
        seen.add(node)
        order.append(node)
        stack.extend(tree[node])
    for node in reversed(order):
        below: set[int] = set()
        for k in tree[node]:
            below.add(k)
            below |= out[k]
        out[node] = frozenset(below)
    return out


def source_routed(root: int, dests: Iterable[int]) -> Tree:
    """Build the tree by applying ``partition`` recursively, shares carried in the message."""
    out: Tree = {}
    stack: list[tuple[int, tuple[int, ...]]] = [(root, tuple(dests))]
    while stack:
        node, share = stack.pop()
        assert node not in out, f"node {node} received twice"
        parts = vcube.partition(node, share)
        # partition invariant: children and shares are disjoint and cover share - {node}
        covered = [c for c, _ in parts] + [y for _, sh in parts for y in sh]
        assert len(covered) == len(set(covered))
        assert set(covered) == set(share) - {node}
        for child, sub in parts:
            s = cluster(node, child)
            assert all(cluster(node, y) == s for y in sub)
            assert child == min([child, *sub], key=lambda y: y ^ node)
        assert [cluster(node, c) for c, _ in parts] == sorted({cluster(node, c) for c, _ in parts})
        out[node] = tuple(c for c, _ in parts)
        stack.extend(parts)
    return out


# --------------------------------------------------------------------------- #
# 1. Fig. 2.6: the c(i, s) table for N = 8, CLUSTER and FIRSTCHILD examples    #
# --------------------------------------------------------------------------- #

FIG_2_6: dict[int, tuple[list[int], list[int], list[int]]] = {
    0: ([1], [2, 3], [4, 5, 6, 7]),
    1: ([0], [3, 2], [5, 4, 7, 6]),
    2: ([3], [0, 1], [6, 7, 4, 5]),
    3: ([2], [1, 0], [7, 6, 5, 4]),
    4: ([5], [6, 7], [0, 1, 2, 3]),
    5: ([4], [7, 6], [1, 0, 3, 2]),
    6: ([7], [4, 5], [2, 3, 0, 1]),
    7: ([6], [5, 4], [3, 2, 1, 0]),
}


@pytest.mark.parametrize("i", range(8))
@pytest.mark.parametrize("s", [1, 2, 3])
def test_fig_2_6_cluster_table(i: int, s: int) -> None:
    cube = Hypercube(range(8))
    assert cube.cluster_members(i, s) == FIG_2_6[i][s - 1]
    assert cube.first_child(i, s) == FIG_2_6[i][s - 1][0]


def test_fig_2_6_table_matches_recursive_definition() -> None:
    # Sanity of the oracle itself: the literal recursion reproduces the thesis table.
    for i, row in FIG_2_6.items():
        for s, expected in enumerate(row, start=1):
            assert list(thesis_c(i, s)) == expected


@pytest.mark.parametrize("d", range(1, 9))
def test_full_cube_clusters_equal_recursive_definition(d: int) -> None:
    n = 1 << d
    cube = Hypercube(range(n))
    for i in range(n):
        for s in range(1, d + 1):
            assert cube.cluster_members(i, s) == list(thesis_c(i, s))
            assert cube.first_child(i, s) == thesis_c(i, s)[0]
            assert all(cluster(i, y) == s for y in thesis_c(i, s))
        # the clusters of i above d are empty in a cube of N = 2^d nodes
        assert all(cube.first_child(i, s) is None for s in range(d + 1, vcube.ID_BITS + 1))


def test_cluster_examples() -> None:
    assert cluster(0, 1) == 1
    assert cluster(0, 2) == cluster(0, 3) == 2
    assert cluster(0, 4) == cluster(0, 5) == cluster(0, 6) == cluster(0, 7) == 3
    assert cluster(0, 0) == 0
    for i in range(8):
        for j in range(8):
            assert cluster(i, j) == cluster(j, i)
            if i != j:
                assert cluster(i, j) == thesis_cluster(3, i, j)


def test_first_child_examples() -> None:
    cube = Hypercube(range(8))
    assert cube.first_child(0, 1) == 1
    assert cube.first_child(1, 2) == 3
    assert cube.first_child(1, 3) == 5
    without_5 = Hypercube(set(range(8)) - {5})
    assert without_5.first_child(1, 3) == 4
    # a cluster whose nodes are all faulty has no first child
    assert Hypercube({0, 2, 3}).first_child(0, 1) is None


# --------------------------------------------------------------------------- #
# 2. Fig. 2.8 trees                                                            #
# --------------------------------------------------------------------------- #

FIG_2_8_A: Tree = {0: (1, 2, 4), 1: (), 2: (3,), 3: (), 4: (5, 6), 5: (), 6: (7,), 7: ()}
FIG_2_8_B: Tree = {0: (1, 3, 5), 1: (), 3: (), 5: (7,), 7: ()}
FIG_2_8_C: Tree = {2: (3, 0, 6), 0: (1,), 1: (), 3: (), 4: (5,), 5: (), 6: (7, 4), 7: ()}


def assert_tree_is(tree: Tree, expected: Tree) -> None:
    assert edges(tree) == edges(expected)
    assert set(tree) == set(expected)
    for node, kids in tree.items():
        # children in the order of the cluster they are first of
        assert kids == expected[node]
        assert [cluster(node, k) for k in kids] == sorted({cluster(node, k) for k in kids})


def test_fig_2_8a_fault_free_tree_rooted_at_0() -> None:
    cube = Hypercube(range(8))
    assert_tree_is(cube.tree(0), FIG_2_8_A)
    # the per-hop calls stated in the text
    assert cube.children_at(0, 3) == (1, 2, 4)
    assert cube.children_at(1, 0) == ()
    assert cube.children_at(2, 1) == (3,)
    assert cube.children_at(4, 2) == (5, 6)
    assert cube.children_at(5, 0) == ()
    assert cube.children_at(6, 1) == (7,)
    assert cube.children_at(7, 0) == ()
    for node, kids in FIG_2_8_A.items():
        assert cube.children(node, 0) == kids
    assert vcube.depth_and_degree(cube.tree(0), 0) == (3, 3)


def test_fig_2_8b_nodes_2_4_6_faulty() -> None:
    cube = Hypercube(set(range(8)) - {2, 4, 6})
    assert_tree_is(cube.tree(0), FIG_2_8_B)
    assert cube.children_at(0, 3) == (1, 3, 5)
    assert cube.children_at(3, 1) == ()
    assert cube.children_at(5, 2) == (7,)
    for node, kids in FIG_2_8_B.items():
        assert cube.children(node, 0) == kids
    assert vcube.depth_and_degree(cube.tree(0), 0) == (2, 3)


def test_fig_2_8c_fault_free_tree_rooted_at_2() -> None:
    cube = Hypercube(range(8))
    assert_tree_is(cube.tree(2), FIG_2_8_C)
    for node, kids in FIG_2_8_C.items():
        assert cube.children(node, 2) == kids


# --------------------------------------------------------------------------- #
# 3. §2.4.1 / Fig. 2.7: children of node 4 in the tree rooted at 2             #
# --------------------------------------------------------------------------- #


def test_children_walk_of_node_4_in_tree_of_2() -> None:
    cube = Hypercube(range(8))
    # CHILDREN(2,3) -> CHILDREN(6,2) -> CHILDREN(4,1) = {5}
    s = cluster(2, 4)
    assert s == 3
    assert cube.first_child(2, s) == 6
    s = cluster(6, 4)
    assert s - 1 == 1
    assert cube.first_child(6, s) == 4
    assert cube.children_at(4, 1) == (5,)
    assert cube.children(4, 2) == (5,)
    assert cube.path(2, 4) == [2, 6, 4]
    assert cube.parent(4, 2) == 6
    assert cube.parent(2, 2) is None
    assert thesis_children(3, frozenset(range(8)), 4, 2, 3) == (5,)


# --------------------------------------------------------------------------- #
# 4. Fig. 5.4 and §5.5.1: topic trees made only of subscribers                 #
# --------------------------------------------------------------------------- #


def test_fig_5_4_left_all_subscribers_of_t1() -> None:
    t1 = Hypercube(range(8)).filtered(range(8))
    assert t1.children(0, 0) == (1, 2, 4)
    assert t1.children(1, 0) == ()
    assert t1.children(2, 0) == (3,)
    assert t1.children(3, 0) == ()
    assert t1.children(4, 0) == (5, 6)
    assert t1.children(6, 0) == (7,)
    assert_tree_is(t1.tree(0), FIG_2_8_A)


def test_fig_5_4_right_topic_t2_published_by_2() -> None:
    subscribers = {0, 2, 3, 5, 7}
    t2 = Hypercube(range(8)).filtered(subscribers)
    assert t2.members == frozenset(subscribers)
    assert t2.children(2, 2) == (3, 0, 7)  # p6 is first of c(2,3) but not subscribed
    assert t2.children(3, 2) == ()
    assert t2.children(0, 2) == ()  # p1 is not a subscriber
    assert t2.cluster_members(7, 2) == [5]  # c(7,2) = (5,4), only 5 subscribed
    assert t2.children(7, 2) == (5,)
    assert t2.children(5, 2) == ()  # p4 is first and only in c(5,1), not subscribed
    assert_tree_is(t2.tree(2), {2: (3, 0, 7), 3: (), 0: (), 7: (5,), 5: ()})


def test_fig_5_4_right_partition() -> None:
    parts = vcube.partition(2, [0, 2, 3, 5, 7])
    assert [c for c, _ in parts] == [3, 0, 7]
    assert dict(parts) == {3: (), 0: (), 7: (5,)}
    assert vcube.partition(7, (5,)) == [(5, ())]
    assert vcube.partition(5, ()) == []
    assert source_routed(2, [0, 2, 3, 5, 7]) == {2: (3, 0, 7), 3: (), 0: (), 7: (5,), 5: ()}


def test_section_5_5_1_children_examples() -> None:
    cube = Hypercube(range(8))
    assert cube.children_at(0, 3) == (1, 2, 4)  # Children(0, *, 3)
    assert cube.children_at(0, 2) == (1, 2)  # Children(0, *, 2)
    assert cube.children_at(4, 2) == (5, 6)  # Children(4, *, 2)
    t1 = cube.filtered({0, 3, 4})
    assert t1.children_at(0, 3) == (3, 4)  # Children(0, t1, 3)
    assert t1.children_at(4, 2) == ()  # Children(4, t1, 2)


# --------------------------------------------------------------------------- #
# 5. Properties on random sparse populations with faulty nodes                 #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Scenario:
    ids: frozenset[int]
    members: frozenset[int]  # ids minus the faulty ones
    root: int
    order: tuple[int, ...]  # the members in an arbitrary order (for partition)


@st.composite
def scenarios(draw: st.DrawFn, ids_strategy: st.SearchStrategy[int]) -> Scenario:
    ids = draw(st.sets(ids_strategy, min_size=1, max_size=200))
    ordered = sorted(ids)
    faulty_mask = draw(st.lists(st.booleans(), min_size=len(ordered), max_size=len(ordered)))
    members = frozenset(x for x, dead in zip(ordered, faulty_mask, strict=True) if not dead)
    root = draw(st.one_of(st.sampled_from(ordered), ids_strategy, ID64))
    order = draw(st.permutations(sorted(members)))
    return Scenario(frozenset(ids), members, root, tuple(order))


def check_tree_properties(sc: Scenario) -> None:
    cube = Hypercube(sc.ids).filtered(sc.members)
    assert cube.members == sc.members
    tree = cube.tree(sc.root)

    # nodes of the tree: exactly the members, plus the root (which may be faulty/absent)
    assert set(tree) == sc.members | {sc.root}
    # every member but the root is the child of exactly one node; the root of none
    counts = Counter(k for kids in tree.values() for k in kids)
    assert set(counts) == sc.members - {sc.root}
    assert all(n == 1 for n in counts.values())
    below = subtrees(tree, sc.root)  # reachability from the root, no node twice
    assert below[sc.root] == sc.members - {sc.root}

    parent_of: dict[int, int] = {}
    for p, kids in tree.items():
        # children are ordered by strictly increasing cluster index
        ss = [cluster(p, k) for k in kids]
        assert ss == sorted(set(ss))
        for k in kids:
            parent_of[k] = p
            s = cluster(p, k)
            # the child's subtree is the whole (correct part of) cluster c(p, s)...
            assert below[k] | {k} == set(bucket(sc.members, p, s))
            # ...and the child is its first correct node
            assert k == cube.first_child(p, s)
            assert k == bucket(sc.members, p, s)[0]

    # per-node queries agree with the whole tree
    for n in sc.members:
        hops = cube.path(sc.root, n)
        assert hops[0] == sc.root
        assert hops[-1] == n
        assert len(hops) == len(set(hops))
        assert all(b in tree[a] for a, b in pairwise(hops))
        assert cube.parent(n, sc.root) == parent_of.get(n)
        assert cube.children(n, sc.root) == tree[n]
    assert cube.children(sc.root, sc.root) == tree[sc.root]
    assert cube.parent(sc.root, sc.root) is None

    # source routing (partition with shares) builds the very same tree
    assert source_routed(sc.root, sc.order) == tree

    depth, degree = vcube.depth_and_degree(tree, sc.root)
    assert depth == max((len(cube.path(sc.root, n)) - 1 for n in sc.members), default=0)
    assert degree == max(len(kids) for kids in tree.values())


@given(scenarios(ID64))
def test_tree_properties_sparse_64bit(sc: Scenario) -> None:
    check_tree_properties(sc)


@given(scenarios(SMALL_ID))
def test_tree_properties_dense_small_ids(sc: Scenario) -> None:
    check_tree_properties(sc)


@given(
    st.sets(ID64, max_size=200),
    st.one_of(ID64, st.integers(min_value=0, max_value=255)),
    st.data(),
)
def test_first_child_is_xor_closest_in_bucket(ids: set[int], i: int, data: st.DataObject) -> None:
    query_a_member: bool = data.draw(st.booleans())
    if ids and query_a_member:
        i = data.draw(st.sampled_from(sorted(ids)))
    cube = Hypercube(ids)
    for s in range(1, vcube.ID_BITS + 1):
        expected = bucket(ids, i, s)
        assert cube.cluster_members(i, s) == expected
        assert cube.first_child(i, s) == (min(expected, key=lambda y: y ^ i) if expected else None)
    for y in ids:
        if y != i:
            assert y in cube.cluster_members(i, cluster(i, y))


@given(
    st.sets(SMALL_ID, max_size=200),
    st.integers(min_value=0, max_value=255),
)
def test_first_child_dense_small_ids(ids: set[int], i: int) -> None:
    cube = Hypercube(ids)
    for s in range(1, 10):
        expected = bucket(ids, i, s)
        assert cube.cluster_members(i, s) == expected
        assert cube.first_child(i, s) == (expected[0] if expected else None)


@given(st.integers(min_value=1, max_value=8), st.data())
def test_matches_thesis_algorithm_1(d: int, data: st.DataObject) -> None:
    """Against the literal §2.4 definitions: faulty nodes of a 2^d cube are absent ids."""
    n = 1 << d
    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    correct = frozenset(x for x in range(n) if mask[x])
    root = data.draw(st.integers(min_value=0, max_value=n - 1))
    cube = Hypercube(correct)
    for i in range(n):
        for s in range(1, d + 1):
            assert cube.first_child(i, s) == thesis_first_child(correct, i, s)
            assert cube.cluster_members(i, s) == [x for x in thesis_c(i, s) if x in correct]
    assert cube.tree(root) == thesis_tree(d, correct, root)
    for i in correct:
        assert cube.children(i, root) == thesis_children(d, correct, i, root, d)


@pytest.mark.parametrize("d", range(1, 8))
def test_fault_free_trees_are_binomial(d: int) -> None:
    """§2.4.1: in a complete cube, height log2 N and up to log2 N children, any root."""
    n = 1 << d
    cube = Hypercube(range(n))
    for root in range(n):
        tree = cube.tree(root)
        assert vcube.depth_and_degree(tree, root) == (d, d)
        # binomial tree: a node that roots a sub-tree of height h has h children
        sizes = Counter(len(kids) for kids in tree.values())
        assert sizes == Counter({h: max(1, (n >> (h + 1))) for h in range(d + 1)})


# --------------------------------------------------------------------------- #
# 6. Depth and degree stay near log2 N on random 64-bit populations            #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("n", [16, 64, 256, 1024])
def test_depth_and_degree_near_log2_n(n: int) -> None:
    rng = random.Random(0xC0BE + n)
    ids: set[int] = set()
    while len(ids) < n:
        ids.add(rng.getrandbits(vcube.ID_BITS))
    cube = Hypercube(ids)
    log_n = math.log2(n)
    bound = math.ceil(log_n) + 4
    depths = []
    for root in rng.sample(sorted(ids), 5):
        tree = cube.tree(root)
        assert len(tree) == n
        depth, degree = vcube.depth_and_degree(tree, root)
        assert depth <= bound
        assert degree <= bound
        depths.append(depth)
    mean_depth = sum(depths) / len(depths)
    assert log_n - 2 <= mean_depth <= log_n + 2


# --------------------------------------------------------------------------- #
# 7. Error cases                                                               #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("bad", [-1, 2**64, "x"])
def test_check_id_rejects_invalid(bad: Any) -> None:
    with pytest.raises(vcube.VCubeError):
        vcube.check_id(bad)


@pytest.mark.parametrize("good", [0, 1, vcube.MAX_ID])
def test_check_id_accepts_valid(good: int) -> None:
    assert vcube.check_id(good) == good


def test_hypercube_rejects_invalid_member() -> None:
    with pytest.raises(vcube.VCubeError):
        Hypercube([0, -1])
    with pytest.raises(vcube.VCubeError):
        Hypercube([2**64])


@pytest.mark.parametrize("s", [0, 65])
def test_first_child_rejects_bad_cluster_index(s: int) -> None:
    with pytest.raises(vcube.VCubeError):
        Hypercube(range(8)).first_child(0, s)


def test_path_to_non_member_raises() -> None:
    cube = Hypercube(range(8))
    with pytest.raises(vcube.UnknownNodeError):
        cube.path(0, 99)
    with pytest.raises(vcube.VCubeError):
        cube.parent(99, 0)
