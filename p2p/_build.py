"""Which build of the cores is running: pure Python, or compiled with mypyc.

The compiled build is optional (``make compiled``, which runs ``python -m
p2p._build --compile``; needs a C compiler and the ``dev`` extra's mypy): the
same modules, compiled in place to extension modules, which Python imports
instead of the ``.py`` beside them.  Each module is its own extension with its
own runtime library beside it (mypyc's ``separate`` mode), so the build loads
from any working directory: one shared library would sit at the checkout's
root, outside every package, where only a process started there finds it.  A pure
install (a Raspberry Pi without a compiler) runs the same code unchanged.
``make pure`` removes the extensions again.  Benchmarks record
:func:`build_kind` with their numbers.

Invariant: :data:`COMPILED_MODULES` is the one list of what ``make compiled``
compiles; :func:`build_kind` reports ``mixed`` when only some of them are
extensions (a stale build after ``git pull``: rebuild or ``make pure``).

``python -m p2p._build --sources`` prints the source files of the list.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

COMPILED_MODULES: tuple[str, ...] = (
    "causal._ids",
    "causal._errors",
    "causal._barrier",
    "causal._buffer",
    "causal._packing",
    "causal._broadcast",
    "topics._config",
    "topics._errors",
    "topics._messages",
    "topics._state",
    "topics._base",
    "topics._delivery",
    "topics._aggregation",
    "topics._announce",
    "topics._rounds",
    "topics._repair",
    "topics._receive",
    "topics._core",
    "vcube._errors",
    "vcube._topology",
    "vcube._timing",
    "p2p._reliable",
    "p2p._wire",
)
"""The modules ``make compiled`` compiles.  Left out: package ``__init__`` files
(their lazy re-exports), ``topics._events`` (the simulator sends the causal
broadcast's packets in its ``Send``), ``vcube._detector`` (its message classes
must hold whatever a peer sends until its own checks reject it with
``RemoteDetectorError``; compiled, their constructors would raise
``TypeError`` first), ``topics._srpt`` and ``vcube._detsim`` (baselines and
test harnesses, off the hot paths)."""

_ROOT = Path(__file__).resolve().parent.parent


def _is_extension(module: str) -> bool | None:
    """Whether ``module`` loads from an extension module (``None``: not found)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    return spec.origin.endswith(tuple(EXTENSION_SUFFIXES))


def build_kind() -> str:
    """``"mypyc"`` if every module of :data:`COMPILED_MODULES` loads compiled,
    ``"pure"`` if none does, ``"mixed"`` otherwise (a stale partial build)."""
    kinds = {_is_extension(m) for m in COMPILED_MODULES}
    if kinds == {True}:
        return "mypyc"
    if kinds <= {False, None}:
        return "pure"
    return "mixed"


def sources() -> list[str]:
    """The source files of :data:`COMPILED_MODULES`, relative to the checkout."""
    return [m.replace(".", "/") + ".py" for m in COMPILED_MODULES]


def compile_in_place() -> int:
    """Compile :data:`COMPILED_MODULES` next to their sources (``build_ext --inplace``)."""
    try:
        from mypyc.build import mypycify

        # setuptools ships no type stubs: looked up by name, typed as Any.
        setup = importlib.import_module("setuptools").setup
    except ImportError as exc:
        print(f"the compiled build needs the dev extra (mypy, setuptools): {exc}", file=sys.stderr)
        return 1
    setup(
        name="vcube-ps-compiled",
        script_args=["build_ext", "--inplace"],
        ext_modules=mypycify([str(_ROOT / s) for s in sources()], separate=True),
    )
    return 0


def main(argv: list[str]) -> int:
    """``--sources``: print the files to compile; ``--compile``: compile them in
    place (run from the checkout's root); otherwise print the build kind."""
    if argv == ["--compile"]:
        return compile_in_place()
    if argv == ["--sources"]:
        missing = [s for s in sources() if not (_ROOT / s).is_file()]
        if missing:
            print(f"not found: {' '.join(missing)}", file=sys.stderr)
            return 1
        print(" ".join(sources()))
        return 0
    if argv:
        print("usage: python -m p2p._build [--sources | --compile]", file=sys.stderr)
        return 2
    print(build_kind())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
