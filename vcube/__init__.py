"""VCube: hypercube clusters and spanning trees on sparse 64-bit ids (sans-IO)."""

from vcube._errors import UnknownNodeError, VCubeError
from vcube._topology import (
    ID_BITS,
    MAX_ID,
    Hypercube,
    check_id,
    cluster,
    depth_and_degree,
    partition,
    partition_sorted,
)

__all__ = [
    "ID_BITS",
    "MAX_ID",
    "Hypercube",
    "UnknownNodeError",
    "VCubeError",
    "check_id",
    "cluster",
    "depth_and_degree",
    "partition",
    "partition_sorted",
]
