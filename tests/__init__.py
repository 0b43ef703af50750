"""The test suite (tests/README.md).

gRPC's C core logs at INFO when nothing says otherwise (``Got goaway`` when a server closes
a channel), onto the pytest process's stderr, between pytest's own lines, and from every
product process a test starts: errors only, unless the caller asked for more."""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
