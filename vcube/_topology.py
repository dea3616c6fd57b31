"""VCube clusters and per-source spanning trees on sparse 64-bit identifiers.

The thesis (de Araujo 2019, §2.4) numbers nodes ``0..N-1`` with ``N = 2^d``
and defines the clusters ``c(i, s)`` recursively.  Two facts make the same
structure work for a real, changing population (DESIGN.md §2):

* ``c(i, s)`` is exactly the set of ids ``y`` with ``bit_length(y ^ i) == s``,
  ordered by ``y ^ i`` ascending, so ``FIRSTCHILD(i, s)`` is the XOR-closest
  correct node of bucket ``s`` of ``i`` and ``CLUSTER(i, j) = bit_length(i ^ j)``;
* an id that nobody holds is simply a faulty id, which VCube already skips.

Everything here is pure and immutable: a :class:`Hypercube` is a snapshot of
the correct nodes at one membership ``version``; its caches are filled lazily
and never invalidated, because a new membership is a new object.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence

from vcube._errors import UnknownNodeError, VCubeError

ID_BITS = 64
"""Width of a node identifier; buckets are numbered ``1..ID_BITS``."""

MAX_ID = (1 << ID_BITS) - 1


def cluster(i: int, j: int) -> int:
    """``CLUSTER(i, j)``: the index ``s`` of the cluster of ``i`` holding ``j``.

    Symmetric, and ``0`` only when ``i == j``.
    """
    return (i ^ j).bit_length()


def check_id(node: object) -> int:
    """Return ``node`` if it is a valid 64-bit identifier, else raise (any object
    may come in: this is the check, so the compiled build must not reject first)."""
    if not isinstance(node, int) or isinstance(node, bool) or not 0 <= node <= MAX_ID:
        raise VCubeError(f"node id must be an integer in [0, 2^{ID_BITS}), got {node!r}")
    return node


def partition(self_id: int, dests: Iterable[int]) -> list[tuple[int, tuple[int, ...]]]:
    """Split ``dests`` into the sub-cubes of ``self_id``: one entry per child.

    Returns ``[(child, share), ...]`` ordered by bucket, where ``child`` is the
    XOR-closest node of a non-empty bucket ``s`` of ``self_id`` (FIRSTCHILD over
    ``dests``) and ``share`` the other ids of that bucket, which ``child`` is
    responsible for.  ``self_id`` itself is ignored.  Invariant: the children and
    their shares are pairwise disjoint and together are exactly
    ``set(dests) - {self_id}``; applying ``partition`` recursively at each child
    with its share therefore reaches every destination exactly once, in the same
    tree as Algorithm 1 would build over the correct set ``dests``.
    """
    return partition_sorted(self_id, sorted(set(dests)))


def partition_sorted(self_id: int, dests: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
    """:func:`partition` for ``dests`` already sorted ascending without duplicates.

    Each bucket ``s`` of ``self_id`` is a contiguous id range, so it is a slice
    of ``dests`` found by bisection, and every share comes out sorted again: a
    tree of source-routed hops never sorts twice.  Cost per call is
    ``O(buckets * s * log n)`` comparisons plus C-level slicing.
    """
    out: list[tuple[int, int, tuple[int, ...]]] = []
    i, n = 0, len(dests)
    while i < n:
        y = dests[i]
        if y == self_id:
            i += 1
            continue
        s = (y ^ self_id).bit_length()
        width = 1 << (s - 1)
        lo = ((self_id >> s) << s) | ((self_id & width) ^ width)
        j = bisect_left(dests, lo + width, i)
        k = i if j - i == 1 else _closest(dests, i, j, self_id, lo, width)
        out.append((s, dests[k], tuple(dests[i:k]) + tuple(dests[k + 1 : j])))
        i = j
    out.sort()
    return [(child, share) for _, child, share in out]


def _closest(dests: Sequence[int], i: int, j: int, target: int, lo: int, width: int) -> int:
    """Index in ``dests[i:j]`` (all within ``[lo, lo + width)``) of the id XOR-closest to
    ``target``: descend the bits, preferring the half that agrees with ``target``."""
    half = width >> 1
    while half and j - i > 1:
        near = lo + (target & half)
        far = lo + ((target & half) ^ half)
        mid = bisect_left(dests, lo + half, i, j)
        if near == lo:  # preferred half is the lower one
            if mid > i:
                j = mid
            else:
                lo = far
        elif mid < j:
            i, lo = mid, near
        half >>= 1
    return i


class Hypercube:
    """Snapshot of the correct nodes of a VCube, with cached tree queries.

    ``members`` are the correct node ids; every other id in ``[0, 2^64)`` is
    faulty.  The object never changes after construction; ``version`` names
    the membership it describes, so callers can key their own caches on it.
    """

    __slots__ = ("_child_cache", "_children_cache", "_filtered", "_ids", "_set", "version")

    def __init__(self, members: Iterable[int], version: int = 0) -> None:
        ids = sorted({check_id(m) for m in members})
        self._ids: tuple[int, ...] = tuple(ids)
        self._set: frozenset[int] = frozenset(ids)
        self.version = version
        self._child_cache: dict[tuple[int, int], int | None] = {}
        self._children_cache: dict[tuple[int, int], tuple[int, ...]] = {}
        self._filtered: dict[frozenset[int], Hypercube] = {}

    def __repr__(self) -> str:
        return f"Hypercube(n={len(self._ids)}, version={self.version})"

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, node: object) -> bool:
        return node in self._set

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    @property
    def members(self) -> frozenset[int]:
        """The correct nodes."""
        return self._set

    def _any_in(self, lo: int, hi: int) -> bool:
        k = bisect_left(self._ids, lo)
        return k < len(self._ids) and self._ids[k] < hi

    def first_child(self, i: int, s: int) -> int | None:
        """``FIRSTCHILD(i, s)``: the first correct node of cluster ``c(i, s)``.

        That is the member ``y`` with ``cluster(i, y) == s`` minimising
        ``y ^ i``, or ``None`` when the whole cluster is faulty.  ``i`` need
        not be a member itself.
        """
        if not 1 <= s <= ID_BITS:
            raise VCubeError(f"cluster index must be in 1..{ID_BITS}, got {s}")
        key = (i, s)
        if key in self._child_cache:
            return self._child_cache[key]
        width = 1 << (s - 1)
        lo = ((i >> s) << s) | ((i & width) ^ width)  # bucket s: bit s-1 flipped
        result: int | None = None
        if self._any_in(lo, lo + width):
            # Descend the bits below s-1, preferring the half that agrees with i:
            # this walks the XOR order c(i, s) lists, so the first hit is minimal.
            half = width >> 1
            while half:
                near = lo + (i & half)
                lo = near if self._any_in(near, near + half) else lo + ((i & half) ^ half)
                half >>= 1
            result = lo
        self._child_cache[key] = result
        return result

    def cluster_members(self, i: int, s: int) -> list[int]:
        """The correct nodes of ``c(i, s)`` in the thesis' order (XOR order)."""
        width = 1 << (s - 1)
        lo = ((i >> s) << s) | ((i & width) ^ width)
        k = bisect_left(self._ids, lo)
        found = []
        while k < len(self._ids) and self._ids[k] < lo + width:
            found.append(self._ids[k])
            k += 1
        return sorted(found, key=lambda y: y ^ i)

    def children_at(self, i: int, h: int) -> tuple[int, ...]:
        """Children of ``i`` when it roots a sub-tree of height ``h``.

        ``FIRSTCHILD(i, s)`` for every ``s <= h`` whose cluster has a correct
        node, ordered by ``s``.  A node that received from parent ``p`` has
        ``h = cluster(p, i) - 1``; a root has ``h = ID_BITS``.
        """
        h = min(h, ID_BITS)
        key = (i, h)
        cached = self._children_cache.get(key)
        if cached is None:
            found = (self.first_child(i, s) for s in range(1, h + 1))
            cached = tuple(c for c in found if c is not None)
            self._children_cache[key] = cached
        return cached

    def path(self, root: int, node: int) -> list[int]:
        """The nodes from ``root`` down to ``node`` in ``root``'s tree (Algorithm 1).

        Raises :class:`UnknownNodeError` if ``node`` is not a member.
        """
        if node not in self._set:
            raise UnknownNodeError(f"node {node} is not a correct member of this VCube")
        hops = [root]
        cur = root
        while cur != node:
            nxt = self.first_child(cur, cluster(cur, node))
            assert nxt is not None  # node itself is a correct member of that cluster
            hops.append(nxt)
            cur = nxt
        return hops

    def parent(self, node: int, root: int) -> int | None:
        """Parent of ``node`` in the tree rooted at ``root`` (``None`` for the root):
        the hop before ``node`` on :meth:`path`, walked without building the list.

        Raises :class:`UnknownNodeError` if ``node`` is not a member.  Asked once
        per missing predecessor at every relay (causal aggregation), so each hop
        first tries the id that differs from ``cur`` in bit ``s - 1`` alone: it
        is the XOR-closest id of cluster ``c(cur, s)``, hence FIRSTCHILD
        whenever it is a member (the usual case), at the cost of an int set
        test instead of a cache look-up on a tuple key."""
        if node == root:
            return None
        members = self._set
        if node not in members:
            raise UnknownNodeError(f"node {node} is not a correct member of this VCube")
        cur = root
        while True:
            s = (cur ^ node).bit_length()  # cluster(cur, node)
            nxt: int | None = cur ^ (1 << (s - 1))
            if nxt not in members:
                nxt = self.first_child(cur, s)
                assert nxt is not None  # node itself is a correct member of that cluster
            if nxt == node:
                return cur
            cur = nxt

    def children(self, node: int, root: int) -> tuple[int, ...]:
        """``CHILDREN``: the children of ``node`` in the tree rooted at ``root``."""
        p = self.parent(node, root)
        return self.children_at(node, ID_BITS if p is None else cluster(p, node) - 1)

    def tree(self, root: int) -> dict[int, tuple[int, ...]]:
        """The whole spanning tree rooted at ``root``: ``{node: children}``.

        The root need not be a member (a relay or a departed node can still
        root a tree over the members); every member appears exactly once.
        """
        out: dict[int, tuple[int, ...]] = {}
        stack: list[tuple[int, int]] = [(root, ID_BITS)]
        while stack:
            node, h = stack.pop()
            kids = self.children_at(node, h)
            out[node] = kids
            stack.extend((k, cluster(node, k) - 1) for k in kids)
        return out

    def filtered(self, members: Iterable[int]) -> Hypercube:
        """The same VCube seen by a topic: only ``members`` count as correct.

        Cached per member set, so the trees of a topic are computed once per
        membership version of the topic.
        """
        key = frozenset(members) & self._set
        cube = self._filtered.get(key)
        if cube is None:
            cube = Hypercube(key, version=self.version)
            if len(self._filtered) > 256:  # bounded: topics churn, memory must not
                self._filtered.clear()
            self._filtered[key] = cube
        return cube


def depth_and_degree(tree: dict[int, tuple[int, ...]], root: int) -> tuple[int, int]:
    """Maximum depth and maximum out-degree of a tree from :meth:`Hypercube.tree`."""
    depth = 0
    stack = [(root, 0)]
    while stack:
        node, d = stack.pop()
        depth = max(depth, d)
        stack.extend((k, d + 1) for k in tree[node])
    return depth, max((len(v) for v in tree.values()), default=0)


def members_of(ids: Sequence[int]) -> Hypercube:
    """Convenience constructor: the VCube whose correct nodes are ``ids``."""
    return Hypercube(ids)
