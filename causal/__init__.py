"""Causal ordering: message ids, causal barriers, hold-back buffers, vector-clock
causal broadcast with timer-free aggregation, and MTU packing (sans-IO)."""

from causal._barrier import CausalBarrier
from causal._broadcast import (
    BroadcastConfig,
    BroadcastDelivered,
    BroadcastMessage,
    BroadcastOutput,
    BroadcastReceived,
    CausalBroadcast,
    HeldBack,
    LocalBroadcastError,
    MessageSet,
    RemoteBroadcastError,
    Transmit,
)
from causal._buffer import CausalBuffer, Dep, op_stream
from causal._errors import CausalError
from causal._ids import MsgId
from causal._packing import PacketLimits, pack

__all__ = [
    "BroadcastConfig",
    "BroadcastDelivered",
    "BroadcastMessage",
    "BroadcastOutput",
    "BroadcastReceived",
    "CausalBarrier",
    "CausalBroadcast",
    "CausalBuffer",
    "CausalError",
    "Dep",
    "HeldBack",
    "LocalBroadcastError",
    "MessageSet",
    "MsgId",
    "PacketLimits",
    "RemoteBroadcastError",
    "Transmit",
    "op_stream",
    "pack",
]
