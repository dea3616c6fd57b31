"""The asyncio facade (``p2p.aio``, issue 44).

In one process: publish and ``async for`` between two nodes, the bounded hand-over
(a reader that does not read holds at most ``queue_size`` deliveries; the rest
is dropped and counted by the node, never queued without bound), errors as
``P2PError``, cancellation of calls and of the task holding the node, and a
node whose event loop is closed under it.  Real processes (slow): two plain
asyncio programs and a ``p2p node`` deliver to each other; Ctrl-C and
SIGTERM close each program's node gracefully (the others see a leave, not a
suspicion) and leave no thread or socket behind; a node held by a task that
``main`` never awaits closes at the loop's shutdown; an aiohttp application
serves publications and deliveries and closes its node on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _cli import free_port, make_fleet, start, wait_for

from p2p import NodeConfig, NodeError, P2PError, aio, fleet

HERE = Path(__file__).resolve().parent
PY = [sys.executable]


@pytest.fixture
def dirs(tmp_path: Path) -> Path:
    fleet.init_fleet(tmp_path / "fleet", psk=True)
    for name in ("a", "b"):
        fleet.add_node(tmp_path / "fleet", tmp_path / name)
    return tmp_path


def _cfg(*seeds: int, **kw: Any) -> NodeConfig:
    return NodeConfig(discovery=False, seeds=tuple(f"127.0.0.1:{p}" for p in seeds), **kw)


def _only_main_thread(timeout: float = 15.0) -> list[str]:
    """The threads left once trio's idle worker threads (10 s) have gone."""
    deadline = time.monotonic() + timeout
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    return [t.name for t in threading.enumerate()]


def test_publish_and_async_for(dirs: Path) -> None:
    async def main() -> tuple[list[bytes], list[str]]:
        async with aio.open_node(dirs / "a", _cfg()) as a, a.membership() as events:
            async with aio.open_node(dirs / "b", _cfg(a.port)) as b, asyncio.timeout(20):
                await a.wait_for_members(2)
                sa = await a.subscribe("t")
                await b.subscribe("t")
                await b.publish("t", "one")
                await b.publish_many("t", [b"two", "three"])
                await b.publish("t", b"four", wait_acked=True)
                got = [d.payload async for d in _take(sa, 4)]
                assert (await a.members()) == {a.id, b.id}
                assert (await a.stats())["packets_received"] >= 1
            kinds = []
            async with asyncio.timeout(10):
                async for ev in events:  # b joined, then left gracefully
                    kinds.append(f"{ev.kind}/{ev.reason}")
                    if ev.kind == "left":
                        break
        return got, kinds

    got, kinds = asyncio.run(main())
    assert got == [b"one", b"two", b"three", b"four"]
    assert kinds == ["joined/discovered", "left/left"]
    assert _only_main_thread() == ["MainThread"]


async def _take(sub: aio.Subscription, n: int) -> Any:
    async for d in sub:
        yield d
        n -= 1
        if n == 0:
            return


def test_a_slow_reader_holds_a_bounded_queue(dirs: Path) -> None:
    """Nothing read while 600 deliveries arrive: 8 wait on the asyncio side, the
    node's buffer holds 16, the rest is dropped and counted; every delivery is
    either read or counted."""

    async def main() -> tuple[int, int, int]:
        async with (
            aio.open_node(dirs / "a", _cfg(delivery_buffer=16), queue_size=8) as a,
            aio.open_node(dirs / "b", _cfg(a.port)) as b,
            asyncio.timeout(30),
        ):
            await a.wait_for_members(2)
            sa = await a.subscribe("t")
            await b.subscribe("t")
            for _ in range(6):
                await b.publish_many("t", [b"x"] * 99)
            await b.publish_many("t", [b"x"] * 5)
            await b.publish("t", b"end", wait_acked=True)
            await asyncio.sleep(0.3)
            pending = sa.pending
            read = 0
            while True:  # what there is to read, until none comes for a second
                try:
                    async with asyncio.timeout(1):
                        await sa.get()
                except TimeoutError:
                    break
                read += 1
            return pending, read, sa.dropped

    pending, read, dropped = asyncio.run(main())
    assert pending == 8
    assert dropped > 0
    assert read + dropped == 600
    assert read <= 8 + 16 + 64  # queue + node buffer + one hand-over batch in the pump


def test_errors_are_p2p_errors(dirs: Path) -> None:
    async def main() -> list[str]:
        seen = []
        async with aio.open_node(dirs / "a", _cfg()) as a:
            for call in (
                lambda: a.publish("t", b"x"),  # not subscribed
                lambda: a.unsubscribe("t"),
                lambda: a.wait_for_members(0),
            ):
                with pytest.raises(NodeError) as caught:
                    await call()
                seen.append(str(caught.value))
            await a.subscribe("t")
            with pytest.raises(NodeError, match="exceeds the limit"):
                await a.publish("t", b"x" * (1 << 17))
            with pytest.raises(TypeError):
                await a.publish("t", 5)  # type: ignore[arg-type]
            held = a
        with pytest.raises(NodeError, match="closed"):
            await held.publish("t", b"late")
        return seen

    seen = asyncio.run(main())
    assert "must subscribe" in seen[0]
    assert "not subscribed" in seen[1]


def test_a_node_that_cannot_start_says_why(tmp_path: Path, dirs: Path) -> None:
    async def start_in(path: Path, cfg: NodeConfig | None = None) -> None:
        async with aio.open_node(path, cfg):
            raise AssertionError("started")

    with pytest.raises(P2PError, match=r"no such (node )?directory"):
        asyncio.run(start_in(tmp_path / "missing"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(NodeError, match=rf"cannot listen on 127\.0\.0\.1 port {port}"):
            asyncio.run(start_in(dirs / "a", NodeConfig(discovery=False, port=port)))

    async def twice() -> None:
        async with aio.open_node(dirs / "a", _cfg()), aio.open_node(dirs / "a", _cfg()):
            raise AssertionError("started twice")

    with pytest.raises(P2PError, match="already in use"):
        asyncio.run(twice())
    assert _only_main_thread() == ["MainThread"]


def test_cancellation(dirs: Path) -> None:
    """A cancelled wait leaves the node working; a cancelled task closes it."""

    async def main() -> tuple[bool, bool]:
        async with aio.open_node(dirs / "a", _cfg()) as a:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await a.wait_for_members(3)
            sub = await a.subscribe("t")
            await a.publish("t", b"still works")
            first = await sub.get()
            assert first is not None
            assert first.payload == b"still works"

        ready = asyncio.Event()

        async def holder() -> None:
            async with aio.open_node(dirs / "b", _cfg()) as b:
                await b.subscribe("t")
                ready.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(holder())
        await ready.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled(), sub.dropped == 0

    assert asyncio.run(main()) == (True, True)
    assert _only_main_thread() == ["MainThread"]


def test_a_closed_loop_closes_its_node(dirs: Path) -> None:
    """A program that closes its loop without leaving the ``async with``: the
    node's thread notices and ends (announcing its leave)."""
    loop = asyncio.new_event_loop()
    opened = aio.open_node(dirs / "a", _cfg())
    node = loop.run_until_complete(opened.__aenter__())
    assert node.port > 0
    loop.close()
    assert _only_main_thread() == ["MainThread"]


# ------------------------------------------------------------------ real processes


def _lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _has(log: Path, key: str) -> bool:
    return _field(log, key) is not None


def _field(log: Path, key: str) -> Any:
    for item in _lines(log):
        if key in item:
            return item
    return None


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


@pytest.mark.slow
def test_plain_asyncio_programs_with_a_native_node(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    ids = make_fleet(tmp_path, ["a", "b", "c"], psk=True)
    app = [*PY, str(HERE / "_aio_app.py")]
    common = ["--members", "3", "--settle", "2", "--publish", "20", "--expect", "40"]
    a = start([str(tmp_path / "a"), *common], tmp_path / "a.log", command=app)
    procs.append(a)
    wait_for("a's port", lambda: _field(tmp_path / "a.log", "port") is not None,
             log=tmp_path / "a.log")  # fmt: skip
    seed = f"127.0.0.1:{_field(tmp_path / 'a.log', 'port')['port']}"
    b = start([str(tmp_path / "b"), *common, "--seed", seed], tmp_path / "b.log", command=app)
    procs.append(b)
    c = start(["node", "--identity", str(tmp_path / "c"), "--no-mdns", "--seed", seed,
               "--settle", "1", "--publish", "chat", "--count", "20", "--rate", "20",
               "--duration", "12", "--trace", str(tmp_path / "c.jsonl")],
              tmp_path / "c.log")  # fmt: skip
    procs.append(c)
    for name in ("a", "b"):
        log = tmp_path / f"{name}.log"
        wait_for(f"{name}'s deliveries", partial(_has, log, "got"), timeout=40, log=log)
    for name, others in (("a", ("b", "c")), ("b", ("a", "c"))):
        got = _field(tmp_path / f"{name}.log", "got")["got"]
        assert got == {ids[o]: 20 for o in others}, (name, got)
    b.send_signal(signal.SIGINT)  # Ctrl-C
    assert b.wait(20) == 130
    end = _field(tmp_path / "b.log", "end")
    assert end == {"end": True, "threads": ["MainThread"], "sockets": 0}
    wait_for("a sees b leave", lambda: {"member": "left", "node": ids["b"], "reason": "left"}
             in _lines(tmp_path / "a.log"), log=tmp_path / "a.log")  # fmt: skip
    assert c.wait(30) == 0
    delivered = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    from_apps = {e["source"] for e in delivered if e["event"] == "deliver"} - {ids["c"]}
    assert from_apps == {ids["a"], ids["b"]}
    a.send_signal(signal.SIGTERM)
    assert a.wait(20) == 0
    assert _field(tmp_path / "a.log", "end") == {"end": True, "threads": ["MainThread"],
                                                 "sockets": 0}  # fmt: skip
    suspected = [x for x in _lines(tmp_path / "a.log") if x.get("reason") == "suspected"]
    assert suspected == []


@pytest.mark.slow
def test_the_loop_shutdown_closes_an_orphaned_node(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    ids = make_fleet(tmp_path, ["a", "b"], psk=True)
    app = [*PY, str(HERE / "_aio_app.py")]
    common = ["--members", "2", "--settle", "1", "--publish", "5", "--expect", "5"]
    a = start([str(tmp_path / "a"), *common], tmp_path / "a.log", command=app)
    procs.append(a)
    wait_for("a's port", lambda: _field(tmp_path / "a.log", "port") is not None,
             log=tmp_path / "a.log")  # fmt: skip
    seed = f"127.0.0.1:{_field(tmp_path / 'a.log', 'port')['port']}"
    b = start([str(tmp_path / "b"), *common, "--seed", seed, "--orphan"], tmp_path / "b.log",
              command=app)  # fmt: skip
    procs.append(b)
    assert b.wait(40) == 0, (tmp_path / "b.log").read_text()
    assert _field(tmp_path / "b.log", "got")["got"] == {ids["a"]: 5}
    assert _field(tmp_path / "b.log", "end") == {"end": True, "threads": ["MainThread"],
                                                 "sockets": 0}  # fmt: skip
    wait_for("a sees b leave", lambda: {"member": "left", "node": ids["b"], "reason": "left"}
             in _lines(tmp_path / "a.log"), log=tmp_path / "a.log")  # fmt: skip
    a.send_signal(signal.SIGINT)
    assert a.wait(20) == 130


def _http(port: int, path: str, body: bytes | None = None) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body)
    with urllib.request.urlopen(request, timeout=20) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_under_an_aiohttp_server(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    ids = make_fleet(tmp_path, ["web", "peer"], psk=True)
    http = free_port()
    web = start([str(tmp_path / "web"), str(http)], tmp_path / "web.log",
                command=[*PY, str(HERE / "_aio_web.py")])  # fmt: skip
    procs.append(web)
    wait_for("the web node's port", lambda: _field(tmp_path / "web.log", "port") is not None,
             log=tmp_path / "web.log")  # fmt: skip
    seed = f"127.0.0.1:{_field(tmp_path / 'web.log', 'port')['port']}"
    peer = start(["node", "--identity", str(tmp_path / "peer"), "--no-mdns", "--seed", seed,
                  "--settle", "1", "--publish", "chat", "--count", "10", "--rate", "20",
                  "--duration", "8", "--trace", str(tmp_path / "peer.jsonl")],
                 tmp_path / "peer.log")  # fmt: skip
    procs.append(peer)
    wait_for("the peer's publications over HTTP", lambda: len(_http(http, "/got")) == 10,
             log=tmp_path / "peer.log")  # fmt: skip
    assert _http(http, "/got") == [f"{ids['peer']}:{i}" for i in range(10)]
    assert _http(http, "/members") == 2
    seqs = [_http(http, "/publish", f"web {i}".encode())["seq"] for i in range(5)]
    assert seqs == sorted(seqs)
    assert peer.wait(30) == 0
    trace = [json.loads(line) for line in (tmp_path / "peer.jsonl").read_text().splitlines()]
    from_web = [e["seq"] for e in trace if e["event"] == "deliver" and e["source"] == ids["web"]]
    assert len(from_web) == 5
    web.send_signal(signal.SIGINT)
    assert web.wait(20) == 0, (tmp_path / "web.log").read_text()
    assert _field(tmp_path / "web.log", "end") == {"end": True, "threads": ["MainThread"],
                                                   "sockets": 0}  # fmt: skip
    assert "Traceback" not in (tmp_path / "web.log").read_text()


def _readme_python(fragment: str) -> str:
    """The README's ```python block that contains ``fragment``."""
    text = (HERE.parent / "README.md").read_text()
    blocks: list[str] = re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    (block,) = [b for b in blocks if fragment in b]
    return block


def test_the_readme_snippets_run(tmp_path: Path) -> None:
    """The asyncio example (its node delivers its own message and stops) and the
    provisioning example run as written."""
    fleet.init_fleet(tmp_path / "fleet", psk=True)
    fleet.add_node(tmp_path / "fleet", tmp_path / "alice")
    out = subprocess.run(
        [*PY, "-c", _readme_python("from p2p import aio")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    node_id = fleet.node_info(tmp_path / "alice").node_id
    assert out.stdout == f"{node_id} b'hello'\n"
    work = tmp_path / "prov"
    work.mkdir()
    out = subprocess.run(
        [*PY, "-c", _readme_python("from p2p import fleet")],
        cwd=work, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    sensor = fleet.node_info(work / "sensor-1")
    assert out.stdout == f"{sensor.hex_id}\n"
    assert fleet.revoked(work / "gateway") == {sensor.node_id}
