"""Reporting the workers that disagree with the rest of their model (``fit.py``).

Workers of one model that publish another reading (tokenizer, block size, body checks)
than most of them do are left out of routing: an operator must hear of it, since it is
either a rolling upgrade half done or a record that should not be there. ``Dissent``
keeps a gauge, ``dynamod_router_disagreeing_workers{model}``, and logs one warning line
each time a model's count of them changes (naming the worker whose event changed it when
that worker is one of them), and one info line when its workers agree again. Called by
the router for every model a discovery event touched; O(distinct readings of the model)
when its workers agree.
"""

from __future__ import annotations

import logging

from prometheus_client import Gauge

from dynamod.records import WorkerRecord
from dynamod.router.fit import Reading
from dynamod.router.table import RoutingTable

log = logging.getLogger(__name__)


class Dissent:
    """See the module docstring; ``gauge`` is labelled by ``model``."""

    def __init__(self, table: RoutingTable, gauge: Gauge) -> None:
        self._table = table
        self._gauge = gauge
        self._known: dict[str, int] = {}

    def check(self, model: str, changed: WorkerRecord | None = None) -> None:
        """Report a change in ``model``'s disagreeing workers; ``changed``: the worker whose
        event was just applied, if one was."""
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
        log.warning("%s", self._sentence(model, count, changed))

    def _sentence(self, model: str, count: int, changed: WorkerRecord | None) -> str:
        chosen = self._table.reading(model)
        assert chosen is not None  # count > 0: the model has workers
        said = (
            f"{count} worker{'s' if count != 1 else ''} of model {model!r} disagree with the "
            f"{chosen.workers} that publish {chosen.reading.describe()}, and are left out "
            f"of routing"
        )
        if changed is not None and changed.model == model:
            reading = Reading.of(changed.model_card)
            if reading != chosen.reading:
                said += f"; worker {changed.instance_id} publishes {reading.describe()}"
        return said
