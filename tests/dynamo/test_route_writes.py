"""Taint updates of a Dynamo fleet through an in-process dynamod, against stand-in
workers that store their taints as Dynamo's route does (``fake_worker.py``): each update
computed on the freshly read card, sent whole to the worker's own route, confirmed in
the store; Dynamo's answers mapped to dynamod's errors; what does not carry over refused
before anything is sent; one audit line per update, under Dynamo's own key. What is
shown is what Dynamo routes by: a hand-set cordon not honoured (and removable), a worker
whose port refuses connection unreachable, LoRA adapters beside the worker, ``route
explain`` by Dynamo's rule with dynamod's guess said to be one. The real Dynamo is in
``test_real_fleet.py``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from dynamoctl import formats, listing
from dynamod.boundary.taint_writes import RouteWrites
from dynamod.client import AsyncClient
from dynamod.daemon import Daemon
from dynamod.discovery.view import WorkerView
from dynamod.errors import (
    ConstraintError,
    PermissionDeniedError,
    RevisionMismatchError,
    TaintError,
    UnsupportedError,
    WorkerUnavailableError,
)
from dynamod.results import WorkerState
from dynamod.settings import DaemonSettings
from dynamod.store.dynamo import DynamoStore
from dynamod.store.etcd import EtcdStore
from dynamod.taints import CORDONED, DRAIN_TAINTS, TaintLimits, TaintUpdate
from dynamod.targets import Target
from tests.daemon.helpers import client_for, running_daemon, settings_for
from tests.dynamo import values
from tests.dynamo.fake_worker import ROUTE, FakeDynamoWorker, Mode
from tests.support.eventually import eventually

ZONED, PLAIN = 0x13B0A2323C378618, 0x13B0A2323C37860C


class Fleet:
    def __init__(self, store: DynamoStore, client: AsyncClient, audit: Path, http: str) -> None:
        self.store, self.client, self.audit, self.http = store, client, audit, http
        self.workers: dict[str, FakeDynamoWorker] = {}
        self.settings: DaemonSettings | None = None

    def client_as(self, token: str) -> AsyncClient:
        assert self.settings is not None
        return client_for(self.settings, token=token)

    def audit_lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.audit.read_text().splitlines()]


TOKENS = """
[[token]]
name = "viewer"
secret = "read-secret"
role = "read"

[[token]]
name = "autoscaler"
secret = "scale-secret"
role = "write"
prefixes = ["capacity/"]
"""


@pytest.fixture
async def fleet(dynamo_etcd: EtcdStore, dynamo_url: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    """Two stand-in workers (one zoned with a taint, one plain) and a dynamod on them, with
    a read-only token and a write token limited to ``capacity/`` besides the socket."""
    workers = [
        FakeDynamoWorker(dynamo_etcd, ZONED, taints=("pool=slow",), zone="b"),
        FakeDynamoWorker(dynamo_etcd, PLAIN),
    ]
    (tmp_path / "tokens.toml").write_text(TOKENS)
    store = await DynamoStore.open(dynamo_url)
    try:
        for worker in workers:
            await worker.start()
        settings = settings_for(store, tmp_path, tokens_file=tmp_path / "tokens.toml")
        async with running_daemon(store, settings) as daemon, client_for(settings) as client:
            found = Fleet(store, client, tmp_path / "audit.log", daemon.http_url)
            found.settings = settings
            found.workers = {w.id: w for w in workers}
            yield found
            workers = list(found.workers.values())  # and those a test added
    finally:
        await store.aclose()
        for worker in workers:
            await worker.stop()


async def add_worker(fleet: Fleet, etcd: EtcdStore, number: int, mode: Mode) -> str:
    """Start one more stand-in worker; return once the daemon's view has it."""
    events = fleet.client.events()
    await anext(events)  # the snapshot: the stream is established
    worker = await FakeDynamoWorker(etcd, number, mode=mode).start()
    fleet.workers[worker.id] = worker
    async with asyncio.timeout(10):
        async for event in events:
            if event.kind == "ADDED" and event.worker and event.worker.id == worker.id:
                break
    await events.aclose()
    return worker.id


async def test_listing_shows_dynamos_workers_with_their_split_taints(fleet: Fleet) -> None:
    listed = {w.id: w for w in await fleet.client.workers()}
    zoned = listed[f"{ZONED:x}"]
    assert zoned.caller_taints == ("pool=slow",)
    assert zoned.generated_taints == ("dynamo.topology/zone=b",)
    assert dict(zoned.record.runtime_config.topology_domains) == {"zone": "b"}
    assert listed[f"{PLAIN:x}"].taints == ()


async def test_add_remove_set_and_clear_go_through_the_workers_route(fleet: Fleet) -> None:
    client, zoned = fleet.client, fleet.workers[f"{ZONED:x}"]
    assert await client.add_taints(zoned.id, ["pool=fast"]) == (
        "dynamo.topology/zone=b", "pool=fast", "pool=slow",
    )  # fmt: skip
    assert await zoned.stored_taints() == ["pool=fast", "pool=slow"]
    assert await client.remove_taints(zoned.id, [], keys=["pool"]) == ("dynamo.topology/zone=b",)
    assert await client.update_model_taints(zoned.id, ["gpu"]) == ("dynamo.topology/zone=b", "gpu")
    assert await client.clear_taints(zoned.id) == ("dynamo.topology/zone=b",)
    assert await zoned.stored_taints() == []
    assert zoned.requests == 4
    lines = [line for line in fleet.audit_lines() if line["worker"] == zoned.id]
    assert [(line["action"], line["outcome"]) for line in lines] == [
        ("add", "ok"), ("remove", "ok"), ("replace", "ok"), ("clear", "ok"),
    ]  # fmt: skip


async def test_an_update_that_changes_nothing_sends_nothing(fleet: Fleet) -> None:
    zoned = fleet.workers[f"{ZONED:x}"]
    await fleet.client.add_taints(zoned.id, ["pool=slow"])
    assert zoned.requests == 0


async def test_64_concurrent_adds_through_dynamod_are_all_kept(fleet: Fleet) -> None:
    """Dynamo's route replaces the whole set, with no compare-and-swap: only the daemon's
    lock per worker keeps concurrent adds from losing each other."""
    plain = fleet.workers[f"{PLAIN:x}"]
    wanted = [f"batch={i}" for i in range(64)]
    await asyncio.gather(*(fleet.client.add_taints(plain.id, [t]) for t in wanted))
    assert await plain.stored_taints() == sorted(wanted)
    assert set((await fleet.client.worker(plain.id)).taints) == set(wanted)


async def test_a_reserved_taint_is_refused_before_anything_is_sent(fleet: Fleet) -> None:
    zoned = fleet.workers[f"{ZONED:x}"]
    with pytest.raises(TaintError, match=re.escape("reserved prefix 'dynamo.topology/'")):
        await fleet.client.add_taints(zoned.id, ["dynamo.topology/zone=x"])
    assert zoned.requests == 0


async def test_adding_the_cordon_is_refused_as_not_carrying_over(fleet: Fleet) -> None:
    zoned = fleet.workers[f"{ZONED:x}"]
    for update in (TaintUpdate.add([CORDONED]), TaintUpdate.replace([CORDONED, "pool=a"])):
        with pytest.raises(UnsupportedError, match="ignores taints on requests that require none"):
            await fleet.client.update_taints(update, Target(worker=zoned.id))
    assert zoned.requests == 0
    assert [line["outcome"] for line in fleet.audit_lines()] == ["UnsupportedError"] * 2


async def test_a_hand_set_cordon_is_shown_as_not_honoured_and_uncordon_removes_it(
    fleet: Fleet,
) -> None:
    """Set through the worker's own route (Dynamo takes any string), the cordon does not
    take the worker out of Dynamo's routing: it is shown ``ready,cordon-not-honoured``,
    routable, eligible in ``route explain``; removing it (what ``uncordon`` sends, the
    drain taint with it) goes through the route like any removal."""
    zoned = fleet.workers[f"{ZONED:x}"]
    async with aiohttp.ClientSession() as http:
        body = {"taints": [CORDONED, "pool=slow"]}
        async with http.post(f"http://127.0.0.1:{zoned.port}{ROUTE}", json=body) as answer:
            assert answer.status == 200
    info = await eventually(lambda: fleet.client.worker(zoned.id),
                            lambda w: CORDONED in w.taints, what="the hand-set cordon")  # fmt: skip
    assert info.state is WorkerState.CORDON_NOT_HONOURED and info.state.routable
    listed = {w.id: w.state for w in await fleet.client.workers()}
    assert listed[zoned.id] is WorkerState.CORDON_NOT_HONOURED
    explained = await fleet.client.explain("lab-model", required=["pool=slow"])
    assert explained.chosen == zoned.id  # Dynamo routes there, cordon or not
    (done,) = await fleet.client.update_taints(TaintUpdate.remove(DRAIN_TAINTS),
                                               Target(worker=zoned.id))  # fmt: skip
    assert done.removed == (CORDONED,)
    assert await zoned.stored_taints() == ["pool=slow"]
    assert (await fleet.client.worker(zoned.id)).state is WorkerState.READY
    (done,) = await fleet.client.update_taints(TaintUpdate.remove([CORDONED]),
                                               Target(worker=zoned.id))  # fmt: skip
    assert done.removed == () and zoned.requests == 2  # the hand-set POST, then the removal


async def test_keys_shown_and_audited_are_dynamos_own(fleet: Fleet) -> None:
    zoned = fleet.workers[f"{ZONED:x}"]
    card_key = values.card_key(ZONED)
    info = await fleet.client.worker(zoned.id)
    assert info.key == card_key
    assert [w.key for w in await fleet.client.workers() if w.id == zoned.id] == [card_key]
    (done,) = await fleet.client.update_taints(TaintUpdate.add(["gpu"]), Target(worker=card_key))
    assert done.key == card_key  # and the key it is shown by names it
    assert [line["key"] for line in fleet.audit_lines()] == [card_key]
    assert (await fleet.client.worker(card_key)).id == zoned.id


async def test_a_worker_is_found_by_its_id_in_decimal_as_dynamo_logs_it(fleet: Fleet) -> None:
    """``nvext.worker_id`` and Dynamo's logs show the lease id in decimal; a listing's
    JSON (which carries no record) shows it too, beside the card's key."""
    plain = f"{PLAIN:x}"
    assert (await fleet.client.get_worker(str(PLAIN))).id == plain
    (done,) = await fleet.client.update_taints(TaintUpdate.add(["gpu"]), Target(str(PLAIN)))
    assert done.worker == plain
    workers, _ = await fleet.client.list_workers(fields=listing.FIELDS["json"])
    shown = {o["id"]: o["dynamo"] for o in map(formats.worker_object, workers)}
    assert shown[plain] == {"card_key": values.card_key(PLAIN), "instance_id": str(PLAIN)}


async def test_lora_adapters_are_shown_with_their_worker_and_change_nothing_else(
    fleet: Fleet, dynamo_etcd: EtcdStore
) -> None:
    zoned = fleet.workers[f"{ZONED:x}"]
    before = await fleet.client.worker(zoned.id)
    for name in ("lora-b", "lora-a"):
        value = values.lora_card(ZONED, name)
        await dynamo_etcd.put(values.card_key(ZONED, name), value, lease=zoned.lease)
    shown = await eventually(lambda: fleet.client.worker(zoned.id),
                             lambda w: w.record.extra["dynamo"]["lora_count"] == 2,
                             what="the two adapters")  # fmt: skip
    assert shown.record.extra["dynamo"]["loras"] == ["lora-a", "lora-b"]
    assert shown.revision == before.revision  # the worker itself did not change
    assert "loras" not in shown.record.model_card.extra["dynamo"]


async def test_a_worker_whose_port_refuses_connection_is_unreachable_until_its_lease_ends(
    fleet: Fleet, dynamo_etcd: EtcdStore
) -> None:
    """Its process gone but its lease not yet over: dynamod's connection to its port ends,
    the next is refused, and it is marked at once: not ready, not routable, left out by
    ``route explain``; its record goes with its lease."""
    victim = await FakeDynamoWorker(dynamo_etcd, 0x7E01, taints=("pool=v",)).start()
    fleet.workers[victim.id] = victim
    await eventually(lambda: fleet.client.workers(), lambda ws: victim.id in {w.id for w in ws},
                     what="the victim listed")  # fmt: skip
    await victim.close_port()  # what a SIGKILL does to its port; its keys stay
    info = await eventually(lambda: fleet.client.worker(victim.id),
                            lambda w: w.state is WorkerState.UNREACHABLE,
                            what="the worker marked unreachable")  # fmt: skip
    assert not WorkerState.UNREACHABLE.routable
    assert info.engine is not None and "refuses connection" in info.engine.reason
    explained = await fleet.client.explain("lab-model", required=["pool=v"])
    (row,) = [c for c in explained.candidates if c.worker.id == victim.id]
    assert not any(c.rank for c in explained.candidates) and explained.chosen == ""
    assert row.reason.startswith("unreachable: its taint route's port 127.0.0.1:")
    assert "would refuse it at once (500)" in explained.summary
    assert victim.lease is not None
    await dynamo_etcd.revoke(victim.lease)  # its lease ends: its record goes
    await eventually(lambda: fleet.client.workers(),
                     lambda ws: victim.id not in {w.id for w in ws},
                     what="the victim gone")  # fmt: skip
    victim.lease = None


async def test_explain_says_what_is_dynamos_rule_and_what_dynamods_guess(fleet: Fleet) -> None:
    explained = await fleet.client.explain("lab-model", preferred={"pool=slow": 5.0})
    assert explained.chosen == ""  # two workers are eligible: Dynamo's own cost picks
    assert "one of these 2 workers" in explained.summary
    assert "Dynamo's rule (every required taint held" in explained.summary
    assert "dynamod's guess" in explained.summary
    assert sorted(c.rank for c in explained.candidates) == [1, 2]
    with pytest.raises(ConstraintError, match="weights must be from"):
        await fleet.client.explain("lab-model", preferred={"pool=slow": float("inf")})


async def test_if_revision_compares_the_cards_revision(fleet: Fleet) -> None:
    zoned = fleet.workers[f"{ZONED:x}"]
    revision = (await fleet.client.worker(zoned.id)).revision
    with pytest.raises(RevisionMismatchError) as caught:
        await fleet.client.update_taints(
            TaintUpdate.add(["x"]), Target(worker=zoned.id, expect_revision=revision - 1)
        )
    assert (caught.value.expected, caught.value.actual) == (revision - 1, revision)
    assert caught.value.key == values.card_key(ZONED)  # Dynamo's key, not the view's
    (done,) = await fleet.client.update_taints(
        TaintUpdate.add(["x"]), Target(worker=zoned.id, expect_revision=revision)
    )
    assert done.revision > revision and zoned.requests == 1


@pytest.mark.parametrize(
    ("mode", "error", "words"),
    [
        ("stock", UnsupportedError, r"has no taint route: .* answered 404"),
        ("starting", WorkerUnavailableError, "unavailable while the worker is starting"),
    ],
)
async def test_a_workers_answer_becomes_dynamods_error(
    fleet: Fleet, dynamo_etcd: EtcdStore, mode: Mode, error: type[Exception], words: str
) -> None:
    other = await add_worker(fleet, dynamo_etcd, 0x7F00 + len(mode), mode)
    with pytest.raises(error, match=words) as caught:
        await fleet.client.add_taints(other, ["pool=fast"])
    assert getattr(caught.value, "retryable", False) is (mode == "starting")


async def test_tokens_and_roles_apply_as_for_dynamods_own_workers(fleet: Fleet) -> None:
    zoned = fleet.workers[f"{ZONED:x}"]
    async with fleet.client_as("read-secret") as viewer:
        assert {w.id for w in await viewer.workers()} == set(fleet.workers)
        with pytest.raises(PermissionDeniedError, match="read-only"):
            await viewer.add_taints(zoned.id, ["capacity/fast"])
    async with fleet.client_as("scale-secret") as autoscaler:
        await autoscaler.add_taints(zoned.id, ["capacity/fast"])
        with pytest.raises(PermissionDeniedError, match="'pool=fast' is outside them"):
            await autoscaler.add_taints(zoned.id, ["pool=fast"])
    assert zoned.requests == 1
    lines = [(line["caller"], line["outcome"]) for line in fleet.audit_lines()]
    assert lines == [
        ("viewer", "PermissionDeniedError"), ("autoscaler", "ok"),
        ("autoscaler", "PermissionDeniedError"),
    ]  # fmt: skip


async def test_a_card_not_understood_is_counted_in_the_daemons_metrics(
    dynamo_etcd: EtcdStore, dynamo_url: str, tmp_path: Path
) -> None:
    """The daemon opens the store itself (as in production) and counts each record it
    leaves out (a field of another type, a count out of range) and each taint it warns
    of (a hand-set cordon, one past dynamod's grammar); the fleet's other workers are
    listed."""
    good, bad, seqs, odd = 0x5A5A, 0x5B5B, 0x5C5C, 0x5D5D
    lease = await dynamo_etcd.grant(30)
    card = values.mutated(values.card(bad), card_json={"kv_cache_block_size": "64"})
    negative = values.mutated(values.card(seqs), runtime={"max_num_seqs": -1})
    cordoned = values.card(odd, taints=[CORDONED, "x" * 2000])
    for number, value in ((good, values.card(good)), (bad, card), (seqs, negative),
                          (odd, cordoned)):  # fmt: skip
        await dynamo_etcd.put(values.card_key(number), value, lease=lease)
        await dynamo_etcd.put(values.instance_key(number), values.instance(number), lease=lease)
    settings = DaemonSettings(
        store=dynamo_url,
        listen=(f"unix://{tmp_path / 'dynamod.sock'}",),
        http="127.0.0.1:0",
        audit_log=tmp_path / "audit.log",
    )
    daemon = Daemon(settings)
    running = asyncio.create_task(daemon.run())
    try:
        async with asyncio.timeout(20):
            await daemon.ready.wait()
        async with (
            aiohttp.ClientSession() as http,
            http.get(daemon.http_url + "/metrics") as response,
        ):
            metrics = await response.text()
        async with client_for(settings) as client:
            listed = {w.id for w in await client.workers()}
    finally:
        daemon.stop()
        async with asyncio.timeout(20):
            await running
    assert 'dynamod_dynamo_records_refused_total{kind="card"} 2.0' in metrics
    assert "dynamod_dynamo_taint_warnings_total 2.0" in metrics  # the cordon, the long taint
    assert listed == {f"{good:x}", f"{odd:x}"}


async def test_the_front_points_at_dynamos_frontend(fleet: Fleet) -> None:
    body = {"model": "lab-model", "prompt": "hello", "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        async with http.post(fleet.http + "/v1/completions", json=body) as response:
            answer = await response.json()
        assert response.status == 501
        async with http.get(fleet.http + "/health") as health:
            assert health.status == 200
    assert "Dynamo's frontend" in answer["error"]["message"]
    assert answer["error"]["code"] == "dynamo_fleet"


async def test_explain_follows_dynamos_rule_every_required_taint(fleet: Fleet) -> None:
    explained = await fleet.client.explain("lab-model", required=["dynamo.topology/zone=b"])
    assert explained.chosen == f"{ZONED:x}"
    ineligible = [c for c in explained.candidates if not c.eligible]
    assert [c.worker.id for c in ineligible] == [f"{PLAIN:x}"]


async def test_a_change_that_never_shows_in_the_store_names_the_worker_and_the_store(
    dynamo_etcd: EtcdStore, dynamo_url: str
) -> None:
    """The worker answers ok but stores nothing: the wait ends with what the store shows."""
    worker = await FakeDynamoWorker(dynamo_etcd, PLAIN, mode="silent").start()
    store = await DynamoStore.open(dynamo_url)
    view = WorkerView(store)
    watching = asyncio.create_task(view.run())
    try:
        await asyncio.wait_for(view.ready.wait(), 10)
        (record,) = view.records()
        writes = RouteWrites(store, view, settle_within=0.3)
        with pytest.raises(WorkerUnavailableError) as caught:
            await writes.apply(record, TaintUpdate.add(["gpu"]), expect_revision=None,
                               check=lambda before, after: None, limits=TaintLimits())  # fmt: skip
        assert caught.value.worker == worker.id
        assert "accepted taints ['gpu'], but after 0.3 s the store shows []" in str(caught.value)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await store.aclose()
        await worker.stop()
