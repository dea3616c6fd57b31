"""Exception root of the :mod:`p2p` package."""

from typing import ClassVar


class P2PError(Exception):
    """Root of every error raised by :mod:`p2p`."""

    exit_code: ClassVar[int] = 2
    """Exit status when this error ends a command: 2, the command as given cannot
    work (a bad argument or input file); subclasses for runtime failures say 1."""


class CommandError(P2PError):
    """A well-formed command failed while running (a port in use, an identity
    already running elsewhere, too few subscribers): exit status 1."""

    exit_code = 1


class ScenarioError(P2PError, ValueError):
    """A scenario file is malformed; the message names the line and the reason."""


class SecurityError(P2PError):
    """Root of every security failure: the runtime logs it and closes the connection."""


class IdentityError(SecurityError):
    """A key, certificate or fleet file is missing, corrupt or too widely readable."""


class HandshakeError(SecurityError):
    """A secure-channel handshake failed: malformed, unexpected or unauthenticated."""


class AuthenticationError(SecurityError):
    """A record or certificate failed its cryptographic check (tampered or wrong key)."""


class ReplayError(AuthenticationError):
    """A record arrived with the wrong sequence number: replayed, reordered or after a gap."""


class ForgedRecordError(SecurityError):
    """A discovery record is malformed, unsigned, wrongly signed or from outside the fleet."""


class NodeError(P2PError):
    """A local misuse of a node (for example using it after close, or a malformed
    ``HOST:PORT``)."""


class IdentityInUseError(CommandError):
    """Another process runs a node with this identity (its lock file names the pid)."""
