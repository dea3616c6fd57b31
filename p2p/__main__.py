"""``python -m p2p`` runs the command line."""

import sys

from p2p.cli import main

sys.exit(main())
