"""``python -m bench.peer``: see ``bench/peer/run.py``."""

import sys

from bench.peer.run import main

sys.exit(main())
