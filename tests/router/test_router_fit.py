"""Per-worker checks in the router (``router/fit.py``): a model's bodies are read the way
most of its workers read them, a worker of another reading is left out and reported, and
a worker's context is a condition on each request, never a verdict for the others."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest

from dynamod.discovery_events import ViewResync, WorkerAdded, WorkerRemoved
from dynamod.errors import NoEligibleWorkerError
from dynamod.records import WorkerRecord
from dynamod.router import Router, RouteRequest, RoutingTable, Waiter, WaitState
from dynamod.router.fit import ANY, CardNeeds, ModelReading, Reading
from dynamod.taints import RoutingConstraints
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import with_tokenizer
from tests.router.test_router_queue import assigned, attempt, park, router_with
from tests.router.test_router_table import required, worker

pytestmark = pytest.mark.timeout(30)

GAUGE = "dynamod_router_disagreeing_workers"


def sized(instance_id: str, context: int, *taints: str, block: int = 16) -> WorkerRecord:
    """A worker whose card names the simple tokenizer, with this context and block size."""
    record = worker(instance_id, *taints, kv_block_size=block)
    card = replace(record.model_card, context_length=context)
    return replace(record, model_card=with_tokenizer(card, SimpleTokenizer()))


def reading_of(table: RoutingTable | Router, model: str = "m") -> ModelReading:
    found = table.reading(model)
    assert found is not None
    return found


def test_a_request_needs_the_smallest_context_that_holds_it() -> None:
    record = sized("a", 8192)
    chosen = ModelReading(Reading.of(record.model_card), record.model_card, (2, 8192), 2, 0, True)
    assert [chosen.tier(n) for n in (1, 2, 3, 8192, 9000)] == [2, 2, 8192, 8192, 9000]
    assert chosen.needs(6) == CardNeeds(chosen.reading, 8192)
    assert chosen.needs(6) == chosen.needs(7)  # one tier, one case in the queue
    assert chosen.needs(0) == CardNeeds(chosen.reading, 0)


def test_the_reading_most_workers_publish_decides_and_the_first_wins_a_tie() -> None:
    odd, honest, other = sized("a0", 8192, block=1), sized("b1", 8192), sized("c2", 4096)
    table = RoutingTable([odd, honest])
    assert reading_of(table).reading == Reading.of(odd.model_card)  # a tie: the first
    assert table.disagreeing("m") == 1
    table.apply(WorkerAdded(other, 3))
    chosen = reading_of(table)
    assert chosen.reading == Reading.of(honest.model_card)
    assert (chosen.contexts, chosen.workers, chosen.disagreeing) == ((4096, 8192), 2, 1)
    assert table.card("m") == honest.model_card
    table.apply(WorkerRemoved(odd, 4))
    assert table.disagreeing("m") == 0 and reading_of(table).disagreeing == 0


def test_a_forwarding_worker_reads_as_its_in_process_peers_and_turns_the_checks_off() -> None:
    """An ``--engine openai`` worker beside a ``vllm serve`` serves the model with the
    in-process workers (one reading, none disagreeing); while it is there the front leaves
    the body checks to each worker, since its upstream accepts more (``n`` > 1)."""
    in_process, other = sized("a", 8192), sized("b", 8192)
    forwarding = replace(in_process, instance_id="f", model_card=replace(
        in_process.model_card, engine="openai"
    ))  # fmt: skip
    table = RoutingTable([in_process, other])
    assert reading_of(table).checked
    table.apply(WorkerAdded(forwarding, 3))
    chosen = reading_of(table)
    assert (chosen.workers, chosen.disagreeing, chosen.checked) == (3, 0, False)
    eligible = table.eligible("m", RoutingConstraints(), needs=chosen.needs(0))
    assert sorted(w.instance_id for w in eligible) == ["a", "b", "f"]
    table.apply(WorkerRemoved(forwarding, 4))
    assert reading_of(table).checked


def test_eligible_groups_leave_out_other_readings_and_short_contexts() -> None:
    tiny, honest, odd = sized("t", 2, "fast"), sized("h", 8192, "fast"), sized("o", 9000, block=1)
    table = RoutingTable([tiny, honest, odd])
    chosen = reading_of(table)
    everyone = table.eligible_groups("m", frozenset())
    assert table.eligible_groups("m", frozenset(), ANY) is everyone
    fits_all = CardNeeds(chosen.reading, 2)
    assert {g.context_length for g in table.eligible_groups("m", frozenset(), fits_all)} == {
        2,
        8192,
    }
    long = chosen.needs(6)
    assert [w.instance_id for w in table.eligible("m", RoutingConstraints(), needs=long)] == ["h"]
    why = table.why_not(tiny, RoutingConstraints(), needs=long)
    assert why is not None and why.short_context == 6
    assert why.describe(tiny) == "t has a context of 2 tokens (the request needs 6)"
    why = table.why_not(odd, RoutingConstraints(), needs=long)
    assert why is not None and why.other_reading == Reading.of(odd.model_card)
    assert "disagrees with the model's other workers" in why.describe(odd)


async def test_a_request_goes_only_to_a_worker_whose_context_holds_it() -> None:
    tiny, honest = sized("t", 2, "tiny"), sized("h", 8192)
    router = router_with(tiny, honest)
    long = reading_of(router).needs(6)
    for _ in range(5):
        async with router.route(RouteRequest("m", needs=long)) as assignment:
            assert assignment.worker.instance_id == "h"
    result = await attempt(router, RouteRequest("m", required("tiny"), needs=long))
    assert isinstance(result, NoEligibleWorkerError)
    assert str(result) == (
        "no worker of model 'm' has tiny and a context that holds 6 tokens; 2 workers: "
        "t has a context of 2 tokens (the request needs 6), h has no taints (missing tiny)"
    )
    small = reading_of(router).needs(2)
    async with router.route(RouteRequest("m", required("tiny"), needs=small)) as assignment:
        assert assignment.worker.instance_id == "t"


async def test_a_waiter_is_not_dispatched_to_a_worker_too_small_for_it() -> None:
    honest = sized("h", 8192)
    router = router_with(replace(honest, model_card=replace(honest.model_card, max_num_seqs=1)))
    long = reading_of(router).needs(6)
    async with asyncio.TaskGroup() as tg, router.route(RouteRequest("m", needs=long)):
        waiting = await park(tg, router, RouteRequest("m", needs=long))
        router.apply(WorkerAdded(sized("t", 2), 5))  # free, but too small for it
        await asyncio.sleep(0)
        assert not waiting.done()
    assert assigned(waiting).worker.instance_id == "h"


def test_requests_of_one_tier_share_a_case_in_the_queue() -> None:
    chosen = reading_of(RoutingTable([sized("t", 2), sized("h", 8192)]))
    loop = asyncio.new_event_loop()
    try:
        cases = {
            Waiter(
                RouteRequest("m", needs=chosen.needs(n)), WaitState.BUSY, 0.0, loop.create_future()
            ).case
            for n in (3, 100, 8192)
        }
    finally:
        loop.close()
    assert len(cases) == 1


def test_disagreeing_workers_are_logged_once_per_change_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = Router()
    honest = [sized(f"h{n}", 8192) for n in range(2)]
    odd = sized("odd", 8192, block=1)
    caplog.set_level(logging.INFO, "dynamod.router.dissent")
    router.apply(ViewResync((*honest, odd), 3))
    router.apply(WorkerAdded(sized("h2", 4096), 4))  # agrees: nothing to say
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "1 worker of model 'm' disagrees with the 2 that publish tokenizer "
        f"{Reading.of(honest[0].model_card).tokenizer[:15]}…, block size 16 and is left out "
        f"of routing: odd (tokenizer {Reading.of(odd.model_card).tokenizer[:15]}…, "
        "block size 1)"
    ]
    assert router.registry.get_sample_value(GAUGE, {"model": "m"}) == 1.0
    router.apply(WorkerRemoved(odd, 5))
    assert caplog.records[-1].getMessage() == (
        "the workers of model 'm' agree again on how to read a request"
    )
    assert router.registry.get_sample_value(GAUGE, {"model": "m"}) is None
