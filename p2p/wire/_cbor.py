"""Canonical CBOR items of the wire subset, both ways: shortest heads, integers,
byte and text strings, bools written byte by byte; the checked reading of
decoded values (:func:`_array`, :func:`_int`, ...); :func:`_scan`, the byte scan
a body passes before ``cbor2`` sees it."""

from __future__ import annotations

from typing import Final

import cbor2

from p2p.wire._limits import COUNTER_LIMIT, MAX_DEPTH, NODE_LIMIT, WireError, WireLimits

# ------------------------------------------------------------------ encoding
#
# Bodies are written here byte by byte instead of by ``cbor2.dumps`` on a tree
# of lists: the same canonical CBOR (shortest heads, definite lengths), several
# times faster, since cbor2's encoder makes a Python-level ``write`` per item.
# A value the core never puts in a packet (a bool or a bignum where an int
# belongs, a bytearray payload) is handed to ``cbor2.dumps``, so the bytes are
# cbor2's in every case (``tests/test_wire.py`` compares the two).


def _head(major: int, n: int) -> bytes:
    """The shortest CBOR head of type ``major`` (0x00, 0x20, ... 0x80) with argument ``n``."""
    if n < 24:
        return bytes((major | n,))
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return bytes((major | 25, n >> 8, n & 0xFF))
    if n < 0x1_0000_0000:
        return bytes((major | 26,)) + n.to_bytes(4, "big")
    return bytes((major | 27,)) + n.to_bytes(8, "big")


_UINT: Final = tuple(_head(0x00, n) for n in range(256))
_BYTES_HEAD: Final = tuple(_head(0x40, n) for n in range(256))
_ARRAY_HEAD: Final = tuple(_head(0x80, n) for n in range(256))


def _e_int(v: object) -> bytes:
    if type(v) is int:
        if 0 <= v < 0x100:
            return _UINT[v]
        if 0 <= v < NODE_LIMIT:
            return _head(0x00, v)
        if -NODE_LIMIT <= v < 0:
            return _head(0x20, -1 - v)
    return cbor2.dumps(v)


def _e_array(n: int) -> bytes:
    return _ARRAY_HEAD[n] if n < 0x100 else _head(0x80, n)


def _e_bytes(v: object) -> bytes:
    if type(v) is bytes:
        n = len(v)
        return (_BYTES_HEAD[n] if n < 0x100 else _head(0x40, n)) + v
    return cbor2.dumps(v)


def _e_bool(v: object) -> bytes:
    if v is True:
        return b"\xf5"
    if v is False:
        return b"\xf4"
    return cbor2.dumps(v)


_TOPICS: dict[str, bytes] = {}
"""Encoded topic names (a node uses few; cleared when it holds :data:`_CACHE_TOPICS`)."""

_CACHE_TOPICS: Final = 1024


def _e_topic(v: object) -> bytes:
    if type(v) is not str:
        return cbor2.dumps(v)
    data = _TOPICS.get(v)
    if data is None:
        try:
            raw = v.encode()
        except UnicodeEncodeError:  # a lone surrogate: cbor2 raises as it always did
            return cbor2.dumps(v)
        if len(_TOPICS) >= _CACHE_TOPICS:
            _TOPICS.clear()
        data = _TOPICS[v] = _head(0x60, len(raw)) + raw
    return data


# ------------------------------------------------------------------ decoding


def _scan(body: bytes, max_items: int) -> None:
    """Check that ``body`` is exactly one CBOR item of the wire subset (see ``p2p.wire``).

    Cheap: strings are skipped by their length, so the cost is per item, not per
    byte.  Every declared length is checked against the bytes left, so no
    length is ever trusted before it is known to be there.
    """
    end = len(body)
    pos = 0
    items = 0
    left = 1  # items still to read in the innermost open array (top level: the body)
    stack: list[int] = []
    while True:
        if left == 0:
            if not stack:
                break
            left = stack.pop()
            continue
        if pos >= end:
            raise WireError(f"body truncated at byte {pos}")
        head = body[pos]
        pos += 1
        left -= 1
        items += 1
        if items > max_items:
            raise WireError(f"body holds more than max_items={max_items} CBOR items")
        major, info = head >> 5, head & 0x1F
        if major == 7:
            if info not in (20, 21):
                raise WireError(f"CBOR simple/float item 0x{head:02x} at byte {pos - 1}")
            continue
        if major > 4:
            kind = "map" if major == 5 else "tag"
            raise WireError(f"CBOR {kind} at byte {pos - 1} (not used by the wire format)")
        if info < 24:
            arg = info
        elif info <= 27:
            width = 1 << (info - 24)
            if pos + width > end:
                raise WireError(f"body truncated at byte {pos}")
            arg = int.from_bytes(body[pos : pos + width], "big")
            pos += width
            if arg < (24 if width == 1 else 1 << (4 * width)):
                raise WireError(f"CBOR head at byte {pos - width - 1} is not in its shortest form")
        else:
            raise WireError(
                f"indefinite-length or reserved CBOR item 0x{head:02x} at byte {pos - 1}"
            )
        if major <= 1:
            continue
        if arg > end - pos:  # strings: their bytes; arrays: at least one byte per item
            raise WireError(f"length {arg} at byte {pos} exceeds the {end - pos} bytes left")
        if major < 4:
            pos += arg
            continue
        if len(stack) >= MAX_DEPTH:
            raise WireError(f"arrays nested deeper than {MAX_DEPTH}")
        stack.append(left)
        left = arg
    if pos != end:
        raise WireError(f"{end - pos} trailing bytes after the body")


def _array(v: object, what: str, size: int | None = None, limit: int | None = None) -> list[object]:
    if type(v) is not list:
        raise WireError(f"{what}: expected an array, got {type(v).__name__}")
    if size is not None and len(v) != size:
        raise WireError(f"{what}: expected {size} elements, got {len(v)}")
    if limit is not None and len(v) > limit:
        raise WireError(f"{what}: {len(v)} elements exceed the limit of {limit}")
    return v


def _int(v: object, what: str, lo: int, hi: int) -> int:
    if type(v) is not int:  # also rejects bool, a subclass of int
        raise WireError(f"{what}: expected an integer, got {type(v).__name__}")
    if not lo <= v < hi:
        raise WireError(f"{what}: {v} is outside [{lo}, {hi})")
    return v


def _node(v: object, what: str) -> int:
    return _int(v, what, 0, NODE_LIMIT)


def _ctr(v: object, what: str) -> int:
    return _int(v, what, 0, COUNTER_LIMIT)


def _d_topic(v: object, lim: WireLimits) -> str:
    if type(v) is not str:
        raise WireError(f"topic: expected a text string, got {type(v).__name__}")
    size = len(v.encode())
    if not 0 < size <= lim.max_topic_len:
        raise WireError(
            f"topic: {size} UTF-8 bytes, outside [1, max_topic_len={lim.max_topic_len}]"
        )
    return v
