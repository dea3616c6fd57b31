"""``p2p telemetry aggregate`` and ``p2p telemetry generate``.

::

    p2p telemetry aggregate LANDING_DIR --out OUT_DIR [--master local[*]]
                            [--since ISO] [--until ISO] [--window SECONDS]
    p2p telemetry generate --devices D --hours H --out LANDING_DIR [--seed S]

``aggregate`` needs the ``spark`` extra (PySpark and Java 17+); ``generate``
is pure Python.  Nothing here imports PySpark until ``aggregate`` runs.
Errors are :class:`~p2p.telemetry.TelemetryError` (a :class:`P2PError`):
``p2p`` prints them on one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from p2p._cliargs import finite, nonempty
from p2p.telemetry._schema import TelemetryError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``telemetry`` command with its ``aggregate`` and ``generate`` subcommands."""
    tel = sub.add_parser("telemetry", help="fleet telemetry: Spark aggregation, synthetic data")
    tsub = tel.add_subparsers(dest="telemetry_command", required=True)

    agg = tsub.add_parser(
        "aggregate",
        help="aggregate landing files with Spark (the 'spark' extra)",
        description="Decode, validate and aggregate LANDING_DIR into Parquet tables, "
        "summary.json and report.html under OUT_DIR.",
    )
    agg.add_argument(
        "landing", type=nonempty, metavar="LANDING_DIR", help="landing directory (path or URI)"
    )
    agg.add_argument(
        "--out", type=nonempty, required=True, metavar="OUT_DIR", help="output directory"
    )
    agg.add_argument(
        "--master", default="local[*]", help="Spark master (default local[*]; e.g. spark://h:7077)"
    )
    agg.add_argument("--since", metavar="ISO", help="first record time kept (date/datetime, UTC)")
    agg.add_argument("--until", metavar="ISO", help="records from this time on are left out")
    agg.add_argument(
        "--window", type=finite, default=3600.0, help="aggregation window in seconds (default 3600)"
    )
    agg.add_argument("--partitions", type=int, help="decode tasks (default: by size, >= 2/core)")
    agg.add_argument("--driver-memory", default="2g", help="Spark driver memory (default 2g)")
    agg.add_argument("--no-report", action="store_true", help="skip report.html")
    agg.add_argument("--ui", action="store_true", help="enable the Spark web UI")
    agg.add_argument("--quiet", action="store_true", help="no progress on stderr")

    gen = tsub.add_parser(
        "generate",
        help="write synthetic telemetry in the landing layout",
        description="Synthetic fleet telemetry (skewed topics, diurnal load, crashes, "
        "corrupt records) in the landing layout; deterministic by --seed.",
    )
    gen.add_argument("--devices", type=int, required=True, help="number of devices")
    gen.add_argument("--hours", type=finite, required=True, help="hours of telemetry")
    gen.add_argument(
        "--out", type=nonempty, required=True, metavar="LANDING_DIR", help="new or empty directory"
    )
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("--start", metavar="ISO", help="first instant (default 2026-03-02, UTC)")
    gen.add_argument("--window", type=finite, default=60.0, help="record window in seconds")
    gen.add_argument("--jobs", type=int, help="worker processes (default: one per core)")
    gen.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _add_collect(tsub)


def _add_collect(tsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    col = tsub.add_parser(
        "collect",
        help="receive the fleet's telemetry uploads into a landing directory",
        description="Run a collector: devices started with --telemetry SPOOL_DIR "
        "--collector HOST:PORT upload their spools here over fleet connections.",
    )
    col.add_argument("landing", type=nonempty, metavar="LANDING_DIR", help="landing directory")
    col.add_argument(
        "--identity", type=nonempty, required=True, help="the collector's node directory"
    )
    col.add_argument("--interface", default="127.0.0.1", help="address to listen on")
    col.add_argument("--port", type=int, default=7478, help="TCP port (default 7478)")
    col.add_argument("--duration", type=finite, help="seconds to run (default: until Ctrl-C)")


def cmd_telemetry(args: argparse.Namespace) -> int:
    if args.telemetry_command == "generate":
        return _generate(args)
    if args.telemetry_command == "collect":
        return _collect(args)
    return _aggregate(args)


def _collect(args: argparse.Namespace) -> int:
    import logging

    import trio

    from p2p._identity import load_node
    from p2p._shutdown import graceful
    from p2p.telemetry._collector import run_collector

    if not 0 <= args.port < 65536:
        raise TelemetryError(f"--port must be in 0..65535, got {args.port}")
    if args.duration is not None and not args.duration > 0:  # also NaN
        raise TelemetryError(f"--duration must be positive, got {args.duration}")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    identity, fleet = load_node(args.identity)

    async def serve() -> int:
        async with graceful(args.duration or None) as stop, trio.open_nursery() as nursery:
            with stop.scope:  # a signal or the end of --duration: stop serving, no traceback
                collector = await nursery.start(
                    lambda task_status: run_collector(
                        identity, fleet, args.landing, interface=args.interface,
                        port=args.port, task_status=task_status,
                    )
                )  # fmt: skip
                print(f"collecting on {args.interface}:{collector.port} into {args.landing}",
                      file=sys.stderr, flush=True)  # fmt: skip
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()
        return stop.exit_code

    return trio.run(serve)


def _generate(args: argparse.Namespace) -> int:
    from p2p.telemetry._generate import _stderr, generate, parse_time

    if args.jobs is not None and args.jobs < 1:
        raise TelemetryError("--jobs must be at least 1")
    stats = generate(
        args.out,
        devices=args.devices,
        hours=args.hours,
        seed=args.seed,
        start=parse_time(args.start) if args.start else None,
        window=args.window,
        jobs=args.jobs,
        progress=None if args.quiet else _stderr,
    )
    print(json.dumps(stats, sort_keys=True))
    return 0


def _aggregate(args: argparse.Namespace) -> int:
    from p2p.telemetry._job import Options, parse_when, run

    if args.partitions is not None and args.partitions < 1:
        raise TelemetryError("--partitions must be at least 1")
    opts = Options(
        landing=args.landing,
        out=args.out,
        master=args.master,
        since=parse_when(args.since),
        until=parse_when(args.until),
        window=args.window,
        partitions=args.partitions,
        driver_memory=args.driver_memory,
        report=not args.no_report,
        progress=not args.quiet,
        ui=args.ui,
    )
    summary = run(opts)
    print(
        f"{summary['records_read']:,} records read: {summary['aggregated']:,} aggregated, "
        f"{summary['quarantined']:,} quarantined, {summary['duplicates_dropped']:,} duplicates "
        f"dropped, {summary['outside_range']:,} outside the range; tables in {args.out}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m p2p.telemetry._cli telemetry ...``: the same as ``p2p telemetry ...``."""
    parser = argparse.ArgumentParser(prog="p2p")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(argv)
    from p2p._shutdown import run_cli

    return run_cli(lambda: cmd_telemetry(args))


if __name__ == "__main__":
    sys.exit(main())
