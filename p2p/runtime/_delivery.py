"""What the application receives: :class:`Delivery`, :class:`MembershipEvent`,
and the per-topic queue a node hands deliveries to (:class:`Subscription`).

The node side of the hand-off is :meth:`Node._deliver
<p2p.runtime._driver._Driver._deliver>`; this module owns the reading side.
Invariant: a subscription holds at most ``capacity`` deliveries (beyond it a
delivery is dropped and counted in ``dropped``, never silently), hands them
out in the order the node queued them, and lets other tasks run at least
every :data:`DELIVERY_BATCH` deliveries.  The runtime's part of the payload
envelope (:data:`_STAMP`, the publisher's wall clock in front of the
application's bytes, behind the machine's ordinal envelope) is defined here,
where :attr:`Delivery.published_at` comes from.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields

import trio


@dataclass(frozen=True, slots=True)
class Delivery:
    """A publication handed to the application, in causal order per topic.

    ``published_at`` is the publisher's wall clock (Unix seconds) when it
    published: comparable across hosts only as far as their clocks agree.

    ``missed`` is the gap event: how many publications of ``source`` on this
    topic came after the one this subscriber delivered last and before this
    one, and will not reach it (published while it was cut off by a
    partition, or away; see docs/failures.md).  0 but after a loss; each
    loss is counted once, exactly, on the delivery that follows it.
    """

    topic: str
    source: int
    incarnation: int
    seq: int
    payload: bytes
    own: bool
    published_at: float = 0.0
    missed: int = 0


_STAMP = struct.Struct(">d")
"""The runtime's payload envelope: the publish wall clock, then the application's bytes."""
_STAMP_SIZE = _STAMP.size
_unpack_stamp = _STAMP.unpack_from


def _delivery_maker() -> Callable[[str, int, int, int, bytes, bool, float, int], Delivery]:
    """A constructor of :class:`Delivery` that fills its slots directly, without the
    frozen dataclass' ``__init__`` (eight ``object.__setattr__`` calls per delivery);
    the class itself if its fields are not the ones this code knows."""
    names = ("topic", "source", "incarnation", "seq", "payload", "own", "published_at", "missed")
    if not tuple(f.name for f in fields(Delivery)) == names == Delivery.__slots__:
        return Delivery
    s_topic, s_source, s_inc, s_seq, s_payload, s_own, s_at, s_missed = (
        Delivery.__dict__[n].__set__ for n in names
    )
    new = object.__new__

    def make(
        topic: str,
        source: int,
        inc: int,
        seq: int,
        payload: bytes,
        own: bool,
        at: float,
        missed: int,
    ) -> Delivery:
        d: Delivery = new(Delivery)
        s_topic(d, topic)
        s_source(d, source)
        s_inc(d, inc)
        s_seq(d, seq)
        s_payload(d, payload)
        s_own(d, own)
        s_at(d, at)
        s_missed(d, missed)
        return d

    return make


_new_delivery = _delivery_maker()


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    """``kind`` is ``joined`` or ``left`` (the overlay gained or lost ``node``).

    ``reason`` says why: ``discovered`` (a new member), ``restarted`` (a new
    ``incarnation`` of a known id), ``suspected`` (the failure detector
    suspects it: treated as crashed), ``left`` (it announced a graceful
    leave, or discovery reported its departure).
    """

    kind: str
    node: int
    incarnation: int = 0
    reason: str = ""


DELIVERY_BATCH = 64
"""Deliveries :meth:`Subscription.receive` hands out between two schedule points."""


class Subscription:
    """Async iterator of :class:`Delivery` for one topic.

    Deliveries wait in a queue of at most ``NodeConfig.delivery_buffer``.
    Reading is cheap when some are queued: :meth:`receive` is a cancellation
    point every time but lets other tasks run (a schedule point) only every
    :data:`DELIVERY_BATCH` deliveries, or when it has to wait; a received
    round of publications thus costs one wake-up, not one per delivery.
    """

    def __init__(self, topic: str, capacity: int, *, own: bool = True) -> None:
        self.topic = topic
        self.own = own
        """Whether this node's own publications on the topic are handed out too."""
        self.dropped = 0
        """Deliveries lost because the application did not read fast enough."""
        self._queue: deque[Delivery] = deque()
        self._capacity = capacity
        self._closed = False
        self._waiting = trio.lowlevel.ParkingLot()
        self._parked = False
        """Whether a reader may be parked in ``_waiting``: set before parking, cleared
        only by waking them all (cheaper to test per delivery than the lot itself)."""
        self._streak = 0

    def _put(self, item: Delivery) -> bool:
        """Queue ``item`` (no checkpoint); ``False`` if the queue is full.

        :meth:`Node._deliver` does the same inline (the hot path)."""
        if len(self._queue) >= self._capacity:
            return False
        self._queue.append(item)
        if self._parked:
            self._parked = False
            self._waiting.unpark_all()
        return True

    def _close(self) -> None:
        """No more deliveries: readers get what is queued, then the end."""
        self._closed = True
        self._waiting.unpark_all()

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._queue and self._streak < DELIVERY_BATCH - 1:  # receive()'s usual case
            self._streak += 1
            return self._queue.popleft()
        try:
            return await self._next()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def receive(self) -> Delivery:
        """The next delivery; ``trio.EndOfChannel`` once unsubscribed and all read."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._queue and self._streak < DELIVERY_BATCH - 1:
            self._streak += 1
            return self._queue.popleft()
        return await self._next()

    async def receive_batch(self, limit: int = DELIVERY_BATCH) -> list[Delivery]:
        """The queued deliveries, in order, at most ``limit`` and at least one
        (waiting for it); ``trio.EndOfChannel`` once unsubscribed and all read.
        A cancellation point; lets other tasks run once per batch."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        await trio.lowlevel.checkpoint_if_cancelled()
        queue = await self._ready()
        pop = queue.popleft
        return [pop() for _ in range(min(limit, len(queue)))]

    def batches(self, limit: int = DELIVERY_BATCH) -> AsyncIterator[list[Delivery]]:
        """``async for batch in sub.batches(): ...``: :meth:`receive_batch` until
        the subscription ends (the same deliveries, in the same order, as
        iterating the subscription, for one wake-up per batch)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        return _Batches(self, limit)

    async def _next(self) -> Delivery:
        """:meth:`receive` after its cancellation point, when it has to yield or wait."""
        return (await self._ready()).popleft()

    async def _ready(self) -> deque[Delivery]:
        """The queue, once it holds a delivery: lets other tasks run first if it
        does (a batch is over), else waits; ``trio.EndOfChannel`` once
        unsubscribed and all read."""
        queue = self._queue
        if queue:
            await trio.lowlevel.cancel_shielded_checkpoint()
        while not queue:
            if self._closed:
                raise trio.EndOfChannel
            self._parked = True
            await self._waiting.park()
        self._streak = 0
        return queue


class _Batches:
    """The iterator :meth:`Subscription.batches` returns."""

    def __init__(self, sub: Subscription, limit: int) -> None:
        self._sub, self._limit = sub, limit

    def __aiter__(self) -> _Batches:
        return self

    async def __anext__(self) -> list[Delivery]:
        try:
            return await self._sub.receive_batch(self._limit)
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
