"""A small deterministic network of :class:`~vcube.Detector` cores alone.

The failure detector's own harness, kept out of the core package (it is a
driver): the one copy that ``tests/test_detector.py`` and
``bench/detector_sim.py`` share, for properties of the detector by itself
(the whole node runs in :class:`p2p.sim.Simulation`).  An event heap ordered by ``(time, seq)``; all
randomness comes from the ``rng`` passed in (a seeded ``random.Random``), so a
run is a pure function of its arguments and replays from its seed.

Node ``i`` ticks at ``phase_i + k * interval`` (``phase_i`` uniform in
``[0, interval)``), so its ``k``-th tick lies in round ``k``, the time interval
``[k * interval, (k + 1) * interval)``, and, like the runtime, calls
:meth:`Detector.expire` at :meth:`Detector.deadline` (``deadline_expiry=False``:
probes expire only at ticks).  Every message takes an independent one-way
delay from :class:`Delays`; a :class:`~vcube._detmsg.Push` is lost with
probability ``push_loss`` (nothing else is ever lost).  A crashed node stops
ticking and drops what it receives; what it sent before still arrives.  With
``data=True`` every node also sends one data frame per round to each node it
monitors, carrying its detector version (the piggyback of
:meth:`Detector.heard`), which models application traffic covering every link
the detector uses.  With ``hint=h``, ``h`` after a crash every live node that
has a link to the crashed one (it monitors it, or is monitored by it) gets the
transport's hint, :meth:`Detector.probe_now` (the runtime's broken connection).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from vcube import (
    ID_BITS,
    Corrected,
    Detector,
    DetectorConfig,
    DetectorOutput,
    Probe,
    Push,
    Reply,
    SelfSuspected,
    SendDetector,
    Suspected,
    partition_sorted,
)

_TICK, _MSG, _DATA, _CRASH, _EXPIRE, _HINT = 0, 1, 2, 3, 4, 5


class Rng(Protocol):
    """What the network needs of a ``random.Random``."""

    def random(self) -> float: ...
    def getrandbits(self, k: int, /) -> int: ...


def sparse_ids(rng: Rng, n: int, bits: int = ID_BITS) -> list[int]:
    """``n`` distinct random ids of ``bits`` bits (``bits`` large enough for ``n``)."""
    if n > 1 << bits:
        raise ValueError(f"{n} ids do not fit in {bits} bits")
    ids: set[int] = set()
    while len(ids) < n:
        ids.add(rng.getrandbits(bits))
    return sorted(ids)


def cbor_size(obj: object) -> int:
    """Bytes of ``obj`` (non-negative ints and lists of them) in CBOR."""
    if isinstance(obj, int):
        return _head(obj)
    if isinstance(obj, list):
        return _head(len(obj)) + sum(cbor_size(x) for x in obj)
    raise TypeError(f"cannot size {obj!r}")


def message_size(msg: Probe | Reply | Push) -> int:
    """``cbor_size(encode_detector(msg))``, without building the arrays."""
    h = _head
    if isinstance(msg, Probe):
        return 2 + h(msg.round) + h(msg.incarnation) + h(msg.version) + h(msg.target) + h(msg.since)
    body = sum(h(e.node) + h(e.incarnation) + h(e.counter) for e in msg.entries)
    fixed = 2 + h(msg.incarnation) + h(msg.version)
    if isinstance(msg, Reply):
        fixed += h(msg.round)
    return fixed + h(3 * len(msg.entries)) + body


def _head(n: int) -> int:
    """Size of a CBOR head carrying ``n`` (uint value or array length)."""
    return 1 if n < 24 else 2 if n < 1 << 8 else 3 if n < 1 << 16 else 5 if n < 1 << 32 else 9


@dataclass(frozen=True, slots=True, kw_only=True)
class Delays:
    """One-way link delays: uniform in ``[low, high]``, or ``low`` plus an
    exponential of mean ``high - low`` when ``exponential``; with probability
    ``spike_prob`` a message instead takes ``spike``."""

    low: float = 0.001
    high: float = 0.01
    exponential: bool = False
    spike_prob: float = 0.0
    spike: float = 0.0

    def sample(self, rng: Rng) -> float:
        """One delay; draws exactly two numbers from ``rng`` (stable streams)."""
        spiked, r = rng.random() < self.spike_prob, rng.random()
        if spiked:
            return self.spike
        if self.exponential:
            return self.low - (self.high - self.low) * math.log(1.0 - r)
        return self.low + (self.high - self.low) * r


@dataclass(slots=True)
class Record:
    """What a run observed."""

    suspected_at: dict[tuple[int, int], float] = field(default_factory=dict)
    """``(observer, node)`` -> time of the observer's first suspicion of the node."""
    false_suspicions: list[tuple[float, int, int]] = field(default_factory=list)
    """``(time, observer, node)`` for every suspicion of a node that had not crashed."""
    corrections: int = 0
    self_suspicions: int = 0
    probes: Counter[int] = field(default_factory=Counter)
    """Round -> probes sent in the ticks of that round."""
    checks: Counter[int] = field(default_factory=Counter)
    """Round -> liveness checks made in the ticks of that round."""
    messages: Counter[tuple[str, int]] = field(default_factory=Counter)
    """``(kind, round)`` -> messages sent; kinds ``probe``, ``reply``, ``push``, ``data``."""
    bytes: Counter[tuple[str, int]] = field(default_factory=Counter)
    """``(kind, round)`` -> detector bytes sent (for ``data``: the piggybacked version)."""


class DetectorNet:
    """Detectors for ``ids``, all joined to each other, on a simulated network."""

    def __init__(
        self,
        ids: Sequence[int],
        rng: Rng,
        *,
        config: DetectorConfig | None = None,
        delays: Delays | None = None,
        data: bool = False,
        push_loss: float = 0.0,
        deadline_expiry: bool = True,
        hint: float | None = None,
    ) -> None:
        self.config = config or DetectorConfig()
        self.delays = delays or Delays()
        self.rng = rng
        self.data = data
        self.push_loss = push_loss
        self.deadline_expiry = deadline_expiry
        self.hint = hint
        self._expiry: dict[int, float] = {}
        """Node -> time of its next scheduled expiry event."""
        self.now = 0.0
        self.crashed: dict[int, float] = {}
        self.record = Record()
        self.detectors = {i: Detector(i, 1, config=self.config) for i in ids}
        for det in self.detectors.values():
            for j in ids:
                if j != det.me:
                    det.join(j, 1, 0.0)
        self._heap: list[tuple[float, int, int, int, int, object]] = []
        self._seq = 0
        for i in ids:
            phase = rng.random() * self.config.interval
            self._push(phase, _TICK, i, 0, phase)

    def _push(self, t: float, kind: int, a: int, b: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b, payload))

    def crash(self, nodes: Iterable[int], at: float) -> None:
        """Crash ``nodes`` at time ``at``."""
        for node in nodes:
            self._push(at, _CRASH, node, 0, None)

    def _hint(self, dead: int) -> None:
        """The transport's hint about ``dead`` to every live node linked to it."""
        linked = set(self.detectors[dead].monitored())
        for i, det in self.detectors.items():
            if i not in self.crashed and (i in linked or dead in det.monitored()):
                self._handle(i, det.probe_now(dead, self.now))

    def run_until(self, t_end: float) -> None:
        """Process every event up to and including time ``t_end``."""
        while self._heap and self._heap[0][0] <= t_end:
            t, _, kind, a, b, payload = heapq.heappop(self._heap)
            self.now = t
            if kind == _CRASH:
                self.crashed.setdefault(a, t)
                if self.hint is not None:
                    self._push(t + self.hint, _HINT, a, 0, None)
            elif kind == _HINT:
                self._hint(a)
            elif a in self.crashed:
                continue
            elif kind == _TICK:
                assert isinstance(payload, float)
                self._tick(a, b, payload)
            elif kind == _MSG:
                self._deliver(a, b, payload)
            elif kind == _EXPIRE:
                if self._expiry.get(a) == t:
                    del self._expiry[a]
                self._handle(a, self.detectors[a].expire(t))
            else:
                assert isinstance(payload, int)
                self._handle(a, self.detectors[a].heard(b, t, version=payload))

    def _round(self) -> int:
        return int(self.now // self.config.interval)

    def _tick(self, node: int, k: int, phase: float) -> None:
        det = self.detectors[node]
        if self.data:
            for dest in det.monitored():
                self._send_data(node, dest, det.version)
        checks = det.stats.checks
        self._handle(node, det.tick(self.now), k)
        self.record.checks[k] += det.stats.checks - checks
        self._push(phase + (k + 1) * self.config.interval, _TICK, node, k + 1, phase)

    def _send_data(self, src: int, dest: int, version: int) -> None:
        rnd = self._round()
        self.record.messages["data", rnd] += 1
        self.record.bytes["data", rnd] += cbor_size(version)
        self._push(self.now + self.delays.sample(self.rng), _DATA, dest, src, version)

    def _deliver(self, dest: int, sender: int, msg: object) -> None:
        assert isinstance(msg, Probe | Reply | Push)
        self._handle(dest, self.detectors[dest].receive(sender, msg, self.now))

    def _handle(self, node: int, outs: list[DetectorOutput], k: int | None = None) -> None:
        """Carry out a detector's outputs and record what they say."""
        for out in outs:
            if isinstance(out, SendDetector):
                self._send(node, out, k)
            elif isinstance(out, Suspected):
                self._suspected(node, out)
            elif isinstance(out, Corrected):
                self.record.corrections += 1
            elif isinstance(out, SelfSuspected):
                self.record.self_suspicions += 1
        if self.deadline_expiry:
            self._schedule_expiry(node)

    def _schedule_expiry(self, node: int) -> None:
        """An expiry event at ``node``'s detector deadline, unless one is due by then."""
        due = self.detectors[node].deadline()
        if due is None:
            return
        due = max(due, self.now)
        scheduled = self._expiry.get(node)
        if scheduled is None or due < scheduled:
            self._expiry[node] = due
            self._push(due, _EXPIRE, node, 0, None)

    def _send(self, src: int, out: SendDetector, k: int | None) -> None:
        msg = out.msg
        kind = "probe" if isinstance(msg, Probe) else "push" if isinstance(msg, Push) else "reply"
        rnd = self._round()
        if kind == "probe" and k is not None:
            self.record.probes[k] += 1
        self.record.messages[kind, rnd] += 1
        self.record.bytes[kind, rnd] += message_size(msg)
        delay = self.delays.sample(self.rng)
        if kind == "push" and self.push_loss and self.rng.random() < self.push_loss:
            return
        self._push(self.now + delay, _MSG, out.dest, src, msg)

    def _suspected(self, observer: int, out: Suspected) -> None:
        if out.node in self.crashed:
            self.record.suspected_at.setdefault((observer, out.node), self.now)
        else:
            self.record.false_suspicions.append((self.now, observer, out.node))

    def knows_all(self, crashed: Iterable[int]) -> bool:
        """Whether every live node currently suspects every node of ``crashed``."""
        dead = frozenset(crashed)
        live = (det for i, det in self.detectors.items() if i not in self.crashed)
        return all(dead <= det.suspected() for det in live)


@dataclass(frozen=True, slots=True)
class CrashOutcome:
    """Result of :func:`run_crash`; latencies in rounds after the crash."""

    n: int
    crashed: tuple[int, ...]
    latencies: tuple[float, ...]
    """One per ``(correct observer, crashed node)``: (suspicion time - crash time) / interval."""
    complete: bool
    """Every correct node suspected every crashed node within the horizon."""
    false_suspicions: int
    probes: dict[int, int]
    checks: dict[int, int]

    @property
    def worst_rounds(self) -> int:
        """Rounds until the last correct node knew of the last crash (rounded up)."""
        return max((math.ceil(x - 1e-9) for x in self.latencies), default=0)


def run_crash(
    ids: Sequence[int],
    crashed: Iterable[int],
    rng: Rng,
    *,
    config: DetectorConfig | None = None,
    delays: Delays | None = None,
    data: bool = False,
    warmup: int = 4,
    horizon: int = 200,
    push_loss: float = 0.0,
    deadline_expiry: bool = True,
    hint: float | None = None,
) -> tuple[CrashOutcome, DetectorNet]:
    """Run ``warmup`` rounds, crash ``crashed`` at once, then run until every
    correct node suspects every crashed one (or ``horizon`` rounds pass).
    The other arguments are :class:`DetectorNet`'s."""
    net = DetectorNet(
        ids,
        rng,
        config=config,
        delays=delays,
        data=data,
        push_loss=push_loss,
        deadline_expiry=deadline_expiry,
        hint=hint,
    )
    interval = net.config.interval
    dead = tuple(sorted(set(crashed)))
    t_crash = warmup * interval
    net.crash(dead, t_crash)
    net.run_until(t_crash)
    for r in range(1, horizon + 1):
        net.run_until(t_crash + r * interval)
        if net.knows_all(dead):
            break
    live = [i for i in ids if i not in net.crashed]
    at = net.record.suspected_at
    lat = tuple(
        (at[i, k] - t_crash) / interval if (i, k) in at else math.inf for i in live for k in dead
    )
    outcome = CrashOutcome(
        n=len(ids),
        crashed=dead,
        latencies=lat,
        complete=net.knows_all(dead),
        false_suspicions=len(net.record.false_suspicions),
        probes=dict(net.record.probes),
        checks=dict(net.record.checks),
    )
    return outcome, net


def nonempty_clusters(ids: Sequence[int]) -> int:
    """``T``: the sum over nodes of their non-empty clusters, the number of
    (node, cluster) pairs VCube tests per round (``N log2 N`` for a dense cube)."""
    ordered = sorted(ids)
    return sum(len(partition_sorted(i, ordered)) for i in ordered)
