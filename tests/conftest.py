"""Shared pytest configuration: Hypothesis profiles.

Select one with ``HYPOTHESIS_PROFILE=dev|ci|verify``.  The default is ``ci``
when the ``CI`` environment variable is set (CI runs ``.ci/run`` with
``CI=true``) and ``dev`` otherwise: ``dev`` is quick for local iteration,
``ci`` spends a few minutes, ``verify`` is for long verification runs.
Every profile prints a reproduction blob when a property fails.
"""

import os

from hypothesis import settings

settings.register_profile("dev", max_examples=50, deadline=None, print_blob=True)
settings.register_profile("ci", max_examples=300, deadline=None, print_blob=True)
settings.register_profile("verify", max_examples=5000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_report_header() -> str:
    return f"hypothesis profile: {settings().max_examples} examples per property"
