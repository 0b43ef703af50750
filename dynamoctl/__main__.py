"""``python -m dynamoctl``."""

import sys

from dynamoctl.main import main

sys.exit(main())
