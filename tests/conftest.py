"""Shared pytest configuration: Hypothesis profiles.

Select one with ``HYPOTHESIS_PROFILE=ci|dev|verify`` (default ``ci``).
"""

import os

from hypothesis import settings

settings.register_profile("ci", max_examples=100, deadline=None, derandomize=False, print_blob=True)
settings.register_profile(
    "dev", max_examples=100, deadline=None, derandomize=False, print_blob=True
)
settings.register_profile("verify", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
