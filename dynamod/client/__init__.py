"""The public Python client of dynamod: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

    from dynamod.client import Client

    with Client() as client:                      # DYNAMO_ENDPOINT, the config file, ...
        for worker in client.workers("capacity/fast"):
            print(worker.id, worker.model, worker.taints)
        client.update_model_taints(worker, ["capacity/slow"])   # replace, as Dynamo's

Both return the daemon's reports (``dynamod.reports``: ``WorkerInfo``, ``TaintChange``,
``EventInfo``, ...) and raise the errors of ``dynamod.errors``. Where the daemon is and
which credentials to show come from the arguments, else the environment and the config
file dynamoctl reads (``dynamod.client.config``). dynamoctl is built on ``AsyncClient``.
This package and ``dynamod/api/`` are the only parts of dynamod that import gRPC; the
names below are loaded on first use, so ``dynamod.client.config`` alone stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynamod.client.aio import AsyncClient, Worker
    from dynamod.client.config import Credentials, default_endpoint, target_of
    from dynamod.client.sync import Client

__all__ = ["AsyncClient", "Client", "Credentials", "Worker", "default_endpoint", "target_of"]

_HOMES = {
    "AsyncClient": "dynamod.client.aio",
    "Worker": "dynamod.client.aio",
    "Client": "dynamod.client.sync",
    "Credentials": "dynamod.client.config",
    "default_endpoint": "dynamod.client.config",
    "target_of": "dynamod.client.config",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dynamod.client' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
