"""Exception root of the :mod:`p2p` package."""


class P2PError(Exception):
    """Root of every error raised by :mod:`p2p`."""


class ScenarioError(P2PError, ValueError):
    """A scenario file is malformed; the message names the line and the reason."""
