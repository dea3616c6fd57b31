"""Hot-path value classes: plain slotted classes typed as frozen dataclasses.

Packets, core events and machine outputs are made once per message or more.
A frozen dataclass costs about a millisecond to define (six generated
methods, each compiled at import) and its ``__init__`` sets every field
through ``object.__setattr__``.  :func:`hot` gives a class the same
constructor, equality, hash, ``repr`` and ``__match_args__`` at a fraction of
both costs, and type checkers treat the class as a frozen dataclass
(``dataclass_transform(frozen_default=True)``): assigning a field is a type
error, not a run-time one.

This module imports nothing of the project, so every package may use it.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, Literal, TypeVar, dataclass_transform, overload

__all__ = ["cached", "hot", "replace"]

T = TypeVar("T")


class _Cached:
    """The marker :func:`cached` leaves as a class-level value."""


_CACHED = _Cached()


def cached(*, init: Literal[False] = False) -> Any:
    """A slot that is not a field: ``None`` after ``__init__``, left out of
    equality, hash, ``repr`` and ``__match_args__`` (a value computed on first
    use and kept, set with ``object.__setattr__``).  Declare it last."""
    return _CACHED


def _fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The class's own annotated names, in order, less its ``ClassVar`` ones:
    the fields, and the :func:`cached` slots."""
    notes: dict[str, Any] = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 (inspect is slow to import)
    names = [n for n, a in notes.items() if "ClassVar" not in str(a)]
    extra = tuple(n for n in names if cls.__dict__.get(n) is _CACHED)
    return tuple(n for n in names if n not in extra), extra


def _slotted(cls: type, slots: tuple[str, ...]) -> type:
    """``cls`` again with ``__slots__`` for ``slots``, unless its instances have
    no ``__dict__`` already (a class compiled to a native one, or one that
    declares its slots)."""
    if not cls.__dictoffset__:
        return cls
    ns = {k: v for k, v in cls.__dict__.items() if k not in slots}
    ns.pop("__dict__", None)
    ns.pop("__weakref__", None)
    ns["__slots__"] = slots
    return type(cls)(cls.__name__, cls.__bases__, ns)


def _init(
    cls: type, fields: tuple[str, ...], defaults: dict[str, Any], extra: tuple[str, ...], kw: bool
) -> Any:
    """The generated ``__init__``: one plain assignment per slot."""
    seen_default = False
    params = ["*"] if kw and fields else []
    for f in fields:
        if f in defaults:
            seen_default = True
            params.append(f"{f}=__d_{f}")
        elif seen_default and not kw:
            raise TypeError(f"{cls.__qualname__}: field {f!r} without a default follows one with")
        else:
            params.append(f)
    lines = [f"    self.{f} = {f}\n" for f in fields] + [f"    self.{f} = None\n" for f in extra]
    body = "".join(lines) or "    pass\n"
    source = f"def __init__({', '.join(['self', *params])}):\n{body}"
    namespace: dict[str, Any] = {f"__d_{f}": v for f, v in defaults.items()}
    exec(source, namespace)  # the field names are the class's own identifiers
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _methods(cls: type, fields: tuple[str, ...]) -> None:
    """Equality, hash and ``repr`` as a frozen dataclass has them: by class,
    then by the tuple of fields (so hashes equal a dataclass's)."""
    if not fields:
        values: Any = lambda self: ()  # noqa: E731
    elif len(fields) == 1:
        one = attrgetter(fields[0])
        values = lambda self: (one(self),)  # noqa: E731
    else:
        values = attrgetter(*fields)

    def __eq__(self: Any, other: object) -> bool:  # noqa: N807
        if other.__class__ is not self.__class__:
            return NotImplemented
        return bool(values(self) == values(other))

    def __hash__(self: Any) -> int:  # noqa: N807
        return hash(values(self))

    def __repr__(self: Any) -> str:  # noqa: N807
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in fields)
        return f"{self.__class__.__qualname__}({shown})"

    for method in (__eq__, __hash__, __repr__):
        method.__qualname__ = f"{cls.__qualname__}.{method.__name__}"
        setattr(cls, method.__name__, method)


@overload
def hot(cls: type[T], /) -> type[T]: ...
@overload
def hot(*, kw_only: bool = False) -> Callable[[type[T]], type[T]]: ...
@dataclass_transform(frozen_default=True, field_specifiers=(cached,))
def hot(cls: type[T] | None = None, /, *, kw_only: bool = False) -> Any:
    """``cls`` as a plain slotted class of its annotated fields, with a frozen
    dataclass's ``__init__`` (positional or keyword, or keyword only with
    ``kw_only``; class-level values as defaults), ``__eq__``, ``__hash__``,
    ``__repr__`` and ``__match_args__``.

    Invariants: the fields are the class's own annotations in order (a base's
    are not inherited), less :func:`cached` slots; instances have no
    ``__dict__``; two instances are equal exactly when a frozen dataclass's
    would be, with the same hash.  Not kept: assignment is not refused at
    run time (type checkers refuse it), and ``dataclasses.fields`` does not
    apply (:func:`replace` stands for ``dataclasses.replace``)."""

    def make(cls: type[T]) -> type[T]:
        fields, extra = _fields(cls)
        defaults = {f: cls.__dict__[f] for f in fields if f in cls.__dict__}
        out = _slotted(cls, fields + extra)
        setattr(out, "__init__", _init(out, fields, defaults, extra, kw_only))  # noqa: B010
        setattr(out, "__match_args__", () if kw_only else fields)  # noqa: B010
        setattr(out, "_hot_fields", fields)  # noqa: B010
        _methods(out, fields)
        return out

    return make if cls is None else make(cls)


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of the :func:`hot` instance ``obj`` with ``changes`` to its fields."""
    fields: tuple[str, ...] = getattr(type(obj), "_hot_fields")  # noqa: B009
    unknown = changes.keys() - set(fields)
    if unknown:
        raise TypeError(f"{type(obj).__qualname__} has no field {sorted(unknown)[0]!r}")
    return type(obj)(**{f: changes[f] if f in changes else getattr(obj, f) for f in fields})
