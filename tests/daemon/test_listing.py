"""Listing at fleet size, over a real unix socket: the stream of pages from one snapshot,
the fields a client asks for (applied in the daemon), bad requests refused with the rule,
and each worker's message rebuilt when, and only when, its record changes; and the
daemon's encoded answer, joined from kept bytes, against the message protobuf writes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamod.api import convert, worker_pages
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.client import AsyncClient
from dynamod.engine_events import EngineLoad
from dynamod.errors import InvalidInputError
from dynamod.load import Load
from dynamod.records import WorkerRecord
from dynamod.results import WorkerInfo, WorkerPage
from dynamod.store import Store, open_store
from dynamod.taints import TaintUpdate
from tests.daemon.helpers import add_worker, client_for, running_daemon, settings_for
from tests.support.factories import make_record

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    async with await open_store("memory://") as opened:
        yield opened


@pytest.fixture
async def fleet(store: Store) -> list[WorkerRecord]:
    """Seven workers of two models, registered out of order; two ids share 9 characters."""
    specs = [
        ("c0ffee0000000001", "mistral"), ("3f2a9c1e0a000001", "llama"),
        ("3f2a9c1e7a000001", "llama"), ("3f2a9c1e0b000001", "llama"),
        ("0abc000000000001", "mistral"), ("77aa000000000001", "llama"),
        ("12ab000000000001", "llama"),
    ]  # fmt: skip
    return [
        await add_worker(store, instance_id=i, model=m, taints=[f"pool=p{n % 2}"])
        for n, (i, m) in enumerate(specs)
    ]


@pytest.fixture
async def client(
    store: Store, fleet: list[WorkerRecord], tmp_path: Path
) -> AsyncIterator[AsyncClient]:
    settings = settings_for(store, tmp_path)
    async with running_daemon(store, settings), client_for(settings) as opened:
        yield opened


async def pages_of(client: AsyncClient, **kwargs: object) -> list[WorkerPage]:
    return [page async for page in client.stream_workers(**kwargs)]  # type: ignore[arg-type]


async def test_the_stream_sends_pages_by_model_then_id_from_one_snapshot(
    client: AsyncClient, fleet: list[WorkerRecord]
) -> None:
    pages = await pages_of(client, page_size=3)
    assert [len(p.workers) for p in pages] == [3, 3, 1]
    assert len({(p.revision, p.id_prefix) for p in pages}) == 1
    listed = [w for p in pages for w in p.workers]
    expected = sorted((r.model, r.instance_id) for r in fleet)
    assert [(w.record.model, w.id) for w in listed] == expected
    assert pages[0].id_prefix == 10  # 3f2a9c1e0a… and 3f2a9c1e0b… share nine characters
    by_id = {r.instance_id: r for r in fleet}
    assert all(w.record == by_id[w.id] for w in listed)  # every field, as stored
    _, revision = await client.list_workers()
    assert revision == pages[0].revision


async def test_an_empty_selection_is_one_empty_page(client: AsyncClient) -> None:
    pages = await pages_of(client, selector="model=nope")
    assert [p.workers for p in pages] == [[]]
    assert pages[0].revision > 0


async def test_only_the_fields_asked_for_travel(
    client: AsyncClient, fleet: list[WorkerRecord]
) -> None:
    workers, _ = await client.list_workers(fields=["id", "model", "taints"])
    first = workers[0].record  # sorted by key, so by id within one namespace
    assert (first.instance_id, first.model, first.taints) == (
        "0abc000000000001",
        "mistral",
        ("pool=p0",),
    )
    assert all(w.record.address == "" and w.revision == 0 for w in workers)
    carded, _ = await client.list_workers(fields=["id", "model_card_json"])
    by_id = {r.instance_id: r for r in fleet}
    assert all(w.record.model_card == by_id[w.id].model_card for w in carded)


async def test_selectors_and_fields_apply_in_the_daemon(client: AsyncClient) -> None:
    pages = await pages_of(client, selector="pool=p0,model=llama", fields=["id"])
    ids = [w.id for p in pages for w in p.workers]
    assert ids == ["12ab000000000001", "3f2a9c1e7a000001"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fields": ["id", "colour"]}, "fields names 'colour', which is not a worker field; "),
        ({"page_size": -1}, "page_size -1 is out of range; use 1 to 10000, or 0 for 500"),
        ({"page_size": 10_001}, "page_size 10001 is out of range"),
    ],
)
async def test_a_bad_listing_request_is_refused_naming_the_value_and_the_rule(
    client: AsyncClient, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        await pages_of(client, **kwargs)
    if "fields" in kwargs:
        with pytest.raises(InvalidInputError, match="which is not a worker field"):
            await client.list_workers(fields=["colour"])


async def seen(client: AsyncClient, since: int, kind: str) -> int:
    """Wait for the daemon's view to show an event of ``kind`` after ``since``."""
    async for event in client.tail_events(since=since):
        if event.kind == kind:
            return event.revision
    raise AssertionError(f"the event stream ended before a {kind} event")


async def test_a_changed_or_removed_record_is_listed_as_it_is_now(
    store: Store, client: AsyncClient, fleet: list[WorkerRecord]
) -> None:
    """Each worker's message is kept between listings: a taint update or a removal must
    show at the next one all the same."""
    one = "id=c0ffee0000000001"
    before, revision = await client.list_workers(selector=one)
    await store.put(fleet[0].key, fleet[0].updated(TaintUpdate.replace(["pool=moved"])).to_bytes())
    await seen(client, revision, "TAINTS")
    after, revision = await client.list_workers(selector=one)
    assert (before[0].record.taints, after[0].record.taints) == (("pool=p0",), ("pool=moved",))
    assert after[0].revision > before[0].revision
    await store.delete(fleet[0].key)
    await seen(client, revision, "REMOVED")
    assert [p.workers for p in await pages_of(client, selector=one)] == [[]]


fields_sets = st.frozensets(st.sampled_from(sorted(worker_pages.WORKER_FIELDS)))
loads = st.builds(Load, st.integers(0, 300), st.integers(0, 10**9), st.integers(0, 10**6))


@settings(max_examples=200, deadline=None)
@given(
    taints=st.lists(st.sampled_from(["pool=a", "gpu", "capacity/fast"]), max_size=3),
    load_of=st.lists(loads, min_size=1, max_size=5),
    fields=fields_sets,
    revision=st.integers(0, 2**40),
    id_prefix=st.integers(8, 16),
)
def test_the_encoded_listing_is_the_message_protobuf_would_write(
    taints: list[str], load_of: list[Load], fields: frozenset[str], revision: int, id_prefix: int
) -> None:
    """Joining each worker's kept bytes gives what building the whole message gives, field
    for field; and a second listing (entries kept, loads changed) does too."""
    records = [make_record(instance_id=f"{n:016x}", taints=taints) for n in range(len(load_of))]
    chosen = worker_pages.worker_fields(fields)
    messages = worker_pages.WorkerMessages({r.key: r for r in records}.get)
    for loads_now in (load_of, list(reversed(load_of))):
        pairs = enumerate(zip(records, loads_now, strict=True))
        infos = [WorkerInfo(r, n + 1, load) for n, (r, load) in pairs]
        encoded = messages.response(infos, chosen, revision, id_prefix)
        expected = pb.ListWorkersResponse(revision=revision, id_prefix=id_prefix)
        for info in infos:
            worker = expected.workers.add()
            worker.CopyFrom(convert.worker_message(info.record, info.revision, chosen))
            if "load" in chosen and not info.load.idle:
                worker.load.CopyFrom(convert.load_to_pb(info.load))
        assert pb.ListWorkersResponse.FromString(encoded) == expected


def test_an_engine_report_is_listed_as_it_is_now_while_its_encoding_is_kept() -> None:
    """The engine field is kept encoded per worker while its report is the same object: a
    new report (a changed engine, a mark) shows at the next listing, a worker that left
    lets its entry go."""
    records = [make_record(instance_id=f"{n:016x}") for n in range(3)]
    view = {r.key: r for r in records}
    messages = worker_pages.WorkerMessages(view.get)
    fields = worker_pages.worker_fields([])

    def listed(engines: list[EngineLoad]) -> list[EngineLoad | None]:
        infos = [WorkerInfo(r, 1, engine=e) for r, e in zip(records, engines, strict=True)]
        encoded = pb.ListWorkersResponse.FromString(messages.response(infos, fields, 1, 8))
        return [convert.worker_from_pb(w).engine for w in encoded.workers]

    first = [EngineLoad(running=n, source="engine") for n in range(3)]
    assert listed(first) == first
    assert listed(first) == first  # from the kept bytes
    changed = [first[0], EngineLoad(healthy=False, reason="marked", source="boundary"), first[2]]
    assert listed(changed) == changed
    del view[records[2].key]
    for _ in range(100):  # listings of one worker: the others' entries go past the bound
        messages.response([WorkerInfo(records[0], 1, engine=first[0])], fields, 1, 8)
    assert listed(changed) == changed  # still what each report says


def test_varints_encode_as_protobuf_does() -> None:
    assert worker_pages.varint(0) == b"\x00"  # protobuf leaves a zero out: nothing to compare
    for value in (1, 127, 128, 300, 2**31, 2**63 - 1):
        written = pb.ListWorkersResponse(revision=value).SerializeToString()
        assert worker_pages.varint(value) == written[1:]  # after the tag
    with pytest.raises(ValueError, match="never negative"):
        worker_pages.varint(-1)
