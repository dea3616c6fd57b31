"""Fleet telemetry: records on devices, collection, and the Spark job (``spark`` extra).

Only the schema is imported here; the Spark job imports PySpark itself, so
devices never need it.  Landing layout (what the collector and
``p2p telemetry generate`` write, and what ``p2p telemetry aggregate`` reads)::

    LANDING_DIR/date=YYYY-MM-DD/device=<16 hex>/<boot>-<first seq>.cbor

each file a spool file of records (see ``p2p.telemetry._schema``).
"""

from p2p.telemetry._schema import (
    BUCKETS,
    EDGES,
    EVENTS,
    HISTOGRAMS,
    KINDS,
    NODE_COUNTERS,
    SCHEMA_VERSION,
    TOPIC_COUNTERS,
    TelemetryError,
    bucket,
    empty_histogram,
    encode_record,
    iter_items,
    percentile,
    record_id,
    validate,
)

__all__ = [
    "BUCKETS",
    "EDGES",
    "EVENTS",
    "HISTOGRAMS",
    "KINDS",
    "NODE_COUNTERS",
    "SCHEMA_VERSION",
    "TOPIC_COUNTERS",
    "TelemetryError",
    "bucket",
    "empty_histogram",
    "encode_record",
    "iter_items",
    "percentile",
    "record_id",
    "validate",
]
