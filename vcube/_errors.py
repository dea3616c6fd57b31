"""Exception root of the :mod:`vcube` package."""


class VCubeError(Exception):
    """Root of every error raised by :mod:`vcube`."""


class UnknownNodeError(VCubeError, LookupError):
    """A node id was asked about that the topology does not contain."""


class DetectorError(VCubeError, ValueError):
    """The failure detector was used wrongly by its driver (bad config, bad local call)."""


class RemoteDetectorError(DetectorError):
    """A detector message from the network is malformed or over a limit.

    Raised before any state changes: the detector is exactly as it was, and the
    driver should log the frame and drop (or close) the peer's connection.
    """
