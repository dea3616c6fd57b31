"""``vcube._hot.hot``: the hot path's value classes behave as frozen dataclasses do."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vcube._hot import cached, hot, replace


@hot
class Hot:
    KIND: ClassVar[int] = 7
    a: int
    b: str
    c: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Hot_:  # noqa: N801 (the same class as a frozen dataclass, to compare with)
    a: int
    b: str
    c: tuple[int, ...] = ()


@hot
class One:
    a: int


@hot
class Empty:
    pass


values = st.tuples(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3))


@given(values, values)
def test_equality_and_hash_are_a_frozen_dataclass_s(x: tuple, y: tuple) -> None:  # type: ignore[type-arg]
    hx, hy = Hot(x[0], x[1], tuple(x[2])), Hot(y[0], y[1], tuple(y[2]))
    dx, dy = Hot_(x[0], x[1], tuple(x[2])), Hot_(y[0], y[1], tuple(y[2]))
    assert (hx == hy) == (dx == dy)
    assert hash(hx) == hash(dx)
    assert repr(hx).replace("Hot", "Hot_", 1) == repr(dx)


def test_constructor_defaults_keywords_and_match_args() -> None:
    assert Hot(1, "x") == Hot(a=1, b="x", c=())
    assert Hot(1, "x").c == ()
    assert Hot.__match_args__ == ("a", "b", "c")
    assert Hot.KIND == 7  # a ClassVar stays a class attribute, not a field
    with pytest.raises(TypeError):
        Hot(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Hot(1, "x", (), 4)  # type: ignore[call-arg]
    match Hot(3, "y"):
        case Hot(a, b):
            assert (a, b) == (3, "y")
        case _:
            pytest.fail("no match")


def test_one_field_and_no_field_hash_as_dataclasses_do() -> None:
    assert hash(One(5)) == hash((5,))
    assert hash(Empty()) == hash(())
    assert Empty() == Empty()
    assert One(1) != One(2)
    assert One(1) != Hot(1, "")  # type: ignore[comparison-overlap] # another class: never equal
    assert One(1).__eq__(5) is NotImplemented


def test_slotted_and_copyable() -> None:
    h = Hot(1, "x", (2,))
    assert not hasattr(h, "__dict__")
    with pytest.raises(AttributeError):
        h.d = 1  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(h)) == h
    assert copy.deepcopy(h) == h


def test_a_field_without_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="without a default"):

        @hot
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]


def test_assignment_is_a_type_error(tmp_path: Path) -> None:
    """Type checkers read a hot class as a frozen dataclass."""
    src = tmp_path / "use_hot.py"
    src.write_text(
        textwrap.dedent(
            """
            from vcube._hot import hot

            @hot
            class P:
                a: int

            p = P(1)
            p.a = 2
            """
        )
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--strict", str(src)],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stdout
    assert "read-only" in done.stdout or "frozen" in done.stdout, done.stdout


@hot(kw_only=True)
class Kw:
    a: int = 0
    b: int


@hot
class WithCache:
    a: int
    _memo: str | None = cached()

    def memo(self) -> str:
        if self._memo is None:
            object.__setattr__(self, "_memo", f"<{self.a}>")
        assert self._memo is not None
        return self._memo


def test_keyword_only_fields_take_defaults_in_any_order() -> None:
    assert Kw(b=2) == Kw(a=0, b=2)
    assert Kw.__match_args__ == ()
    with pytest.raises(TypeError):
        Kw(1, 2)  # type: ignore[call-arg]


def test_cached_slots_are_not_fields() -> None:
    w = WithCache(3)
    assert w._memo is None
    assert w.memo() == "<3>"
    assert w == WithCache(3)  # the cached value takes no part in equality
    assert hash(w) == hash((3,))
    assert repr(w) == "WithCache(a=3)"
    assert WithCache.__match_args__ == ("a",)
    with pytest.raises(TypeError):
        WithCache(3, "x")  # type: ignore[call-arg]


def test_replace_copies_with_changes() -> None:
    h = Hot(1, "x", (2,))
    assert replace(h, b="y") == Hot(1, "y", (2,))
    assert replace(h) == h
    assert replace(WithCache(3), a=4) == WithCache(4)
    with pytest.raises(TypeError, match="no field 'd'"):
        replace(h, d=1)
