"""Headless runs: a throw-away fleet of bot players on this host, in one process or
split over several (one :class:`~edge_examples._game_net.Shard` each), and the report.

Every player is a real node (own identity in a pre-shared-key fleet, own TCP
listener on the interface, encrypted channel).  Nodes find each other through
one static seed (the first node) unless ``discovery="mdns"``.

With ``procs > 1`` the coordinator (this process, which runs no node) starts
``python -m edge_examples._game_run SPEC_JSON`` workers and drives them over
their stdin/stdout, one JSON line per command and per answer::

    start -> seeds | members -> seconds | subscribe -> seconds
    run START_NS DURATION -> null | quiesce -> bool | finish -> path of the ledger

Every shard goes through the same steps at the same time, so all nodes know
each other before anyone subscribes (the library's known limit), and all
players start publishing at the same wall-clock instant.
"""

from __future__ import annotations

import cProfile
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from edge_examples._game_ledger import Ledger
from edge_examples._game_logic import GameMap, Tile, plan_bots
from edge_examples._game_net import PlayerSpec, Shard, ShardSpec, write_ledger
from edge_examples._game_report import RunInfo
from p2p import P2PError
from p2p.fleet import add_node, init_fleet


class GameError(P2PError):
    """A headless run could not be carried out (bad settings, a worker failed)."""


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Settings of one headless run (the report's ``config`` echoes them)."""

    bots: int = 16
    crowd: int = 8
    rate: float = 20.0
    duration: float = 60.0
    gmap: GameMap = field(default_factory=GameMap)
    hot: Tile | None = None
    speed: float = 4.0
    procs: int = 1
    seed: int = 1
    warmup: float = 2.0
    discovery: str = "seeds"
    interface: str = "127.0.0.1"
    profile_dir: str = ""

    def __post_init__(self) -> None:
        checks = (
            (1 <= self.bots <= 128, f"bots must be 1..128, got {self.bots}"),
            (0 <= self.crowd <= self.bots, f"crowd must be 0..bots, got {self.crowd}"),
            (0 < self.rate <= 100, f"rate must be in (0, 100] Hz, got {self.rate}"),
            (0 < self.duration <= 24 * 3600, f"duration must be positive, got {self.duration}"),
            (0 < self.speed <= 100, f"speed must be in (0, 100] cells/s, got {self.speed}"),
            (1 <= self.procs <= self.bots, f"procs must be 1..bots, got {self.procs}"),
            (0 <= self.warmup < self.duration, "warmup must be shorter than the duration"),
            (self.discovery in ("seeds", "mdns"), "discovery must be seeds or mdns"),
        )
        for ok, message in checks:
            if not ok:
                raise GameError(message)

    @property
    def hot_tile(self) -> Tile:
        return self.hot if self.hot is not None else self.gmap.centre()

    def describe(self) -> dict[str, Any]:
        g = self.gmap
        return {
            "players": self.bots,
            "crowd": self.crowd,
            "hot_tile": f"{self.hot_tile.col},{self.hot_tile.row}",
            "rate": self.rate,
            "duration": self.duration,
            "warmup": self.warmup,
            "map": f"{g.cols}x{g.rows}",
            "tile_size": g.tile_size,
            "view_radius": g.radius,
            "speed": self.speed,
            "procs": self.procs,
            "seed": self.seed,
            "discovery": self.discovery,
            "interface": self.interface,
            "host": {
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
            },
        }


class ShardClient(Protocol):
    """The coordinator's handle on a shard, in this process or in a worker."""

    async def start(self) -> list[str]: ...
    async def wait_members(self) -> float: ...
    async def subscribe(self) -> float: ...
    async def run(self, start_ns: int, duration: float) -> None: ...
    async def quiesce(self) -> bool: ...
    async def finish(self) -> Ledger: ...


class _Lines:
    """Newline-terminated lines from a byte stream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def readline(self) -> bytes | None:
        while b"\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buffer += data
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        return line


class RemoteShard:
    """A shard in a worker process (``python -m edge_examples._game_run SPEC``)."""

    def __init__(self, spec: ShardSpec) -> None:
        self.spec = spec
        self._proc: trio.Process | None = None
        self._lines: _Lines | None = None

    async def __aenter__(self) -> RemoteShard:
        cmd = [sys.executable, "-m", "edge_examples._game_run", json.dumps(self.spec.to_json())]
        self._proc = await trio.lowlevel.open_process(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._proc.stdout is not None
        self._lines = _Lines(self._proc.stdout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        proc = self._proc
        if proc is None:
            return
        with trio.CancelScope(shield=True):
            try:
                assert proc.stdin is not None
                await proc.stdin.aclose()
            except trio.BrokenResourceError:
                pass
            with trio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    async def _call(self, cmd: str, *args: Any) -> Any:
        assert self._proc is not None
        assert self._proc.stdin is not None
        assert self._lines
        await self._proc.stdin.send_all(json.dumps([cmd, *args]).encode() + b"\n")
        line = await self._lines.readline()
        if line is None:
            raise GameError(f"worker {self.spec.index} exited during {cmd!r} (see stderr)")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise GameError(f"worker {self.spec.index}: {cmd}: {answer.get('error')}")
        return answer.get("value")

    async def start(self) -> list[str]:
        return [str(s) for s in await self._call("start")]

    async def wait_members(self) -> float:
        return float(await self._call("members"))

    async def subscribe(self) -> float:
        return float(await self._call("subscribe"))

    async def run(self, start_ns: int, duration: float) -> None:
        await self._call("run", start_ns, duration)

    async def quiesce(self) -> bool:
        return bool(await self._call("quiesce"))

    async def finish(self) -> Ledger:
        path = Path(await self._call("finish"))
        return Ledger.from_json(json.loads(path.read_text()))


# ----------------------------------------------------------------- the run


def make_fleet(base: Path, names: list[str]) -> list[Path]:
    """A throw-away psk fleet in ``base`` with one node directory per name."""
    init_fleet(base / "fleet", psk=True, name="game")
    dirs = [base / name for name in names]
    for name, d in zip(names, dirs, strict=True):
        add_node(base / "fleet", d, name=name)
    return dirs


def shard_specs(cfg: RunConfig, base: Path, dirs: list[Path]) -> list[ShardSpec]:
    """Players dealt round-robin over ``cfg.procs`` shards (crowders spread evenly)."""
    plans = plan_bots(cfg.gmap, cfg.bots, cfg.crowd, cfg.seed, cfg.hot_tile)
    service = f"_game{random.Random(cfg.seed).randrange(1 << 32):08x}{os.getpid():x}._tcp.local."
    specs = []
    for k in range(cfg.procs):
        players = tuple(
            PlayerSpec(p.index, p.name, str(dirs[p.index]), p) for p in plans[k :: cfg.procs]
        )
        profile = str(Path(cfg.profile_dir) / f"shard{k}.prof") if cfg.profile_dir else ""
        specs.append(
            ShardSpec(
                index=k,
                gmap=cfg.gmap,
                players=players,
                total=cfg.bots,
                rate=cfg.rate,
                speed=cfg.speed,
                interface=cfg.interface,
                discovery=cfg.discovery,
                service_type=service,
                result_path=str(base / f"shard{k}.json"),
                profile_path=profile,
            )
        )
    return specs


async def run_headless(
    cfg: RunConfig, base: Path, progress: Callable[[str], None]
) -> tuple[Ledger, RunInfo]:
    """Run the bots, and return the merged ledger and what the report needs to know."""
    load_before = [round(x, 2) for x in os.getloadavg()]
    dirs = make_fleet(base, [f"bot{i}" for i in range(cfg.bots)])
    specs = shard_specs(cfg, base, dirs)
    async with AsyncExitStack() as stack:

        async def open_shard(spec: ShardSpec) -> ShardClient:
            if cfg.procs == 1:
                return await stack.enter_async_context(Shard(spec))
            return await stack.enter_async_context(RemoteShard(spec))

        first = await open_shard(specs[0])
        seeds = (await _all([first], "start", lambda c: c.start(), 60))[0]
        clients = [first] + [await open_shard(_with_seeds(s, seeds)) for s in specs[1:]]
        await _all(clients[1:], "start", lambda c: c.start(), 60)
        progress(f"{cfg.bots} nodes up in {cfg.procs} process(es); waiting for membership")
        took = await _all(clients, "members", lambda c: c.wait_members(), 90)
        progress(f"every node knows all {cfg.bots} in {max(took):.1f} s; subscribing")
        took = await _all(clients, "subscribe", lambda c: c.subscribe(), 90)
        progress(f"first neighbourhoods joined in {max(took):.1f} s; playing {cfg.duration:g} s")
        start_ns = time.time_ns() + 500_000_000
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_report_progress, progress, start_ns, cfg.duration)
            await _all(clients, "run", lambda c: c.run(start_ns, cfg.duration), cfg.duration + 120)
            nursery.cancel_scope.cancel()
        quiet = await _all(clients, "quiesce", lambda c: c.quiesce(), 60)
        if not all(quiet):
            progress("warning: some rounds were still unacknowledged after 20 s")
        ledgers = await _all(clients, "finish", lambda c: c.finish(), 60)
    config = cfg.describe()
    config["host"]["loadavg_before"] = load_before
    config["host"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    config["quiesced"] = all(quiet)
    info = RunInfo(start_ns=start_ns, duration=cfg.duration, warmup=cfg.warmup, config=config)
    return Ledger.merge(ledgers), info


def _with_seeds(spec: ShardSpec, seeds: list[str]) -> ShardSpec:
    doc = spec.to_json()
    doc["seeds"] = seeds
    return ShardSpec.from_json(doc)


async def _all(
    clients: list[ShardClient], what: str, call: Callable[[ShardClient], Any], timeout: float
) -> list[Any]:
    """``call`` on every client at once; their answers in order.

    A single client is called from this task and with no cancel scope around it:
    an in-process :class:`Shard` enters its nodes' contexts in :meth:`Shard.start`,
    which must nest like ``async with`` blocks (its methods bound their own waits).
    """
    results: list[Any] = [None] * len(clients)
    if len(clients) == 1:
        return [await call(clients[0])]

    async def one(i: int, c: ShardClient) -> None:
        results[i] = await call(c)

    try:
        with trio.fail_after(timeout):
            async with trio.open_nursery() as nursery:
                for i, c in enumerate(clients):
                    nursery.start_soon(one, i, c)
    except trio.TooSlowError:
        raise GameError(f"{what} took more than {timeout:g} s") from None
    return results


async def _report_progress(progress: Callable[[str], None], start_ns: int, duration: float) -> None:
    step = 10.0 if duration >= 30 else max(1.0, duration / 3)
    elapsed = 0.0
    while True:
        await trio.sleep(step)
        elapsed = (time.time_ns() - start_ns) / 1e9
        if elapsed < duration:
            progress(f"  {elapsed:.0f}/{duration:g} s")


# ------------------------------------------------------------------ worker


async def _worker(spec: ShardSpec) -> None:
    """Answer the coordinator's commands (one JSON line each) until stdin closes."""
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    lines = _Lines(stdin)
    async with Shard(spec) as shard:
        while (line := await lines.readline()) is not None:
            cmd, *args = json.loads(line)
            try:
                value = await _dispatch(shard, cmd, args)
                answer: dict[str, Any] = {"ok": True, "value": value}
            except (P2PError, OSError, trio.TooSlowError, ValueError) as exc:
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


async def _dispatch(shard: Shard, cmd: str, args: list[Any]) -> Any:
    if cmd == "start":
        return await shard.start()
    if cmd == "members":
        return await shard.wait_members()
    if cmd == "subscribe":
        return await shard.subscribe()
    if cmd == "run":
        await shard.run(int(args[0]), float(args[1]))
        return None
    if cmd == "quiesce":
        return await shard.quiesce()
    if cmd == "finish":
        path = Path(shard.spec.result_path)
        write_ledger(await shard.finish(), path)
        return str(path)
    raise ValueError(f"unknown command {cmd!r}")


def profiled(path: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, under cProfile writing to ``path`` when it is not empty."""
    if not path:
        return fn()
    profile = cProfile.Profile()
    try:
        return profile.runcall(fn)
    finally:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        profile.dump_stats(path)


def worker_main(argv: list[str]) -> int:
    spec = ShardSpec.from_json(json.loads(argv[0]))
    try:
        profiled(spec.profile_path, lambda: trio.run(_worker, spec))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))


__all__ = ["GameError", "RunConfig", "make_fleet", "run_headless"]
