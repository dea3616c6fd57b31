"""The fan-out's floor: our tree and round discipline over trio and TCP alone.

A worker of ``bench.runtime`` (its parent spawns ``python -m
bench._floor_worker SPEC_JSON`` for these systems) that moves the paced
1 -> N fan-out the way our runtime does, with everything but the event loop
and the sockets left out: no encryption, no causal order, no node machine,
no decoding beyond a length prefix, no delivery hand-off.  What it measures
is what any node built on trio pays per hop on this host, so our latency
can be split into that floor and our own work.

* ``floor``: rounds as in ``topics`` (DESIGN.md §3): the publisher sends
  everything queued as one frame to its children when no round is in
  flight; a relay forwards a round before it records it (cut-through) and
  acknowledges it to its parent once all its children did; a leaf
  acknowledges at once.  One round in flight per source.
* ``stream``: the same tree, every publication forwarded as soon as it is
  due, no acknowledgements (what a second round in flight would tend to).

The tree is the one our nodes build from node 0 when all subscribe (the
parent computes it from the fleet's node ids: ``Spec.children``); every
edge is one TCP connection on 127.0.0.1, dialled by the parent.  Frames: a
4-byte big-endian length, then ``R`` and the round's 64-byte payloads, or
``A`` (an acknowledgement).
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import time

import trio

from bench._runtime_workers import (
    FLOORS,
    HEADER,
    PAYLOAD_SIZE,
    Pacer,
    Recorder,
    Sent,
    Spec,
    _ours_command,
    _trio_sleep_until,
    emit,
    mark,
    payload,
    process_info,
    window,
)

ROUND_MAX = 256
"""Publications per round at most (``PubSubConfig.max_round_messages``)."""
_LEN = struct.Struct(">I")
_MAX_FRAME = 1 + ROUND_MAX * PAYLOAD_SIZE


class _Conn:
    """One tree edge: length-prefixed frames read by one task, written at once."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()
        self.unsent = b""
        self.wake = trio.Event()

    async def frame(self) -> bytes | None:
        """The next frame's body (``None``: the peer closed)."""
        buf = self.buf
        while True:
            if len(buf) >= 4:
                (size,) = _LEN.unpack_from(buf)
                if size > _MAX_FRAME:
                    raise ValueError(f"frame of {size} bytes")
                if len(buf) >= 4 + size:
                    body = bytes(buf[4 : 4 + size])
                    del buf[: 4 + size]
                    return body
            data = await self.stream.receive_some(1 << 16)
            if not data:
                return None
            buf += data

    def send(self, body: bytes) -> None:
        """Write ``body`` now; what the socket does not take waits for :meth:`flush`."""
        data = _LEN.pack(len(body)) + body
        if self.unsent:
            self.unsent += data
            return
        try:
            sent = os.write(self.stream.socket.fileno(), data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            self.unsent = data[sent:]
            self.wake.set()

    async def flush(self) -> None:
        """Write what :meth:`send` could not, whenever there is some."""
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            while self.unsent:
                data, self.unsent = self.unsent, b""
                await self.stream.send_all(data)


class _Node:
    """One node's part of the fan-out (see the module docstring)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.rounds = spec.system == "floor"
        self.parent: _Conn | None = None
        self.kids: list[_Conn] = []
        self.waiting = 0
        """Children yet to acknowledge the round in flight."""
        self.queue: list[bytes] = []
        self.rec = Recorder(spec.index, (0, 0))

    def launch(self) -> None:
        """Publisher: send what is queued as one round, unless one is in flight."""
        if self.waiting or not self.queue:
            return
        body = b"R" + b"".join(self.queue[:ROUND_MAX])
        del self.queue[:ROUND_MAX]
        for kid in self.kids:
            kid.send(body)
        self.waiting = len(self.kids) if self.rounds else 0

    async def from_parent(self) -> None:
        """Relay or leaf: forward each round, record it, acknowledge a leaf's at once."""
        assert self.parent is not None
        on = self.rec.on
        while (body := await self.parent.frame()) is not None:
            for kid in self.kids:
                kid.send(body)
            for off in range(1, len(body), PAYLOAD_SIZE):
                on(body[off : off + PAYLOAD_SIZE])
            if self.rounds:
                if self.kids:
                    self.waiting = len(self.kids)
                else:
                    self.parent.send(b"A")

    async def from_child(self, kid: _Conn) -> None:
        """The acknowledgements of one child: the last of a round's goes up, or
        (at the publisher) launches the next round."""
        while await kid.frame() is not None:
            self.waiting -= 1
            if self.waiting:
                continue
            if self.parent is not None:
                self.parent.send(b"A")
            else:
                self.launch()

    async def publish(self, start_ns: int, sent: Sent) -> None:
        """Paced publishing from ``start_ns`` for the spec's duration."""
        lo, hi = window(self.spec, start_ns)
        await _trio_sleep_until(start_ns)
        pacer = Pacer(self.spec.rate, start_ns)
        seq = 0
        while (now := time.time_ns()) < hi:
            for _ in range(pacer.due(now)):
                data = payload(seq, self.spec.index)
                self.queue.append(data)
                sent.in_window += lo <= HEADER.unpack_from(data)[0] < hi
                seq += 1
            self.launch()
            await _trio_sleep_until(min(pacer.next_ns(), hi))
        sent.count = seq
        sent.max_burst = pacer.max_burst


async def _dial(port: int) -> _Conn:
    """Connect to a child, retrying until it listens (at most 30 s)."""
    with trio.fail_after(30):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.02)
                continue
            return _Conn(stream)  # trio's streams set TCP_NODELAY


async def _main(spec: Spec) -> None:
    node = _Node(spec)
    async with trio.open_nursery() as nursery:
        if spec.index:  # listen first: the parent dials until this node listens
            (listener,) = await trio.open_tcp_listeners(spec.ports[spec.index], host="127.0.0.1")
        node.kids = [await _dial(spec.ports[c]) for c in spec.children]
        if spec.index:
            node.parent = _Conn(await listener.accept())
            await listener.aclose()
            nursery.start_soon(node.parent.flush)
        for kid in node.kids:
            nursery.start_soon(kid.flush)
            nursery.start_soon(node.from_child, kid)
        emit("up", imported_ns=time.time_ns())
        await _ours_command("sub")
        emit("subscribed")
        start_ns = int((await _ours_command("go"))[1])
        at_go = mark()
        node.rec = Recorder(spec.index, window(spec, start_ns))
        if node.parent is not None:
            nursery.start_soon(node.from_parent)
        sent = Sent()
        if spec.publish:
            await node.publish(start_ns, sent)
        await _trio_sleep_until(start_ns + int((spec.duration + spec.drain) * 1e9))
        emit("result", recv=node.rec.summary(), sent=sent.summary(), stats={},
             **process_info(at_go))  # fmt: skip
        await _ours_command("exit")
        nursery.cancel_scope.cancel()


def main(argv: list[str]) -> int:
    """Run the worker ``argv[0]`` (a :class:`~bench._runtime_workers.Spec` as JSON) describes."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    spec = Spec.from_json(argv[0])
    if spec.system not in FLOORS:
        print(f"not a floor system: {spec.system!r}", file=sys.stderr)
        return 2
    try:
        trio.run(_main, spec)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
