"""The ``p2p`` command line, and the pieces of it that applications reuse.

``main`` is the ``p2p`` entry point (``p2p sim`` is a contract: outside
scripts call it).  An application with a command line of its own (the
examples in ``edge_examples/``) takes the node options and their checks from
here, and ends through :func:`run_cli`, so that a user's mistake is one line
on stderr and an exit status, never a traceback.
"""

from p2p._cliargs import finite
from p2p._shutdown import INTERRUPTED, Shutdown, explain, graceful, run_cli
from p2p.cli._main import build_parser, main
from p2p.cli._nodecli import _common as add_node_options
from p2p.cli._nodecli import _config as node_config
from p2p.cli._nodecli import check_listen

__all__ = [
    "INTERRUPTED",
    "Shutdown",
    "add_node_options",
    "build_parser",
    "check_listen",
    "explain",
    "finite",
    "graceful",
    "main",
    "node_config",
    "run_cli",
]
