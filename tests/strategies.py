"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from p2p.sim import Step
from vcube import MAX_ID


@st.composite
def populations(draw: st.DrawFn, min_size: int, max_size: int) -> list[int]:
    """Distinct node ids: usually sparse 64-bit, sometimes dense ``0..N-1``."""
    n = draw(st.integers(min_size, max_size))
    if draw(st.booleans()):
        return list(range(n))
    raw = draw(st.lists(st.integers(0, MAX_ID), min_size=n, max_size=n))
    ids: list[int] = []
    seen: set[int] = set()
    for v in raw:  # make duplicates distinct without a filter (shrinks well)
        while v in seen:
            v = (v + 0x9E37_79B9_7F4A_7C15) & MAX_ID
        seen.add(v)
        ids.append(v)
    return ids


def raw_steps(
    ids: list[int], topics: list[str], *, horizon: float, rolls: int
) -> st.SearchStrategy[list[Step]]:
    """``(time, node, topic, roll)`` steps for :func:`p2p.sim.legal_script`: 2..6 per node,
    times in ``[0, horizon]`` to a tenth, rolls in ``0..rolls``."""
    return st.lists(
        st.tuples(
            st.floats(0, horizon, allow_nan=False).map(lambda x: round(x, 1)),
            st.sampled_from(ids),
            st.sampled_from(topics),
            st.integers(0, rolls),
        ),
        min_size=2 * len(ids),
        max_size=6 * len(ids),
    )
