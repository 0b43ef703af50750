"""The workers each policy's selector selects, without a scan of the fleet per policy.

With a thousand policies over a thousand workers, scanning every record for every policy
is a million selector matches a round (seconds of loop time). ``Owners`` keeps the view's
records grouped by the value of each field a selector requires (``model=NAME`` for
nearly every policy), built once per change of the view and lazily per field: a
policy's candidates are the records holding its required value, and only those are
matched against the whole selector. A selector that requires no field (taints only) is
matched against every record, as before.

Policies are indexed the same way for ``stored.in_force``: ``required_field`` is the key
under which two policies can only overlap when they agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from dynamod.discovery.view import WorkerView
from dynamod.records import WorkerRecord
from dynamod.selectors import FIELDS, Selector, field_of

_ORDER: Final = {name: i for i, name in enumerate(FIELDS)}


def required_field(selector: Selector) -> tuple[str, str] | None:
    """The first field (in ``selectors.FIELDS`` order) the selector requires to equal a
    value, and the value; None when it requires none. A worker it selects holds that
    value, so only workers (and policies) with it need to be looked at."""
    found = [
        (term.kind, term.value)
        for term in selector.terms
        if term.kind != "taint" and not term.negate and term.kind in _ORDER
    ]
    return min(found, key=lambda kv: _ORDER[kv[0]]) if found else None


class Owners:
    """See the module docstring. Stale after any event of the view (a listener marks it),
    rebuilt at the next question."""

    def __init__(self, view: WorkerView) -> None:
        self.view = view
        self._records: list[WorkerRecord] | None = None
        self._by: dict[str, dict[str, list[WorkerRecord]]] = {}
        self._at = (-1, -1)
        view.listen(lambda _event: self._forget())

    def _forget(self) -> None:
        self._records = None
        self._by.clear()

    def records(self) -> list[WorkerRecord]:
        """Every record of the view, by key (``WorkerView.records``, once per change)."""
        at = (self.view.revision, len(self.view))
        if self._records is None or at != self._at:
            self._forget()
            self._records = self.view.records()
            self._at = at
        return self._records

    def of(self, selector: Selector) -> Iterable[WorkerRecord]:
        """The records ``selector`` selects, by key."""
        records = self.records()
        key = required_field(selector)
        if key is not None:
            records = self._bucket(*key)
        return [record for record in records if selector.matches(record)]

    def _bucket(self, name: str, value: str) -> list[WorkerRecord]:
        groups = self._by.get(name)
        if groups is None:
            groups = self._by[name] = {}
            for record in self.records():
                groups.setdefault(field_of(record, name), []).append(record)
        return groups.get(value, [])
