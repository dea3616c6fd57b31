"""The project's one percentile rule (``p2p._stats``): nearest rank."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2p._stats import nearest_rank, percentile_of


def test_nearest_rank_on_a_hundred_values() -> None:
    values = list(range(1, 101))
    assert [percentile_of(values, q) for q in (1, 50, 95, 99, 100)] == [1, 50, 95, 99, 100]
    assert percentile_of([7], 50) == 7
    assert percentile_of([1, 2], 50) == 1  # the smallest with at least half at or below


@given(st.lists(st.integers(-1000, 1000), min_size=1, max_size=200), st.floats(0.001, 100))
def test_the_percentile_is_the_smallest_value_with_q_percent_at_or_below(
    values: list[int], q: float
) -> None:
    ordered = sorted(values)
    p = percentile_of(ordered, q)
    at_or_below = sum(v <= p for v in ordered)
    assert at_or_below >= q / 100 * len(ordered) - 1e-6
    below = sum(v < p for v in ordered)
    assert below < q / 100 * len(ordered) + 1e-6


@pytest.mark.parametrize(("n", "q"), [(0, 50), (5, 0), (5, 101), (5, -1)])
def test_nonsense_is_refused(n: int, q: float) -> None:
    with pytest.raises(ValueError, match="need n >= 1"):
        nearest_rank(n, q)
