"""``python -m p2p`` runs the command line (Ctrl-C while it loads: exit 130, no traceback)."""

import sys

try:
    from p2p.cli import main
except KeyboardInterrupt:
    sys.exit(130)

sys.exit(main())
