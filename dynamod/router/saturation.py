"""What workers' engines report about their own load, and when that makes a worker busy.

The router's own ``Load`` counts only what *this* router has in flight on a worker.
Engines know more: requests from other routers or clients, their real queue, their KV
cache, their health. Workers push it (``dynamod.boundary``), the daemon hands it to
``Router.report``, and it is kept here, one ``EngineLoad`` per worker, until the worker
goes or its stream breaks (``None``: nothing known).

The policy: a worker is **busy** while its engine reports requests *waiting* in its own
queue (it is saturated: more would only queue there, where no router can move them) or
reports itself **unhealthy** (an upstream server that stopped answering). Busy means what
it means for the router's own limits: no new request goes there; requests that find all
their eligible workers busy wait in the router's FCFS queue, and the report that frees the
worker dispatches them. Reported figures enter nothing else: costs stay computed from the
router's own, exact and immediate, in-flight count.
"""

from __future__ import annotations

from dynamod.engine_events import EngineLoad
from dynamod.load import Busy


def busy(load: EngineLoad | None) -> Busy | None:
    """Why a worker whose engine reports ``load`` takes no new request, if it doesn't."""
    if load is None:
        return None
    if not load.healthy:
        return Busy.UNHEALTHY
    if load.waiting > 0:
        return Busy.ENGINE_QUEUE
    return None


def describe(load: EngineLoad) -> str:
    """``is unhealthy: upstream ... not answering`` / ``has 3 requests waiting in its engine``."""
    if not load.healthy:
        return f"is unhealthy: {load.reason or 'its engine cannot serve'}"
    return f"has {load.waiting} requests waiting in its engine"


class ReportedLoads:
    """The last ``EngineLoad`` each worker reported, by worker key."""

    def __init__(self) -> None:
        self._loads: dict[str, EngineLoad] = {}

    def get(self, key: str) -> EngineLoad | None:
        return self._loads.get(key)

    def busy(self, key: str) -> Busy | None:
        return busy(self._loads.get(key))

    def set(self, key: str, load: EngineLoad | None) -> bool:
        """Keep ``load`` (None forgets); whether the worker stopped being busy by it."""
        was = self.busy(key)
        if load is None:
            self._loads.pop(key, None)
        else:
            self._loads[key] = load
        return was is not None and self.busy(key) is None
