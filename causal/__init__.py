"""Causal ordering: message ids, causal barriers and hold-back buffers (sans-IO)."""

from causal._barrier import CausalBarrier
from causal._buffer import CausalBuffer, Dep, op_stream
from causal._errors import CausalError
from causal._ids import MsgId

__all__ = ["CausalBarrier", "CausalBuffer", "CausalError", "Dep", "MsgId", "op_stream"]
