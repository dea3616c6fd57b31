"""Shared pytest configuration: Hypothesis profiles, and the ``lan`` fixture.

Select one with ``HYPOTHESIS_PROFILE=dev|ci|verify``.  The default is ``ci``
when the ``CI`` environment variable is set (CI runs ``.ci/run`` with
``CI=true``) and ``dev`` otherwise: ``dev`` is quick for local iteration,
``ci`` spends a few minutes, ``verify`` is for long verification runs.
Every profile prints a reproduction blob when a property fails.

``ci`` is derandomized: the same examples on every run, so whether a
submission lands never depends on the draw (a failure it finds is
reproducible by running it again).  Exploring new examples is the job of
``dev`` (every local run draws afresh) and of ``verify`` runs, whose
findings become worked cases (``tests/test_failures.py``).
"""

import os
from collections.abc import Iterator

import pytest
from _netns import Lan, leftovers, sigterm_raises, unavailable
from hypothesis import settings

# dev and ci are derandomized: the README's `make test` gives the same result on
# every run of the same code; random exploration is the verify profile's job.
settings.register_profile("dev", max_examples=50, deadline=None, print_blob=True, derandomize=True)
settings.register_profile("ci", max_examples=300, deadline=None, print_blob=True, derandomize=True)
settings.register_profile("verify", max_examples=5000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_report_header() -> str:
    return f"hypothesis profile: {settings().max_examples} examples per property"


LAN_HOSTS = 8
"""Host namespaces of the ``lan`` fixture (the system tests run 8 nodes)."""


@pytest.fixture
def lan() -> Iterator[Lan]:
    """A LAN of LAN_HOSTS namespaces; torn down (and checked gone) even if the test fails."""
    reason = unavailable()
    if reason is not None:
        pytest.fail(reason)
    net = Lan(LAN_HOSTS)
    with sigterm_raises():
        try:
            net.build()
            yield net
        finally:
            net.close()
    left = leftovers(net.suffix)
    assert not left, f"teardown left {left}"
