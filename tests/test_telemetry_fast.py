"""The compiled record parser (p2p.telemetry._fast) against cbor2 + validate.

Its invariant: every item it accepts decodes (cbor2) over exactly the same
bytes to a record that ``validate`` accepts, of the folder's device, with
exactly the values the parser wrote.  Checked on generated spool files, on
thousands of byte-mutated copies of them, and on hand-made records that
are valid or nearly so but must take the exact path.
"""

from __future__ import annotations

import io
import math
import random
import struct
from pathlib import Path
from typing import Any

import cbor2
import numpy as np
import pytest

from p2p.telemetry import (
    HISTOGRAMS,
    NODE_COUNTERS,
    TOPIC_COUNTERS,
    TelemetryError,
    empty_histogram,
    record_id,
    validate,
)
from p2p.telemetry import _fast as fast
from p2p.telemetry._generate import generate

DEV = "00000000000000d1"


def records_of(parser: fast.Parser, blob: bytes, device: str) -> list[tuple[int, int]]:
    """Runs the parser over ``blob`` as the task does (an item it leaves is skipped with
    cbor2) and checks every accepted record against cbor2 + validate; returns the spans."""
    buf = np.frombuffer(blob, dtype=np.uint8)
    pos, accepted = 0, []
    while pos < len(blob):
        count, stop = parser.run(buf, pos, device)
        for r in range(count):
            accepted.append(check_row(parser, blob, device, r))
        pos = stop
        if pos < len(blob) and count < fast.RUN:
            stream = io.BytesIO(blob)
            stream.seek(pos)
            try:
                cbor2.CBORDecoder(stream).decode()
            except Exception:
                break
            pos = stream.tell()
    return accepted


def check_row(parser: fast.Parser, blob: bytes, device: str, r: int) -> tuple[int, int]:
    ints, floats, hists = parser.ints[r], parser.floats[r], parser.hists[r]
    start, end = int(ints[fast.START]), int(ints[fast.END])
    stream = io.BytesIO(blob)
    stream.seek(start)
    rec = cbor2.CBORDecoder(stream).decode()
    assert stream.tell() == end
    assert validate(rec) is rec
    assert rec["device"] == device
    assert (rec["boot"], rec["seq"]) == (ints[fast.BOOT], ints[fast.SEQ])
    assert type(rec["t"]) is float
    assert rec["t"] == floats[fast.T]
    assert type(rec["window"]) is float
    assert rec["window"] == floats[fast.WINDOW]
    if ints[fast.KIND] == fast.NODE:
        assert rec["kind"] == "node"
        assert [rec[c] for c in NODE_COUNTERS] == ints[fast.COUNTERS :].tolist()
        assert type(rec["cpu_s"]) is float
        assert rec["cpu_s"] == floats[fast.CPU]
    else:
        assert ints[fast.KIND] == fast.TOPIC
        assert rec["kind"] == "topic"
        off, size = int(ints[fast.TOPIC_OFF]), int(ints[fast.TOPIC_LEN])
        assert blob[off : off + size].decode() == rec["topic"]
        got = ints[fast.COUNTERS : fast.COUNTERS + len(TOPIC_COUNTERS)].tolist()
        assert got == [rec[c] for c in TOPIC_COUNTERS]
        assert [rec[h] for h in HISTOGRAMS] == hists.tolist()
        assert all(type(c) is int for h in HISTOGRAMS for c in rec[h])  # no bools
    return start, end


@pytest.fixture(scope="module")
def spools(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, bytes]]:
    root = tmp_path_factory.mktemp("fast") / "landing"
    generate(root, devices=3, hours=1, seed=5, jobs=1)
    files = sorted(root.glob("date=*/device=*/*.cbor"))
    return [(p.parent.name[7:], p.read_bytes()) for p in files]


def test_generated_files_are_read_by_the_parser(spools: list[tuple[str, bytes]]) -> None:
    parser = fast.Parser()
    for device, blob in spools:
        spans = records_of(parser, blob, device)
        kinds = []
        pos = 0
        stream = io.BytesIO(blob)
        decoder = cbor2.CBORDecoder(stream)
        while pos < len(blob):
            try:
                rec = decoder.decode()
            except Exception:
                break
            kinds.append((pos, rec.get("kind") if isinstance(rec, dict) else None))
            pos = stream.tell()
        node_topic = [p for p, k in kinds if k in ("node", "topic")]
        # Nearly every node and topic record is taken (the generator's corrupt ones aren't).
        assert len(spans) >= 0.99 * len(node_topic) > 0


def test_mutated_bytes_never_pass_what_validate_refuses(
    spools: list[tuple[str, bytes]],
) -> None:
    parser = fast.Parser()
    rng = random.Random(7)
    device, blob = spools[0]
    blob = blob[:20000]
    accepted = 0
    for _ in range(3000):
        data = bytearray(blob)
        for _ in range(rng.choice((1, 1, 2, 4))):
            i = rng.randrange(len(data))
            data[i] = rng.choice((rng.randrange(256), data[i] ^ 1, 0xF5, 0xF9, 0x1B, 0x20))
        accepted += len(records_of(parser, bytes(data), device))
    assert accepted > 1000  # the mutations left most records alone, and those are taken


def base(kind: str, seq: int = 3, **over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "v": 1,
        "id": record_id(DEV, 2, seq),
        "device": DEV,
        "boot": 2,
        "seq": seq,
        "t": 1.77e9,
        "window": 60.0,
        "kind": kind,
    }
    if kind == "node":
        rec.update({c: 10 + i for i, c in enumerate(NODE_COUNTERS)}, cpu_s=0.25)
    else:
        rec.update(topic="a/b", publications=1, deliveries=2, held=0)
        rec.update({h: empty_histogram() for h in HISTOGRAMS})
    rec.update(over)
    return rec


def taken(data: bytes, device: str = DEV) -> int:
    parser = fast.Parser()
    count, _ = parser.run(np.frombuffer(data, dtype=np.uint8), 0, device)
    for r in range(count):
        check_row(parser, data, device, r)
    return count


def test_valid_records_in_any_key_order_are_taken() -> None:
    node, topic = base("node"), base("topic", latency=[*[0] * 40, 2**32 - 1])
    flipped = dict(reversed(list(topic.items())))
    big = base("node", seq=2**63 - 1, rss_bytes=2**63 - 1)
    assert taken(cbor2.dumps(node) + cbor2.dumps(topic) + cbor2.dumps(flipped)) == 3
    assert taken(cbor2.dumps(big)) == 1


def half_float_t() -> bytes:
    data = cbor2.dumps(base("node", t=1.77e9))
    return data.replace(b"\xfb" + struct.pack(">d", 1.77e9), b"\xfa" + struct.pack(">f", 1.77e9))


def duplicate_key() -> bytes:
    rec = base("node")
    data = cbor2.dumps(rec)
    # One pair more in the header, and "v": 1 again at the end: cbor2 keeps the last.
    return bytes([data[0] + 1]) + data[1:] + cbor2.dumps("v")[0:2] + b"\x01"


def event() -> bytes:
    head = dict(list(base("node").items())[:8])
    return cbor2.dumps({**head, "kind": "event", "window": 0.0, "event": "crash"})


NOT_TAKEN = {
    "event": event(),
    "int time": cbor2.dumps(base("node", t=1770000000)),
    "half float": half_float_t(),
    "int cpu": cbor2.dumps(base("node", cpu_s=1)),
    "nan cpu": cbor2.dumps(base("node", cpu_s=math.nan)),
    "inf cpu": cbor2.dumps(base("node", cpu_s=math.inf)),
    "count 2**32": cbor2.dumps(base("topic", latency=[2**32, *[0] * 40])),
    "counter 2**32": cbor2.dumps(base("topic", held=2**32)),
    "node counter 2**63": cbor2.dumps(base("node", dropped=2**63)),
    "bool count": cbor2.dumps(base("topic", holdback=[True, *[0] * 40])),
    "bool counter": cbor2.dumps(base("node", rejected=False)),
    "negative": cbor2.dumps(base("topic", held=-1)),
    "40 counts": cbor2.dumps(base("topic", ack_round=[0] * 40)),
    "other device": cbor2.dumps(
        base("node", device="00000000000000d2", id=record_id("00000000000000d2", 2, 3))
    ),
    "wrong id": cbor2.dumps(base("node", id=record_id(DEV, 2, 4))),
    "leading zero id": cbor2.dumps(base("node", id=f"{DEV}-02-3")),
    "v 2": cbor2.dumps(base("node", v=2)),
    "extra key": cbor2.dumps(base("node", extra=1)),
    "missing key": cbor2.dumps({k: v for k, v in base("node").items() if k != "dropped"}),
    "topic keys on a node": cbor2.dumps({**base("topic"), "kind": "node"}),
    "empty topic": cbor2.dumps(base("topic", topic="")),
    "non-ascii topic": cbor2.dumps(base("topic", topic="d/ü")),
    "window 0": cbor2.dumps(base("node", window=0.0)),
    "window over a day": cbor2.dumps(base("node", window=86400.5)),
    "t past 9999": cbor2.dumps(base("node", t=2.6e11)),
    "negative t": cbor2.dumps(base("node", t=-1.0)),
    "duplicate key": duplicate_key(),
    "torn": cbor2.dumps(base("topic"))[:-3],
}


@pytest.mark.parametrize("name", list(NOT_TAKEN))
def test_records_the_parser_leaves_to_the_exact_path(name: str) -> None:
    data = NOT_TAKEN[name]
    assert taken(data) == 0
    if name in ("event", "int time", "half float", "int cpu", "count 2**32", "counter 2**32",
                "non-ascii topic", "duplicate key"):  # fmt: skip
        validate(cbor2.loads(data))  # valid: the exact path keeps them
    elif name == "other device":
        assert validate(cbor2.loads(data))["device"] != DEV  # misplaced
    elif name != "torn":
        with pytest.raises((TelemetryError, cbor2.CBORDecodeError)):
            validate(cbor2.loads(data))


def test_the_parser_stops_at_the_first_item_it_leaves(tmp_path: Path) -> None:
    good = cbor2.dumps(base("node"))
    data = good + NOT_TAKEN["event"] + good
    parser = fast.Parser()
    count, stop = parser.run(np.frombuffer(data, dtype=np.uint8), 0, DEV)
    assert (count, stop) == (1, len(good))
    count, stop = parser.run(np.frombuffer(data, dtype=np.uint8), len(data) - len(good), DEV)
    assert (count, stop) == (1, len(data))


def test_a_full_topic_table_sends_new_topics_to_the_exact_path() -> None:
    parser = fast.Parser()
    parser.table = np.zeros((2, parser.table.shape[1]), dtype=np.uint8)
    parser.sizes = np.zeros(3, dtype=np.int64)
    parser.slots = np.full(4, -1, dtype=np.int64)
    recs = [base("topic", seq=i, topic=name) for i, name in enumerate(("a", "b", "a", "c"))]
    data = b"".join(cbor2.dumps(r) for r in recs)
    count, stop = parser.run(np.frombuffer(data, dtype=np.uint8), 0, DEV)
    assert count == 3  # "a", "b", "a" again; "c" would be a third topic
    assert stop == len(data) - len(cbor2.dumps(recs[3]))
    assert parser.topic_names() == ["a", "b"]
    assert parser.ints[:3, fast.CODE].tolist() == [0, 1, 0]


def test_both_paths_count_the_same_duplicates_and_conflicts(tmp_path: Path) -> None:
    from p2p.telemetry._listing import LandingFile
    from p2p.telemetry._task import _Task, _TaskConfig

    node, topic, event_ = base("node", seq=1), base("topic", seq=2), event()
    changed = base("topic", seq=2, held=1)  # same id, other bytes
    slow_copy = base("node", seq=1, cpu_s=1)  # same id, an int cpu_s: the exact path
    files = [
        cbor2.dumps(node) + cbor2.dumps(topic) + event_,
        event_ + cbor2.dumps(topic) + cbor2.dumps(changed) + cbor2.dumps(slow_copy),
        cbor2.dumps(node),
    ]
    pairs = [
        (LandingFile(f"f{i}", len(b), "2026-03-02", DEV, 2, i), b) for i, b in enumerate(files)
    ]
    counts = {}
    for compiled in (True, False):
        task = _Task(_TaskConfig(None, None, 3600.0, True, compiled))
        assert task.device(DEV, pairs) == 8
        assert (task.parser is not None) == compiled
        counts[compiled] = {k: v for k, v in task.stats.items() if k != "compiled"}
        assert task.stats["compiled"] == (5 if compiled else 0)
    assert counts[True] == counts[False]
    assert counts[True]["duplicates"] == 5
    assert counts[True]["duplicates_conflicting"] == 2


def test_without_numba_or_pyarrow_the_job_imports_and_takes_the_exact_path() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('numba', 'pyarrow', 'pyarrow.parquet'): sys.modules[name] = None\n"
        "import p2p, p2p.telemetry, p2p.telemetry._job\n"
        "from p2p.telemetry import _fast\n"
        "from p2p.telemetry._task import _Task, _TaskConfig\n"
        "assert not _fast.available()\n"
        "assert _Task(_TaskConfig(None, None, 3600.0)).parser is None\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.stdout.strip() == "ok", res.stderr
