"""The game on real nodes: a :class:`Player` per node, and a :class:`Shard` that runs
several players (each its own node: own identity, TCP listener, secure channel)
in one trio run.

A player's life is three kinds of task:

* the *ticker* moves it (a bot's :class:`Walker` or the keyboard) and publishes
  its :class:`StateUpdate` on the tile it stands on, ``rate`` times a second;
* the *interest manager* joins the tiles of its neighbourhood and leaves the
  others whenever its tile changes (``subscribe`` returns after the ACK wave,
  so a resubscription costs a round trip over the tree: a real part of the load);
* one *receiver* per joined tile records every delivery in the :class:`Ledger`.

Invariant: a player only ever stands on a tile it has joined (``subscribe``
was called), so it can always publish there; moves onto other tiles wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import trio
import trio.testing

from edge_examples._game_ledger import Interval, Ledger, Pub, Receipt, Sample
from edge_examples._game_logic import (
    BotPlan,
    GameMap,
    StateUpdate,
    Tile,
    Walker,
    WorldView,
    interest_change,
)
from p2p.runtime import Node, NodeConfig, Subscription, open_node

log = logging.getLogger("edge_examples.game")


class Mover(Protocol):
    """Where a player is, and how it moves between two ticks."""

    x: float
    y: float

    def step(self, dt: float, allowed: Callable[[Tile], bool]) -> tuple[float, float]: ...


class Manual:
    """A human's position: it moves only when :meth:`nudge` is called (a key press)."""

    def __init__(self, gmap: GameMap, x: float, y: float) -> None:
        self.gmap = gmap
        self.x, self.y = gmap.clamp(x, y)

    def step(self, dt: float, allowed: Callable[[Tile], bool]) -> tuple[float, float]:
        return self.x, self.y

    def nudge(self, dx: int, dy: int, allowed: Callable[[Tile], bool]) -> bool:
        """Move one cell (``dx, dy`` in -1..1); refused off the map or onto a tile not joined."""
        nx, ny = int(self.x) + dx + 0.5, int(self.y) + dy + 0.5
        if not (0 <= nx < self.gmap.width and 0 <= ny < self.gmap.height):
            return False
        if not allowed(self.gmap.tile_of(nx, ny)):
            return False
        self.x, self.y = nx, ny
        return True


class Player:
    """One player on one node; see the module docstring for its tasks."""

    def __init__(self, node: Node, gmap: GameMap, name: str, mover: Mover, ledger: Ledger) -> None:
        self.node = node
        self.gmap = gmap
        self.name = name
        self.mover = mover
        self.ledger = ledger
        self.seq = 0
        self.world = WorldView()
        self.joined: dict[Tile, int] = {}
        """Tiles whose ``subscribe`` has been called -> index of their ledger interval."""
        self._draining: dict[Tile, trio.Event] = {}
        self._wake = trio.Event()
        self.stopping = False
        ledger.names[node.id] = name

    @property
    def tile(self) -> Tile:
        return self.gmap.tile_of(self.mover.x, self.mover.y)

    def allowed(self, tile: Tile) -> bool:
        """A move onto ``tile`` may happen now (it is joined)."""
        return tile in self.joined

    def moved(self) -> None:
        """Tell the interest manager the tile may have changed."""
        self._wake.set()

    # --------------------------------------------------------------- interest

    async def reconcile(self, nursery: trio.Nursery) -> None:
        """Join the missing tiles of the current neighbourhood (at once), then leave
        the tiles outside it.  The tile stood on is never left (it is in its own
        neighbourhood, and each leave re-checks against the current tile)."""
        join, _ = interest_change(self.gmap, self.joined, self.tile)
        if join:
            async with trio.open_nursery() as joins:
                for tile in join:
                    joins.start_soon(self._join, tile, nursery)
        for tile in list(self.joined):
            if tile not in self.gmap.neighbourhood(self.tile):
                await self._leave(tile)

    async def manage_interest(self, nursery: trio.Nursery) -> None:
        """Reconcile whenever woken, until :attr:`stopping` (the current one finishes)."""
        while not self.stopping:
            self._wake = trio.Event()
            await self.reconcile(nursery)
            if self.stopping:
                return
            if set(self.gmap.neighbourhood(self.tile)) == set(self.joined):
                await self._wake.wait()

    def stop(self) -> None:
        self.stopping = True
        self._wake.set()

    async def leave_game(self, timeout: float = 2.0) -> bool:
        """Leave every tile, then wait (at most ``timeout``) for the rounds to be acknowledged.

        A node that closes while still subscribed stalls the other players: their
        rounds on its tiles wait for its ACK forever (the library has no failure
        detector yet, see docs/runtime.md).  Returns whether everything was acknowledged.
        """
        self.stop()
        for tile in list(self.joined):
            await self._leave(tile)
        with trio.move_on_after(timeout):
            while not self.node.core.idle():
                await trio.sleep(0.02)
            return True
        return False

    async def _join(self, tile: Tile, nursery: trio.Nursery) -> None:
        drained = self._draining.pop(tile, None)
        if drained is not None:  # the last subscription's deliveries first (FIFO per tile)
            await drained.wait()
        index = len(self.ledger.intervals)
        self.ledger.intervals.append(
            Interval(self.node.id, self.gmap.index(tile), time.time_ns(), None, None)
        )
        self.joined[tile] = index
        sub = await self.node.subscribe(self.gmap.topic(tile))  # core.subscribe runs first
        self.ledger.intervals[index] = self.ledger.intervals[index]._replace(
            acked_ns=time.time_ns()
        )
        done = self._draining[tile] = trio.Event()
        nursery.start_soon(self._receive, sub, tile, done)

    async def _leave(self, tile: Tile) -> None:
        index = self.joined.pop(tile)
        self.ledger.intervals[index] = self.ledger.intervals[index]._replace(end_ns=time.time_ns())
        await self.node.unsubscribe(self.gmap.topic(tile))

    async def _receive(self, sub: Subscription, tile: Tile, done: trio.Event) -> None:
        """Record every delivery (the channel ends after ``unsubscribe``, once drained)."""
        me, index, ledger = self.node.id, self.gmap.index(tile), self.ledger
        try:
            async for d in sub:
                now = time.time_ns()
                if d.own:
                    continue
                update = StateUpdate.decode(d.payload)
                if update is None or update.player != d.source:
                    ledger.foreign += 1
                    continue
                latency = (now - update.sent_ns) // 1000
                ledger.receipts.append(
                    Receipt(me, update.player, update.seq, index, update.sent_ns, latency)
                )
                self.world.apply(update, now)
        finally:
            ledger.dropped += sub.dropped
            done.set()

    # ----------------------------------------------------------------- ticks

    async def publish_state(self) -> None:
        """Publish where this player is, on the tile it stands on (always joined)."""
        x, y = self.mover.x, self.mover.y
        tile = self.gmap.tile_of(x, y)
        update = StateUpdate(self.node.id, self.seq, int(x), int(y), time.time_ns(), self.name)
        await self.node.publish(self.gmap.topic(tile), update.encode())
        self.ledger.pubs.append(Pub(self.node.id, self.seq, self.gmap.index(tile), update.sent_ns))
        self.seq += 1

    async def tick(self, rate: float, phase: float, end: float) -> None:
        """Move and publish every ``1/rate`` s from ``phase`` s on until trio time ``end``.

        A late tick is not made up for (a game sends its current state, not a
        backlog): the next one is scheduled a period after now.
        """
        period = 1.0 / rate
        due = trio.current_time() + phase
        last = due
        while True:
            await trio.sleep_until(due)
            now = trio.current_time()
            if now >= end:
                return
            before = self.tile
            self.mover.step(now - last, self.allowed)
            last = now
            if self.tile != before:
                self.moved()
            await self.publish_state()
            due += period
            if due < now:
                due = now + period


# ------------------------------------------------------------------ shards


@dataclass(frozen=True, slots=True)
class PlayerSpec:
    """One player of a shard: its node directory and, for a bot, its plan."""

    index: int
    name: str
    node_dir: str
    plan: BotPlan | None
    """``None``: a human (keyboard) player, starting at the map's centre."""


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """What one shard runs (JSON-able: worker processes get it on their command line)."""

    index: int
    gmap: GameMap
    players: tuple[PlayerSpec, ...]
    total: int
    """Players in the whole game (each node waits until it knows them all)."""
    rate: float
    speed: float
    interface: str = "127.0.0.1"
    discovery: str = "seeds"
    """``seeds``: static seed (no multicast needed); ``mdns``: mDNS on ``interface``."""
    service_type: str = ""
    seeds: tuple[str, ...] = ()
    """Empty for the shard whose first node is the seed."""
    result_path: str = ""
    profile_path: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(doc: dict[str, Any]) -> ShardSpec:
        players = []
        for p in doc["players"]:
            plan = p["plan"]
            if plan is not None:
                home = Tile(*plan["home"]) if plan["home"] is not None else None
                plan = BotPlan(
                    plan["index"], plan["name"], tuple(plan["start"]), home, plan["seed"]
                )
            players.append(PlayerSpec(p["index"], p["name"], p["node_dir"], plan))
        fields = {k: v for k, v in doc.items() if k not in ("gmap", "players", "seeds")}
        return ShardSpec(
            gmap=GameMap(**doc["gmap"]),
            players=tuple(players),
            seeds=tuple(doc["seeds"]),
            **fields,
        )


class Shard:
    """Several players in one trio run, driven step by step by the coordinator.

    Use it as ``async with Shard(spec) as shard:`` then :meth:`start`,
    :meth:`wait_members`, :meth:`subscribe`, :meth:`run`, :meth:`quiesce`,
    :meth:`finish`, in that order.
    """

    def __init__(self, spec: ShardSpec) -> None:
        self.spec = spec
        self.ledger = Ledger()
        self.nodes: list[Node] = []
        self.players: list[Player] = []
        self._stack = AsyncExitStack()
        self._nursery: trio.Nursery | None = None
        self._cpu0 = time.process_time()

    async def __aenter__(self) -> Shard:
        await self._stack.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        return await self._stack.__aexit__(exc_type, exc, tb)

    def _config(self, seeds: tuple[str, ...]) -> NodeConfig:
        mdns = self.spec.discovery == "mdns"
        kwargs: dict[str, Any] = {"interface": self.spec.interface, "discovery": mdns}
        if mdns and self.spec.service_type:
            kwargs["service_type"] = self.spec.service_type
        return NodeConfig(seeds=() if mdns else seeds, **kwargs)

    async def start(self) -> list[str]:
        """Open every node; the first node of a seedless shard is the game's seed.

        Returns the seed addresses the other shards should use.
        """
        seeds = self.spec.seeds
        for p in self.spec.players:
            node = await self._stack.enter_async_context(open_node(p.node_dir, self._config(seeds)))
            self.nodes.append(node)
            if not seeds:
                seeds = (f"{self.spec.interface}:{node.port}",)
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        return list(seeds)

    async def wait_members(self, timeout: float = 60.0) -> float:
        """Wait until every node knows every player's node; seconds it took."""
        started = trio.current_time()
        with trio.fail_after(timeout):
            while any(len(n.members()) < self.spec.total for n in self.nodes):
                await trio.sleep(0.05)
        return trio.current_time() - started

    async def subscribe(self, timeout: float = 60.0) -> float:
        """Place every player and join its first neighbourhood; seconds it took."""
        started = trio.current_time()
        assert self._nursery is not None
        for p, node in zip(self.spec.players, self.nodes, strict=True):
            mover: Mover
            if p.plan is None:
                c = self.spec.gmap.centre()
                x0, y0, x1, y1 = self.spec.gmap.bounds(c)
                mover = Manual(self.spec.gmap, (x0 + x1) / 2, (y0 + y1) / 2)
            else:
                mover = Walker.from_plan(self.spec.gmap, p.plan, self.spec.speed)
            self.players.append(Player(node, self.spec.gmap, p.name, mover, self.ledger))
        with trio.fail_after(timeout):
            async with trio.open_nursery() as n:
                for player in self.players:
                    n.start_soon(player.reconcile, self._nursery)
        return trio.current_time() - started

    async def run(self, start_ns: int, duration: float) -> None:
        """Play from wall-clock ``start_ns`` for ``duration`` s (``inf``: until cancelled).

        Each player ticks at ``rate`` with its own phase, spread over one period.
        Interest managers finish their current change before this returns.
        """
        assert self._nursery is not None
        await trio.sleep(max(0.0, (start_ns - time.time_ns()) / 1e9))
        self._cpu0 = time.process_time()
        end = trio.current_time() + duration
        period = 1.0 / self.spec.rate
        samples: list[Sample] = []
        self.ledger.samples.append(samples)
        async with trio.open_nursery() as sampling:
            sampling.start_soon(_sample, samples, start_ns)
            async with trio.open_nursery() as managers:
                for player in self.players:
                    managers.start_soon(player.manage_interest, self._nursery)
                async with trio.open_nursery() as tickers:
                    for i, player in enumerate(self.players):
                        phase = period * ((i * 7919) % 1000) / 1000
                        tickers.start_soon(player.tick, self.spec.rate, phase, end)
                for player in self.players:
                    player.stop()
            sampling.cancel_scope.cancel()

    def idle(self) -> bool:
        return all(n.core.idle() for n in self.nodes)

    async def quiesce(self, timeout: float = 20.0) -> bool:
        """Wait until no round of this shard's nodes awaits ACKs; whether that happened."""
        with trio.move_on_after(timeout):
            while not self.idle():
                await trio.sleep(0.02)
            return True
        return False

    async def finish(self) -> Ledger:
        """Let receivers drain what was delivered, then close the books."""
        with trio.move_on_after(5):
            await trio.testing.wait_all_tasks_blocked(0.05)
        stats: dict[str, int] = {}
        for node in self.nodes:
            for k, v in node.stats.items():
                stats[k] = stats.get(k, 0) + v
            stats["causal_holds"] = stats.get("causal_holds", 0) + node.core.holds
        self.ledger.stats = stats
        self.ledger.cpu_s = time.process_time() - self._cpu0
        return self.ledger


def host_cpu() -> tuple[int, int]:
    """The host's busy and total CPU time so far (jiffies, ``/proc/stat``); zeros elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


async def _sample(samples: list[Sample], start_ns: int) -> None:
    """Append a :class:`Sample` at ``start_ns`` + 0, 1, 2, ... s (shards sample together)."""
    k = 0
    while True:
        await trio.sleep(max(0.0, (start_ns + k * 1_000_000_000 - time.time_ns()) / 1e9))
        busy, total = host_cpu()
        samples.append(Sample(time.time_ns(), time.process_time(), busy, total))
        k += 1


def write_ledger(ledger: Ledger, path: Path) -> None:
    import json

    path.write_text(json.dumps(ledger.to_json()))
