"""Exception root of the :mod:`causal` package."""


class CausalError(Exception):
    """Root of every error raised by :mod:`causal`."""
