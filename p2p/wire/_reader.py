"""Incremental de-framing of a stream: :class:`FrameReader`."""

from __future__ import annotations

from p2p.wire._limits import PREFIX_BYTES, WireError, WireLimits


class FrameReader:
    """Incremental de-framing of one TCP stream, in bounded memory.

    Holds at most one incomplete frame (``PREFIX_BYTES + max_frame`` bytes).  A
    length prefix above ``max_frame`` (or of zero) raises :class:`WireError`
    as soon as its 4 bytes arrive, before anything is buffered for it; the
    reader then stays failed.
    """

    __slots__ = ("_buf", "_failed", "_max_frame", "_tight", "_tight_max")

    def __init__(self, limits: WireLimits, *, tight: int = 0, tight_max: int = 0) -> None:
        """``tight``: the first frames, limited to ``tight_max`` bytes each (a
        handshake, before the peer has proved anything), then ``max_frame``."""
        self._max_frame = limits.max_frame
        self._tight = tight
        self._tight_max = tight_max
        self._buf = bytearray()
        self._failed: WireError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for the frame being received."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data`` from the stream; return the frame bodies it completes, in order."""
        if self._failed is not None:
            raise self._failed
        out: list[bytes] = []
        buf = self._buf
        view = memoryview(data)
        while view:
            if len(buf) < PREFIX_BYTES:
                take = PREFIX_BYTES - len(buf)
                buf += view[:take]
                view = view[take:]
                if len(buf) < PREFIX_BYTES:
                    break
                size = int.from_bytes(buf, "big")
                limit = self._max_frame
                if self._tight:
                    self._tight -= 1
                    limit = self._tight_max
                if not 0 < size <= limit:
                    buf.clear()
                    self._failed = WireError(f"frame length {size} outside [1, max_frame={limit}]")
                    raise self._failed
            size = int.from_bytes(buf[:PREFIX_BYTES], "big")
            take = PREFIX_BYTES + size - len(buf)
            buf += view[:take]
            view = view[take:]
            if len(buf) == PREFIX_BYTES + size:
                out.append(bytes(buf[PREFIX_BYTES:]))
                buf.clear()
        return out
