"""The game's world: the tiled map, state updates, bot movement and what one
player has seen of the others.  Nothing here touches a socket, a clock or
trio, so all of it is tested headless (``tests/test_game.py``).  The run's
ledger and its checks are in ``_game_ledger``, the report in ``_game_report``.

The map is ``cols x rows`` square tiles of ``tile_size`` cells.  Each tile is a
topic (:meth:`GameMap.topic`).  A player publishes its state to the tile it
stands on and subscribes to every tile within ``radius`` tiles of it (its
*neighbourhood*, a 3x3 block for ``radius=1``, clipped at the map's edges).

Invariants: every cell belongs to exactly one tile and every tile is in its
own neighbourhood (so a player never leaves the tile it stands on); a bot's
position is always on the map; a player's view keeps only the newest update
of each player it has heard from.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

# ------------------------------------------------------------------ the map


class Tile(NamedTuple):
    """A tile's column and row (``0 <= col < cols``, ``0 <= row < rows``)."""

    col: int
    row: int


@dataclass(frozen=True, slots=True)
class GameMap:
    """Geometry of the world.  Invariant: every cell belongs to exactly one tile,
    and every tile is in its own neighbourhood."""

    cols: int = 4
    rows: int = 4
    tile_size: int = 8
    radius: int = 1
    name: str = "game"
    """Prefix of every topic, so two games on one fleet never mix."""

    def __post_init__(self) -> None:
        if not (1 <= self.cols <= 64 and 1 <= self.rows <= 64):
            raise ValueError(f"map must be 1..64 tiles each way, got {self.cols}x{self.rows}")
        if not 2 <= self.tile_size <= 256:
            raise ValueError(f"tile size must be 2..256 cells, got {self.tile_size}")
        if not 0 <= self.radius <= 8:
            raise ValueError(f"view radius must be 0..8 tiles, got {self.radius}")
        if not self.name or "/" in self.name:
            raise ValueError(f"game name must be non-empty without '/', got {self.name!r}")

    @property
    def width(self) -> int:
        """Cells across."""
        return self.cols * self.tile_size

    @property
    def height(self) -> int:
        """Cells down."""
        return self.rows * self.tile_size

    def tiles(self) -> list[Tile]:
        """Every tile, row by row."""
        return [Tile(c, r) for r in range(self.rows) for c in range(self.cols)]

    def clamp(self, x: float, y: float) -> tuple[float, float]:
        """``(x, y)`` moved onto the map (cells are ``[0, width) x [0, height)``)."""
        return min(max(x, 0.0), self.width - 1e-6), min(max(y, 0.0), self.height - 1e-6)

    def tile_of(self, x: float, y: float) -> Tile:
        """The tile holding the cell at ``(x, y)`` (clamped onto the map)."""
        cx, cy = self.clamp(x, y)
        return Tile(int(cx) // self.tile_size, int(cy) // self.tile_size)

    def index(self, tile: Tile) -> int:
        """A compact number for ``tile`` (row-major)."""
        return tile.row * self.cols + tile.col

    def tile_at(self, index: int) -> Tile:
        return Tile(index % self.cols, index // self.cols)

    def neighbourhood(self, tile: Tile) -> frozenset[Tile]:
        """The tiles within ``radius`` of ``tile`` (Chebyshev distance), clipped to the map."""
        r = self.radius
        return frozenset(
            Tile(c, w)
            for c in range(max(0, tile.col - r), min(self.cols, tile.col + r + 1))
            for w in range(max(0, tile.row - r), min(self.rows, tile.row + r + 1))
        )

    def topic(self, tile: Tile) -> str:
        """The topic of ``tile``: ``<name>/tile/<col>,<row>``."""
        return f"{self.name}/tile/{tile.col},{tile.row}"

    def bounds(self, tile: Tile) -> tuple[int, int, int, int]:
        """``(x0, y0, x1, y1)``: the cells of ``tile`` are ``x0 <= x < x1, y0 <= y < y1``."""
        s = self.tile_size
        return tile.col * s, tile.row * s, (tile.col + 1) * s, (tile.row + 1) * s

    def centre(self) -> Tile:
        """The default hot tile: the middle one (towards the top left on even maps)."""
        return Tile((self.cols - 1) // 2, (self.rows - 1) // 2)


def parse_tile(text: str) -> Tile:
    """``"COL,ROW"`` as a :class:`Tile` (``ValueError`` if malformed)."""
    col, sep, row = text.partition(",")
    if not sep or not col.strip().isdigit() or not row.strip().isdigit():
        raise ValueError(f"expected COL,ROW, got {text!r}")
    return Tile(int(col), int(row))


def parse_size(text: str) -> tuple[int, int]:
    """``"COLSxROWS"`` (e.g. ``4x4``) as a pair (``ValueError`` if malformed)."""
    cols, sep, rows = text.lower().partition("x")
    if not sep or not cols.isdigit() or not rows.isdigit():
        raise ValueError(f"expected COLSxROWS such as 4x4, got {text!r}")
    return int(cols), int(rows)


def interest_change(
    gmap: GameMap, joined: Iterable[Tile], here: Tile
) -> tuple[list[Tile], list[Tile]]:
    """What a player on ``here`` must join and leave, given the tiles it is joined to.

    Joins come first in the answer's use (see ``Player.reconcile``): a player
    never leaves the tile it stands on, because it is in its own neighbourhood.
    """
    want = gmap.neighbourhood(here)
    have = set(joined)
    return sorted(want - have), sorted(have - want)


# ------------------------------------------------------------ state updates

_UPDATE = struct.Struct("<QIHHQ8s")
UPDATE_SIZE = _UPDATE.size
"""Bytes of one encoded :class:`StateUpdate` (32)."""


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """What a player publishes 20 times a second: who, which update, where, when.

    ``seq`` counts the player's updates over every tile (so a receiver keeps the
    newest); ``sent_ns`` is the sender's ``time.time_ns()`` just before publishing.
    """

    player: int
    seq: int
    x: int
    y: int
    sent_ns: int
    name: str = ""

    def encode(self) -> bytes:
        raw = self.name.encode()[:8]
        return _UPDATE.pack(self.player, self.seq, self.x, self.y, self.sent_ns, raw)

    @staticmethod
    def decode(data: bytes) -> StateUpdate | None:
        """``None`` for anything that is not an update (another app on the topic)."""
        if len(data) != UPDATE_SIZE:
            return None
        player, seq, x, y, sent, raw = _UPDATE.unpack(data)
        return StateUpdate(player, seq, x, y, sent, raw.rstrip(b"\0").decode(errors="replace"))


# -------------------------------------------------------------------- bots


@dataclass(frozen=True, slots=True)
class BotPlan:
    """Where bot ``index`` starts and what it does: wander the map or, with a
    ``home`` tile, walk there and stay (crowding)."""

    index: int
    name: str
    start: tuple[float, float]
    home: Tile | None
    seed: int


def plan_bots(
    gmap: GameMap, bots: int, crowd: int, seed: int, hot: Tile | None = None
) -> list[BotPlan]:
    """Deterministic plans: bots ``0..crowd-1`` crowd into ``hot``, the others wander.

    Crowders start outside ``hot`` (when the map has another tile) so they walk in.
    """
    if not 0 <= crowd <= bots:
        raise ValueError(f"crowd must be 0..bots ({bots}), got {crowd}")
    hot = hot if hot is not None else gmap.centre()
    if not (0 <= hot.col < gmap.cols and 0 <= hot.row < gmap.rows):
        raise ValueError(f"hot tile {hot} is outside the {gmap.cols}x{gmap.rows} map")
    rng = random.Random(seed)
    plans = []
    for i in range(bots):
        home = hot if i < crowd else None
        while True:
            start = (rng.uniform(0, gmap.width), rng.uniform(0, gmap.height))
            start = gmap.clamp(*start)
            if home is None or gmap.tile_of(*start) != home or len(gmap.tiles()) == 1:
                break
        plans.append(BotPlan(i, f"bot{i}", start, home, rng.randrange(1 << 32)))
    return plans


@dataclass(slots=True)
class Walker:
    """A bot's movement: straight at a target at ``speed`` cells/s, then a new target.

    A crowder's targets are all inside its home tile, so once there it stays.
    Invariant: the position is always on the map.
    """

    gmap: GameMap
    x: float
    y: float
    speed: float
    home: Tile | None
    rng: random.Random
    target: tuple[float, float] = (0.0, 0.0)

    @staticmethod
    def from_plan(gmap: GameMap, plan: BotPlan, speed: float) -> Walker:
        w = Walker(gmap, plan.start[0], plan.start[1], speed, plan.home, random.Random(plan.seed))
        w.target = w.pick_target()
        return w

    def pick_target(self) -> tuple[float, float]:
        if self.home is None:
            x0, y0, x1, y1 = 0, 0, self.gmap.width, self.gmap.height
        else:
            x0, y0, x1, y1 = self.gmap.bounds(self.home)
        return self.gmap.clamp(
            self.rng.uniform(x0 + 0.5, x1 - 0.5), self.rng.uniform(y0 + 0.5, y1 - 0.5)
        )

    def step(self, dt: float, allowed: Callable[[Tile], bool]) -> tuple[float, float]:
        """Move for ``dt`` seconds; a move onto a tile ``allowed`` refuses is not made."""
        tx, ty = self.target
        dx, dy = tx - self.x, ty - self.y
        dist = math.hypot(dx, dy)
        reach = self.speed * dt
        if dist <= reach:
            nx, ny = tx, ty
            self.target = self.pick_target()
        else:
            nx, ny = self.x + dx * reach / dist, self.y + dy * reach / dist
        nx, ny = self.gmap.clamp(nx, ny)
        if allowed(self.gmap.tile_of(nx, ny)):
            self.x, self.y = nx, ny
        return self.x, self.y


# ------------------------------------------------------------- world view


@dataclass(slots=True)
class WorldView:
    """What one player has seen of the others: the newest update of each.

    An update older than one already applied (it came on another tile, see
    ``cross_tile_stale`` in the report) is ignored, as a game would.
    """

    latest: dict[int, StateUpdate] = field(default_factory=dict)
    seen_at: dict[int, int] = field(default_factory=dict)
    latency_ns: dict[int, int] = field(default_factory=dict)

    def apply(self, update: StateUpdate, now_ns: int) -> bool:
        """Keep ``update`` if it is the player's newest; whether it was kept."""
        old = self.latest.get(update.player)
        if old is not None and old.seq >= update.seq:
            return False
        self.latest[update.player] = update
        self.seen_at[update.player] = now_ns
        self.latency_ns[update.player] = now_ns - update.sent_ns
        return True

    def visible(self, now_ns: int, ttl_ns: int = 2_000_000_000) -> list[StateUpdate]:
        """Players heard from within ``ttl_ns``, by name."""
        alive = [u for p, u in self.latest.items() if now_ns - self.seen_at[p] <= ttl_ns]
        return sorted(alive, key=lambda u: (u.name, u.player))
