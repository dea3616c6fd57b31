"""Configuration of the VCube-PS core."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class PubSubConfig:
    """Limits of one VCube-PS node.  Every size that comes from outside is bounded here."""

    max_topic_len: int = 256
    """Longest topic name, in UTF-8 bytes."""

    max_payload: int = 64 * 1024
    """Largest payload a publication may carry, in bytes."""

    max_round_messages: int = 1024
    """Most publications a source batches into one round (one tree traversal):
    what queued while the previous round was in flight, so rounds grow with
    the load, up to this and ``max_round_bytes``."""

    max_round_bytes: int = 512 * 1024
    """Most payload bytes a source batches into one round."""

    max_barrier: int = 4096
    """Most entries (publications plus membership ops) a received causal barrier may have."""

    max_view_entries: int = 1 << 16
    """Most membership entries (and bounds) a received ACK may carry."""

    max_queued_ops: int = 100_000
    """Most local operations (publications, (un)subscriptions) queued per topic
    behind the round in flight; beyond it :meth:`publish` refuses instead of
    growing memory without bound."""

    max_held: int = 100_000
    """Most received publications held back per topic (waiting for causal
    predecessors); a packet that would exceed it is refused as a protocol error,
    so its sender's connection closes and no honest state is lost."""

    max_pending_rounds: int = 100_000
    """Most relayed rounds awaiting their children's acknowledgements; a round
    beyond it is refused as a protocol error."""

    aggregation: bool = True
    """Timer-free causal aggregation: hold a round back from a child that could not
    deliver it before a predecessor this node will bring it (see ``VCubePS``)."""

    def __post_init__(self) -> None:
        for name in (
            "max_topic_len",
            "max_payload",
            "max_round_messages",
            "max_round_bytes",
            "max_barrier",
            "max_view_entries",
            "max_queued_ops",
            "max_held",
            "max_pending_rounds",
        ):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:  # NaN and floats passed "<= 0"
                raise ValueError(f"{name} must be a positive int, got {value!r}")
