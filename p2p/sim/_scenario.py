"""Scenario files: ``time;ACTION;node;topic[;payload]``, one event per line.

The format of the VCube-PS authors' PeerSim event scripts.  ``node`` is an
index ``0..N-1`` (index ``i`` gets id ``i``) or ``*`` for every node; ``#``
starts a comment; blank lines are ignored.  Failures are
``time;CRASH;node`` (the node stops) and ``time;RECOVER;node`` (it restarts,
empty, as a new incarnation); ``time;RESTART;node`` restarts it with what
its node directory keeps (its delivery frontier: it resumes what it
missed).  ``time;HINT;node;other`` gives ``node`` a hint
that node ``other`` (an index) may be gone, as a spoofed mDNS goodbye or a
reset connection would (with the real detector: a probe, never an eviction).
``time;RESET;node;other`` breaks the connections between ``node`` and node
``other`` (an index): what was in flight on them is lost, each side re-dials
and sends again what the other has not confirmed (the runtime's reliable
links, ``p2p.sim._links``).  ``time;TWIN;node`` starts a second process with
``node``'s id while the first still runs (a copied node directory): the
newer start keeps the id and the older process stops (``p2p.sim._twin``).
``time;PARTITION;node;side`` moves ``node`` to the network segment named
``side`` (every node starts on the unnamed one): nothing crosses between
segments, connections across break and dials across fail, as when a switch
splits in two; ``time;HEAL;node`` puts it back on the unnamed segment
(``*`` for every node).  Side changes at one instant apply together.
``time;REVOKE;node;other`` revokes node ``other`` (an index): the fleet's
revocation list naming it reaches ``node`` (copied into its directory) and
spreads from there; ``other`` keeps running, refused by every member that
holds the list, and its calls are refused from then on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from p2p._errors import ScenarioError

ACTIONS = ("SUB", "UNS", "PUB", "CRASH", "RECOVER", "RESTART", "HINT", "RESET", "TWIN",
           "PARTITION", "HEAL", "REVOKE")  # fmt: skip
PEERED = ("HINT", "RESET", "REVOKE")
"""Actions whose fourth field is another node's index, not a topic."""
FAILURES = ("CRASH", "RECOVER", "RESTART", "TWIN", "HEAL")
"""Actions on a node alone: ``time;ACTION;node``, no topic."""
MAX_LINE = 64 * 1024


@dataclass(frozen=True, slots=True)
class Action:
    """One scenario event, expanded to a single node."""

    time: float
    action: str
    node: int
    topic: str
    payload: bytes = b""
    line: int = 0


def parse_scenario(lines: Iterable[str], nodes: int) -> list[Action]:
    """Parse scenario lines for a run of ``nodes`` nodes; raise :class:`ScenarioError`.

    The result is sorted by time, keeping file order among equal times.
    """
    out: list[Action] = []
    for lineno, raw in enumerate(lines, start=1):
        if len(raw) > MAX_LINE:
            raise ScenarioError(f"line {lineno}: longer than {MAX_LINE} characters")
        text = raw.split("#", 1)[0].strip()
        if text:
            out.extend(_parse_line(text, lineno, nodes))
    out.sort(key=lambda a: a.time)
    return out


Step = tuple[float, int, str, int]
"""A raw random step: ``(time, node, topic, roll)``."""

Script = list[tuple[float, str, int, str]]
"""``(time, ACTION, node, topic)`` lines, as :meth:`Simulation.schedule` takes them."""


def legal_script(
    steps: Iterable[Step],
    *,
    crash_roll: int | None = None,
    max_down: int = 0,
    recover: bool = False,
) -> Script:
    """Turn random steps (in time order, ties kept in order) into a script legal at every step.

    A node that is up and not subscribed to the topic subscribes; a
    subscribed one unsubscribes on ``roll == 0`` and publishes otherwise.
    With ``crash_roll``, a node that is up crashes instead on that roll while
    fewer than ``max_down`` nodes are down; a crashed node ends its
    subscriptions, and its later steps are dropped, or with ``recover`` the
    first of them makes it RECOVER.  Property tests and fuzzers share this,
    so they exercise the same kinds of scripts.
    """
    subs: set[tuple[int, str]] = set()
    down: set[int] = set()
    out: Script = []
    for time, node, topic, roll in sorted(steps, key=lambda s: s[0]):
        if node in down:
            if recover:
                down.discard(node)
                out.append((time, "RECOVER", node, ""))
        elif roll == crash_roll and len(down) < max_down:
            down.add(node)
            subs = {(n, t) for n, t in subs if n != node}
            out.append((time, "CRASH", node, ""))
        elif (node, topic) not in subs:
            subs.add((node, topic))
            out.append((time, "SUB", node, topic))
        elif roll == 0:
            subs.discard((node, topic))
            out.append((time, "UNS", node, topic))
        else:
            out.append((time, "PUB", node, topic))
    return out


def load_scenario(path: str | Path, nodes: int) -> list[Action]:
    """Read and parse a scenario file."""
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_scenario(fh, nodes)
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc


def _parse_line(text: str, lineno: int, nodes: int) -> list[Action]:
    fields = [f.strip() for f in text.split(";")]
    if len(fields) == 3 and fields[1].upper() in FAILURES:
        fields.append("")
    if len(fields) == 3 and fields[1].upper() == "PARTITION":
        raise ScenarioError(f"line {lineno}: PARTITION needs the segment's name")
    if len(fields) not in (4, 5):
        raise ScenarioError(
            f"line {lineno}: expected time;ACTION;node;topic[;payload] "
            f"or time;CRASH|RECOVER|RESTART|TWIN|HEAL;node, got {len(fields)} fields"
        )
    t_raw, action, node_raw, topic = fields[:4]
    try:
        time = float(t_raw)
    except ValueError:
        raise ScenarioError(f"line {lineno}: time {t_raw!r} is not a number") from None
    if not math.isfinite(time) or time < 0:
        raise ScenarioError(f"line {lineno}: time must be finite and >= 0, got {t_raw!r}")
    action = action.upper()
    if action not in ACTIONS:
        raise ScenarioError(
            f"line {lineno}: unknown action {fields[1]!r} (expected {', '.join(ACTIONS)})"
        )
    if action in FAILURES and topic:
        raise ScenarioError(f"line {lineno}: {action} takes no topic")
    if not topic and action not in FAILURES:
        what = {
            "HINT": "the node it hints about",
            "RESET": "the other end",
            "PARTITION": "the segment's name",
            "REVOKE": "the node it revokes",
        }.get(action, "a topic")
        raise ScenarioError(f"line {lineno}: {action} needs {what}")
    if action in PEERED:
        topic = str(_index(topic, lineno, nodes))
    payload = fields[4].encode() if len(fields) == 5 else b""
    if payload and action != "PUB":
        raise ScenarioError(f"line {lineno}: only PUB takes a payload")
    targets = list(range(nodes)) if node_raw == "*" else [_index(node_raw, lineno, nodes)]
    if action == "RESET":  # a node has no connection to itself
        targets = [n for n in targets if str(n) != topic]
        if not targets:
            raise ScenarioError(f"line {lineno}: RESET of node {topic}'s connection to itself")
    return [Action(time, action, n, topic, payload, lineno) for n in targets]


def _index(raw: str, lineno: int, nodes: int) -> int:
    """A node index ``0..nodes-1``, or a :class:`ScenarioError` naming the line."""
    try:
        index = int(raw)
    except ValueError:
        raise ScenarioError(f"line {lineno}: node {raw!r} is not an index or *") from None
    if not 0 <= index < nodes:
        raise ScenarioError(f"line {lineno}: node {index} out of range 0..{nodes - 1}")
    return index
