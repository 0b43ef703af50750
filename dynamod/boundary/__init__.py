"""What workers report about their engines, as the daemon receives it.

``EngineStreams`` follows each worker's engine events stream (its load and health, pushed by the
worker: ``dynamod.engine_events``) and hands every state to the router; ``TokenizerRegistry``
fetches and caches the tokenizer each model's workers publish, for the front and
``explain``; ``KvIndexer`` folds the KV cache events workers forward into the router's KV
index. The daemon owns them.

Every read from a worker is held to that worker's ``Budgets`` (bytes, time, rate:
``budgets.py``), and a worker that breaks one is dealt with by one policy, ``Breaches``
(``breaches.py``): its feed dropped and retried with back-off, the worker marked
unhealthy with the reason, counted; nothing else disturbed.
"""

from dynamod.boundary.breaches import Breach, Breaches, BreachKind
from dynamod.boundary.budgets import Budgets, RateBudget, TooFastError
from dynamod.boundary.engine_streams import EngineStreams
from dynamod.boundary.kv_indexer import KvIndexer
from dynamod.boundary.tokenizer_registry import TokenizerRegistry

__all__ = [
    "Breach",
    "BreachKind",
    "Breaches",
    "Budgets",
    "EngineStreams",
    "KvIndexer",
    "RateBudget",
    "TokenizerRegistry",
    "TooFastError",
]
