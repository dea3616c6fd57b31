"""Causal barriers (Prakash et al. 1996; thesis §2.2.3) extended with membership ops."""

from __future__ import annotations

from collections.abc import Iterable

from causal._ids import MsgId


class CausalBarrier:
    """The direct predecessors of the next message a node will publish on a topic.

    Two kinds of predecessor are kept: publications (``pubs``) and membership
    operations learned since the last publication (``ops``, at most one, the
    newest, per node).  Invariant: together with their own causal pasts they
    cover everything this node has delivered or learned on the topic, and no
    element is a causal predecessor of another (only direct dependencies).
    """

    __slots__ = ("_ops", "_pubs")

    def __init__(self) -> None:
        self._pubs: set[MsgId] = set()
        self._ops: dict[int, MsgId] = {}

    def __repr__(self) -> str:
        return f"CausalBarrier(pubs={sorted(self._pubs)}, ops={sorted(self._ops.values())})"

    @property
    def pubs(self) -> tuple[MsgId, ...]:
        return tuple(sorted(self._pubs))

    @property
    def ops(self) -> tuple[MsgId, ...]:
        return tuple(sorted(self._ops.values()))

    def __len__(self) -> int:
        return len(self._pubs) + len(self._ops)

    def learned_op(self, op: MsgId) -> None:
        """Record a newly learned membership operation (replaces the node's older one)."""
        self._ops[op.source] = op

    def publish(self, mid: MsgId) -> tuple[tuple[MsgId, ...], tuple[MsgId, ...]]:
        """:attr:`pubs` and :attr:`ops` (the barrier of ``mid``), then :meth:`published`."""
        pubs = self._pubs
        barrier = (next(iter(pubs)),) if len(pubs) == 1 else tuple(sorted(pubs))
        ops = tuple(sorted(self._ops.values())) if self._ops else ()
        self.published(mid)
        return barrier, ops

    def published(self, mid: MsgId) -> None:
        """After publishing ``mid``: it is now the only direct predecessor."""
        self._pubs = {mid}
        self._ops.clear()

    def delivered(self, mid: MsgId, deps: Iterable[MsgId], op_deps: Iterable[MsgId]) -> None:
        """After delivering ``mid``: its own predecessors become indirect (line 94)."""
        self._pubs.difference_update(deps)
        for op in op_deps:
            if self._ops.get(op.source) == op:
                del self._ops[op.source]
        self._pubs.add(mid)
