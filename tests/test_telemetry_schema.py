"""The telemetry record schema: what devices write is exactly what the job accepts."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2p.telemetry import (
    BUCKETS,
    EDGES,
    TelemetryError,
    bucket,
    empty_histogram,
    encode_record,
    iter_items,
    percentile,
    record_id,
    validate,
)

DEV = "00000000000000ab"


def base(kind: str, **fields: Any) -> dict[str, Any]:
    rec = {"v": 1, "id": record_id(DEV, 2, 7), "device": DEV, "boot": 2, "seq": 7,
           "t": 1.7e9, "window": 0.0 if kind == "event" else 10.0, "kind": kind}  # fmt: skip
    return {**rec, **fields}


NODE = base("node", rss_bytes=30_000_000, cpu_s=0.2, connections=3, packets_sent=5,
            packets_received=6, frames_sent=4, frames_received=4, bytes_sent=900,
            bytes_received=1000, suspicions=0, repairs=0, rejected=0, dropped=0)  # fmt: skip
HIST = empty_histogram()
TOPIC = base("topic", topic="room", publications=3, deliveries=9, held=1,
             latency=HIST, holdback=HIST, ack_round=HIST)  # fmt: skip
EVENT = base("event", event="suspect", peer="00000000000000cd", detail="no answer")


@pytest.mark.parametrize("rec", [NODE, TOPIC, EVENT, base("event", event="start")])
def test_valid_records_round_trip(rec: dict[str, Any]) -> None:
    data = encode_record(rec)
    assert [item for item, _ in iter_items(data + data)] == [rec, rec]


BAD = {
    "not a map": [1, 2],
    "future version": {**NODE, "v": 2},
    "bool version": {**NODE, "v": True},
    "id mismatch": {**NODE, "id": "x"},
    "device upper hex": {**NODE, "device": DEV.upper(), "id": record_id(DEV.upper(), 2, 7)},
    "negative counter": {**NODE, "packets_sent": -1},
    "float counter": {**NODE, "packets_sent": 1.0},
    "nan cpu": {**NODE, "cpu_s": float("nan")},
    "missing field": {k: v for k, v in NODE.items() if k != "rss_bytes"},
    "unknown key": {**NODE, "rss": 1},
    "event with window": {**EVENT, "window": 5.0},
    "node without window": {**NODE, "window": 0.0},
    "unknown event": {**EVENT, "event": "explode"},
    "short histogram": {**TOPIC, "latency": [0] * BUCKETS},
    "negative bucket": {**TOPIC, "latency": [-1] + [0] * BUCKETS},
    "empty topic": {**TOPIC, "topic": ""},
    "bad peer": {**EVENT, "peer": "zz"},
    "unknown kind": {**NODE, "kind": "gauge"},
    "time past year 9999": {**NODE, "t": 253402300800.0},
    "time zero": {**NODE, "t": 0.0},
}


@pytest.mark.parametrize("rec", BAD.values(), ids=BAD.keys())
def test_invalid_records_are_rejected(rec: object) -> None:
    with pytest.raises(TelemetryError):
        validate(rec)


def test_corrupt_spool_keeps_what_came_before() -> None:
    good = encode_record(NODE)
    items = list(iter_items(good + b"\xff\xff" + good))
    assert items[0] == (NODE, None)
    assert items[1][0] is None
    assert "undecodable" in str(items[1][1])
    assert len(items) == 2
    assert next(iter_items(cbor2.dumps({"v": 1})))[0] == {"v": 1}  # decoding is not validating


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_bucket_edges_bracket_the_value(v: float) -> None:
    i = bucket(v)
    assert 0 <= i <= BUCKETS
    if i < BUCKETS:
        assert v < EDGES[i]
    if i > 0:
        assert EDGES[i - 1] <= v


def test_percentile_of_a_histogram() -> None:
    h = empty_histogram()
    for v in [1.0] * 90 + [50.0] * 9 + [5000.0]:
        h[bucket(v)] += 1
    assert percentile(h, 0.5) == EDGES[bucket(1.0)]
    assert percentile(h, 0.95) == EDGES[bucket(50.0)]
    assert percentile(h, 1.0) == EDGES[bucket(5000.0)]
    assert percentile(empty_histogram(), 0.5) is None
