"""Package names load lazily (issue 22: import time), and every public name still resolves.

``vcube``, ``causal``, ``topics``, ``p2p`` and ``p2p.runtime`` re-export their
names through PEP 562 ``__getattr__``: importing one name loads the module
that defines it and what that module needs, not the whole package.  These
tests pin the public surface (every ``__all__`` name importable, the same
object as in its private module) and what ``from p2p import open_node`` does
not load, in a fresh interpreter.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

PACKAGES = ("vcube", "causal", "topics", "p2p", "p2p.runtime")

P2P_ALL = [
    "BlockingNode",
    "BlockingSubscription",
    "Delivery",
    "MembershipEvent",
    "Node",
    "NodeConfig",
    "NodeError",
    "P2PError",
    "ScenarioError",
    "SecurityError",
    "Subscription",
    "__version__",
    "open_node",
    "percentile_of",
]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert name in dir(module)
        defined_in = getattr(value, "__module__", None)
        if defined_in is not None and defined_in.startswith(package.split(".")[0]):
            assert getattr(importlib.import_module(defined_in), name) is value
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_star_import_and_p2p_surface() -> None:
    assert sorted(importlib.import_module("p2p").__all__) == P2P_ALL
    for package in PACKAGES:
        namespace: dict[str, object] = {}
        exec(f"from {package} import *", namespace)
        assert set(importlib.import_module(package).__all__) <= set(namespace)


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_open_node_loads_only_what_a_node_needs() -> None:
    loaded = _loaded_after("from p2p import open_node")
    assert "p2p.runtime._node" in loaded
    for unneeded in (
        "p2p.runtime._blocking",  # BlockingNode
        "causal._broadcast",  # the vector-clock broadcast of ch. 4 (simulator only)
        "topics._srpt",
        "p2p.sim._detsim",
        "p2p.sim",
        "p2p.telemetry",
        "asyncio",  # zeroconf's, loaded when discovery starts
        "zeroconf",
    ):
        assert unneeded not in loaded, unneeded


def test_import_p2p_loads_no_runtime() -> None:
    loaded = _loaded_after("import p2p")
    assert "trio" not in loaded
    below = {m for m in loaded if m.startswith(("p2p.runtime", "topics", "causal", "vcube"))}
    assert below <= {"vcube", "vcube._lazy"}, sorted(below)  # the lazy-export helper only


def test_the_lazy_export_helper_loads_nothing() -> None:
    """Every package's ``__init__`` takes its ``__getattr__`` from ``vcube._lazy``
    (the lowest package): loading it loads no module of the project besides it."""
    loaded = _loaded_after("import vcube._lazy")
    assert {m for m in loaded if m.startswith(("p2p", "topics", "causal", "vcube"))} == {
        "vcube",
        "vcube._lazy",
    }
