"""Small asyncio helpers shared by the daemon, the worker and the CLI."""

from __future__ import annotations

import asyncio


def raise_if_cancelling() -> None:
    """Re-raise a cancellation that an ``except*`` clause may have absorbed.

    When a task is cancelled while a child of its ``TaskGroup`` fails, the group raises an
    ``ExceptionGroup`` of the child's error and the ``CancelledError`` is not re-raised; the
    task's ``cancelling()`` count still says it was asked to stop. Call this after handling
    such a group so the cancellation is never swallowed.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
