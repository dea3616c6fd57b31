"""What a simulation run observed: the trace and the metrics of ``p2p sim``."""

from __future__ import annotations

import json
import statistics
from array import array
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from causal import MessageSet, MsgId
from p2p._stats import percentile_of
from p2p.sim._frames import Frame, frame_ids
from topics import PubRound


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One line of ``TRACE.jsonl``; ``node`` and ``source`` are scenario indices."""

    time: float
    node: int
    event: str
    topic: str
    source: int | None
    seq: int | None
    """The publication's sequence number; on a ``gap``, the count of
    publications of ``source`` the node reported it will not get."""
    view: tuple[int, ...] | None = None
    """On a ``publish`` only, when the run has partial membership: the
    subscribers in the publisher's view as it published (scenario indices).
    A publication is owed to those only (the trace checks' validity)."""

    def as_dict(self) -> dict[str, Any]:
        out = {
            "time": self.time,
            "node": self.node,
            "event": self.event,
            "topic": self.topic,
            "source": self.source,
            "seq": self.seq,
        }
        if self.view is not None:
            out["view"] = list(self.view)
        return out


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, mean, p50, p95, p99 (nearest rank, ``p2p._stats``) and max of
    ``values`` (zeros when empty)."""
    if not values:
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "mean": statistics.fmean(ordered),
        "p50": percentile_of(ordered, 50),
        "p95": percentile_of(ordered, 95),
        "p99": percentile_of(ordered, 99),
        "max": ordered[-1],
    }


def _hist_mean(hist: dict[int, int]) -> float:
    """The mean of the integer samples counted in ``hist`` (not empty): the value
    ``statistics.fmean`` gives for them, as both are the exact sum correctly
    rounded, divided by the count and rounded once."""
    return sum(value * count for value, count in hist.items()) / sum(hist.values())


@dataclass(slots=True)
class Recorder:
    """Collects what happens in a run; cheap enough to leave on for 10^6 packets."""

    index: dict[int, int]
    record_trace: bool = True
    trace: list[TraceEvent] = field(default_factory=list)
    packets: Counter[str] = field(default_factory=Counter)
    sent_by_node: Counter[int] = field(default_factory=Counter)
    msgs_per_pub_packet: Counter[int] = field(default_factory=Counter)
    queue_hist: dict[int, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    """Per sending node, how many of its link packets found each number of packets
    queued ahead on its link.  A histogram, not the samples in order: every
    figure read from them (mean, max, spread) is independent of order, and a
    list kept an entry per link packet, 2M at 1024 nodes."""
    publish_time: dict[MsgId, float] = field(default_factory=dict)
    barrier_sizes: dict[MsgId, int] = field(default_factory=dict)
    # Per-delivery numbers are packed (8 bytes each instead of a float object):
    # a 1024-node all-publish run records a million of each.
    reception: array[float] = field(default_factory=lambda: array("d"))
    delivery: array[float] = field(default_factory=lambda: array("d"))
    last_delivery: dict[MsgId, float] = field(default_factory=dict)
    false_positives: int = 0
    deliveries: int = 0
    missed: int = 0
    """Publications reported missed (gap events), over all nodes."""
    subscribe_called: dict[tuple[int, str], float] = field(default_factory=dict)
    subscribe_latency: list[float] = field(default_factory=list)
    refusals: list[tuple[float, int, str, str, str]] = field(default_factory=list)
    silenced: set[int] = field(default_factory=set)
    """Revoked nodes: out of the trace from their revocation on."""
    drops: int = 0
    rounds: Counter[str] = field(default_factory=Counter)
    messages_per_round: list[int] = field(default_factory=list)
    header: int = 20
    frames: int = 0
    msgs_per_frame: Counter[int] = field(default_factory=Counter)
    frame_sizes: array[int] = field(default_factory=lambda: array("q"))
    messages_sent: Counter[int] = field(default_factory=Counter)
    holds: list[tuple[float, int, int, tuple[MsgId, ...]]] = field(default_factory=list)
    """``(time, node, child, ids)`` of every causal hold-back, for checkers."""
    held_by_node: Counter[int] = field(default_factory=Counter)
    record_links: bool = False
    links: list[tuple[float, int, int, int, tuple[MsgId, ...]]] = field(default_factory=list)
    """With ``record_links``: ``(time, src, dst, size, message ids)`` per link packet, in
    the order the receiver processed them; ``time`` is when the receiver's CPU took
    the packet (its parts are handled in order at that instant)."""
    failures: list[tuple[float, int, bool]] = field(default_factory=list)
    """``(time, node, crashed)``: every CRASH (``True``) and RECOVER of the run."""
    pending_max: dict[int, int] = field(default_factory=dict)
    """Largest pending set (received, not delivered) per node, when the core reports it."""

    def _add(self, time: float, node: int, event: str, topic: str, mid: MsgId | None) -> None:
        if self.record_trace and node not in self.silenced:
            source = self.index.get(mid.source) if mid is not None else self.index[node]
            seq = mid.seq if mid is not None else None
            self.trace.append(TraceEvent(time, self.index[node], event, topic, source, seq))

    # --- hooks called by the simulator
    def preset(self, node: int, topic: str) -> None:
        self._add(0.0, node, "subscribe", topic, None)
        self._add(0.0, node, "subscribed", topic, None)

    def call(self, time: float, node: int, action: str, topic: str) -> None:
        if action == "SUB":
            self.subscribe_called[(node, topic)] = time
            self._add(time, node, "subscribe", topic, None)
        elif action == "UNS":
            self._add(time, node, "unsubscribe", topic, None)

    def revoked(self, time: float, node: int) -> None:
        """The fleet revoked ``node``: its trace ends as a crash's does (what it
        does from now on, refused by the members, is no member's doing)."""
        self.failure(time, node, True)
        self.silenced.add(node)

    def failure(self, time: float, node: int, crash: bool) -> None:
        self.failures.append((time, self.index[node], crash))
        self._add(time, node, "crash" if crash else "recover", "", None)

    def refused(self, time: float, node: int, action: str, topic: str, why: str) -> None:
        self.refusals.append((time, self.index[node], action, topic, why))

    def published(
        self, time: float, node: int, topic: str, mid: MsgId, view: frozenset[int] | None = None
    ) -> None:
        self.publish_time[mid] = time
        if view is None or not self.record_trace:
            self._add(time, node, "publish", topic, mid)
            return
        index = self.index
        seen = tuple(sorted(index[n] for n in view))
        self.trace.append(
            TraceEvent(time, index[node], "publish", topic, index[mid.source], mid.seq, seen)
        )

    def subscribed(self, time: float, node: int, topic: str) -> None:
        called = self.subscribe_called.pop((node, topic), None)
        if called is not None:
            self.subscribe_latency.append(time - called)
        self._add(time, node, "subscribed", topic, None)

    def delivered(self, time: float, node: int, topic: str, mid: MsgId, own: bool) -> None:
        self.deliveries += 1
        if not own:
            self.delivery.append(time - self.publish_time[mid])
            # max(last, time) without the call (once per delivery); times are >= 0
            last = self.last_delivery.get(mid)
            if last is None or time > last:
                self.last_delivery[mid] = time
        if self.record_trace:
            self._add(time, node, "deliver", topic, mid)

    def gap(self, time: float, node: int, topic: str, source: int, count: int) -> None:
        """``node`` will not get ``count`` publications of ``source`` (a ``gap``
        event: its ``seq`` is the count)."""
        self.missed += count
        if self.record_trace and node not in self.silenced:
            ev = TraceEvent(time, self.index[node], "gap", topic, self.index.get(source), count)
            self.trace.append(ev)

    def received(self, time: float, node: int, topic: str, mid: MsgId, relay: bool) -> None:
        if relay:
            self.false_positives += 1
        else:
            self.reception.append(time - self.publish_time[mid])

    def round_acked(
        self, time: float, node: int, topic: str, kind: str, ids: tuple[MsgId, ...]
    ) -> None:
        self.rounds[kind] += 1
        if kind == "PUB":
            self.messages_per_round.append(len(ids))

    def dropped(self, time: float, node: int, topic: str, count: int, reason: str) -> None:
        self.drops += count

    def held(self, time: float, node: int, child: int, ids: tuple[MsgId, ...]) -> None:
        self.holds.append((time, node, child, ids))
        self.held_by_node[node] += 1

    def sent(self, src: int, frame: Frame, queued_ahead: int) -> None:
        """A link packet was queued (its parts may still grow until it starts)."""
        self.frames += 1
        self.sent_by_node[src] += 1
        hist = self.queue_hist[src]  # a plain dict: a Counter's += is 2x slower
        hist[queued_ahead] = hist.get(queued_ahead, 0) + 1

    def arrived(self, dest: int, frame: Frame, src: int | None = None, now: float = 0.0) -> None:
        """A link packet arrived: its content is final, count it."""
        msgs = 0
        packets = self.packets
        for part in frame.parts:
            packets[part.kind] += 1
            if isinstance(part, PubRound):
                msgs += 1  # one, as part_messages counts every part but a MessageSet
                self.msgs_per_pub_packet[len(part.messages)] += 1
                if part.round.source == src:
                    for m in part.messages:
                        self.barrier_sizes.setdefault(m.id, len(m.deps) + len(m.op_deps))
            elif isinstance(part, MessageSet):
                msgs += len(part.messages)
                for bm in part.messages:
                    if bm.source == src:
                        self.barrier_sizes.setdefault(bm.id, len(bm.clock))
            else:
                msgs += 1
        if src is not None:
            self.messages_sent[src] += msgs
        self.msgs_per_frame[msgs] += 1
        self.frame_sizes.append(frame.size)
        if self.record_links and src is not None:
            self.links.append((now, src, dest, frame.size, frame_ids(frame)))

    # --- outputs
    def metrics(self) -> dict[str, Any]:
        """The ``METRICS.json`` document."""
        pkts = {k: self.packets.get(k, 0) for k in ("PUB", "SUB", "UNS", "ACK", "MSG")}
        if self.packets.get("FENCE"):  # agreement on a crashed stream (topics._fence): rare
            pkts["FENCE"] = self.packets["FENCE"]
        pkts["total"] = sum(pkts.values())
        pub_msgs = sum(k * v for k, v in self.msgs_per_pub_packet.items())
        queue_means = {n: _hist_mean(h) for n, h in self.queue_hist.items() if h}
        completion = [t - self.publish_time[m] for m, t in self.last_delivery.items()]
        return {
            "packets": pkts,
            "pub_messages": pub_msgs,
            "false_positives": self.false_positives,
            "latency": {
                "reception": summarize(self.reception),
                "delivery": summarize(self.delivery),
                "completion": summarize(completion),
                "subscribe": summarize(self.subscribe_latency),
            },
            "publications": len(self.publish_time),
            "deliveries": self.deliveries,
            "dropped": self.drops,
            "refused": len(self.refusals),
            "rounds": dict(self.rounds),
            "messages_per_round": summarize([float(x) for x in self.messages_per_round]),
            "messages_per_pub_packet": {
                str(k): v for k, v in sorted(self.msgs_per_pub_packet.items())
            },
            "queue": {
                "mean_per_node": summarize(list(queue_means.values())),
                "max": max((max(h) for h in self.queue_hist.values() if h), default=0),
            },
            "causal_barrier": summarize([float(x) for x in self.barrier_sizes.values()]),
            "link": {
                "packets": self.frames,
                "messages_per_packet": {str(k): v for k, v in sorted(self.msgs_per_frame.items())},
                "bytes": sum(self.frame_sizes),
                "packet_size": summarize([float(x) for x in self.frame_sizes]),
                "held_back": sum(self.held_by_node.values()),
            },
            "nodes": self.node_counters(),
        }

    def queue_samples(self, node: int) -> list[int]:
        """``node``'s queue samples (see :attr:`queue_hist`), in ascending order."""
        hist = self.queue_hist.get(node)
        return [] if hist is None else [v for v, c in sorted(hist.items()) for _ in range(c)]

    def node_counters(self) -> dict[str, dict[str, int]]:
        """Per-node counters by scenario index: packets and messages sent, hold-backs,
        largest pending set (what device telemetry reports)."""
        out: dict[str, dict[str, int]] = {}
        for node, idx in self.index.items():
            out[str(idx)] = {
                "packets_sent": self.sent_by_node.get(node, 0),
                "messages_sent": self.messages_sent.get(node, 0),
                "held_back": self.held_by_node.get(node, 0),
                "pending_max": self.pending_max.get(node, 0),
            }
        return out

    def write_trace(self, fh: TextIO) -> None:
        """Write the trace as JSON lines, in time order (per node: event order)."""
        for ev in sorted(self.trace, key=lambda e: e.time):
            fh.write(json.dumps(ev.as_dict(), separators=(",", ":")) + "\n")
