"""A small real-time LAN game on the library: each map tile is a topic.

Players publish their state (position, 20 times a second) to the tile they
stand on and subscribe to the tiles around them, so players who crowd into one
area make its tile a hot topic with many publishers, each with a delivery tree
of its own (VCube-PS builds one tree per publisher).

Headless benchmark with bots, all real nodes on this host (an RGame-style
workload: 16 players at 20 Hz, 8 of them crowding into one tile)::

    python -m edge_examples.game --bots 16 --duration 60 --headless --report REPORT.json

Play on this host against bots in a throw-away fleet (curses; arrows/WASD, q)::

    python -m edge_examples.game --local [--bots 5]

Play on a LAN, one player per machine (node directories from ``p2p fleet add-node``)::

    python -m edge_examples.game --identity NODE_DIR --interface 192.168.1.20

See ``docs/game.md`` for what it measures and the numbers to expect.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import trio

from edge_examples._game_ledger import Ledger
from edge_examples._game_logic import (
    GameMap,
    Tile,
    Walker,
    parse_size,
    parse_tile,
    plan_bots,
)
from edge_examples._game_net import (
    Manual,
    Mover,
    Player,
    PlayerSpec,
    Shard,
    ShardSpec,
    write_ledger,
)
from edge_examples._game_report import RunInfo, build_report, summary_lines
from edge_examples._game_run import GameError, RunConfig, make_fleet, profiled, run_headless
from p2p.cli import Shutdown, finite, graceful, run_cli
from p2p.fleet import load_node
from p2p.runtime import NodeConfig, open_node, parse_address

DEFAULT_CROWD = "half"


def _progress(quiet: bool) -> Callable[[str], None]:
    """Progress lines on stderr (none when ``quiet``)."""

    def say(message: str) -> None:
        if not quiet:
            print(f"game: {message}", file=sys.stderr, flush=True)

    return say


# ----------------------------------------------------------------- headless


def run_benchmark(
    cfg: RunConfig, report_path: Path | None, *, quiet: bool, ledger_path: Path | None = None
) -> int:
    """Run the bots, write the report, print the summary; 0 if order and delivery held."""
    say = _progress(quiet)
    with tempfile.TemporaryDirectory(prefix="p2p-game-") as tmp:

        async def go() -> tuple[Ledger, RunInfo]:
            return await run_headless(cfg, Path(tmp), say)

        profile = str(Path(cfg.profile_dir) / "main.prof") if cfg.profile_dir else ""
        ledger, info = profiled(profile, lambda: trio.run(go))
    if ledger_path is not None:
        write_ledger(ledger, ledger_path)
    report = build_report(cfg.gmap, ledger, info)
    if report_path is not None:
        report_path.write_text(json.dumps(report, indent=2) + "\n")
    for line in summary_lines(report):
        print(line)
    if report_path is not None:
        print(f"report: {report_path}")
    ok = report["in_order"]["ok"] and report["delivery"]["ok"]
    return 0 if ok else 1


# --------------------------------------------------------------- LAN player


async def run_lan_player(args: argparse.Namespace, gmap: GameMap) -> int:
    """One player on this machine's node: curses, or a bot with ``--headless``.

    The node looks for peers for ``--settle`` seconds before joining any tile
    (nodes must know each other before subscribing), and leaves every tile
    before it closes (see :meth:`Player.leave_game`).
    """
    identity, fleet = load_node(args.identity)
    cfg = NodeConfig(
        interface=args.interface,
        port=args.port,
        seeds=tuple(args.peers),
        discovery=not args.no_mdns,
    )
    say = _progress(args.quiet or not args.headless)
    # Ctrl-C / SIGTERM cancel the game inside open_node: the node still leaves gracefully.
    async with graceful() as stop, open_node((identity, fleet), cfg) as node, _played(stop):
        say(f"node {node.id:016x} on {args.interface}:{node.port}; finding peers")
        await trio.sleep(args.settle)
        say(f"{len(node.members()) - 1} other player(s) found")
        name = args.name or f"{node.id:016x}"[:6]
        player = Player(node, gmap, name, _lan_mover(args, gmap, node.id), Ledger())
        async with trio.open_nursery() as nursery:
            await player.reconcile(nursery)
            start_ns = time.time_ns()
            if args.headless:
                await _play(player, nursery, args.rate, args.duration)
            else:
                await _play_with_ui(player, nursery, args.rate)
            await player.leave_game()
            nursery.cancel_scope.cancel()
        members = len(node.members())
    if stop.signum is not None:
        return stop.exit_code
    if not args.headless:
        return 0
    return _lan_report(args, gmap, player, start_ns, members)


def _lan_mover(args: argparse.Namespace, gmap: GameMap, node_id: int) -> Mover:
    """A bot's walker with ``--headless``, else the keyboard; placed by the node id."""
    if args.headless:
        plan = plan_bots(gmap, 1, 0, node_id & 0xFFFFFFFF)[0]
        return Walker.from_plan(gmap, plan, args.speed)
    rng = random.Random(node_id)
    return Manual(gmap, rng.uniform(0, gmap.width), rng.uniform(0, gmap.height))


def _lan_report(
    args: argparse.Namespace, gmap: GameMap, player: Player, start_ns: int, members: int
) -> int:
    """This player's view of the game (no delivery check: it holds only its own sends)."""
    config = {
        "players": members,
        "rate": args.rate,
        "duration": args.duration,
        "warmup": 0.0,
        "map": f"{gmap.cols}x{gmap.rows}",
        "node": f"{player.node.id:016x}",
    }
    info = RunInfo(start_ns=start_ns, duration=args.duration, warmup=0.0, config=config)
    report = build_report(gmap, player.ledger, info, full=False)
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    for line in summary_lines(report):
        print(line)
    return 0 if report["in_order"]["ok"] else 1


async def _play(player: Player, nursery: trio.Nursery, rate: float, duration: float) -> None:
    """Tick and manage interest for ``duration`` s (``inf``: until cancelled)."""
    async with trio.open_nursery() as inner:
        inner.start_soon(player.manage_interest, nursery)
        await player.tick(rate, 0.0, trio.current_time() + duration)
        player.stop()


@asynccontextmanager
async def _played(stop: Shutdown) -> AsyncIterator[None]:
    """The game's block under ``stop.scope`` (so a signal ends it, not the node)."""
    with stop.scope:
        yield


async def _play_with_ui(player: Player, nursery: trio.Nursery, rate: float) -> None:
    from edge_examples._game_ui import run_ui

    async with trio.open_nursery() as inner:
        inner.start_soon(_play, player, nursery, rate, float("inf"))
        await run_ui(player)
        inner.cancel_scope.cancel()


# ------------------------------------------------------------- local fleet


async def run_local(args: argparse.Namespace, gmap: GameMap) -> int:
    """You and ``--bots`` bots, each a real node on 127.0.0.1, in this process."""
    from edge_examples._game_ui import run_ui  # curses only when there is a screen

    with tempfile.TemporaryDirectory(prefix="p2p-game-local-") as tmp:
        names = [f"bot{i}" for i in range(args.bots)] + ["you"]
        dirs = make_fleet(Path(tmp), names)
        crowd = _crowd(args)
        plans = plan_bots(gmap, args.bots, crowd, args.rng_seed, _hot(args))
        players = [PlayerSpec(p.index, p.name, str(dirs[p.index]), p) for p in plans]
        players.append(PlayerSpec(args.bots, "you", str(dirs[-1]), None))
        spec = ShardSpec(
            index=0,
            gmap=gmap,
            players=tuple(players),
            total=len(players),
            rate=args.rate,
            speed=args.speed,
        )
        async with Shard(spec) as shard:
            await shard.start()
            await shard.wait_members()
            await shard.subscribe()
            you = shard.players[-1]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(shard.run, time.time_ns(), float("inf"))
                await run_ui(you)
                nursery.cancel_scope.cancel()
    return 0


# --------------------------------------------------------------------- CLI


def _crowd(args: argparse.Namespace) -> int:
    """``--crowd``: a number of bots, or half of them by default."""
    if args.crowd == DEFAULT_CROWD:
        return int(args.bots) // 2
    if not str(args.crowd).isdigit():
        raise GameError(f"--crowd must be a number of bots, got {args.crowd!r}")
    return int(args.crowd)


def _hot(args: argparse.Namespace) -> Tile | None:
    return parse_tile(args.hot_tile) if args.hot_tile else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m edge_examples.game", description=(__doc__ or "").splitlines()[0]
    )
    mode = p.add_argument_group("mode")
    mode.add_argument("--headless", action="store_true", help="no UI: bots (and a report)")
    mode.add_argument("--local", action="store_true", help="play against bots on this host")
    mode.add_argument("--identity", type=Path, help="node directory: play on a LAN")
    game = p.add_argument_group("game")
    game.add_argument(
        "--bots", type=int, default=None, help="bot players (default 16; 5 with --local)"
    )
    game.add_argument(
        "--crowd",
        default=DEFAULT_CROWD,
        help="bots that walk into the hot tile and stay (default: half the bots)",
    )
    game.add_argument(
        "--hot-tile", default="", help="COL,ROW of the crowded tile (default: centre)"
    )
    game.add_argument("--rate", type=finite, default=20.0, help="state updates per second (20)")
    game.add_argument("--duration", type=finite, default=60.0, help="seconds of play (60)")
    game.add_argument(
        "--warmup", type=finite, default=2.0, help="seconds left out of latency statistics (2)"
    )
    game.add_argument("--map", default="4x4", help="tiles across x down (4x4)")
    game.add_argument("--tile-size", type=int, default=8, help="cells per tile side (8)")
    game.add_argument("--radius", type=int, default=1, help="tiles of interest around a player (1)")
    game.add_argument("--speed", type=finite, default=4.0, help="bot speed, cells per second (4)")
    game.add_argument("--rng-seed", type=int, default=1, help="random seed of the bots (1)")
    game.add_argument("--name", default="", help="your name on the map (LAN mode)")
    run = p.add_argument_group("run")
    run.add_argument("--report", type=Path, help="write the JSON report here")
    run.add_argument(
        "--ledger",
        type=Path,
        help="headless: also write every publication, subscription and receipt",
    )
    run.add_argument(
        "--procs",
        type=int,
        default=0,
        help="processes for the bots (default: one per 8 bots, at most the CPUs)",
    )
    run.add_argument(
        "--discovery",
        choices=("seeds", "mdns"),
        default="seeds",
        help="how the local fleet's nodes find each other (seeds)",
    )
    run.add_argument("--interface", default="127.0.0.1", help="address peers dial (127.0.0.1)")
    run.add_argument("--port", type=int, default=0, help="LAN mode: TCP port to listen on (any)")
    run.add_argument(
        "--seed",
        "--seed-peer",
        dest="peers",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="LAN mode: a peer to exchange members with",
    )
    run.add_argument("--no-mdns", action="store_true", help="LAN mode: seeds only")
    run.add_argument(
        "--settle",
        type=finite,
        default=2.0,
        help="LAN mode: seconds spent finding peers before joining tiles (2)",
    )
    run.add_argument(
        "--profile",
        default="",
        metavar="DIR",
        help="write cProfile statistics of every process to DIR",
    )
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    run.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    return p


def _procs(args: argparse.Namespace) -> int:
    if args.procs:
        return int(args.procs)
    return max(1, min(os.cpu_count() or 1, -(-int(args.bots) // 8)))


def _has_terminal() -> bool:
    """Whether the interactive modes' curses screen can start (keys in, a screen out)."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_cli(partial(_run, args), debug=args.debug, prog="game")


def _run(args: argparse.Namespace) -> int:
    try:
        cols, rows = parse_size(args.map)
        gmap = GameMap(cols, rows, args.tile_size, args.radius)
        for peer in args.peers:
            parse_address(peer)
        if args.local and (args.headless or args.identity is not None):
            other = "--headless" if args.headless else "--identity"
            raise GameError(f"--local is its own mode (you against bots here), not with {other}")
        interactive = args.local or (args.identity is not None and not args.headless)
        if interactive and not _has_terminal():
            # curses failed deep inside the node's nursery, with a traceback
            if args.local:
                raise GameError("--local draws the map in a terminal; without one, use --headless")
            raise GameError(
                "--identity without --headless draws the map in a terminal; add --headless"
                " to run a bot"
            )
        if args.identity is not None:
            if args.duration <= 0 or not 0 < args.rate <= 100:
                raise GameError("--duration must be positive and --rate in (0, 100]")
            return trio.run(run_lan_player, args, gmap)
        if args.bots is None:
            args.bots = 5 if args.local else 16
        if args.local:
            if not 0 <= args.bots <= 64:
                raise GameError("--bots must be 0..64")
            logging.getLogger("p2p").setLevel(logging.ERROR)
            return trio.run(run_local, args, gmap)
        if not args.headless:
            raise GameError("choose --headless (bots and a report), --local or --identity NODE_DIR")
        cfg = RunConfig(
            bots=args.bots,
            crowd=_crowd(args),
            rate=args.rate,
            duration=args.duration,
            gmap=gmap,
            hot=_hot(args),
            speed=args.speed,
            procs=_procs(args),
            seed=args.rng_seed,
            warmup=args.warmup,
            discovery=args.discovery,
            interface=args.interface,
            profile_dir=args.profile,
        )
        return run_benchmark(cfg, args.report, quiet=args.quiet, ledger_path=args.ledger)
    except ValueError as exc:  # a malformed --map or --hot-tile
        raise GameError(str(exc)) from None


if __name__ == "__main__":
    sys.exit(main())
