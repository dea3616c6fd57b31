"""The compiled parser of :mod:`p2p.telemetry._fast` (importing this module needs numba).

Every function here is compiled by numba in nopython mode; they call each
other through the module's names of the compiled versions.  What the
parser accepts, and why that keeps the job's verdicts, is in
:mod:`p2p.telemetry._fast`.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

import numpy as np

from p2p.telemetry._columns import (
    BOOT,
    CODE,
    COUNTERS,
    CPU,
    DIGEST,
    END,
    KEYS,
    KIND,
    NODE,
    SEQ,
    START,
    TOPIC,
    TOPIC_LEN,
    TOPIC_OFF,
    WINDOW,
    T,
)
from p2p.telemetry._schema import (
    BUCKETS,
    HISTOGRAMS,
    MAX_RECORD_BYTES,
    MAX_TIME,
    MAX_TOPIC_LEN,
    NODE_COUNTERS,
    TOPIC_COUNTERS,
)

_numba = importlib.import_module("numba")  # ImportError without numba: the caller's fallback

_K = {k: i for i, k in enumerate(KEYS)}
_BASE_MASK = sum(1 << _K[k] for k in KEYS[:8])
NODE_MASK: Final = _BASE_MASK | sum(1 << _K[k] for k in (*NODE_COUNTERS, "cpu_s"))
TOPIC_MASK: Final = _BASE_MASK | sum(1 << _K[k] for k in ("topic", *TOPIC_COUNTERS, *HISTOGRAMS))

_I_NODE0: Final = _K[NODE_COUNTERS[0]]
_I_CPU: Final = _K["cpu_s"]
_I_TOPIC: Final = _K["topic"]
_I_TOPIC0: Final = _K[TOPIC_COUNTERS[0]]
_I_HIST0: Final = _K[HISTOGRAMS[0]]
_LIMIT32: Final = 1 << 32
_MAX_T: Final = float(MAX_TIME)
_NCOUNTS: Final = BUCKETS + 1
_TOP_BIT: Final = np.uint64(1 << 63)
_EIGHT: Final = np.uint64(8)
_K1: Final = np.uint64(0x9E3779B97F4A7C15)
_K2: Final = np.uint64(0xBF58476D1CE4E5B9)
_S31: Final = np.uint64(31)
_S29: Final = np.uint64(29)


def _jit(func: Any) -> Any:
    """``func`` compiled, cached on disk where numba can.  (numba's own inlining,
    ``inline="always"``, made the parser 5x slower than leaving it to LLVM.)"""
    try:
        return _numba.njit(cache=True)(func)
    except RuntimeError:  # no writable cache location (a zip import): compile in memory
        return _numba.njit(func)


def _uint_py(buf: Any, p: int, n: int) -> tuple[int, Any]:
    """An unsigned int < 2**63 at ``p``: ``(next position, value)``, position -1 if not."""
    if p >= n:
        return -1, 0
    b = buf[p]
    if b < 24:
        return p + 1, np.int64(b)
    size = 1 if b == 24 else 2 if b == 25 else 4 if b == 26 else 8 if b == 27 else 0
    if size == 0 or p + 1 + size > n:
        return -1, 0
    v = np.uint64(0)
    for j in range(size):
        v = (v << _EIGHT) | np.uint64(buf[p + 1 + j])
    if v >= _TOP_BIT:
        return -1, 0
    return p + 1 + size, np.int64(v)


_uint = _jit(_uint_py)


def _text_py(buf: Any, p: int, n: int) -> tuple[int, Any]:
    """A definite text header at ``p``: ``(payload position, length)``, position -1 if not
    (or if the payload runs past the buffer)."""
    if p >= n or buf[p] >> 5 != 3:
        return -1, 0
    ai = np.int64(buf[p]) & 31
    if ai < 24:
        size, q = np.int64(ai), p + 1
    elif ai == 24 and p + 1 < n:
        size, q = np.int64(buf[p + 1]), p + 2
    elif ai == 25 and p + 2 < n:
        size, q = (np.int64(buf[p + 1]) << 8) | np.int64(buf[p + 2]), p + 3
    else:
        return -1, 0
    if q + size > n:
        return -1, 0
    return q, size


_text = _jit(_text_py)


def _double_py(buf: Any, p: int, n: int, bits: Any) -> int:
    """A 64-bit float (``0xfb``) at ``p`` into ``bits[0]`` (the caller views it as
    float64): the next position, or -1."""
    if p + 9 > n or buf[p] != 0xFB:
        return -1
    v = np.uint64(0)
    for j in range(8):
        v = (v << _EIGHT) | np.uint64(buf[p + 1 + j])
    bits[0] = v
    return p + 9


_double = _jit(_double_py)


def _digits_py(buf: Any, p: int, n: int, value: int) -> int:
    """``str(value)`` (``value >= 0``) at ``p``: the position after it, or -1."""
    width = 1
    x = value
    while x >= 10:
        x //= 10
        width += 1
    if p + width > n:
        return -1
    x = value
    for j in range(width - 1, -1, -1):
        if buf[p + j] != 48 + x % 10:
            return -1
        x //= 10
    return p + width


_digits = _jit(_digits_py)


def _is_key_py(buf: Any, p: int, size: int, keys: Any, lens: Any, k: int) -> bool:
    if lens[k] != size:
        return False
    for j in range(size):  # noqa: SIM110 - a loop compiles; all() of a generator may not
        if buf[p + j] != keys[k, j]:
            return False
    return True


_is_key = _jit(_is_key_py)


def _key_py(buf: Any, p: int, size: int, keys: Any, lens: Any, hint: int) -> int:
    """Index in ``KEYS`` of the key bytes ``buf[p:p+size]``, or -1.  ``hint`` (the key
    at this place in the previous record: a device writes its keys in one order) is
    tried first."""
    if hint >= 0 and _is_key(buf, p, size, keys, lens, hint):
        return hint
    for k in range(len(lens)):
        if _is_key(buf, p, size, keys, lens, k):
            return k
    return -1


_key = _jit(_key_py)


def _kind_py(buf: Any, q: int, size: int) -> int:
    """``NODE`` or ``TOPIC`` for the text ``node``/``topic`` at ``q``, else -1."""
    if size == 4 and buf[q] == 110 and buf[q + 1] == 111 and buf[q + 2] == 100 \
            and buf[q + 3] == 101:  # fmt: skip
        return NODE
    if size == 5 and buf[q] == 116 and buf[q + 1] == 111 and buf[q + 2] == 112 \
            and buf[q + 3] == 105 and buf[q + 4] == 99:  # fmt: skip
        return TOPIC
    return -1


_kind = _jit(_kind_py)


def _hist_py(buf: Any, q: int, n: int, row: Any) -> int:
    """A definite array of 41 counts < 2**32 at ``q`` into ``row``: the next position,
    or -1."""
    if q + 2 > n or buf[q] != 0x98 or buf[q + 1] != _NCOUNTS:
        return -1
    q += 2
    for j in range(_NCOUNTS):
        if q < n and buf[q] < 24:  # most counts: one byte
            row[j] = buf[q]
            q += 1
            continue
        q, v = _uint(buf, q, n)
        if q < 0 or v >= _LIMIT32:
            return -1
        row[j] = v
    return q


_hist = _jit(_hist_py)


def _id_ok_py(buf: Any, at: int, size: int, dev: Any, boot: int, seq: int) -> bool:
    """Whether the id's bytes are exactly ``<dev>-<boot>-<seq>``."""
    e = at + size
    if size < 20:
        return False
    for j in range(16):
        if buf[at + j] != dev[j]:
            return False
    if buf[at + 16] != 45:  # "-"
        return False
    s = _digits(buf, at + 17, e, boot)
    if s < 0 or s >= e or buf[s] != 45:
        return False
    return bool(_digits(buf, s + 1, e, seq) == e)


_id_ok = _jit(_id_ok_py)


def _device_ok_py(buf: Any, q: int, n: int, dev: Any) -> bool:
    """Whether the text at ``q`` is the 16 bytes of ``dev``."""
    if q + 17 > n or buf[q] != 0x70:
        return False
    for j in range(16):  # noqa: SIM110
        if buf[q + 1 + j] != dev[j]:
            return False
    return True


_device_ok = _jit(_device_ok_py)


def _record_py(
    buf: Any, p: int, n: int, dev: Any, keys: Any, lens: Any, ints: Any, floats: Any,
    hists: Any, bits: Any, vals: Any, order: Any, r: int,
) -> int:  # fmt: skip
    """One record at ``p`` into row ``r``: its end, or -1 (not one for this path)."""
    if p >= n or buf[p] >> 5 != 5 or (buf[p] & 31) >= 24:
        return -1
    q = p + 1
    mask = 0
    kind = -1
    id_at = id_len = 0
    for i in range(buf[p] & 31):
        q, size = _text(buf, q, n)
        if q < 0:
            return -1
        k = _key(buf, q, size, keys, lens, order[i])
        order[i] = k
        if k < 0 or mask & (1 << k):
            return -1
        mask |= 1 << k
        q += size
        if k == 0:  # v
            q = q + 1 if q < n and buf[q] == 1 else -1
        elif k == 1:  # id: checked once boot and seq are known
            id_at, id_len = _text(buf, q, n)
            q = id_at + id_len if id_at >= 0 else -1
        elif k == 2:
            q = q + 17 if _device_ok(buf, q, n, dev) else -1
        elif k == 7:
            s, size = _text(buf, q, n)
            kind = _kind(buf, s, size) if s >= 0 else -1
            q = s + size if kind >= 0 else -1
        elif k == 5 or k == 6 or k == _I_CPU:  # t, window, cpu_s
            q = _double(buf, q, n, bits)
            floats[r, CPU if k == _I_CPU else k - 5] = vals[0]
        elif k == _I_TOPIC:
            s, size = _text(buf, q, n)
            if s < 0 or size == 0 or size > MAX_TOPIC_LEN:
                return -1
            for j in range(size):
                if buf[s + j] >= 128:
                    return -1
            ints[r, TOPIC_OFF] = s
            ints[r, TOPIC_LEN] = size
            q = s + size
        elif k >= _I_HIST0:
            q = _hist(buf, q, n, hists[r, k - _I_HIST0])
        else:  # boot, seq, a node or a topic counter
            q, v = _uint(buf, q, n)
            if k < 5:
                ints[r, k] = v  # BOOT == 3, SEQ == 4
            elif k < _I_CPU:
                ints[r, COUNTERS + k - _I_NODE0] = v
            elif v >= _LIMIT32:
                return -1
            else:
                ints[r, COUNTERS + k - _I_TOPIC0] = v
        if q < 0:
            return -1
    if mask != (NODE_MASK if kind == NODE else TOPIC_MASK if kind == TOPIC else -1):
        return -1
    t, window = floats[r, T], floats[r, WINDOW]
    if not (0.0 < t <= _MAX_T) or not (0.0 < window <= 86400.0) or q - p > MAX_RECORD_BYTES:
        return -1
    if kind == NODE and floats[r, CPU] - floats[r, CPU] != 0.0:
        return -1  # cpu_s not finite
    if not _id_ok(buf, id_at, id_len, dev, ints[r, BOOT], ints[r, SEQ]):
        return -1
    ints[r, START] = p
    ints[r, END] = q
    ints[r, KIND] = kind
    return q


_record = _jit(_record_py)


def _digest_py(buf: Any, p: int, q: int) -> Any:
    """A 64-bit hash of ``buf[p:q]`` (as an int64): equal bytes, equal digests; different
    ones differ but for a 2**-64 chance (as Python's ``hash`` of the bytes, which it
    replaces on this path).  Eight bytes a step, multiply and xor-shift."""
    h = np.uint64(q - p) * _K1
    i = p
    while i + 8 <= q:
        w = np.uint64(0)
        for j in range(8):
            w = (w << _EIGHT) | np.uint64(buf[i + j])
        h = (h ^ w) * _K2
        h ^= h >> _S31
        i += 8
    w = np.uint64(0)
    while i < q:
        w = (w << _EIGHT) | np.uint64(buf[i])
        i += 1
    h = (h ^ w) * _K2
    h ^= h >> _S29
    return np.int64(h)  # the same bits, as the int64 column holds them


digest = _jit(_digest_py)
"""The compiled :func:`_digest_py`."""


def _intern_py(buf: Any, at: int, size: int, table: Any, sizes: Any, slots: Any) -> Any:
    """The code of the topic ``buf[at:at+size]`` in the task's table (bytes compared, so
    exact), added if new: ``sizes[-1]`` counts the codes; -1 if the table is full."""
    h = np.uint64(size)
    for j in range(size):
        h = (h ^ np.uint64(buf[at + j])) * _K2
    mask = len(slots) - 1
    i = np.int64(h & np.uint64(mask))
    while slots[i] >= 0:
        c = slots[i]
        if sizes[c] == size:
            same = True
            for j in range(size):
                if table[c, j] != buf[at + j]:
                    same = False
                    break
            if same:
                return c
        i = (i + 1) & mask
    c = sizes[-1]
    if c >= len(sizes) - 1:
        return -1
    for j in range(size):
        table[c, j] = buf[at + j]
    sizes[c] = size
    sizes[-1] = c + 1
    slots[i] = c
    return c


_intern = _jit(_intern_py)


def _run_py(
    buf: Any, pos: int, dev: Any, keys: Any, lens: Any, ints: Any, floats: Any, hists: Any,
    table: Any, sizes: Any, slots: Any, row: int,
) -> tuple[int, int]:  # fmt: skip
    """Records from ``pos`` into rows ``row`` on of ``ints``, ``floats``, ``hists``:
    ``(count, stop)``, ``stop`` the position of the first item not taken (the buffer's
    end, or an item for the other path).  Each row also gets the record's digest and its topic's
    code in the task's topic table (``table``, ``sizes``, ``slots``)."""
    bits = np.zeros(1, dtype=np.uint64)
    vals = bits.view(np.float64)
    order = np.full(24, -1, dtype=np.int64)
    n = len(buf)
    r = row
    limit = len(ints)
    while pos < n and r < limit:
        end = _record(buf, pos, n, dev, keys, lens, ints, floats, hists, bits, vals, order, r)
        if end < 0:
            break
        if ints[r, KIND] == TOPIC:
            code = _intern(buf, ints[r, TOPIC_OFF], ints[r, TOPIC_LEN], table, sizes, slots)
            if code < 0:
                break  # a new topic and a full table: the exact path takes it
            ints[r, CODE] = code
        ints[r, DIGEST] = digest(buf, pos, end)
        pos = end
        r += 1
    return r - row, pos


run = _jit(_run_py)
"""The compiled :func:`_run_py`."""
