"""A round's publications handled as runs (DESIGN.md §3, "A round is a run").

A source that publishes several times while its previous round is in flight
sends them as one round, each naming the one before it as its only causal
predecessor.  Once the first of such a chain is delivered here, the rest is
delivered in order without the per-publication decision of
:meth:`_Delivery._consider`: :meth:`_Runs._publications` checks the chain
once and delivers it in one step.

Invariant: the delivery state (frontier, barrier, relay notes) is exactly
what the per-publication path leaves, and the run's one
:class:`~topics.DeliveredRun` expands to exactly the events it gives
(:meth:`~topics.DeliveredRun.expand`); only the buffer's ``known_met``
shortcut (a cache of satisfied ids) holds just the last of the chain.
The argument, for a publication ``m`` whose predecessor ``p`` in the round
was just delivered on a confirmed, non-lonely subscription
without bridges, from a live source other than this node, with nothing
held on the source's stream: ``m`` is not skipped (``p`` was not, and a
skip bound only covers a prefix of a stream); its live predecessors are at
most ``p``, delivered; nothing beyond its barrier is lost (``p`` is
delivered and not skipped); so the buffer admits it at once, its delivery
releases nothing (no waiter on the stream), and it names no op to learn.
``tests/test_runs.py`` checks the equality on random simulated runs.
"""

from __future__ import annotations

from topics._chain import Chain
from topics._delivery import _Delivery
from topics._events import Delivered, DeliveredRun, Output
from topics._messages import PubMessage, chain_end
from topics._state import _stream_key, _Topic


def _chain_end(fresh: tuple[PubMessage, ...], start: int) -> int:
    """The end of the chain from ``fresh[start]``: each publication names only
    the one before it (its barrier and its ``prev``), and no op (``fresh`` is
    one stream in increasing order, checked by ``_fresh``)."""
    if type(fresh) is Chain:  # checked when it was built
        return len(fresh)
    return chain_end(fresh, start)


class _Runs(_Delivery):
    """Delivery of chains of one round in one step (see the module docstring)."""

    def _publications(
        self, state: _Topic, fresh: tuple[PubMessage, ...], out: list[Output]
    ) -> tuple[PubMessage, ...]:
        """:meth:`_on_publication` for each of ``fresh`` (one stream, in order),
        a delivered publication's chain of followers delivered as one run;
        the outputs go to ``out``.  Returns those taken one by one (the others
        were delivered: nothing waits on them)."""
        i, n = 0, len(fresh)
        single: list[PubMessage] = []
        while i < n:
            msg = fresh[i]
            got = self._on_publication(state, msg)
            out += got
            single.append(msg)
            i += 1
            if i < n and self._may_run(state, msg, got):
                end = _chain_end(fresh, i)
                if end > i:
                    out += self._deliver_run(state, fresh[i - 1 : end])
                    i = end
        return fresh if len(single) == n else tuple(single)

    def _may_run(self, state: _Topic, msg: PubMessage, got: list[Output]) -> bool:
        """Whether ``msg`` was just delivered under conditions where its chain of
        followers is delivered at once (the module docstring's argument)."""
        if not got:
            return False
        last = got[-1]
        if type(last) is not Delivered or last.id is not msg.id:
            return False
        src, inc = msg.id.source, msg.id.incarnation
        return not (
            state.lonely
            or state.bridges
            or not state.confirmed
            or src == self.id
            or self._is_dead(src, inc)
            or state.buffer.waited_on(src, inc)
        )

    @staticmethod
    def _deliver_run(state: _Topic, chain: tuple[PubMessage, ...]) -> list[Output]:
        """Deliver ``chain[1:]``, each naming only the one before it, after
        ``chain[0]`` was delivered: the state changes of doing it one by one,
        with one barrier update and one frontier move, and one
        :class:`DeliveredRun` for the events."""
        last = chain[-1].id
        # One by one, each removes the one before it and adds itself: of the
        # chain, only its first was in the barrier before, and only its last is after.
        state.barrier.delivered(last, (chain[0].id,), ())
        state.buffer.deliver(last)  # releases nothing: nothing waits on the stream
        if state.relay_unowed:
            state.relay_unowed.discard(_stream_key(last.source, last.incarnation))
        return [DeliveredRun(state.name, chain[1:])]
