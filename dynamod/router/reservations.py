"""The load this router holds on each worker: what every assignment reserved, until released.

A worker is chosen with its cost terms; ``hold`` reserves the request's load on it (one
request, its prompt's tokens to prefill less those its cached prefix saves, its new KV
blocks: Dynamo's assume-kv-reuse) and returns the ticket that names the reservation.
``prefill_done`` stops counting the prefill tokens (the worker finished the prompt);
``release`` gives the whole reservation back. Both are idempotent and return the key of
the worker whose load went down, for the router to offer it to waiting requests.

``changed(key)`` is called after every change of a worker's load, inside the call that
made it (the router re-ranks the worker and tells its watchers).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from dynamod.load import IDLE, Load
from dynamod.records import WorkerRecord
from dynamod.router.scoring import CostTerms


@dataclass
class _Reservation:
    """The load one assignment holds on its worker, until released."""

    key: str
    prefill_tokens: int
    kv_blocks: int
    prefilling: bool = True


class Reservations:
    """Every worker's load here, and the reservations that make it; see the module doc."""

    def __init__(self, changed: Callable[[str], None]) -> None:
        self._changed = changed
        self._loads: dict[str, Load] = {}
        self._held: dict[int, _Reservation] = {}
        self._tickets = itertools.count()

    def load(self, key: str) -> Load:
        """What this router has in flight on the worker ``key``."""
        return self._loads.get(key, IDLE)

    def in_flight(self) -> dict[str, int]:
        """Requests in flight here by worker key, those with any (the pools' demand)."""
        return {k: load.active_requests for k, load in self._loads.items() if load.active_requests}

    def hold(self, worker: WorkerRecord, prompt_tokens: int, terms: CostTerms) -> int:
        """Reserve a request's load on ``worker``; the ticket that names it."""
        # The cached prefix is not prefilled again (Dynamo's assume-kv-reuse).
        cached = terms.overlap_blocks * worker.model_card.kv_block_size
        held = _Reservation(worker.key, max(0, prompt_tokens - cached), terms.new_blocks)
        self._loads[worker.key] = self.load(worker.key).plus(held.prefill_tokens, held.kv_blocks)
        self._changed(worker.key)
        ticket = next(self._tickets)
        self._held[ticket] = held
        return ticket

    def release(self, ticket: int) -> str | None:
        """Give the reservation back; its worker's key, or None when it was given back."""
        held = self._held.pop(ticket, None)
        if held is None:
            return None
        prefill = held.prefill_tokens if held.prefilling else 0
        self._unload(held.key, Load(1, prefill, held.kv_blocks))
        return held.key

    def prefill_done(self, ticket: int) -> str | None:
        """The prompt is done: its tokens stop counting; the worker's key, or None when
        there was nothing to do."""
        held = self._held.get(ticket)
        if held is None or not held.prefilling:
            return None
        held.prefilling = False
        self._unload(held.key, Load(0, held.prefill_tokens, 0))
        return held.key

    def _unload(self, key: str, amount: Load) -> None:
        load = self._loads[key].minus(amount)
        if load.idle:
            del self._loads[key]
        else:
            self._loads[key] = load
        self._changed(key)
