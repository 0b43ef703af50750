"""``python -m bench.prefix``: see ``bench/prefix/run.py``."""

import sys

from bench.prefix.run import main

sys.exit(main())
