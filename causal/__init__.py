"""Causal ordering: message ids, causal barriers, hold-back buffers, vector-clock
causal broadcast with timer-free aggregation, and MTU packing (sans-IO)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcube._lazy import lazy_exports

if TYPE_CHECKING:
    from causal._barrier import CausalBarrier as CausalBarrier
    from causal._broadcast import BroadcastConfig as BroadcastConfig
    from causal._broadcast import BroadcastDelivered as BroadcastDelivered
    from causal._broadcast import BroadcastMessage as BroadcastMessage
    from causal._broadcast import BroadcastOutput as BroadcastOutput
    from causal._broadcast import BroadcastReceived as BroadcastReceived
    from causal._broadcast import CausalBroadcast as CausalBroadcast
    from causal._broadcast import HeldBack as HeldBack
    from causal._broadcast import LocalBroadcastError as LocalBroadcastError
    from causal._broadcast import MessageSet as MessageSet
    from causal._broadcast import RemoteBroadcastError as RemoteBroadcastError
    from causal._broadcast import Transmit as Transmit
    from causal._buffer import CausalBuffer as CausalBuffer
    from causal._buffer import Dep as Dep
    from causal._buffer import op_stream as op_stream
    from causal._errors import CausalError as CausalError
    from causal._ids import MsgId as MsgId
    from causal._packing import PacketLimits as PacketLimits
    from causal._packing import pack as pack

_LAZY = {
    "causal._barrier": ("CausalBarrier",),
    "causal._broadcast": (
        "BroadcastConfig",
        "BroadcastDelivered",
        "BroadcastMessage",
        "BroadcastOutput",
        "BroadcastReceived",
        "CausalBroadcast",
        "HeldBack",
        "LocalBroadcastError",
        "MessageSet",
        "RemoteBroadcastError",
        "Transmit",
    ),
    "causal._buffer": ("CausalBuffer", "Dep", "op_stream"),
    "causal._errors": ("CausalError",),
    "causal._ids": ("MsgId",),
    "causal._packing": ("PacketLimits", "pack"),
}
"""Module -> the public names taken from it, imported on first use of one of them
(PEP 562), so importing one name does not load every module of the package."""

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY, globals())
