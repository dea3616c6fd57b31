"""Causal ordering: message ids, causal barriers, hold-back buffers, vector-clock
causal broadcast with timer-free aggregation, and MTU packing (sans-IO)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcube._lazy import lazy_exports

if TYPE_CHECKING:
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

_LAZY = {
    "BroadcastConfig": "causal._broadcast",
    "BroadcastDelivered": "causal._broadcast",
    "BroadcastMessage": "causal._broadcast",
    "BroadcastOutput": "causal._broadcast",
    "BroadcastReceived": "causal._broadcast",
    "CausalBarrier": "causal._barrier",
    "CausalBroadcast": "causal._broadcast",
    "CausalBuffer": "causal._buffer",
    "CausalError": "causal._errors",
    "Dep": "causal._buffer",
    "HeldBack": "causal._broadcast",
    "LocalBroadcastError": "causal._broadcast",
    "MessageSet": "causal._broadcast",
    "MsgId": "causal._ids",
    "PacketLimits": "causal._packing",
    "RemoteBroadcastError": "causal._broadcast",
    "Transmit": "causal._broadcast",
    "op_stream": "causal._buffer",
    "pack": "causal._packing",
}
"""Public name -> the private module defining it, imported on first use (PEP 562),
so importing one name does not load every module of the package."""

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


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
