"""Exception root of the :mod:`topics` package.

As in h11, errors split by who is at fault: :class:`LocalProtocolError` when the
local application misused the API (publishing without subscribing, say), and
:class:`RemoteProtocolError` when a peer sent something the protocol forbids.
"""


class TopicsError(Exception):
    """Root of every error raised by :mod:`topics`."""


class LocalProtocolError(TopicsError):
    """The local caller asked for something the protocol does not allow now."""


class NotSubscribedError(LocalProtocolError):
    """Publish or unsubscribe on a topic this node is not subscribed to."""


class AlreadySubscribedError(LocalProtocolError):
    """Subscribe on a topic this node is already subscribed to."""


class RemoteProtocolError(TopicsError):
    """A peer sent a packet that breaks the protocol; the packet was not applied."""
