"""Exception root of the :mod:`vcube` package."""


class VCubeError(Exception):
    """Root of every error raised by :mod:`vcube`."""


class UnknownNodeError(VCubeError, LookupError):
    """A node id was asked about that the topology does not contain."""
