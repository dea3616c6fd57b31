"""One decode task: decode, validate, dedupe and fold a group of devices' records into
partial aggregates (per device, per (window, topic), per window, per topic), events and
quarantine rows.  Runs on the executors.

The task reads and checks the records and drives the folding, by the exact path
(:meth:`_Task._add`, one record at a time) or the compiled one (:func:`_fold_fast`,
a run of records at a time, with the same sums); what it folds into, and how the
driver merges those partials, is :mod:`p2p.telemetry._accum`."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from p2p.telemetry._accum import (
    _ACK_ROUND,
    _F,
    _FLEET_NODE,
    _FLEET_NODE_INDEX,
    _FLUSH,
    _HOLDBACK,
    _LATENCY,
    _RECORDS,
    DEVICE_COUNTERS,
    _Counts,
    _Device,
    _device_row,
    _HistSums,
    _merge_counts,
    _new_fleet,
    _Run,
    _ts,
    _Window,
)
from p2p.telemetry._batch import CHUNK, Checker, check_file
from p2p.telemetry._columns import BOOT as K_BOOT
from p2p.telemetry._columns import CODE as K_CODE
from p2p.telemetry._columns import COUNTERS as K_COUNTERS
from p2p.telemetry._columns import CPU as K_CPU
from p2p.telemetry._columns import DIGEST as K_DIGEST
from p2p.telemetry._columns import KIND as K_KIND
from p2p.telemetry._columns import NODE as K_NODE
from p2p.telemetry._columns import RUN
from p2p.telemetry._columns import SEQ as K_SEQ
from p2p.telemetry._columns import WINDOW as K_WINDOW
from p2p.telemetry._fast import Parser
from p2p.telemetry._fast import T as K_T
from p2p.telemetry._fast import available as fast_available
from p2p.telemetry._listing import LandingFile, classify, scan
from p2p.telemetry._schema import NODE_COUNTERS
from p2p.telemetry._spark import local_path

HEX_PREFIX = 64
"""Bytes of a quarantined item kept (as hex)."""


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last one shorter)."""
    while chunk := list(islice(items, size)):
        yield chunk


@dataclass(frozen=True, slots=True)
class _TaskConfig:
    since: float | None
    until: float | None
    width: float
    batch: bool = True
    compiled: bool = True
    """Use the compiled parser (:mod:`._fast`) where numba is installed."""


class _Task:
    """Everything one decode task produces from its devices."""

    def __init__(self, cfg: _TaskConfig) -> None:
        self.cfg = cfg
        self.stats: Counter[str] = Counter()
        self.t_first = math.inf
        self.t_last = -math.inf
        self.windows: dict[tuple[float, str], _Window] = {}
        self.fleet: dict[float, list[Any]] = {}
        self.topic_devices: Counter[str] = Counter()
        self.topic_span: dict[str, list[float]] = {}
        self.devices: list[tuple[Any, ...]] = []
        self.events: list[tuple[Any, ...]] = []
        self.quarantine: list[tuple[Any, ...]] = []
        self._run = _Run(_Device(""))
        self.checker = Checker()
        self.sums = _HistSums()
        self.parser = Parser() if cfg.compiled and fast_available() else None
        self.pending = 0
        """Rows of the parser's arrays waiting for :meth:`_flush`; ``kept`` marks the kept."""
        self.kept: Any = None if self.parser is None else _zeros_bool(RUN)

    def _fleet(self, ws: float) -> list[Any]:
        part = self.fleet.get(ws)
        if part is None:
            part = self.fleet[ws] = _new_fleet()
        return part

    def _window(self, key: tuple[float, str], acc: _Device) -> _Window:
        """The (window, topic) partial ``key``, made on first use, counting ``acc``'s
        device in it once."""
        part = self.windows.get(key)
        if part is None:
            part = self.windows[key] = _Window(len(self.windows))
        if part.last is not acc:
            part.last = acc
            part.devices += 1
        return part

    def _bad(
        self, lf: LandingFile, offset: int | None, reason: str, fld: str, error: str, raw: bytes
    ) -> None:
        self.stats[f"reason_{reason}"] += 1
        if reason == "invalid":
            self.stats[f"field_{fld}"] += 1
        self.quarantine.append(
            (lf.path, offset, reason, fld, error[:300], raw[:HEX_PREFIX].hex(), lf.device, lf.date)
        )

    def device(self, device: str, files: Iterable[tuple[LandingFile, bytes | None]]) -> int:
        """Decode, validate, dedupe and aggregate one device's files; returns items read.

        Files are read in (date, boot, seq, path) order and items in file order,
        whichever path takes them, so the first copy of a duplicate is the one kept.
        """
        stats = self.stats
        st = _Counts()
        acc = _Device(device)
        self._run = _Run(acc)
        ordered = sorted(files, key=lambda p: (p[0].date, p[0].boot, p[0].seq, p[0].path))
        for lf, blob in ordered:
            stats["files"] += 1
            if blob is None:
                try:
                    with open(local_path(lf.path), "rb") as fh:
                        blob = fh.read()
                except OSError as exc:
                    stats["files_unreadable"] += 1
                    st.items += 1
                    acc.quarantined += 1
                    self._bad(lf, None, "unreadable", "", f"{type(exc).__name__}: {exc}", b"")
                    continue
            stats["bytes"] += len(blob)
            if self.parser is not None:
                self._fast_file(lf, blob, st)
            else:
                self._items(lf, blob, scan(blob), st)
        self._flush()
        self._end_device(acc, st)
        return st.items

    def _end_device(self, acc: _Device, st: _Counts) -> None:
        run, stats = self._run, self.stats
        for ws in run.fleet_keys:
            self.fleet[ws][_F["devices"]] += 1
        for topic, (first, last) in run.topics.items():
            self.topic_devices[topic] += 1
            span = self.topic_span.get(topic)
            if span is None:
                self.topic_span[topic] = [first, last]
            else:
                span[0] = min(span[0], first)
                span[1] = max(span[1], last)
        acc.duplicates = st.duplicates
        stats["items"] += st.items
        stats["valid"] += st.valid
        stats["duplicates"] += st.duplicates
        stats["duplicates_conflicting"] += st.conflicting
        stats["outside_range"] += st.outside
        stats["aggregated"] += acc.records
        stats["kind_node"] += acc.node_records
        stats["kind_topic"] += acc.topic_records
        stats["kind_event"] += acc.events
        if acc.records or acc.quarantined:
            self.devices.append(_device_row(acc))

    def _items(
        self,
        lf: LandingFile,
        blob: bytes,
        items: Iterator[tuple[int, int, object, str | None]],
        st: _Counts,
    ) -> None:
        """The exact path: ``items`` (scanned from ``blob``) checked by :mod:`._batch` (or
        ``validate``), then deduplicated and folded one by one."""
        # In chunks: a whole file of decoded records held at once costs twice the decode
        # (allocator and cache); a chunk is also one numpy batch.
        for scanned in _chunks(items, CHUNK):
            verdicts, hists, rows = check_file(self.checker, blob, scanned, self.cfg.batch)
            for i, item in enumerate(scanned):
                self._item(lf, blob, item, verdicts[i], hists, rows.get(i, -1), st)
            self.sums.fold(len(self.windows))

    def _item(
        self,
        lf: LandingFile,
        blob: bytes,
        item: tuple[int, int, object, str | None],
        rec: Any,
        hists: Any,
        row: int,
        st: _Counts,
    ) -> None:
        """One scanned item with its verdict: quarantined, dropped, or folded in."""
        start, end, _, error = item
        acc = self._run.acc
        st.items += 1
        if error is not None or isinstance(rec, Exception):  # undecodable, or not valid
            message = error if error is not None else str(rec)
            reason, fld = classify(message, error is None)
            acc.quarantined += 1
            self._bad(lf, start, reason, fld, message, blob[start:end])
            return
        if rec["device"] != acc.device:
            acc.quarantined += 1
            self._bad(lf, start, "misplaced", "device",
                      f"record of device {rec['device']} under device={acc.device}",
                      blob[start:end])  # fmt: skip
            return
        st.valid += 1
        parser = self.parser  # with the compiled path, every copy gets the parser's digest
        digest = hash(blob[start:end]) if parser is None else parser.digest(blob, start, end)
        if not st.first(rec["boot"], rec["seq"], digest):
            return
        t = rec["t"]
        since, until = self.cfg.since, self.cfg.until
        if (since is not None and t < since) or (until is not None and t >= until):
            st.outside += 1
            return
        self._flush()  # the compiled path's records before this one
        self._add(rec, t, hists, row)

    # ------------------------------------------------------------ compiled path

    def _fast_file(self, lf: LandingFile, blob: bytes, st: _Counts) -> None:
        """A file through the compiled parser; each item it leaves takes :meth:`_items`."""
        import numpy as np

        parser = self.parser
        assert parser is not None
        buf = np.frombuffer(blob, dtype=np.uint8)
        pos, size = 0, len(blob)
        while pos < size:
            count, pos = parser.run(buf, pos, lf.device, self.pending)
            if count:
                self._fast_run(self.pending, count, st)
                self.pending += count
            if self.pending == RUN:
                self._flush()  # the arrays are full
                continue
            if pos >= size:
                break
            item = next(scan(blob, pos))  # the item the parser left: one exact step
            self._items(lf, blob, iter([item]), st)
            pos = item[1]  # an undecodable item runs to the end: the file ends

    def _fast_run(self, row: int, count: int, st: _Counts) -> None:
        """Dedupes (in file order) and range-checks the parser's ``count`` new records
        from ``row`` on, and marks the kept ones for :meth:`_flush`."""
        parser = self.parser
        assert parser is not None
        ints = parser.ints[row : row + count]
        st.items += count
        st.valid += count
        self.stats["compiled"] += count
        idx = st.firsts(ints[:, K_BOOT].tolist(), ints[:, K_SEQ].tolist(),
                        ints[:, K_DIGEST].tolist()) + row  # fmt: skip
        since, until = self.cfg.since, self.cfg.until
        if since is not None or until is not None:
            t = parser.floats[idx, K_T]
            inside = _ones_bool(len(idx))
            if since is not None:
                inside &= t >= since
            if until is not None:
                inside &= t < until
            st.outside += len(idx) - int(inside.sum())
            idx = idx[inside]
        self.kept[idx] = True

    def _flush(self) -> None:
        """Folds the kept records waiting in the parser's arrays (all of one device, in
        file order).  Called when the arrays are full, at the device's end, and before an
        item of the exact path is folded in, so that float sums keep the file order."""
        if not self.pending:
            return
        import numpy as np

        parser = self.parser
        assert parser is not None
        idx = np.flatnonzero(self.kept[: self.pending])
        if len(idx):
            _fold_fast(self, parser.ints[idx], parser.floats[idx], parser.hists[idx])
        self.kept[: self.pending] = False
        self.pending = 0

    def _add(self, rec: dict[str, Any], t: float, hists: Any = None, row: int = -1) -> None:
        """Fold one kept record into the device, its window and its (window, topic);
        its histograms are ``hists[row]`` if it was accepted in batch (``row >= 0``)."""
        run = self._run
        acc = run.acc
        length, kind = rec["window"], rec["kind"]
        acc.records += 1
        acc.boots.add(rec["boot"])
        begin = t - length
        if begin < acc.first:
            acc.first = begin
        if t > acc.last:
            acc.last = t
        ws = math.floor((t - length / 2) / self.cfg.width) * self.cfg.width
        if ws == run.ws:
            fleet = run.fleet
        else:
            fleet = run.fleet = self._fleet(ws)
            run.ws = ws
            run.fleet_keys.add(ws)
        fleet[_RECORDS] += 1
        if kind == "topic" or kind == "node":  # the data's span: events do not count
            if begin < self.t_first:
                self.t_first = begin
            if t > self.t_last:
                self.t_last = t
        if kind == "topic":
            acc.topic_records += 1
            pubs, deliveries, held = rec["publications"], rec["deliveries"], rec["held"]
            acc.publications += pubs
            acc.deliveries += deliveries
            acc.held += held
            topic = rec["topic"]
            part = self._window((ws, topic), acc)
            part.records += 1
            part.pubs += pubs
            part.deliveries += deliveries
            part.held += held
            if row >= 0:
                self.sums.add(part.number, hists, row)
            else:
                pending = part.pending
                pending[0].append(rec[_LATENCY])
                pending[1].append(rec[_HOLDBACK])
                pending[2].append(rec[_ACK_ROUND])
                if len(pending[0]) >= _FLUSH:
                    part.flush()
            span = run.topics.get(topic)
            if span is None:
                run.topics[topic] = [begin, t]
            else:
                if begin < span[0]:
                    span[0] = begin
                if t > span[1]:
                    span[1] = t
        elif kind == "node":
            acc.node_records += 1
            rss = rec["rss_bytes"]
            cpu = rec["cpu_s"]
            acc.rss_sum += rss
            if rss > acc.rss_max:
                acc.rss_max = rss
            acc.cpu_s += cpu
            acc.window_s += length
            acc.connections += rec["connections"]
            counters = acc.counters
            for name in DEVICE_COUNTERS:
                counters[name] += rec[name]
            fleet[_F["node_records"]] += 1
            fleet[_F["rss_sum"]] += rss
            if rss > fleet[_F["rss_max"]]:
                fleet[_F["rss_max"]] = rss
            fleet[_F["cpu_s"]] += cpu
            fleet[_F["node_window_s"]] += length
            for name, index in _FLEET_NODE_INDEX:
                fleet[index] += rec[name]
        else:
            event = rec["event"]
            acc.events += 1
            acc.crashes += event == "crash"
            acc.starts += event == "start"
            fleet[_F["events"]] += 1
            fleet[_F[f"event_{event}"]] += 1
            self.events.append(
                (
                    _ts(t),
                    float(t),
                    rec["device"],
                    rec["boot"],
                    rec["seq"],
                    event,
                    rec.get("peer"),
                    rec.get("detail"),
                    rec["id"],
                )
            )

    def output(self) -> Iterator[tuple[Any, ...]]:
        """Tagged rows: ``s`` stats, ``d`` device, ``w`` (window, topic) partial, ``t`` topic
        partial, ``f`` window partial, ``e`` event, ``q`` quarantine."""
        stats: dict[str, Any] = dict(self.stats)
        stats["t_first"] = self.t_first
        stats["t_last"] = self.t_last
        yield ("s", stats)
        for row in self.devices:
            yield ("d", row)
        topics: dict[str, list[Any]] = {}
        for (ws, topic), part in self.windows.items():
            values = part.partial(self.sums)
            yield ("w", (ws, topic), values)
            fleet = self._fleet(ws)
            fleet[_F["topic_records"]] += part.records
            fleet[_F["publications"]] += part.pubs
            fleet[_F["deliveries"]] += part.deliveries
            fleet[_F["held"]] += part.held
            latency = zip(fleet[_F["latency"]], values[5], strict=True)
            fleet[_F["latency"]] = [a + b for a, b in latency]
            tp = topics.get(topic)
            if tp is None:
                topics[topic] = [values[0], self.topic_devices[topic], *values[2:]]
            else:
                topics[topic] = _merge_counts(tp, [values[0], 0, *values[2:]])
        for topic, tp in topics.items():
            yield ("t", topic, [*tp, *self.topic_span[topic]])
        for ws, fleet in self.fleet.items():
            yield ("f", ws, fleet)
        for row in self.events:
            yield ("e", row)
        for row in self.quarantine:
            yield ("q", row)


# ------------------------------------------------- folding the compiled path's records


def _zeros_bool(n: int) -> Any:
    import numpy as np

    return np.zeros(n, dtype=bool)


def _ones_bool(n: int) -> Any:
    import numpy as np

    return np.ones(n, dtype=bool)


def _fold_fast(task: _Task, ints: Any, floats: Any, hists: Any) -> None:
    """Folds kept records of the compiled path (one device's, in file order) into the
    task exactly as :meth:`_Task._add` would one by one: integer sums are exact (int64
    over counts < 2**32, Python ints otherwise), float sums are added in record order,
    windows are ``math.floor(...) * width`` of the same float expression."""
    import numpy as np

    run = task._run
    acc = run.acc
    t, length = floats[:, K_T], floats[:, K_WINDOW]
    begin = t - length
    acc.records += len(ints)
    acc.boots.update(np.unique(ints[:, K_BOOT]).tolist())
    low, high = float(begin.min()), float(t.max())
    acc.first, acc.last = min(acc.first, low), max(acc.last, high)
    task.t_first, task.t_last = min(task.t_first, low), max(task.t_last, high)
    width = task.cfg.width
    cells, where = np.unique(np.floor((t - length / 2) / width), return_inverse=True)
    starts = [int(c) * width for c in cells.tolist()]  # what math.floor(x) * width gives
    fleets = [task._fleet(ws) for ws in starts]
    run.fleet_keys.update(starts)
    for fleet, n in zip(fleets, np.bincount(where).tolist(), strict=True):
        fleet[_RECORDS] += n
    node = ints[:, K_KIND] == K_NODE
    if node.any():
        _fold_nodes(acc, ints[node], length[node], floats[node, K_CPU], where[node], fleets)
    topic = ~node
    if topic.any():
        rows = ints[topic]
        _fold_topics(task, rows, begin[topic], t[topic], hists[topic], where[topic], starts)


_NODE_COLUMNS = tuple((name, K_COUNTERS + i) for i, name in enumerate(NODE_COUNTERS))
_FLEET_NODE_COLUMNS = tuple(
    (_F[name], K_COUNTERS + NODE_COUNTERS.index(name)) for name in _FLEET_NODE
)


def _fold_nodes(
    acc: _Device, ints: Any, length: Any, cpu: Any, where: Any, fleets: list[list[Any]]
) -> None:
    """Node records into their device and their windows' fleet partials."""
    cols = {name: ints[:, c].tolist() for name, c in _NODE_COLUMNS}
    rss, lengths, cpus = cols["rss_bytes"], length.tolist(), cpu.tolist()
    acc.node_records += len(rss)
    acc.rss_sum += sum(rss)
    acc.rss_max = max(acc.rss_max, *rss)
    acc.connections += sum(cols["connections"])
    for name in DEVICE_COUNTERS:
        acc.counters[name] += sum(cols[name])
    fleet_cols = [(index, ints[:, c].tolist()) for index, c in _FLEET_NODE_COLUMNS]
    i_nodes, i_rss, i_rss_max = _F["node_records"], _F["rss_sum"], _F["rss_max"]
    i_cpu, i_secs = _F["cpu_s"], _F["node_window_s"]
    for i, cell in enumerate(where.tolist()):  # float sums: one by one, in record order
        acc.cpu_s += cpus[i]
        acc.window_s += lengths[i]
        fleet = fleets[cell]
        fleet[i_nodes] += 1
        fleet[i_rss] += rss[i]
        if rss[i] > fleet[i_rss_max]:
            fleet[i_rss_max] = rss[i]
        fleet[i_cpu] += cpus[i]
        fleet[i_secs] += lengths[i]
        for index, col in fleet_cols:
            fleet[index] += col[i]


def _fold_topics(
    task: _Task,
    ints: Any,
    begin: Any,
    t: Any,
    hists: Any,
    where: Any,
    starts: list[float],
) -> None:
    """Topic records into their device, their (window, topic) partials and the device's
    topic spans; histograms summed per (window, topic) with numpy."""
    import numpy as np

    run = task._run
    acc = run.acc
    counts = ints[:, K_COUNTERS : K_COUNTERS + 3]
    pubs, deliveries, held = (int(x) for x in counts.sum(axis=0).tolist())
    acc.topic_records += len(ints)
    acc.publications += pubs
    acc.deliveries += deliveries
    acc.held += held
    assert task.parser is not None
    names = task.parser.topic_names()
    code = ints[:, K_CODE]
    groups, member = np.unique(where * len(names) + code, return_inverse=True)
    order = np.argsort(member, kind="stable")
    sizes = np.bincount(member)
    bounds = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    group_counts = np.add.reduceat(counts[order], bounds).tolist()
    group_hists = np.add.reduceat(hists[order], bounds)
    for g, (key, n) in enumerate(zip(groups.tolist(), sizes.tolist(), strict=True)):
        cell, c = divmod(key, len(names))
        part = task._window((starts[cell], names[c]), acc)
        part.records += n
        p, d, h = group_counts[g]
        part.pubs += p
        part.deliveries += d
        part.held += h
        task.sums.add(part.number, group_hists, g)
    task.sums.fold(len(task.windows))
    used, code = np.unique(code, return_inverse=True)
    first = np.full(len(used), np.inf)
    last = np.full(len(used), -np.inf)
    np.minimum.at(first, code, begin)
    np.maximum.at(last, code, t)
    for c, name in enumerate(names[u] for u in used.tolist()):
        span = run.topics.get(name)
        if span is None:
            run.topics[name] = [float(first[c]), float(last[c])]
        else:
            span[0] = min(span[0], float(first[c]))
            span[1] = max(span[1], float(last[c]))


def _run_task(cfg: _TaskConfig, counter: Any, groups: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """mapPartitions body: ``groups`` of ``(device, files)``, ``files`` with or without bytes.

    The task's own wall and CPU seconds go into its stats (``task_wall_s``,
    ``task_cpu_s``): what the decode stage spent outside the task code is Spark's.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    task = _Task(cfg)
    for device, files in groups:
        pairs = [(f, None) if isinstance(f, LandingFile) else f for f in files]
        counter.add(task.device(device, pairs))
    task.stats["task_wall_s"] += time.perf_counter() - wall  # type: ignore[assignment]
    task.stats["task_cpu_s"] += time.process_time() - cpu  # type: ignore[assignment]
    yield from task.output()
