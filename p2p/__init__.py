"""p2p: the runtime side of the library (simulator now; trio runtime later)."""

from p2p._errors import P2PError, ScenarioError

__version__ = "0.1.0"

__all__ = ["P2PError", "ScenarioError", "__version__"]
