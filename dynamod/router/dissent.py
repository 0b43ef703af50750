"""Reporting the workers that disagree with the rest of their model (``fit.py``).

Workers of one model that publish another reading (tokenizer, block size, body checks)
than most of them do are left out of routing: an operator must hear of it, since it is
either a rolling upgrade half done or a record that should not be there. ``Dissent``
keeps a gauge, ``dynamod_router_disagreeing_workers{model}``, and logs one warning line
each time a model's count of them changes (naming the first ``NAMED`` of them, with what
they publish), and one info line when its workers agree again. Called by the router for
every model a discovery event touched: O(distinct readings of the model) when the count
stays, O(workers of the model) when it changes.
"""

from __future__ import annotations

import itertools
import logging

from prometheus_client import Gauge

from dynamod.router.fit import Reading
from dynamod.router.table import RoutingTable

log = logging.getLogger(__name__)

NAMED = 3
"""Disagreeing workers a log line names."""


class Dissent:
    """See the module docstring; ``gauge`` is labelled by ``model``."""

    def __init__(self, table: RoutingTable, gauge: Gauge) -> None:
        self._table = table
        self._gauge = gauge
        self._known: dict[str, int] = {}

    def check(self, model: str) -> None:
        """Report a change in ``model``'s count of disagreeing workers."""
        count = self._table.disagreeing(model)
        before = self._known.get(model, 0)
        if count == before:
            return
        if count == 0:
            del self._known[model]
            self._gauge.remove(model)
            log.info("the workers of model %r agree again on how to read a request", model)
            return
        self._known[model] = count
        self._gauge.labels(model=model).set(count)
        log.warning("%s", self._sentence(model, count))

    def _sentence(self, model: str, count: int) -> str:
        chosen = self._table.reading(model)
        assert chosen is not None  # count > 0: the model has workers
        others = (
            (w.instance_id, reading)
            for w in self._table.workers(model)
            if (reading := Reading.of(w.model_card)) != chosen.reading
        )
        named = [f"{i} ({r.describe()})" for i, r in itertools.islice(others, NAMED)]
        more = f", and {count - len(named)} more" if count > len(named) else ""
        workers, verb = (
            ("1 worker", "disagrees") if count == 1 else (f"{count} workers", "disagree")
        )
        return (
            f"{workers} of model {model!r} {verb} with the {chosen.workers} that publish "
            f"{chosen.reading.describe()} and {'is' if count == 1 else 'are'} left out of "
            f"routing: {', '.join(named)}{more}"
        )
