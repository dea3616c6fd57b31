"""VCube: hypercube clusters, spanning trees, failure detector; sparse 64-bit ids (sans-IO)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcube._lazy import lazy_exports

if TYPE_CHECKING:
    from vcube._detector import Detector, DetectorConfig
    from vcube._detmsg import (
        DetectorMessage,
        Entry,
        Probe,
        Push,
        Reply,
        decode_detector,
        encode_detector,
    )
    from vcube._detout import (
        Corrected,
        DetectorOutput,
        DetectorStats,
        Joined,
        Left,
        Reported,
        Restarted,
        SelfSuspected,
        SendDetector,
        Suspected,
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
    "Corrected": "vcube._detout",
    "Detector": "vcube._detector",
    "DetectorConfig": "vcube._detector",
    "DetectorError": "vcube._errors",
    "DetectorMessage": "vcube._detmsg",
    "DetectorOutput": "vcube._detout",
    "DetectorStats": "vcube._detout",
    "Entry": "vcube._detmsg",
    "Hypercube": "vcube._topology",
    "ID_BITS": "vcube._topology",
    "Joined": "vcube._detout",
    "Left": "vcube._detout",
    "MAX_ID": "vcube._topology",
    "Probe": "vcube._detmsg",
    "Push": "vcube._detmsg",
    "RemoteDetectorError": "vcube._errors",
    "Reply": "vcube._detmsg",
    "Reported": "vcube._detout",
    "Restarted": "vcube._detout",
    "SelfSuspected": "vcube._detout",
    "SendDetector": "vcube._detout",
    "Suspected": "vcube._detout",
    "UnknownNodeError": "vcube._errors",
    "VCubeError": "vcube._errors",
    "check_id": "vcube._topology",
    "cluster": "vcube._topology",
    "decode_detector": "vcube._detmsg",
    "depth_and_degree": "vcube._topology",
    "encode_detector": "vcube._detmsg",
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
