"""The ``p2p`` command line.  ``p2p sim`` is a contract: outside scripts call it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from causal import PacketLimits
from p2p import fleet as fleet_api
from p2p._cliargs import check_output, finite, path_arg
from p2p._errors import P2PError
from p2p._identity import DEFAULT_VALID_DAYS, add_node, init_fleet, load_node
from p2p._revocation import REVOKED_FILE
from p2p._shutdown import run_cli
from p2p.cli._nodecli import add_parser as add_node_parser
from p2p.cli._nodecli import cmd_node, cmd_pub, cmd_status, cmd_sub
from p2p.sim import (
    AGGREGATION,
    DETECTOR,
    MEMBERSHIP,
    PROTOCOLS,
    Action,
    DelayModel,
    Simulation,
    load_scenario,
)
from p2p.sim._checkcli import add_parser as add_check_parser
from p2p.sim._checkcli import cmd_check
from p2p.sim._demo import chat_fleet
from p2p.telemetry._cli import add_parser as add_telemetry_parser
from p2p.telemetry._cli import cmd_telemetry
from topics import PubSubConfig


def _add_delay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rng-seed", type=int, default=0, help="seed of the simulator's random numbers (default 0)"
    )
    _old_seed_flag(p)
    p.add_argument("--tpp-mean", type=finite, default=100.0, help="mean propagation time t_pp")
    p.add_argument("--tpp-stdev", type=finite, default=25.0, help="stdev of t_pp")
    p.add_argument("--tpc", type=finite, default=1.0, help="processing time t_pc per input")
    p.add_argument("--tt", type=finite, default=1.0, help="transmission time t_t per packet")


def _old_seed_flag(p: argparse.ArgumentParser) -> None:
    """The simulator's RNG flag was ``--seed``; it now names only a real node's peer."""
    p.add_argument("--seed", dest="old_seed", help=argparse.SUPPRESS)


def _refuse_old_seed(args: argparse.Namespace) -> None:
    if getattr(args, "old_seed", None) is not None:
        raise P2PError(
            f"--seed is now --rng-seed {args.old_seed} (the simulator's random seed); "
            "--seed names a HOST:PORT peer of a real node"
        )


class _Version(argparse.Action):
    """``--version``: the package version and which build of the cores loads
    (``p2p._build``: ``pure``, ``mypyc``, or ``mixed`` for a stale partial build)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from p2p import __version__
        from p2p._build import build_kind

        print(f"p2p {__version__} ({build_kind()} build)")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p2p", description="VCube-PS peer-to-peer pub/sub")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("sim", help="run a scenario in the deterministic simulator")
    sim.add_argument("scenario", help="scenario file: time;ACTION;node;topic[;payload] per line")
    sim.add_argument("--nodes", type=int, required=True, help="number of nodes N (ids 0..N-1)")
    sim.add_argument("--protocol", choices=PROTOCOLS, default="vcube-ps")
    sim.add_argument(
        "--aggregation",
        choices=AGGREGATION,
        default="on",
        help="timer-free aggregation: on (causal + link coalescing, default), "
        "causal (holding back only: Algorithm 2 alone), off",
    )
    sim.add_argument("--mtu", type=int, default=1500, help="link packet size limit in bytes")
    sim.add_argument(
        "--round-messages",
        type=int,
        default=PubSubConfig().max_round_messages,
        help="most publications a source sends per ACK round "
        f"(default {PubSubConfig().max_round_messages}; 1 = the thesis' stop-and-wait)",
    )
    _add_delay_args(sim)
    sim.add_argument("--metrics", type=path_arg, help="write METRICS.json here")
    sim.add_argument("--trace", type=path_arg, help="write TRACE.jsonl here")
    sim.add_argument(
        "--oracle-subscriptions",
        action="store_true",
        help="SUB lines at time 0 are known everywhere from the start (no SUB traffic)",
    )
    sim.add_argument(
        "--membership",
        choices=MEMBERSHIP,
        default="detector",
        help="detector (default): each node runs NodeMachine with the real failure "
        "detector (the runtime's settings, 1 u.t. = 1 ms), which finds CRASH and RECOVER; "
        "oracle: the thesis' model, bare cores told of failures after "
        "1000 + U(0, 500) u.t.",
    )
    sim.add_argument(
        "--discovery",
        choices=("full", "seed"),
        default="full",
        help="full (default): every node knows every other at start; seed: each knows only "
        "node 0, as with --seed and no mDNS, and learns the rest from membership records "
        "(needs --membership detector)",
    )
    sim.add_argument("--quiet", action="store_true", help="print no summary")

    demo = sub.add_parser("demo", help="simulate the embedded default fleet and print a summary")
    demo.add_argument("--nodes", type=int, default=64)
    demo.add_argument("--messages", type=int, default=256)
    demo.add_argument("--rng-seed", type=int, default=1, help="random seed (default 1)")
    _old_seed_flag(demo)
    demo.add_argument("--metrics", type=path_arg, help="write the VCube-PS METRICS.json here")
    _add_fleet_parser(sub)
    add_node_parser(sub)
    add_telemetry_parser(sub)
    add_check_parser(sub)
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print the version and the build (pure or mypyc)",
    )
    _debug_everywhere(parser)
    return parser


def _debug_everywhere(parser: argparse.ArgumentParser) -> None:
    """``--debug`` is accepted after any subcommand too (``p2p node ... --debug``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                hidden = argparse.SUPPRESS
                child.add_argument("--debug", action="store_true", default=hidden, help=hidden)
                _debug_everywhere(child)


def _add_fleet_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fleet = sub.add_parser("fleet", help="create fleets and member node identities")
    fsub = fleet.add_subparsers(dest="fleet_command", required=True)
    init = fsub.add_parser("init", help="create a fleet (signing key, or --psk) in FLEET_DIR")
    init.add_argument("fleet_dir", type=path_arg, metavar="FLEET_DIR")
    init.add_argument("--psk", action="store_true", help="pre-shared-key fleet (quick start)")
    init.add_argument("--name", help="fleet name (default: the directory name)")
    add = fsub.add_parser("add-node", help="create (or re-certify) a member identity in NODE_DIR")
    add.add_argument("fleet_dir", type=path_arg, metavar="FLEET_DIR")
    add.add_argument("node_dir", type=path_arg, metavar="NODE_DIR")
    add.add_argument("--name", help="node name in its certificate (default: the directory name)")
    add.add_argument(
        "--valid-days",
        type=finite,
        default=DEFAULT_VALID_DAYS,
        help=f"certificate lifetime (default {DEFAULT_VALID_DAYS}; run add-node again to renew)",
    )
    show = fsub.add_parser("show", help="print a member node's id (hex) and fleet")
    show.add_argument("node_dir", type=path_arg, metavar="NODE_DIR")
    rev = fsub.add_parser("revoke", help="revoke member nodes (writes FLEET_DIR/revoked.cbor)")
    rev.add_argument("fleet_dir", type=path_arg, metavar="FLEET_DIR")
    rev.add_argument("nodes", nargs="+", metavar="NODE", help="a node id (hex) or a NODE_DIR")
    rev.add_argument(
        "--to",
        type=path_arg,
        action="append",
        default=[],
        metavar="NODE_DIR",
        help="also copy the list into this member's directory (it spreads from there)",
    )


def cmd_fleet(args: argparse.Namespace) -> int:
    if args.fleet_command == "init":
        fleet = init_fleet(args.fleet_dir, psk=args.psk, name=args.name)
        secret = "fleet.psk" if fleet.mode == "psk" else "fleet.key"
        print(f"fleet {fleet.name!r} ({fleet.mode} mode) created in {args.fleet_dir}")
        print(f"keep {args.fleet_dir / secret} secret: it admits new members")
    elif args.fleet_command == "add-node":
        identity = add_node(
            args.fleet_dir, args.node_dir, name=args.name, valid_days=args.valid_days
        )
        print(f"node {identity.node_id:016x} in {args.node_dir}")
    elif args.fleet_command == "revoke":
        return cmd_revoke(args)
    else:
        identity, fleet = load_node(args.node_dir)
        name = identity.certificate.name if identity.certificate else "-"
        print(f"{identity.node_id:016x} {name} fleet={fleet.name} mode={fleet.mode}")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    """``p2p fleet revoke``: add nodes to the fleet's signed revocation list."""
    rl = fleet_api.revoke(args.fleet_dir, args.nodes, to=args.to)
    path = args.fleet_dir / REVOKED_FILE
    print(f"revocation list {rl.serial}: {len(rl.nodes)} nodes revoked ({path})")
    return 0


def _check_nodes(n: int) -> None:
    if not 1 <= n <= 1 << 16:
        raise P2PError(f"--nodes must be between 1 and 65536, got {n}")


def run_actions(
    actions: Sequence[Action],
    nodes: int,
    *,
    protocol: str,
    delays: DelayModel,
    seed: int,
    oracle: bool = False,
    record_trace: bool = True,
    progress: bool = False,
    aggregation: str = "on",
    mtu: int = 1500,
    round_messages: int | None = None,
    membership: str = "detector",
    discovery: str = "full",
) -> Simulation:
    """Run scenario ``actions`` on ``nodes`` dense ids and return the finished simulation.

    ``membership``: ``detector`` (NodeMachine and the real failure detector; only
    ``vcube-ps`` has one, the other protocols run without failures) or ``oracle``."""
    detector = DETECTOR if membership == "detector" and protocol == "vcube-ps" else None
    intro = None
    if discovery == "seed":
        if detector is None:
            raise P2PError("--discovery seed needs --membership detector and --protocol vcube-ps")
        intro = {n: [0] for n in range(1, nodes)}
    sim = Simulation(
        list(range(nodes)),
        protocol=protocol,
        delays=delays,
        seed=seed,
        record_trace=record_trace,
        aggregation=aggregation,
        limits=PacketLimits(mtu=mtu),
        config=None if round_messages is None else PubSubConfig(max_round_messages=round_messages),
        detector=detector,
        introductions=intro,
    )
    if protocol == "causal-broadcast":
        actions = _broadcast_actions(sim, actions)
    if oracle:
        presets: dict[str, list[int]] = {}
        rest = []
        for a in actions:
            if a.action == "SUB" and a.time == 0:
                presets.setdefault(a.topic, []).append(a.node)
            else:
                rest.append(a)
        for topic, subs in presets.items():
            sim.preset_subscriptions(topic, subs)
        actions = rest
    for a in actions:
        sim.schedule(a.time, a.action, a.node, a.topic, a.payload)
    started = time.monotonic()
    last = started
    while sim.run(max_events=200_000):
        now = time.monotonic()
        if progress and now - last > 2:
            last = now
            sent = sum(sim.recorder.packets.values())
            print(
                f"  ... simulated t={sim.now:.0f} u.t., {sent} packets, {now - started:.0f} s",
                file=sys.stderr,
            )
    return sim


def _broadcast_actions(sim: Simulation, actions: Sequence[Action]) -> list[Action]:
    """Causal broadcast has no subscriptions: every node delivers every message.

    Its trace still names topics (each PUB line's), so every node is recorded
    as subscribed to each of them from time 0.
    """
    bad = [a for a in actions if a.action != "PUB"]
    if bad:
        raise P2PError(
            f"line {bad[0].line}: causal-broadcast has no subscriptions "
            f"({bad[0].action}); give PUB lines only"
        )
    for topic in dict.fromkeys(a.topic for a in actions):
        sim.preset_subscriptions(topic, sim.ids)
    return list(actions)


def _summary(sim: Simulation, label: str, wall: float) -> str:
    m = sim.recorder.metrics()
    lat = m["latency"]
    return (
        f"{label:>9}: {m['publications']} publications, {m['deliveries']} deliveries, "
        f"packets {m['packets']['total']} (PUB {m['packets']['PUB']}, SUB {m['packets']['SUB']}, "
        f"UNS {m['packets']['UNS']}, ACK {m['packets']['ACK']}), "
        f"link packets {m['link']['packets']}, held back {m['link']['held_back']}, "
        f"false positives {m['false_positives']}, delivery latency mean "
        f"{lat['delivery']['mean']:.1f} / p99 {lat['delivery']['p99']:.1f} u.t. "
        f"[{wall:.2f} s wall]"
    )


def cmd_sim(args: argparse.Namespace) -> int:
    _refuse_old_seed(args)
    _check_nodes(args.nodes)
    if not 64 <= args.mtu <= 1 << 20:
        raise P2PError(f"--mtu must be between 64 and 1048576 bytes, got {args.mtu}")
    if args.round_messages < 1:
        raise P2PError(f"--round-messages must be >= 1, got {args.round_messages}")
    check_output(args.metrics, "--metrics")
    check_output(args.trace, "--trace")
    actions = load_scenario(args.scenario, args.nodes)
    delays = DelayModel(tpc=args.tpc, tt=args.tt, tpp_mean=args.tpp_mean, tpp_stdev=args.tpp_stdev)
    started = time.monotonic()
    sim = run_actions(
        actions,
        args.nodes,
        protocol=args.protocol,
        delays=delays,
        seed=args.rng_seed,
        oracle=args.oracle_subscriptions,
        record_trace=args.trace is not None,
        progress=not args.quiet,
        aggregation=args.aggregation,
        mtu=args.mtu,
        round_messages=args.round_messages,
        membership=args.membership,
        discovery=args.discovery,
    )
    wall = time.monotonic() - started
    if args.metrics:
        doc = sim.recorder.metrics()
        if sim.detector is not None:
            doc["membership"] = sim.membership_metrics()
        for key, extra in (("links", sim.link_metrics()), ("twins", sim.twin_metrics())):
            if extra:  # only runs with RESET or TWIN lines have these
                doc[key] = extra
        args.metrics.write_text(json.dumps(doc, indent=2) + "\n")
    if args.trace:
        with open(args.trace, "w", encoding="utf-8") as fh:
            sim.recorder.write_trace(fh)
    for t, node, action, topic, why in sim.recorder.refusals:
        print(f"refused at t={t:g}: node {node} {action} {topic}: {why}", file=sys.stderr)
    if not args.quiet:
        print(_summary(sim, args.protocol, wall))
        if sim.detector is not None and sim.recorder.failures:
            print(_membership_summary(sim))
        for line in _fault_summaries(sim):
            print(line)
    return 0


def _fault_summaries(sim: Simulation) -> list[str]:
    """One line each on what the links did under ``RESET`` lines and what
    second starts did under ``TWIN`` lines (nothing for runs without them)."""
    lines = []
    links, twins = sim.link_metrics(), sim.twin_metrics()
    if links:
        lines.append(
            f"links: {links['resets']} resets, {links['reconnects']} reconnects, "
            f"{links['frames_lost_in_flight']} frames lost in flight, "
            f"{links['frames_resent']} resent, {links['frames_duplicate']} duplicates dropped, "
            f"{links['lost_on_disconnect']} lost for good"
        )
    if twins:
        lines.append(
            f"twins: {twins['twins']} second starts, {twins['superseded']} older processes "
            f"stopped, {twins['elder_deliveries']} deliveries by them, "
            f"{twins['notices']} notices sent to them"
        )
    return lines


def _membership_summary(sim: Simulation) -> str:
    """One line on what the real failure detector did in a run with failures."""
    m = sim.membership_metrics()
    d = m["detection"]
    agreed = "agree on the members" if m["agreed"] else "DO NOT agree on the members"
    return (
        f"detector: {d['count']} detections of crashed nodes, latency median "
        f"{d['p50']:.0f} / max {d['max']:.0f} u.t. (bound {sim.detection_bound():.0f}), "
        f"{m['false_suspicions']} false suspicions, {m['reincarnations']} reincarnations; "
        f"at the end the nodes up {agreed}" + _revocation_summary(m)
    )


def _revocation_summary(m: dict[str, Any]) -> str:
    """With REVOKE in the run: how fast the members dropped the revoked nodes."""
    r = m.get("revocation")
    if r is None:
        return ""
    d = r["dropped"]
    return (
        f"\nrevocation: {r['revoked']} node(s) revoked, dropped {d['count']} times, "
        f"median {d['p50']:.0f} / max {d['max']:.0f} u.t. after the list's first holder"
    )


def cmd_demo(args: argparse.Namespace) -> int:
    _refuse_old_seed(args)
    _check_nodes(args.nodes)
    check_output(args.metrics, "--metrics")
    actions = chat_fleet(args.nodes, seed=args.rng_seed, messages=args.messages)
    print(
        f"Simulating a LAN-chat fleet of {args.nodes} nodes: {len(actions)} scenario events "
        f"(subscriptions, {args.messages} publications on 4 rooms, some leaves), "
        f"seed {args.rng_seed}"
    )
    results = {}
    runs = (("vcube-ps", "on"), ("vcube-ps", "off"), ("srpt", "off"))
    for protocol, aggregation in runs:
        started = time.monotonic()
        sim = run_actions(
            actions,
            args.nodes,
            protocol=protocol,
            delays=DelayModel(),
            seed=args.rng_seed,
            aggregation=aggregation,
        )
        label = protocol if protocol == "srpt" or aggregation == "on" else f"{protocol}/no-agg"
        results[label] = sim
        print(_summary(sim, label, time.monotonic() - started))
    vc = results["vcube-ps"].recorder.metrics()
    plain = results["vcube-ps/no-agg"].recorder.metrics()
    sr = results["srpt"].recorder.metrics()
    ratio = sr["latency"]["delivery"]["mean"] / max(vc["latency"]["delivery"]["mean"], 1e-9)
    saved = 1 - vc["link"]["packets"] / max(plain["link"]["packets"], 1)
    print(
        f"VCube-PS delivers in causal order per topic; its {vc['false_positives']} false "
        f"positives are temporary relays after unsubscribes. Timer-free aggregation "
        f"(holding back + link coalescing) saved {saved:.1%} of link packets "
        f"({vc['link']['held_back']} hold-backs). SRPT (no ordering, no ACKs, no "
        f"aggregation) mean delivery latency is {ratio:.2f}x VCube-PS's."
    )
    if args.metrics:
        args.metrics.write_text(json.dumps(vc, indent=2) + "\n")
        print(f"metrics written to {args.metrics}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; every expected failure is one line
    (``p2p: error: ...``, exit 2 for usage, 1 for runtime failures)."""
    args = build_parser().parse_args(argv)
    return run_cli(partial(_dispatch, args), debug=args.debug)


def _dispatch(args: argparse.Namespace) -> int:
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "sim": cmd_sim,
        "fleet": cmd_fleet,
        "demo": cmd_demo,
        "node": cmd_node,
        "sub": cmd_sub,
        "pub": cmd_pub,
        "status": cmd_status,
        "telemetry": cmd_telemetry,
        "check": cmd_check,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
