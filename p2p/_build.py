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
    "topics._runs",
    "topics._aggregation",
    "topics._announce",
    "topics._rounds",
    "topics._repair",
    "topics._fence",
    "topics._receive",
    "topics._core",
    "vcube._errors",
    "vcube._topology",
    "vcube._timing",
    "p2p._reliable",
    "p2p.wire._limits",
    "p2p.wire._cbor",
    "p2p.wire._control",
    "p2p.wire._encode",
    "p2p.wire._decode",
    "p2p.wire._reader",
)
"""The modules ``make compiled`` compiles.  Left out: package ``__init__`` files
(their lazy re-exports), ``topics._events`` (the simulator sends the causal
broadcast's packets in its ``Send``), ``vcube._detmsg`` (the detector's message
classes must hold whatever a peer sends until its own checks reject it with
``RemoteDetectorError``; compiled, their constructors would raise
``TypeError`` first), ``vcube._detector`` and ``vcube._detout`` (the
detector and its outputs, split off that module and pure like it:
``Detector.receive`` too must let a bad sender or message reach its checks),
``topics._chain`` (its ``Chain`` extends ``tuple``, which a compiled class
cannot), ``topics._srpt`` and ``p2p.sim._detsim`` (baselines and test
harnesses, off the hot paths)."""

_ROOT = Path(__file__).resolve().parent.parent


def origins() -> dict[str, str | None]:
    """The file each module of :data:`COMPILED_MODULES` loads from (``None``: not found)."""
    out: dict[str, str | None] = {}
    for module in COMPILED_MODULES:
        spec = importlib.util.find_spec(module)
        out[module] = None if spec is None else spec.origin
    return out


def build_kind(files: dict[str, str | None] | None = None) -> str:
    """``"mypyc"`` if every module of :data:`COMPILED_MODULES` loads compiled,
    ``"pure"`` if none does, ``"mixed"`` otherwise (a stale partial build).
    ``files``: their :func:`origins`, if the caller has them already."""
    found = origins() if files is None else files
    compiled = {f.endswith(tuple(EXTENSION_SUFFIXES)) for f in found.values() if f is not None}
    if compiled == {True} and None not in found.values():
        return "mypyc"
    if True not in compiled:
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
    """``--compile``: compile :data:`COMPILED_MODULES` in place (run from the
    checkout's root); otherwise print the build kind."""
    if argv == ["--compile"]:
        return compile_in_place()
    if argv:
        print("usage: python -m p2p._build [--compile]", file=sys.stderr)
        return 2
    print(build_kind())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
