"""VCube: hypercube clusters, spanning trees, failure detector; sparse 64-bit ids (sans-IO)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcube._lazy import lazy_exports

if TYPE_CHECKING:
    from vcube._detector import (
        Corrected,
        Detector,
        DetectorConfig,
        DetectorMessage,
        DetectorOutput,
        DetectorStats,
        Entry,
        Joined,
        Left,
        Probe,
        Push,
        Reply,
        Reported,
        Restarted,
        SelfSuspected,
        SendDetector,
        Suspected,
        decode_detector,
        encode_detector,
    )
    from vcube._errors import DetectorError, RemoteDetectorError, UnknownNodeError, VCubeError
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

_LAZY = {
    "Corrected": "vcube._detector",
    "Detector": "vcube._detector",
    "DetectorConfig": "vcube._detector",
    "DetectorError": "vcube._errors",
    "DetectorMessage": "vcube._detector",
    "DetectorOutput": "vcube._detector",
    "DetectorStats": "vcube._detector",
    "Entry": "vcube._detector",
    "Hypercube": "vcube._topology",
    "ID_BITS": "vcube._topology",
    "Joined": "vcube._detector",
    "Left": "vcube._detector",
    "MAX_ID": "vcube._topology",
    "Probe": "vcube._detector",
    "Push": "vcube._detector",
    "RemoteDetectorError": "vcube._errors",
    "Reply": "vcube._detector",
    "Reported": "vcube._detector",
    "Restarted": "vcube._detector",
    "SelfSuspected": "vcube._detector",
    "SendDetector": "vcube._detector",
    "Suspected": "vcube._detector",
    "UnknownNodeError": "vcube._errors",
    "VCubeError": "vcube._errors",
    "check_id": "vcube._topology",
    "cluster": "vcube._topology",
    "decode_detector": "vcube._detector",
    "depth_and_degree": "vcube._topology",
    "encode_detector": "vcube._detector",
    "partition": "vcube._topology",
    "partition_sorted": "vcube._topology",
}
"""Public name -> the private module defining it, imported on first use (PEP 562),
so importing one name does not load every module of the package."""

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "ID_BITS",
    "MAX_ID",
    "Corrected",
    "Detector",
    "DetectorConfig",
    "DetectorError",
    "DetectorMessage",
    "DetectorOutput",
    "DetectorStats",
    "Entry",
    "Hypercube",
    "Joined",
    "Left",
    "Probe",
    "Push",
    "RemoteDetectorError",
    "Reply",
    "Restarted",
    "Reported",
    "SelfSuspected",
    "SendDetector",
    "Suspected",
    "UnknownNodeError",
    "VCubeError",
    "check_id",
    "cluster",
    "decode_detector",
    "depth_and_degree",
    "encode_detector",
    "partition",
    "partition_sorted",
]
