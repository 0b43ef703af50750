"""dynamoctl's exit statuses, declared once: the error boundary returns them and the man
page's EXIT STATUS section is generated from ``MEANINGS``."""

from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2
UNREACHABLE = 3
INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C outside a stream
BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (``| head``)

MEANINGS: dict[int, str] = {
    OK: "Success. Ctrl-C (or SIGTERM) ending a stream (events tail, workers ls --watch) "
    "is a success too.",
    FAILED: "The operation failed: the daemon refused it (an invalid or reserved taint, "
    "an unknown or ambiguous worker, a stale --if-revision, missing rights), some "
    "workers of a bulk operation failed (each failure is printed), or dynamod ended a "
    "stream that was to be followed.",
    USAGE: "Usage error: an unknown command or option, a missing argument, conflicting "
    "options, an invalid config file, or --all without --yes where nobody can be asked.",
    UNREACHABLE: "dynamod could not be reached; the message names the endpoint tried.",
    INTERRUPTED: "Interrupted by Ctrl-C while a command other than a stream was running.",
    BROKEN_PIPE: "Standard output was closed by its reader (as in dynamoctl events tail | "
    "head), like a program killed by SIGPIPE.",
}
