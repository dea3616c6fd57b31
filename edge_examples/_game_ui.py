"""The terminal UI (stdlib curses): the map, you, the players you see; arrows/WASD, q.

Split in two so the screen is tested without a terminal: :func:`snapshot` and
:func:`compose` are pure (a :class:`Snapshot` in, lines of text out), and
:func:`run_ui` only reads keys and paints those lines.
"""

from __future__ import annotations

import contextlib
import curses
import logging
import time
from collections import deque
from dataclasses import dataclass

import trio

from edge_examples._game_logic import GameMap, Tile
from edge_examples._game_net import Manual, Player

MOVES: dict[int, tuple[int, int]] = {
    curses.KEY_UP: (0, -1),
    curses.KEY_DOWN: (0, 1),
    curses.KEY_LEFT: (-1, 0),
    curses.KEY_RIGHT: (1, 0),
    **{ord(k): (0, -1) for k in "wW"},
    **{ord(k): (0, 1) for k in "sS"},
    **{ord(k): (-1, 0) for k in "aA"},
    **{ord(k): (1, 0) for k in "dD"},
}
QUIT = frozenset(map(ord, "qQ"))
PANEL = 34
"""Columns of the side panel."""


@dataclass(frozen=True, slots=True)
class Seen:
    """Another player as last heard of."""

    name: str
    x: int
    y: int
    latency_ms: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one frame shows (no live objects: safe to render anywhere)."""

    gmap: GameMap
    name: str
    x: int
    y: int
    joined: frozenset[Tile]
    others: tuple[Seen, ...]
    sent: int
    status: str = ""


def snapshot(player: Player, status: str = "") -> Snapshot:
    """The frame of ``player``'s current view."""
    now = time.time_ns()
    others = tuple(
        Seen(u.name or f"{u.player:016x}"[:6], u.x, u.y, player.world.latency_ns[u.player] / 1e6)
        for u in player.world.visible(now)
    )
    return Snapshot(
        player.gmap,
        player.name,
        int(player.mover.x),
        int(player.mover.y),
        frozenset(player.joined),
        others,
        player.seq,
        status,
    )


def label(i: int) -> str:
    """The map letter of the ``i``-th other player (A..Z, then a..z, then ``*``)."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    return letters[i] if i < len(letters) else "*"


def compose(snap: Snapshot, width: int, height: int) -> list[str]:
    """The screen as at most ``height`` lines of at most ``width`` characters.

    The map shows joined tiles as ``.`` and the rest as blank (out of view),
    ``+`` at tile corners, you as ``@`` and the others by letter; a viewport
    follows you when the map is bigger than the window.
    """
    g = snap.gmap
    rows = max(1, min(g.height, height - 2))
    cols = max(1, min(g.width, width - PANEL - 1))
    top = _clamp(snap.y - rows // 2, 0, g.height - rows)
    left = _clamp(snap.x - cols // 2, 0, g.width - cols)
    marks = {(s.x, s.y): label(i) for i, s in enumerate(snap.others)}
    marks[(snap.x, snap.y)] = "@"
    grid = []
    for y in range(top, top + rows):
        row = []
        for x in range(left, left + cols):
            row.append(marks.get((x, y)) or _ground(g, snap.joined, x, y))
        grid.append("".join(row))
    panel = _panel(snap)
    lines = [f"{snap.gmap.name}: {len(snap.others) + 1} players in view"[:width]]
    for i in range(max(rows, len(panel))):
        left_part = grid[i] if i < rows else " " * cols
        right = panel[i] if i < len(panel) else ""
        lines.append(f"{left_part} {right}"[:width])
    lines.append(snap.status[:width])
    return lines[:height]


def _ground(g: GameMap, joined: frozenset[Tile], x: int, y: int) -> str:
    if x % g.tile_size == 0 and y % g.tile_size == 0:
        return "+"
    return "." if g.tile_of(x, y) in joined else " "


def _panel(snap: Snapshot) -> list[str]:
    tile = snap.gmap.tile_of(snap.x, snap.y)
    lines = [
        f"you: {snap.name} at {snap.x},{snap.y}",
        f"tile {tile.col},{tile.row}; joined {len(snap.joined)} tiles",
        f"updates sent: {snap.sent}",
        "",
        "players seen (latency):",
    ]
    for i, s in enumerate(snap.others):
        lines.append(f" {label(i)} {s.name[:12]:12} {s.latency_ms:6.1f} ms")
    lines += ["", "arrows/WASD move, q quits"]
    return [line[:PANEL] for line in lines]


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(v, max(lo, hi)))


class _LastLog(logging.Handler):
    """Keeps the last log lines for the status line (stderr would tear the screen)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: deque[str] = deque(maxlen=1)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname.lower()}: {record.getMessage()}")


def apply_key(player: Player, key: int) -> bool:
    """Act on one key; whether it asks to quit.  Moves onto unjoined tiles are refused."""
    if key in QUIT:
        return True
    move = MOVES.get(key)
    if move is not None and isinstance(player.mover, Manual):
        before = player.tile
        player.mover.nudge(move[0], move[1], player.allowed)
        if player.tile != before:
            player.moved()
    return False


async def run_ui(player: Player, fps: float = 20.0) -> None:
    """Show ``player``'s view and steer it from the keyboard until ``q``."""
    handler = _LastLog()
    loggers = [logging.getLogger(n) for n in ("p2p", "edge_examples")]
    for lg in loggers:
        lg.addHandler(handler)
    screen = curses.initscr()
    try:
        curses.noecho()
        curses.cbreak()
        screen.keypad(True)
        screen.nodelay(True)
        with contextlib.suppress(curses.error):
            curses.curs_set(0)
        while True:
            key = screen.getch()
            while key != -1:
                if apply_key(player, key):
                    return
                key = screen.getch()
            _paint(
                screen,
                compose(
                    snapshot(player, handler.lines[-1] if handler.lines else ""), *_size(screen)
                ),
            )
            await trio.sleep(1 / fps)
    finally:
        screen.keypad(False)
        curses.nocbreak()
        curses.echo()
        curses.endwin()
        for lg in loggers:
            lg.removeHandler(handler)


def _size(screen: curses.window) -> tuple[int, int]:
    h, w = screen.getmaxyx()
    return w, h


def _paint(screen: curses.window, lines: list[str]) -> None:
    screen.erase()
    h, w = screen.getmaxyx()
    for i, line in enumerate(lines[:h]):
        with contextlib.suppress(curses.error):
            screen.addstr(i, 0, line[: w - 1])
    screen.refresh()
