"""VCube: hypercube clusters, spanning trees, failure detector; sparse 64-bit ids (sans-IO)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcube._lazy import lazy_exports

if TYPE_CHECKING:
    from vcube._detector import Detector as Detector
    from vcube._detector import DetectorConfig as DetectorConfig
    from vcube._detmsg import DetectorMessage as DetectorMessage
    from vcube._detmsg import Entry as Entry
    from vcube._detmsg import Probe as Probe
    from vcube._detmsg import Push as Push
    from vcube._detmsg import Reply as Reply
    from vcube._detmsg import decode_detector as decode_detector
    from vcube._detmsg import encode_detector as encode_detector
    from vcube._detout import Corrected as Corrected
    from vcube._detout import DetectorOutput as DetectorOutput
    from vcube._detout import DetectorStats as DetectorStats
    from vcube._detout import Joined as Joined
    from vcube._detout import Left as Left
    from vcube._detout import Reported as Reported
    from vcube._detout import Restarted as Restarted
    from vcube._detout import SelfSuspected as SelfSuspected
    from vcube._detout import SendDetector as SendDetector
    from vcube._detout import Suspected as Suspected
    from vcube._errors import DetectorError as DetectorError
    from vcube._errors import RemoteDetectorError as RemoteDetectorError
    from vcube._errors import UnknownNodeError as UnknownNodeError
    from vcube._errors import VCubeError as VCubeError
    from vcube._topology import ID_BITS as ID_BITS
    from vcube._topology import MAX_ID as MAX_ID
    from vcube._topology import Hypercube as Hypercube
    from vcube._topology import check_id as check_id
    from vcube._topology import cluster as cluster
    from vcube._topology import depth_and_degree as depth_and_degree
    from vcube._topology import partition as partition
    from vcube._topology import partition_sorted as partition_sorted

_LAZY = {
    "vcube._detector": ("Detector", "DetectorConfig"),
    "vcube._detmsg": (
        "DetectorMessage",
        "Entry",
        "Probe",
        "Push",
        "Reply",
        "decode_detector",
        "encode_detector",
    ),
    "vcube._detout": (
        "Corrected",
        "DetectorOutput",
        "DetectorStats",
        "Joined",
        "Left",
        "Reported",
        "Restarted",
        "SelfSuspected",
        "SendDetector",
        "Suspected",
    ),
    "vcube._errors": ("DetectorError", "RemoteDetectorError", "UnknownNodeError", "VCubeError"),
    "vcube._topology": (
        "ID_BITS",
        "MAX_ID",
        "Hypercube",
        "check_id",
        "cluster",
        "depth_and_degree",
        "partition",
        "partition_sorted",
    ),
}
"""Module -> the public names taken from it, imported on first use of one of them
(PEP 562), so importing one name does not load every module of the package."""

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY, globals())
