"""The public Python client of dynamod: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

    from dynamod.client import Client

    with Client() as client:                      # DYNAMO_ENDPOINT, the config file, ...
        for worker in client.workers("capacity/fast"):
            print(worker.id, worker.model, worker.taints)
        client.update_model_taints(worker, ["capacity/slow"])   # replace, as Dynamo's

Both return the daemon's reports (``dynamod.results``: ``WorkerInfo``, ``UpdateOutcome``,
``EventInfo``, ...) and raise the errors of ``dynamod.errors``. Where the daemon is and
which credentials to show come from the arguments, else the environment and the config
file dynamoctl reads (``dynamod.client.endpoint``). dynamoctl is built on ``AsyncClient``.
This package and ``dynamod/api/`` are the only parts of dynamod that import gRPC; the
names below are loaded on first use, so ``dynamod.client.endpoint`` alone stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynamod.client.async_client import AsyncClient
    from dynamod.client.blocking import Client
    from dynamod.client.dynamo_compat import Worker
    from dynamod.client.endpoint import Credentials, default_endpoint, target_of

__all__ = ["AsyncClient", "Client", "Credentials", "Worker", "default_endpoint", "target_of"]

_HOMES = {
    "AsyncClient": "dynamod.client.async_client",
    "Worker": "dynamod.client.dynamo_compat",
    "Client": "dynamod.client.blocking",
    "Credentials": "dynamod.client.endpoint",
    "default_endpoint": "dynamod.client.endpoint",
    "target_of": "dynamod.client.endpoint",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dynamod.client' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
