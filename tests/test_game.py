"""The tiled LAN game (``edge_examples.game``): its pure logic, its screen, and short
headless runs of real nodes, in this process and through the command line.

No test asserts the latency targets: this host is shared and noisy.  The
benchmark numbers live in ``docs/game.md``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from edge_examples._game_ledger import (
    Interval,
    Ledger,
    Pub,
    Receipt,
    ReceiptLog,
    check_deliveries,
    check_order,
)
from edge_examples._game_logic import (
    GameMap,
    StateUpdate,
    Tile,
    Walker,
    WorldView,
    interest_change,
    parse_size,
    parse_tile,
    plan_bots,
)
from edge_examples._game_net import Manual
from edge_examples._game_report import (
    RunInfo,
    build_report,
    latency_summary,
    percentile,
    summary_lines,
)
from edge_examples._game_run import GameError, RunConfig, run_headless
from edge_examples._game_ui import Seen, Snapshot, compose
from p2p._identity import add_node, init_fleet

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ the map


def test_tiles_cover_the_map_and_clamp_outside() -> None:
    g = GameMap(cols=4, rows=3, tile_size=8)
    assert (g.width, g.height) == (32, 24)
    assert g.tile_of(0, 0) == Tile(0, 0)
    assert g.tile_of(7.99, 8.0) == Tile(0, 1)
    assert g.tile_of(31.5, 23.5) == Tile(3, 2)
    assert g.tile_of(-5, 100) == Tile(0, 2)  # clamped onto the map
    assert [g.tile_at(g.index(t)) for t in g.tiles()] == g.tiles()
    assert len({g.topic(t) for t in g.tiles()}) == 12


@pytest.mark.parametrize(
    ("tile", "radius", "size"),
    [(Tile(0, 0), 1, 4), (Tile(1, 0), 1, 6), (Tile(1, 1), 1, 9), (Tile(3, 3), 1, 4),
     (Tile(1, 1), 0, 1), (Tile(0, 0), 3, 16)],
)  # fmt: skip
def test_neighbourhood_is_the_clipped_square_around_the_tile(
    tile: Tile, radius: int, size: int
) -> None:
    g = GameMap(radius=radius)
    hood = g.neighbourhood(tile)
    assert len(hood) == size
    assert tile in hood
    assert all(max(abs(t.col - tile.col), abs(t.row - tile.row)) <= radius for t in hood)


tiles_4x4 = st.builds(Tile, st.integers(0, 3), st.integers(0, 3))


@given(joined=st.frozensets(tiles_4x4), here=tiles_4x4, radius=st.integers(0, 2))
def test_interest_change_reaches_the_neighbourhood_and_never_leaves_here(
    joined: frozenset[Tile], here: Tile, radius: int
) -> None:
    g = GameMap(radius=radius)
    join, leave = interest_change(g, joined, here)
    assert (joined | set(join)) - set(leave) == g.neighbourhood(here)
    assert here not in leave
    assert not set(join) & joined
    assert set(leave) <= joined


def test_moving_one_tile_right_swaps_a_column() -> None:
    g = GameMap()
    join, leave = interest_change(g, g.neighbourhood(Tile(1, 1)), Tile(2, 1))
    assert join == [Tile(3, 0), Tile(3, 1), Tile(3, 2)]
    assert leave == [Tile(0, 0), Tile(0, 1), Tile(0, 2)]


def test_parsers() -> None:
    assert parse_size("4x3") == (4, 3)
    assert parse_tile("2,1") == Tile(2, 1)
    for bad in ("4", "x3", "ax4"):
        with pytest.raises(ValueError, match="COLSxROWS"):
            parse_size(bad)
    with pytest.raises(ValueError, match="COL,ROW"):
        parse_tile("2;1")
    with pytest.raises(ValueError, match="tile size"):
        GameMap(tile_size=1)


# ------------------------------------------------------------ state updates


@given(
    player=st.integers(0, 2**64 - 1),
    seq=st.integers(0, 2**32 - 1),
    x=st.integers(0, 2**16 - 1),
    y=st.integers(0, 2**16 - 1),
    sent=st.integers(0, 2**64 - 1),
    name=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=8),
)
def test_state_update_round_trips(
    player: int, seq: int, x: int, y: int, sent: int, name: str
) -> None:
    update = StateUpdate(player, seq, x, y, sent, name)
    data = update.encode()
    assert len(data) == 32
    assert StateUpdate.decode(data) == update


def test_state_update_rejects_other_payloads_and_truncates_names() -> None:
    assert StateUpdate.decode(b"hello") is None
    assert StateUpdate.decode(b"\0" * 33) is None
    got = StateUpdate.decode(StateUpdate(1, 2, 3, 4, 5, "a-long-name").encode())
    assert got is not None
    assert got.name == "a-long-n"


# --------------------------------------------------------------------- bots


def test_crowders_start_outside_the_hot_tile_walk_in_and_stay() -> None:
    g = GameMap()
    hot = Tile(1, 1)
    plans = plan_bots(g, 6, 4, seed=3, hot=hot)
    assert plans == plan_bots(g, 6, 4, seed=3, hot=hot)  # deterministic
    assert [p.home for p in plans] == [hot] * 4 + [None] * 2
    for plan in plans[:4]:
        assert g.tile_of(*plan.start) != hot
        walker = Walker.from_plan(g, plan, speed=4.0)
        for _ in range(20 * 30):  # 30 s at 20 Hz: far enough to cross the map
            walker.step(0.05, lambda t: True)
        tiles = set()
        for _ in range(20 * 20):
            tiles.add(g.tile_of(*walker.step(0.05, lambda t: True)))
        assert tiles == {hot}


def test_walker_never_steps_onto_a_refused_tile() -> None:
    g = GameMap()
    plan = plan_bots(g, 1, 0, seed=5)[0]
    walker = Walker.from_plan(g, plan, speed=8.0)
    start = g.tile_of(walker.x, walker.y)
    for _ in range(2000):
        x, y = walker.step(0.05, lambda t: t == start)
        assert g.tile_of(x, y) == start
        assert 0 <= x < g.width
        assert 0 <= y < g.height


def test_plan_rejects_a_crowd_bigger_than_the_bots_and_a_hot_tile_off_the_map() -> None:
    with pytest.raises(ValueError, match="crowd"):
        plan_bots(GameMap(), 2, 3, seed=1)
    with pytest.raises(ValueError, match="outside"):
        plan_bots(GameMap(), 2, 1, seed=1, hot=Tile(4, 0))


def test_manual_moves_one_cell_within_the_map_and_the_joined_tiles() -> None:
    g = GameMap()
    m = Manual(g, 7.5, 0.5)
    joined = {Tile(0, 0)}
    assert not m.nudge(0, -1, joined.__contains__)  # off the map
    assert not m.nudge(1, 0, joined.__contains__)  # tile (1, 0) not joined
    assert (m.x, m.y) == (7.5, 0.5)
    joined.add(Tile(1, 0))
    assert m.nudge(1, 0, joined.__contains__)
    assert g.tile_of(m.x, m.y) == Tile(1, 0)


def test_world_view_keeps_only_the_newest_update_of_each_player() -> None:
    view = WorldView()
    assert view.apply(StateUpdate(7, 5, 1, 1, 100, "a"), now_ns=200)
    assert not view.apply(StateUpdate(7, 4, 9, 9, 150, "a"), now_ns=300)  # stale, other tile
    assert view.latest[7].x == 1
    assert view.latency_ns[7] == 100
    assert [u.player for u in view.visible(now_ns=1_000)] == [7]
    assert view.visible(now_ns=3_000_000_000) == []


# ------------------------------------------------------------------ checks


def test_order_check_separates_fifo_violations_from_stale_tile_crossings() -> None:
    ok = [Receipt(1, 2, s, 0, s, 10) for s in (0, 1, 2)]
    assert check_order(ok).ok
    crossing = [Receipt(1, 2, 4, 1, 4, 10), Receipt(1, 2, 3, 0, 3, 10)]  # new tile overtook old
    got = check_order(ok + crossing)
    assert (got.ok, got.violations, got.cross_tile_stale, got.streams) == (True, 0, 1, 2)
    bad = check_order([*ok, Receipt(1, 2, 1, 0, 1, 10)])
    assert (bad.ok, bad.violations) == (False, 1)


SECOND = 1_000_000_000


def _ledger() -> Ledger:
    """Player 2 publishes on tile 0 at t=0..9 s; player 1 subscribes to tile 0
    from 2 s (acknowledged at 3 s) to 7 s."""
    s = SECOND
    led = Ledger(names={1: "a", 2: "b"})
    led.pubs = [Pub(2, i, 0, i * s) for i in range(10)]
    led.intervals = [Interval(1, 0, 2 * s, 3 * s, 7 * s), Interval(2, 0, 0, 0, None)]
    return led


def test_delivery_check_bounds_what_a_subscription_must_and_may_receive() -> None:
    led = _ledger()
    # may: sent in [2 s, 7 s] -> seq 2..7; must: sent from 3 s on and before the
    # newest one received from the same player (FIFO) -> seq 3..5
    led.receipts = ReceiptLog([Receipt(1, 2, s, 0, s * SECOND, 5) for s in (2, 3, 4, 5, 6)])
    got = check_deliveries(led)
    assert (got.expected_min, got.expected_max, got.receipts) == (3, 6, 5)
    assert got.ok
    led.receipts = ReceiptLog([Receipt(1, 2, s, 0, s * SECOND, 5) for s in (1, 3, 3, 5, 6, 8)])
    got = check_deliveries(led)
    assert (got.missing, got.unexpected, got.duplicates) == (1, 2, 1)  # 4; 1 and 8; 3
    assert not got.ok


def test_a_subscription_that_lasts_to_the_end_must_receive_everything_after_its_ack() -> None:
    led = _ledger()
    led.intervals[0] = led.intervals[0]._replace(end_ns=None)
    led.receipts = ReceiptLog([Receipt(1, 2, s, 0, s * SECOND, 5) for s in (3, 4, 5, 6, 7, 8)])
    got = check_deliveries(led)
    assert (got.expected_min, got.expected_max, got.missing) == (7, 8, 1)  # seq 9 missing


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 101))
    assert [percentile(values, q) for q in (50, 95, 99, 100)] == [50, 95, 99, 100]
    s = latency_summary([1000 * v for v in range(1, 201)])  # 1..200 ms
    assert (s["p50"], s["p95"], s["p99"], s["max"]) == (100.0, 190.0, 198.0, 200.0)
    assert s["within_150ms"] == 0.75
    assert s["within_200ms"] == 1.0
    assert latency_summary([]) == {"count": 0}


def test_report_has_every_section_and_judges_the_targets() -> None:
    led = _ledger()
    led.receipts = ReceiptLog(
        [Receipt(1, 2, s, 0, s * SECOND, 1000 * (10 + s)) for s in range(2, 7)]
    )
    info = RunInfo(start_ns=0, duration=10.0, warmup=0.0, config={"players": 2})
    report = build_report(GameMap(), led, info)
    assert set(report) >= {"config", "overall", "tiles", "in_order", "delivery", "targets"}
    tile = report["tiles"]["game/tile/0,0"]
    assert (tile["publishers"], tile["updates"], tile["receipts"]) == (1, 10, 5)
    assert tile["latency_ms"]["max"] == 16.0
    assert report["targets"]["95%_within_150ms"]["met"]
    assert report["targets"]["all_met"]
    assert any("in order: yes" in line for line in summary_lines(report))
    partial = build_report(GameMap(), led, info, full=False)
    assert partial["delivery"] is None


# ------------------------------------------------------------------ screen


def test_screen_shows_you_the_others_and_only_joined_tiles() -> None:
    g = GameMap()
    snap = Snapshot(
        g, "me", 12, 11, g.neighbourhood(Tile(1, 1)), (Seen("bot0", 9, 10, 3.2),), 42, "hi"
    )
    lines = compose(snap, 80, 40)
    assert len(lines) <= 40
    assert all(len(line) <= 80 for line in lines)
    assert lines[1 + 11][12] == "@"
    assert lines[1 + 10][9] == "A"
    assert lines[1 + 30][5] == " "  # tile (0, 3): not joined, out of view
    assert lines[1 + 20][5] == "."  # tile (0, 2): joined
    assert any("A bot0" in line for line in lines)
    assert lines[-1] == "hi"
    small = compose(snap, 50, 12)  # the viewport follows the player
    assert len(small) <= 12
    assert any("@" in line for line in small)


# ---------------------------------------------------------- real nodes


def _run(cfg: RunConfig, tmp_path: Path) -> tuple[Ledger, RunInfo]:
    async def main() -> tuple[Ledger, RunInfo]:
        return await run_headless(cfg, tmp_path, lambda _: None)

    return trio.run(main)


def test_stationary_players_receive_exactly_what_their_neighbourhoods_promise(
    tmp_path: Path,
) -> None:
    """Nobody changes tile (speed ~0), so every subscription spans the whole run and
    the receipts are exactly: for each update on tile t, every other player whose
    neighbourhood holds t (computed here from the plans and the map alone)."""
    g = GameMap()
    cfg = RunConfig(bots=5, crowd=3, rate=20.0, duration=3.0, speed=0.001, warmup=0.5, gmap=g)
    ledger, info = _run(cfg, tmp_path)
    plans = plan_bots(g, cfg.bots, cfg.crowd, cfg.seed, cfg.hot_tile)
    names = {v: k for k, v in ledger.names.items()}
    home = {names[p.name]: g.tile_of(*p.start) for p in plans}
    watchers = {t: {q for q, tile in home.items() if t in g.neighbourhood(tile)} for t in g.tiles()}
    expected: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for pub in ledger.pubs:
        assert pub.tile == g.index(home[pub.player])
        for q in watchers[g.tile_at(pub.tile)] - {pub.player}:
            expected[q].add((pub.player, pub.seq))
    got: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in ledger.receipts:
        got[r.subscriber].append((r.player, r.seq))
    assert {q: sorted(v) for q, v in got.items()} == {q: sorted(v) for q, v in expected.items()}
    assert len(ledger.pubs) >= 5 * 20 * 3 * 0.8
    report = build_report(g, ledger, info)
    assert report["in_order"]["ok"]
    assert report["delivery"]["ok"]
    assert report["delivery"]["expected_min"] == len(ledger.receipts)


def test_moving_players_get_every_update_their_subscriptions_allow(tmp_path: Path) -> None:
    """Fast bots change tiles (join/leave): each receipt falls in a subscription of
    its tile, nothing arrives twice or out of order, and every update published
    while a subscription was established (and not about to end) arrives."""
    g = GameMap(cols=3, rows=3, tile_size=4)
    cfg = RunConfig(bots=5, crowd=2, duration=4.0, speed=12.0, warmup=0.5, gmap=g, seed=7)
    ledger, info = _run(cfg, tmp_path)
    changes = sum(iv.end_ns is not None for iv in ledger.intervals)
    assert changes > 0, "the bots should have left some tiles"
    sent = {(p.player, p.seq): p for p in ledger.pubs}
    by_sub: dict[tuple[int, int], list[Interval]] = defaultdict(list)
    for iv in ledger.intervals:
        by_sub[(iv.player, iv.tile)].append(iv)
    seen = set()
    for r in ledger.receipts:
        pub = sent[(r.player, r.seq)]
        assert pub.tile == r.tile
        assert any(
            iv.call_ns <= pub.sent_ns and (iv.end_ns is None or pub.sent_ns <= iv.end_ns)
            for iv in by_sub[(r.subscriber, r.tile)]
        )
        assert (r.subscriber, r.player, r.seq) not in seen
        seen.add((r.subscriber, r.player, r.seq))
    for (sub, tile), ivs in by_sub.items():
        for iv in ivs:
            if iv.acked_ns is None or iv.end_ns is not None:
                continue  # established until the end: the must-arrive case
            for pub in ledger.pubs:
                if pub.tile == tile and pub.player != sub and pub.sent_ns >= iv.acked_ns:
                    assert (sub, pub.player, pub.seq) in seen
    report = build_report(g, ledger, info)
    assert report["in_order"]["ok"]
    assert report["delivery"]["ok"], report["delivery"]


def test_run_config_rejects_bad_settings() -> None:
    with pytest.raises(GameError, match="crowd"):
        RunConfig(bots=4, crowd=5)
    with pytest.raises(GameError, match="procs"):
        RunConfig(bots=2, crowd=0, procs=3)
    with pytest.raises(GameError, match="warmup"):
        RunConfig(duration=1.0, warmup=2.0)


def _game(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge_examples.game", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _check_report(report: dict[str, Any], players: int) -> None:
    assert report["config"]["players"] == players
    assert report["in_order"] == {**report["in_order"], "ok": True, "violations": 0}
    delivery = report["delivery"]
    assert delivery["ok"], delivery
    assert delivery["expected_min"] <= delivery["receipts"] <= delivery["expected_max"]
    assert report["overall"]["receipts"] == delivery["receipts"]
    assert sum(t["receipts"] for t in report["tiles"].values()) == delivery["receipts"]
    assert sum(t["updates"] for t in report["tiles"].values()) == report["overall"]["updates"]
    for tile in report["tiles"].values():
        lat = tile["latency_ms"]
        if lat["count"]:
            assert 0 <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert set(report["targets"]) == {
        "95%_within_150ms", "99%_within_200ms", "in_order", "all_met"
    }  # fmt: skip
    assert len(report["players"]) == players


def test_cli_headless_run_in_two_processes_writes_a_consistent_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = _game(
        "--headless", "--bots", "4", "--crowd", "2", "--duration", "3", "--warmup", "0.5",
        "--procs", "2", "--map", "3x3", "--tile-size", "4", "--speed", "8", "--report", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    _check_report(report, 4)
    assert report["config"]["procs"] == 2
    hot = report["tiles"]["game/tile/1,1"]
    assert hot["publishers"] >= 2
    assert "in order: yes" in done.stdout
    assert "nodes up" in done.stderr  # progress on stderr


def test_cli_rejects_bad_arguments() -> None:
    for args in (
        ["--headless", "--bots", "2", "--crowd", "3"],
        ["--map", "4by4", "--headless"],
        [],
    ):
        done = _game(*args)
        assert done.returncode == 2
        assert "game: error:" in done.stderr


def test_interactive_modes_without_a_terminal_say_so(tmp_path: Path) -> None:
    """``--local`` (and ``--identity`` without ``--headless``) start curses;
    with no terminal that failed with a traceback from inside the node."""
    for args, fragment in (
        (["--local", "--bots", "2"], "--local draws the map in a terminal"),
        (["--identity", str(tmp_path)], "add --headless to run a bot"),
        (["--local", "--headless"], "--local is its own mode"),
    ):
        done = _game(*args)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1
        assert fragment in lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_two_lan_bots_with_a_static_seed_see_each_other(tmp_path: Path) -> None:
    """LAN mode, headless: two processes, one identity each, no multicast."""
    init_fleet(tmp_path / "fleet", psk=True)
    for name in ("alice", "bob"):
        add_node(tmp_path / "fleet", tmp_path / name, name=name)
    port = _free_port()
    common = ["--headless", "--no-mdns", "--radius", "3", "--duration", "4", "--settle", "1.5"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "edge_examples.game", "--identity", str(tmp_path / name),
             "--report", str(tmp_path / f"{name}.json"), *extra, *common],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for name, extra in (
            ("alice", ["--port", str(port)]),
            ("bob", ["--seed-peer", f"127.0.0.1:{port}"]),
        )
    ]  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    for name in ("alice", "bob"):
        report = json.loads((tmp_path / f"{name}.json").read_text())
        assert report["in_order"]["ok"]
        assert report["delivery"] is None  # one player's ledger cannot check others' sends
        assert report["overall"]["receipts"] > 0, f"{name} saw nobody"
