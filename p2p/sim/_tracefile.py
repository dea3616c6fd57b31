"""Reading ``TRACE.jsonl`` files: those of ``p2p sim --trace`` and of ``p2p node --trace``.

Both write one JSON object per line with ``time``, ``node``, ``event``,
``topic``, ``source`` and ``seq``.  The simulator names nodes by scenario
index (integers); real nodes name them by 64-bit id as 16 hex digits and add
``inc``, the incarnation the event belongs to.  A node restarted with the
same id writes events under a new incarnation (often to a new file): the
loader turns each change of incarnation into a ``crash`` and a ``recover``
event, which is what the checker expects of a restart.  A ``gap`` line is a
loss the node reported: ``source`` will not reach it ``seq`` times (its
``seq`` is that count).

Per node, events must come in that node's processing order: the order of
lines within one file.  Files of one node are taken oldest first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2p._errors import P2PError
from p2p.sim._recorder import TraceEvent

EVENTS = frozenset(
    {"subscribe", "subscribed", "unsubscribe", "publish", "deliver", "gap", "crash", "recover"}
)
MAX_LINE = 1 << 20
MAX_VIEW = 1 << 16


class TraceFileError(P2PError, ValueError):
    """A trace file cannot be read; the message names the file, the line and why."""


@dataclass(slots=True)
class _Line:
    """One line read: its event, and the incarnation ``inc`` a real node wrote with it."""

    trace: TraceEvent
    inc: int | None


@dataclass(slots=True)
class LoadedTraces:
    """Events of every node (per node in processing order) and how nodes were named."""

    events: list[TraceEvent] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    """Checker node number -> the name the files use (hex id or index)."""
    files: int = 0
    lines: int = 0

    def name(self, node: int) -> str:
        return self.names.get(node, str(node))


def _node_id(value: Any, what: str) -> tuple[int, str]:
    """An id as the files write it: an integer index or 16 hex digits."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer or a hex id, got {value!r}")
    if isinstance(value, int) and value >= 0:
        return value, str(value)
    if isinstance(value, str) and 1 <= len(value) <= 16:
        try:
            return int(value, 16), value
        except ValueError:
            pass
    raise ValueError(f"{what} must be an integer or a hex id, got {value!r}"[:200])


def _opt_int(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer or null, got {value!r}"[:200])
    return value


def _parse(obj: Any, names: dict[int, str]) -> _Line:
    """Validate one decoded line; raise :class:`ValueError` naming the bad field."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    time = obj.get("time")
    if isinstance(time, bool) or not isinstance(time, int | float) or not math.isfinite(time):
        raise ValueError(f"time must be a finite number, got {time!r}"[:200])
    event = obj.get("event")
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}; expected one of {sorted(EVENTS)}"[:200])
    topic = obj.get("topic", "")
    if not isinstance(topic, str):
        raise ValueError(f"topic must be a string, got {topic!r}"[:200])
    node, label = _node_id(obj.get("node"), "node")
    names.setdefault(node, label)
    source = None
    if obj.get("source") is not None:
        source, label = _node_id(obj["source"], "source")
        names.setdefault(source, label)
    seq = _opt_int(obj, "seq")
    if event in ("publish", "deliver", "gap") and (source is None or seq is None):
        raise ValueError(f"{event} needs source and seq")
    view = _view(obj.get("view"), names)
    return _Line(
        TraceEvent(float(time), node, event, topic, source, seq, view), _opt_int(obj, "inc")
    )


def _view(value: Any, names: dict[int, str]) -> tuple[int, ...] | None:
    """A publication's ``view``: the subscriber ids its publisher knew of."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_VIEW:
        raise ValueError(f"view must be a list of at most {MAX_VIEW} node ids")
    out = []
    for item in value:
        node, label = _node_id(item, "view entry")
        names.setdefault(node, label)
        out.append(node)
    return tuple(out)


def _read(path: Path, names: dict[int, str]) -> list[_Line]:
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise TraceFileError(f"{path}: cannot open: {exc.strerror or exc}") from None
    out: list[_Line] = []
    with fh:
        try:
            for number, text in enumerate(fh, 1):
                if len(text) > MAX_LINE:
                    raise TraceFileError(f"{path}:{number}: line longer than {MAX_LINE} bytes")
                if not text.strip():
                    continue
                try:
                    out.append(_parse(json.loads(text), names))
                except (ValueError, RecursionError) as exc:
                    raise TraceFileError(f"{path}:{number}: {exc}") from None
        except UnicodeDecodeError:
            raise TraceFileError(f"{path}: not UTF-8 text") from None
    return out


def _restarts(lines: Sequence[_Line]) -> list[TraceEvent]:
    """One node's lines as events, a ``crash`` + ``recover`` where ``inc`` changes.

    Only the node's own events say which incarnation it runs: a delivery's
    or a gap's ``inc`` is its source's incarnation, so it is not looked at.
    """
    out: list[TraceEvent] = []
    current: int | None = None
    for line in lines:
        e = line.trace
        own = e.event not in ("deliver", "gap")
        if own and line.inc is not None:
            if current is not None and line.inc != current and e.event not in ("crash", "recover"):
                out.append(TraceEvent(e.time, e.node, "crash", "", e.node, None))
                out.append(TraceEvent(e.time, e.node, "recover", "", e.node, None))
            current = line.inc
        out.append(e)
    return out


def load_traces(paths: Iterable[Path]) -> LoadedTraces:
    """Read trace files into checker input; raise :class:`TraceFileError` on bad input.

    The result keeps every node's events in file order (files of one node
    oldest first), which is all :class:`~p2p.sim.TraceChecker` needs.
    """
    result = LoadedTraces()
    per_node: dict[int, list[list[_Line]]] = {}
    for path in paths:
        lines = _read(Path(path), result.names)
        result.files += 1
        result.lines += len(lines)
        runs: dict[int, list[_Line]] = {}
        for line in lines:
            runs.setdefault(line.trace.node, []).append(line)
        for node, run in runs.items():
            per_node.setdefault(node, []).append(run)
    for chunks in per_node.values():
        chunks.sort(key=lambda r: r[0].trace.time)
        result.events.extend(_restarts([line for run in chunks for line in run]))
    if any(not label.isdecimal() for label in result.names.values()):
        _renumber(result)
    return result


def _renumber(result: LoadedTraces) -> None:
    """Name 64-bit ids ``0..K-1`` in hex order, so reports stay short (with a legend)."""
    order = sorted(result.names, key=lambda n: result.names[n].rjust(16, "0"))
    index = {n: i for i, n in enumerate(order)}
    result.names = {index[n]: result.names[n] for n in order}
    result.events = [
        TraceEvent(
            e.time,
            index[e.node],
            e.event,
            e.topic,
            None if e.source is None else index[e.source],
            e.seq,
            None if e.view is None else tuple(index[n] for n in e.view),
        )
        for e in result.events
    ]


__all__ = ["EVENTS", "LoadedTraces", "TraceFileError", "load_traces"]
