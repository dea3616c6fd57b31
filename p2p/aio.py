"""An asyncio facade over the trio runtime: a node an asyncio program can await.

::

    import asyncio

    from p2p import aio


    async def main() -> None:
        async with aio.open_node("alice/") as node:       # the trio node runs in a thread
            room = await node.subscribe("chat")
            await node.publish("chat", "hello", wait_acked=True)
            async for delivery in room:                   # Delivery(topic, source, ..., payload)
                print(delivery.source, delivery.payload)


    asyncio.run(main())

The node runs in one thread of its own with its own trio run (as
:class:`~p2p.BlockingNode` does); the asyncio side never touches its state.
A call hands its work to that thread and awaits the answer on the caller's
event loop, which stays free meanwhile.  What holds:

* **Bounded memory.**  Between the node and the asyncio side, each
  subscription (and each membership watch) holds at most ``queue_size``
  items; when the application reads slower than deliveries arrive, the node
  stops handing them over, its own per-topic buffer
  (``NodeConfig.delivery_buffer``) fills, and beyond it deliveries are
  dropped and counted (:attr:`Subscription.dropped`), never silently and never
  growing memory.
* **Errors are** :class:`~p2p.P2PError`.  A misuse (publishing before
  subscribing, a payload over the limit, a call after close) raises
  :class:`~p2p.NodeError`; a node that fails or stops makes every pending and
  later call raise :class:`~p2p.NodeError` naming why.  ``TypeError`` only for a
  payload that is neither ``bytes`` nor ``str``.
* **Cancellation.**  Cancelling an awaiting call (``asyncio.timeout``, task
  cancellation, Ctrl-C under ``asyncio.run``) cancels its work in the node's
  thread too; a publication already accepted is still sent (only the wait for
  its acknowledgements ends).  Leaving the ``async with`` block, by any exit
  (an exception, a cancellation, the loop's shutdown cancelling the task),
  closes the node as :func:`p2p.open_node` does (it announces its leave and
  gives queued packets ``drain_timeout``) and waits for its thread to end:
  afterwards no thread and no socket of the node is left.  (trio keeps idle
  worker threads, used for blocking mDNS calls, for 10 s before they exit.)
* If the event loop is closed while a node is still open (a program that
  stopped its loop without finishing its tasks), the node notices within
  half a second and closes itself.

One facade, one file past the usual 600 lines: the node, subscription and
watch wrappers share the thread bridge and its bounded hand-over, whose
invariants are stated once above.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from p2p._errors import NodeError, P2PError

if TYPE_CHECKING:
    from causal import MsgId
    from p2p._identity import Fleet, NodeIdentity
    from p2p.runtime import Delivery, MembershipEvent, Node, NodeConfig
    from p2p.runtime import Subscription as TrioSubscription

T = TypeVar("T")

DEFAULT_QUEUE = 1024
"""Items (deliveries or membership events) a subscription holds on the asyncio side."""

_WATCHDOG = 0.5
"""Seconds between the node thread's checks that its event loop is still open."""


def _as_p2p_error(exc: BaseException) -> BaseException:
    """What the asyncio side sees of an exception raised in the node's thread."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, P2PError | TypeError | TimeoutError):
        return exc
    if isinstance(exc, trio.Cancelled | trio.RunFinishedError | trio.ClosedResourceError):
        return NodeError("the node is closed")
    if isinstance(exc, KeyError):
        return NodeError(f"not subscribed to {exc.args[0]!r}" if exc.args else "not subscribed")
    if isinstance(exc, Exception):
        error = NodeError(f"{exc}" or exc.__class__.__name__)
        error.__cause__ = exc
        return error
    return exc


class _Feed(Generic[T]):
    """Items handed from the node's trio thread to the asyncio side, in order,
    at most ``capacity`` of them in between.

    Credits bound what is in flight: the trio side spends one per item and
    waits when it has none; the asyncio side returns them as it hands items
    out (in batches of a quarter of the capacity, and whenever it has handed
    out everything, so the producer is never left waiting on an empty queue).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken, capacity: int
    ) -> None:
        self._loop = loop
        self._token = token
        self._capacity = capacity
        self._batch = max(1, capacity // 4)
        # asyncio side
        self._items: deque[T] = deque()
        self._waiters: list[asyncio.Future[None]] = []
        self._ended = False
        self._error: BaseException | None = None
        self._taken = 0
        # trio side
        self._credits = capacity
        self._room: trio.Event | None = None

    # ------------------------------------------------------------- trio side

    async def put_many(self, items: list[T]) -> None:
        """Hand ``items`` over, waiting for room (a cancellation point)."""
        while items:
            while self._credits == 0:
                self._room = trio.Event()
                await self._room.wait()
            part, items = items[: self._credits], items[self._credits :]
            self._credits -= len(part)
            self._post(self._arrive, part)

    def end(self, error: BaseException | None = None) -> None:
        """No more items (``error``: why, raised to the reader after what is queued)."""
        self._post(self._finish, error)

    def _release(self, count: int) -> None:
        self._credits += count
        if self._room is not None:
            self._room.set()

    def _post(self, fn: Callable[[Any], None], arg: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            self._loop.call_soon_threadsafe(fn, arg)

    # ---------------------------------------------------------- asyncio side

    def _arrive(self, items: list[T]) -> None:
        self._items.extend(items)
        self._wake()

    def _finish(self, error: BaseException | None) -> None:
        self._ended = True
        self._error = error
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def abandon(self) -> None:
        """The node's thread has ended: a reader still waiting is told so."""
        if not self._ended:
            self._finish(NodeError("the node is closed"))

    def pending(self) -> int:
        return len(self._items)

    async def get(self) -> T | None:
        """The next item; ``None`` once ended (or the ending error, raised)."""
        while not self._items:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return None
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            await waiter
        item = self._items.popleft()
        self._taken += 1
        if self._taken >= self._batch or not self._items:
            taken, self._taken = self._taken, 0
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._release, taken)
        return item


class _Reading(Generic[T]):
    """``async for`` over a :class:`_Feed`: iteration ends where the feed does."""

    _feed: _Feed[T]

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        item = await self._feed.get()
        if item is None:
            raise StopAsyncIteration
        return item


class Subscription(_Reading["Delivery"]):
    """Deliveries of one topic, for ``async for`` on the asyncio side.

    Iteration ends when the topic is unsubscribed; if the node stops first,
    it raises :class:`~p2p.NodeError` once the queued deliveries are read.
    """

    def __init__(self, owner: AioNode, sub: TrioSubscription, feed: _Feed[Delivery]) -> None:
        self._owner = owner
        self._sub = sub
        self._feed = feed
        self.topic: str = sub.topic

    @property
    def dropped(self) -> int:
        """Deliveries the node dropped because they were not read fast enough
        (its ``delivery_buffer`` was full): a snapshot."""
        return self._sub.dropped

    @property
    def pending(self) -> int:
        """Deliveries waiting on the asyncio side (at most the node's ``queue_size``)."""
        return self._feed.pending()

    async def get(self) -> Delivery | None:
        """The next delivery; ``None`` once unsubscribed and every delivery read."""
        return await self._feed.get()

    async def unsubscribe(self) -> None:
        """Leave the topic; iteration ends after what is queued."""
        await self._owner.unsubscribe(self.topic)


class MembershipEvents(_Reading["MembershipEvent"]):
    """Membership changes (:class:`~p2p.MembershipEvent`) while the watch is open."""

    def __init__(self, feed: _Feed[MembershipEvent]) -> None:
        self._feed = feed


class _Call:
    """One call's work in the node's thread, cancellable from the asyncio side."""

    __slots__ = ("cancelled", "scope")

    def __init__(self) -> None:
        self.cancelled = False
        self.scope: trio.CancelScope | None = None

    def cancel(self) -> None:  # the node's thread
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()


class AioNode:
    """A node driven from asyncio.  Create it with :func:`open_node`.

    Every method must be called from the event loop that opened the node.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, queue_size: int) -> None:
        self._loop = loop
        self._queue_size = queue_size
        self._node: Node | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._closing = False
        self._pending: set[asyncio.Future[Any]] = set()
        """Calls awaiting an answer from the node's thread (failed if it ends first)."""
        self._feeds: weakref.WeakSet[_Feed[Any]] = weakref.WeakSet()
        self.id = 0
        """This node's 64-bit overlay id."""
        self.port = 0
        """The TCP port the node listens on."""

    # ------------------------------------------------------------ public API

    async def subscribe(self, topic: str, *, own: bool = True) -> Subscription:
        """Join ``topic``; returns once the subscription is acknowledged
        (``own=False``: without this node's own publications, see
        :meth:`p2p.Node.subscribe`)."""
        node = self._live()
        feed: _Feed[Delivery] = _Feed(self._loop, self._token_or_raise(), self._queue_size)
        self._feeds.add(feed)

        async def start() -> TrioSubscription:
            sub = await node.subscribe(topic, own=own)
            if self._nursery is None:  # the node began closing meanwhile
                raise NodeError("the node is closed")
            self._nursery.start_soon(self._pump, sub, feed)
            return sub

        sub = await self._call(start)
        return Subscription(self, sub, feed)

    async def unsubscribe(self, topic: str) -> None:
        """Leave ``topic``; its subscription's iteration ends."""
        node = self._live()
        await self._call(lambda: node.unsubscribe(topic))

    async def publish(self, topic: str, payload: bytes | str, *, wait_acked: bool = False) -> MsgId:
        """Publish on ``topic`` (subscribe first); ``str`` is sent as UTF-8.

        Returns once accepted or, with ``wait_acked``, once every current
        subscriber has it.  Cancelling it cancels only the wait."""
        data = _payload(payload)
        node = self._live()
        return await self._call(lambda: node.publish(topic, data, wait_acked=wait_acked))

    async def publish_many(self, topic: str, payloads: Iterable[bytes | str]) -> list[MsgId]:
        """Publish each of ``payloads`` in order, with one hand-over to the node's
        thread for them all (see :meth:`p2p.Node.publish_many`)."""
        data = [_payload(p) for p in payloads]
        node = self._live()
        return await self._call(lambda: node.publish_many(topic, data))

    async def members(self) -> frozenset[int]:
        """The overlay members this node knows and believes up (itself included)."""
        node = self._live()

        async def snapshot() -> frozenset[int]:
            return node.members()

        return await self._call(snapshot)

    async def wait_for_members(self, count: int) -> frozenset[int]:
        """Wait until at least ``count`` members are known (bound it with
        ``asyncio.timeout``)."""
        if count < 1:
            raise NodeError(f"wait_for_members needs a count of at least 1, got {count}")
        node = self._live()

        async def wait() -> frozenset[int]:
            while len(node.members()) < count:
                await trio.sleep(0.05)
            return node.members()

        return await self._call(wait)

    async def stats(self) -> dict[str, int]:
        """A snapshot of the node's counters (see ``Node.stats``)."""
        node = self._live()

        async def snapshot() -> dict[str, int]:
            return dict(node.stats)

        return await self._call(snapshot)

    @asynccontextmanager
    async def membership(self) -> AsyncIterator[MembershipEvents]:
        """``async with node.membership() as events: async for ev in events: ...``

        Events from the moment the watch is open, at most ``queue_size`` unread
        (beyond that the node's own watch buffer drops them)."""
        node = self._live()
        feed: _Feed[MembershipEvent] = _Feed(self._loop, self._token_or_raise(), self._queue_size)
        opened: asyncio.Future[None] = self._loop.create_future()
        call = _Call()

        async def watch() -> None:
            error: BaseException | None = None
            try:
                with trio.CancelScope() as scope:
                    call.scope = scope
                    if call.cancelled:
                        scope.cancel()
                    async with node.membership() as events:
                        self._post(_resolve, opened)
                        async for event in events:
                            await feed.put_many([event])
            except trio.Cancelled:
                error = NodeError("the node is closed")
                raise
            finally:
                self._post(_fail, (opened, NodeError("the node is closed")))  # if not yet open
                feed.end(error)

        self._feeds.add(feed)
        self._spawn(watch, opened)
        try:
            await opened
            yield MembershipEvents(feed)
        finally:
            self._in_thread(call.cancel)

    # -------------------------------------------------------------- plumbing

    def _live(self) -> Node:
        if self._node is None or self._closing:
            raise NodeError("the node is closed")
        if self._error is not None:
            raise NodeError(f"the node stopped: {self._error}")
        return self._node

    def _token_or_raise(self) -> trio.lowlevel.TrioToken:
        if self._token is None:
            raise NodeError("the node is closed")
        return self._token

    def _post(self, fn: Callable[[Any], None], arg: object) -> None:
        """Run ``fn(arg)`` on the asyncio loop (from the node's thread)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self._loop.call_soon_threadsafe(fn, arg)

    def _in_thread(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` in the node's thread, soon; nothing if the node has ended."""
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(fn)

    def _spawn(self, fn: Callable[[], Awaitable[None]], answer: asyncio.Future[Any]) -> None:
        """Start ``fn`` as a task of the node's thread; ``answer`` fails with
        :class:`~p2p.NodeError` if the node is closing (or raise it if it has ended)."""

        def start() -> None:
            if self._nursery is None:
                self._post(_fail, (answer, NodeError("the node is closed")))
            else:
                self._nursery.start_soon(fn)

        try:
            self._token_or_raise().run_sync_soon(start)
        except trio.RunFinishedError:
            raise NodeError("the node is closed") from None

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Await ``fn()`` run in the node's thread; cancelling this cancels it there."""
        result: asyncio.Future[T] = self._loop.create_future()
        call = _Call()

        async def run() -> None:
            with trio.CancelScope() as scope:
                call.scope = scope
                if call.cancelled:
                    scope.cancel()
                try:
                    value = await fn()
                except BaseException as exc:  # every outcome goes back to the caller
                    self._post(_fail, (result, _as_p2p_error(exc)))
                    if isinstance(exc, trio.Cancelled):
                        raise
                    return
                self._post(_succeed, (result, value))
            if scope.cancelled_caught:
                self._post(_fail, (result, NodeError("the node is closed")))

        self._spawn(run, result)
        self._pending.add(result)
        try:
            return await result
        except asyncio.CancelledError:
            self._in_thread(call.cancel)
            raise
        finally:
            self._pending.discard(result)

    def _abandon(self) -> None:
        """The node's thread has ended (asyncio side): nothing waits for it any more."""
        for future in self._pending:
            if not future.done():
                future.set_exception(NodeError("the node is closed"))
        for feed in self._feeds:
            feed.abandon()

    async def _pump(self, sub: TrioSubscription, feed: _Feed[Delivery]) -> None:
        """Move ``sub``'s deliveries to the asyncio side (a task of the node's thread)."""
        error: BaseException | None = None
        try:
            while True:
                first = await sub.receive()
                batch = [first]
                queued = sub._queue  # the same package's queue: take what is ready at once
                while queued and len(batch) < self._queue_size:
                    batch.append(queued.popleft())
                await feed.put_many(batch)
        except trio.EndOfChannel:
            pass
        except trio.Cancelled:
            error = NodeError("the node is closed")
            raise
        finally:
            feed.end(error)

    # ------------------------------------------------------------- lifecycle

    async def _main(
        self,
        node_dir: str | Path | tuple[NodeIdentity, Fleet],
        config: NodeConfig | None,
        ready: asyncio.Future[None],
    ) -> None:
        """The node's thread: run the node until told to stop or the loop closes."""
        from p2p.runtime import open_node as open_trio_node

        try:
            async with open_trio_node(node_dir, config) as node, trio.open_nursery() as nursery:
                self._stop = trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                self._node, self._nursery = node, nursery
                self.id, self.port = node.id, node.port
                nursery.start_soon(self._watch_loop)
                self._post(_resolve, ready)
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        except Exception as exc:  # reported to the caller by open_node and later calls
            self._error = exc
            self._post(_fail, (ready, _as_p2p_error(exc)))
        finally:
            self._nursery = None

    async def _watch_loop(self) -> None:
        """Close the node if its event loop is closed under it."""
        while not self._loop.is_closed():
            await trio.sleep(_WATCHDOG)
        assert self._stop is not None
        self._stop.set()

    def _request_stop(self) -> None:
        """Ask the node's thread to close the node (any thread)."""
        self._closing = True

        def stop() -> None:
            if self._stop is not None:
                self._stop.set()

        self._in_thread(stop)


def _payload(payload: bytes | str) -> bytes:
    if isinstance(payload, str):
        return payload.encode()
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    raise TypeError(f"payload must be bytes or str, not {type(payload).__name__}")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _succeed(pair: tuple[asyncio.Future[Any], object]) -> None:
    future, value = pair
    if not future.done():
        future.set_result(value)


def _fail(pair: tuple[asyncio.Future[Any], BaseException]) -> None:
    future, error = pair
    if not future.done():
        future.set_exception(error)


class _Opened:
    """The ``async with`` of :func:`open_node`: starts the thread, and on any exit
    stops the node and waits for its thread without blocking the loop."""

    def __init__(
        self,
        node_dir: str | Path | tuple[NodeIdentity, Fleet],
        config: NodeConfig | None,
        queue_size: int,
        start_timeout: float,
    ) -> None:
        if type(queue_size) is not int or queue_size < 1:
            raise NodeError(f"queue_size must be a positive int, got {queue_size!r}")
        if not start_timeout > 0:
            raise NodeError(f"start_timeout must be positive, got {start_timeout!r}")
        self._args = (node_dir, config)
        self._queue_size = queue_size
        self._start_timeout = start_timeout
        self._node: AioNode | None = None
        self._thread: threading.Thread | None = None
        self._ended: asyncio.Future[None] | None = None

    async def __aenter__(self) -> AioNode:
        loop = asyncio.get_running_loop()
        node = self._node = AioNode(loop, self._queue_size)
        ready: asyncio.Future[None] = loop.create_future()
        ended: asyncio.Future[None] = loop.create_future()
        self._ended = ended

        def run() -> None:
            try:
                trio.run(node._main, *self._args, ready)
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    loop.call_soon_threadsafe(node._abandon)
                node._post(_resolve, ended)

        self._thread = threading.Thread(target=run, name="p2p-aio-node", daemon=True)
        self._thread.start()
        try:
            async with asyncio.timeout(self._start_timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            await self._close()
            raise NodeError(f"the node did not start within {self._start_timeout} s") from None
        except BaseException:  # a cancellation (Ctrl-C) or the start's error
            await self._close()
            raise
        return node

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        """Stop the node and wait for its thread; a second cancellation while
        waiting is delivered after the thread has ended."""
        node, thread, ended = self._node, self._thread, self._ended
        if node is None or thread is None or ended is None:
            return
        node._request_stop()
        if not thread.is_alive() and ended.done():
            thread.join()
            return
        cancelled = False
        while not ended.done():
            try:
                await asyncio.shield(ended)
            except asyncio.CancelledError:
                cancelled = True  # keep waiting: leaving now would leave the thread behind
                node._request_stop()
        thread.join()
        node._node = None
        if cancelled:
            raise asyncio.CancelledError


def open_node(
    node_dir: str | Path | tuple[NodeIdentity, Fleet],
    config: NodeConfig | None = None,
    *,
    queue_size: int = DEFAULT_QUEUE,
    start_timeout: float = 30.0,
) -> contextlib.AbstractAsyncContextManager[AioNode]:
    """Run a node for the duration of an ``async with`` block, from asyncio.

    ``node_dir`` and ``config`` are those of :func:`p2p.open_node` (a directory
    made by :func:`p2p.fleet.add_node`, or the pair :func:`p2p.fleet.load_node`
    returns).  Entering returns once the node listens, or raises
    :class:`~p2p.NodeError` if it cannot start (within ``start_timeout``
    seconds) saying why; ``queue_size`` bounds each subscription's deliveries
    waiting on the asyncio side.
    """
    return _Opened(node_dir, config, queue_size, start_timeout)


__all__ = [
    "DEFAULT_QUEUE",
    "AioNode",
    "MembershipEvents",
    "Subscription",
    "open_node",
]
