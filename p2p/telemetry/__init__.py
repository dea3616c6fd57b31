"""Fleet telemetry: records on devices, collection, and the Spark job (``spark`` extra).

Only the schema is imported here; the Spark job imports PySpark itself, so
devices never need it.  Landing layout (what the collector and
``p2p telemetry generate`` write, and what ``p2p telemetry aggregate`` reads)::

    LANDING_DIR/date=YYYY-MM-DD/device=<16 hex>/<boot>-<first seq>.cbor

each file a spool file of records (see ``p2p.telemetry._schema``).
"""

from p2p.telemetry._schema import BUCKETS as BUCKETS
from p2p.telemetry._schema import EDGES as EDGES
from p2p.telemetry._schema import EVENTS as EVENTS
from p2p.telemetry._schema import HISTOGRAMS as HISTOGRAMS
from p2p.telemetry._schema import KINDS as KINDS
from p2p.telemetry._schema import NODE_COUNTERS as NODE_COUNTERS
from p2p.telemetry._schema import SCHEMA_VERSION as SCHEMA_VERSION
from p2p.telemetry._schema import TOPIC_COUNTERS as TOPIC_COUNTERS
from p2p.telemetry._schema import TelemetryError as TelemetryError
from p2p.telemetry._schema import bucket as bucket
from p2p.telemetry._schema import empty_histogram as empty_histogram
from p2p.telemetry._schema import encode_record as encode_record
from p2p.telemetry._schema import iter_items as iter_items
from p2p.telemetry._schema import percentile as percentile
from p2p.telemetry._schema import record_id as record_id
from p2p.telemetry._schema import validate as validate

__all__ = sorted(name for name in globals() if not name.startswith("_"))
"""Every name imported above."""
