"""Which workers an operation is for: one worker, those a selector matches, or all of them.

One idea with one name on every side: dynamoctl builds a ``Target`` from ``ID``, ``-l
SELECTOR`` or ``--all`` (``dynamoctl/targets.py``), ``dynamod.client`` sends it (the
``target`` of the proto's requests), and the daemon's ``Control`` resolves it to records.
Its rules are checked once, here, on construction, wherever it is built.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dynamod.errors import InvalidInputError

if TYPE_CHECKING:
    from dynamod.selectors import Selector


@dataclass(frozen=True)
class Target:
    """Exactly one of: ``worker`` (an id, a unique id prefix or a store key), ``selector``
    (every worker it matches), ``all``. ``expect_revision`` (one worker only) is the
    caller's optimistic lock: the operation fails unless the record is still at that
    revision. ``matcher`` is the parsed selector, parsed where it is first needed (the
    daemon's ``Control``), so a bad one is refused with ``SelectorError`` there."""

    worker: str | None = None
    selector: str | None = None
    all: bool = False
    expect_revision: int | None = None

    def __post_init__(self) -> None:
        if [self.worker is not None, self.selector is not None, self.all].count(True) != 1:
            raise InvalidInputError("name exactly one target: a worker id, a selector, or all")
        if self.expect_revision is not None and self.worker is None:
            raise InvalidInputError("an expected revision needs a single worker, not a selector")

    @functools.cached_property
    def matcher(self) -> Selector:
        # Imported here: a client builds and sends targets without parsing them, and
        # ``dynamoctl taints add ID ...`` need not load the selector grammar at all.
        from dynamod.selectors import parse

        return parse(self.selector or "")

    @property
    def bulk(self) -> bool:
        """Whether it may name many workers (a selector, or all)."""
        return self.worker is None

    def describe(self) -> str:
        if self.worker is not None:
            return f"worker {self.worker!r}"
        return f"workers matching {self.selector!r}" if self.selector is not None else "all workers"
