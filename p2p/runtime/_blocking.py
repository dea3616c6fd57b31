"""A blocking facade over the trio runtime, for plain scripts (a sensor loop needs no trio).

::

    from p2p import BlockingNode

    with BlockingNode("node-dir") as node:           # starts the node in a thread
        node.wait_for_members(2, timeout=10)
        readings = node.subscribe("sensors")
        node.publish("sensors", b"21.5")
        for delivery in readings.iter(timeout=5):    # stops after 5 s without one
            print(delivery.source, delivery.payload)

The node runs in one background thread with its own trio run; every method
hands its work to that thread and waits for the answer.  Invariant: the
calling thread never touches the node's state directly, and any failure of
the node or of the call reaches the caller as a :class:`~p2p.P2PError`
(``NodeError``) or ``TimeoutError``, never as a raw trio exception.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import trio

from causal import MsgId
from p2p._errors import NodeError
from p2p._identity import Fleet, NodeIdentity
from p2p.runtime._config import NodeConfig
from p2p.runtime._delivery import Delivery, Subscription
from p2p.runtime._node import Node, open_node

T = TypeVar("T")


class BlockingSubscription:
    """Deliveries of one topic, read from plain code."""

    def __init__(self, owner: BlockingNode, sub: Subscription) -> None:
        self._owner = owner
        self._sub = sub
        self.topic = sub.topic

    @property
    def dropped(self) -> int:
        """Deliveries lost because they were not read fast enough (``delivery_buffer``)."""
        return self._sub.dropped

    def get(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery; ``None`` once the subscription has ended.

        Raises ``TimeoutError`` if none arrives within ``timeout`` seconds.
        """

        async def receive() -> Delivery | None:
            try:
                return await self._sub.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return None

        return self._owner._call(receive, timeout, f"no delivery on {self.topic!r}")

    def iter(self, timeout: float | None = None) -> Iterator[Delivery]:
        """Deliveries until the subscription ends or ``timeout`` passes without one."""
        while True:
            try:
                item = self.get(timeout)
            except TimeoutError:
                return
            if item is None:
                return
            yield item

    def __iter__(self) -> Iterator[Delivery]:
        return self.iter()

    def unsubscribe(self) -> None:
        """Leave the topic; iteration ends."""
        self._owner._call(lambda: self._owner._live().unsubscribe(self.topic), None, "unsubscribe")


class BlockingNode:
    """A node running in a background thread, driven by blocking calls.

    ``node_dir`` and ``config`` are those of :func:`~p2p.open_node`.  The
    constructor returns once the node listens (or raises ``NodeError`` if it
    cannot start within ``start_timeout`` seconds).  Use it as a context
    manager, or call :meth:`close`.
    """

    def __init__(
        self,
        node_dir: str | Path | tuple[NodeIdentity, Fleet],
        config: NodeConfig | None = None,
        *,
        start_timeout: float = 30.0,
    ) -> None:
        self._node: Node | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=trio.run, args=(self._main, node_dir, config), name="p2p-node", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(start_timeout):
            raise NodeError(f"the node did not start within {start_timeout} s")
        if self._node is None:
            self._thread.join()
            raise NodeError(f"the node could not start: {self._error}") from self._error

    async def _main(
        self, node_dir: str | Path | tuple[NodeIdentity, Fleet], config: NodeConfig | None
    ) -> None:
        try:
            async with open_node(node_dir, config) as node:
                self._stop = trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                self._node = node
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:  # reported to the caller by _call / the constructor
            self._error = exc
        finally:
            self._ready.set()

    # ------------------------------------------------------------ public API

    @property
    def id(self) -> int:
        """This node's 64-bit overlay id."""
        return self._live().id

    @property
    def port(self) -> int:
        """The TCP port the node listens on."""
        return self._live().port

    @property
    def stats(self) -> dict[str, int]:
        """A snapshot of the node's counters (see ``Node.stats``)."""
        return self._call_sync(lambda: dict(self._live().stats))

    def members(self) -> frozenset[int]:
        """The overlay members this node knows (itself included)."""
        return self._call_sync(self._live().members)

    def wait_for_members(self, count: int, timeout: float | None = None) -> frozenset[int]:
        """Block until at least ``count`` members are known; ``TimeoutError`` otherwise."""
        if count < 1:
            raise NodeError(f"wait_for_members needs a count of at least 1, got {count}")

        async def wait() -> frozenset[int]:
            node = self._live()
            while len(node.members()) < count:
                await trio.sleep(0.05)
            return node.members()

        def short() -> str:
            return f"{len(self._live().members())} of {count} members known"

        return self._call(wait, timeout, short)

    def subscribe(
        self, topic: str, timeout: float | None = None, *, own: bool = True
    ) -> BlockingSubscription:
        """Join ``topic``; returns once the subscription is acknowledged
        (``own=False``: without this node's own publications, see
        :meth:`p2p.Node.subscribe`)."""
        sub = self._call(
            lambda: self._live().subscribe(topic, own=own), timeout, f"subscribe({topic!r})"
        )
        return BlockingSubscription(self, sub)

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        wait_acked: bool = False,
        timeout: float | None = None,
    ) -> MsgId:
        """Publish on ``topic`` (subscribe first); ``str`` payloads are sent as UTF-8.

        Returns once accepted or, with ``wait_acked``, once every current
        subscriber has it.
        """
        data = payload.encode() if isinstance(payload, str) else payload
        what = f"publish on {topic!r}" + (" (waiting for every subscriber)" if wait_acked else "")
        return self._call(
            lambda: self._live().publish(topic, data, wait_acked=wait_acked), timeout, what
        )

    def close(self) -> None:
        """Stop the node (queued packets get ``drain_timeout`` to leave) and its thread."""
        if self._stop is not None and self._token is not None and self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()
        self._node = None

    def __enter__(self) -> BlockingNode:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -------------------------------------------------------------- plumbing

    def _live(self) -> Node:
        if self._node is None:
            raise NodeError("the node is closed")
        return self._node

    def _call(
        self,
        fn: Callable[[], Awaitable[T]],
        timeout: float | None,
        what: str | Callable[[], str],
    ) -> T:
        """Run ``fn()`` in the node's thread; ``TimeoutError`` after ``timeout`` seconds,
        saying ``what`` did not happen (a callable is asked at that moment)."""
        if timeout is not None and not timeout >= 0:  # also NaN
            raise NodeError(f"timeout must be a non-negative number of seconds, got {timeout}")

        async def bounded() -> T:
            with trio.fail_after(float("inf") if timeout is None else timeout):
                return await fn()

        try:
            return trio.from_thread.run(bounded, trio_token=self._token_or_raise())
        except trio.TooSlowError:
            said = what() if callable(what) else what
            raise TimeoutError(f"{said} after {timeout} s") from None
        except trio.RunFinishedError:
            raise self._stopped() from self._error
        except trio.Cancelled:
            raise self._stopped() from None

    def _call_sync(self, fn: Callable[[], T]) -> T:
        try:
            return trio.from_thread.run_sync(fn, trio_token=self._token_or_raise())
        except trio.RunFinishedError:
            raise self._stopped() from self._error

    def _token_or_raise(self) -> trio.lowlevel.TrioToken:
        if self._token is None or self._node is None:
            raise NodeError("the node is closed")
        return self._token

    def _stopped(self) -> NodeError:
        return NodeError(f"the node stopped{f': {self._error}' if self._error else ''}")


__all__ = ["BlockingNode", "BlockingSubscription"]
