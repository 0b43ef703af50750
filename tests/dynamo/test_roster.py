"""Dynamo's keys joined into shown workers, change by change, in the orders Dynamo 1.6.1
was seen to write them: card then endpoint at registration, endpoint first on SIGTERM,
everything in one revision at a lease's expiry, taint updates rewriting the card, a LoRA
card three seconds after its base (and 5,000 of them, each costing the same); records
refused once, under Dynamo's key, counted, and never kept."""

from __future__ import annotations

import base64
import json
import logging
import sys

import pytest

from dynamod.records import WorkerRecord
from dynamod.store.base import Delete, Entry, Put
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.cards import MAX_RECORD_BYTES
from dynamod.store.dynamo.keys import WorkerRef
from dynamod.store.dynamo.roster import Refusals, Roster
from tests.dynamo import values

W = 0x13B0A2323C3786F7
SHOWN = f"v1/workers/dynamo/backend/generate/{W:x}"
REF = WorkerRef("dynamo", "backend", "generate", f"{W:x}")


def roster(refusals: Refusals | None = None) -> Roster:
    return Roster(SystemAddresses(), refusals or Refusals())


def registered(card: bytes, at: int = 3) -> list[Entry]:
    """Worker W's card at revision ``at`` and its endpoint record just after."""
    instance = values.instance(W)
    return [Entry(values.card_key(W), card, at), Entry(values.instance_key(W), instance, at + 1)]


def put(key: str, value: bytes, revision: int) -> Put:
    return Put(Entry(key, value, revision))


def shown(change: Put | Delete) -> WorkerRecord:
    assert isinstance(change, Put)
    return WorkerRecord.from_bytes(change.entry.value)


def test_the_captured_fleet_with_a_lora_and_a_stock_mocker_loads_as_two_workers() -> None:
    dump = json.loads(values.captured("etcd_dump.lora_and_stock_mocker.json"))
    entries = [
        Entry(base64.b64decode(kv["key"]).decode(), base64.b64decode(kv["value"]),
              int(kv["mod_revision"]))
        for kv in dump["kvs"]
    ]  # fmt: skip
    joined = roster()
    joined.load(entries)
    found = {WorkerRecord.from_bytes(e.value).instance_id: e for e in joined.entries()}
    assert sorted(found) == ["13b0a2323c3786f7", "13b0a2323c378709"]  # no KV-query endpoints
    base = WorkerRef("dynamo", "backend", "generate", "13b0a2323c3786f7")
    assert list(joined.adapters(base)) == ["lab-lora"]
    assert "loras" not in WorkerRecord.from_bytes(found[base.instance].value).model_card.extra
    assert found[base.instance].revision == 63  # its newest part: the card's update


def test_a_worker_is_shown_once_card_and_endpoint_exist_and_gone_with_the_endpoint() -> None:
    joined = roster()
    assert joined.apply(put(values.card_key(W), values.card(W, taints=["gpu"]), 10)) == []
    (added,) = joined.apply(put(values.instance_key(W), values.instance(W), 11))
    assert isinstance(added, Put) and added.entry.key == SHOWN and added.revision == 11
    assert shown(added).taints == ("gpu",)
    # SIGTERM: the endpoint records go first, then the lease with the card.
    assert joined.apply(Delete(values.instance_key(W), 12)) == [Delete(SHOWN, 12)]
    assert joined.apply(Delete(values.card_key(W), 14)) == []
    assert joined.entries() == []


def test_a_lease_expiry_deletes_everything_at_one_revision_and_the_worker_once() -> None:
    joined = roster()
    joined.load(registered(values.card(W)))
    changes = joined.apply(Delete(values.card_key(W), 41))
    changes += joined.apply(Delete(values.instance_key(W), 41))
    assert changes == [Delete(SHOWN, 41)]


def test_a_taint_update_is_a_put_at_its_revision_with_the_new_set() -> None:
    joined = roster()
    card = values.card(W, taints=["pool=slow"], zone="b")
    joined.load(registered(card))
    (changed,) = joined.apply(put(values.card_key(W), values.with_taints(card, ["pool=fast"]), 18))
    assert changed.revision == 18
    assert shown(changed).taints == ("dynamo.topology/zone=b", "pool=fast")


def test_a_lora_card_changes_nothing_shown_and_counts_as_an_adapter() -> None:
    joined = roster()
    joined.load(registered(values.card(W)))
    before = joined.entry(REF)
    assert joined.apply(put(values.card_key(W, "lab-lora"), values.lora_card(W), 9)) == []
    assert joined.entry(REF) is before and list(joined.adapters(REF)) == ["lab-lora"]
    assert joined.apply(Delete(values.card_key(W, "lab-lora"), 12)) == []
    assert list(joined.adapters(REF)) == []


def test_5000_lora_cards_under_one_worker_are_each_one_step_and_no_rebuild() -> None:
    """Each adapter's card is a name added to a set: the worker is never joined again,
    so no change is handed on and the shown entry stays the very same object."""
    joined = roster()
    joined.load(registered(values.card(W)))
    before = joined.entry(REF)
    card = values.lora_card(W)
    for n in range(5000):
        assert joined.apply(put(values.card_key(W, f"lora-{n:04d}"), card, 10 + n)) == []
    assert joined.entry(REF) is before
    assert len(joined.adapters(REF)) == 5000
    for n in range(0, 5000, 2):
        assert joined.apply(Delete(values.card_key(W, f"lora-{n:04d}"), 6000 + n)) == []
    assert len(joined.adapters(REF)) == 2500 and joined.entry(REF) is before
    (changed,) = joined.apply(put(values.card_key(W), values.card(W, taints=["gpu"]), 9000))
    assert shown(changed).taints == ("gpu",)  # the base card still joins as before


def test_other_keys_change_nothing() -> None:
    joined = roster()
    channel = (
        "v1/event_channels/namespace/dynamo/component/backend/endpoint/generate/topic/"
        "kv-events/12db88bad489b4"
    )
    assert joined.apply(put(channel, values.captured("event_channel.kv-events.json"), 5)) == []
    query = f"v1/instances/dynamo/backend/worker_kv_query_source_12db88bad489b4/{W:x}"
    query_source = values.captured("instance.worker_kv_query_source.json")
    assert joined.apply(put(query, query_source, 6)) == []


def test_a_card_not_understood_leaves_its_worker_out_reported_once_per_revision(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kinds: list[str] = []
    joined = roster(Refusals(kinds.append))
    bad = values.mutated(values.card(W), top={"type": "ModelV2"})
    joined.apply(put(values.instance_key(W), values.instance(W), 4))
    with caplog.at_level(logging.ERROR):
        assert joined.apply(put(values.card_key(W), bad, 5)) == []
        instance = Entry(values.instance_key(W), values.instance(W), 4)
        joined.load([instance, Entry(values.card_key(W), bad, 5)])  # the same, read again
    assert kinds == ["card"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert values.card_key(W) in line and '"type" is "ModelV2"' in line and "left out" in line
    (fixed,) = joined.apply(put(values.card_key(W), values.card(W), 6))
    assert isinstance(fixed, Put)  # the next, readable card shows the worker


def test_a_namespace_dynamods_keys_cannot_hold_is_reported_not_shown() -> None:
    kinds: list[str] = []
    joined = roster(Refusals(kinds.append))
    key = f"v1/mdc/my ns/backend/generate/{W:x}"
    card = values.mutated(values.card(W), top={"namespace": "my ns"})
    joined.apply(put(f"v1/instances/my ns/backend/generate/{W:x}", values.instance(W), 4))
    assert joined.apply(put(key, card, 5)) == []
    assert kinds == ["card"]


def test_a_card_holding_nan_is_reported_not_shown() -> None:
    kinds: list[str] = []
    joined = roster(Refusals(kinds.append))
    nan = values.card(W).replace(b'"slug":"lab-model"', b'"slug":NaN')
    joined.apply(put(values.instance_key(W), values.instance(W), 4))
    assert joined.apply(put(values.card_key(W), nan, 5)) == []
    assert kinds == ["card"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"card_json": {"kv_cache_block_size": 0}}, "card_json.kv_cache_block_size is 0"),
        ({"runtime": {"max_num_seqs": -1}}, "card_json.runtime_config.max_num_seqs is -1"),
        ({"runtime": {"total_kv_blocks": 2**60}}, "total_kv_blocks is 1152921504606846976"),
        ({"card_json": {"context_length": -5}}, "card_json.context_length is -5"),
    ],
)
def test_a_count_the_view_would_refuse_is_refused_here_under_dynamos_key_and_counted(
    change: dict[str, object], named: str, caplog: pytest.LogCaptureFixture
) -> None:
    kinds: list[str] = []
    joined = roster(Refusals(kinds.append))
    bad = values.mutated(values.card(W), **change)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR):
        assert joined.apply(put(values.card_key(W), bad, 5)) == []
        assert joined.apply(put(values.instance_key(W), values.instance(W), 6)) == []
    assert kinds == ["card"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert values.card_key(W) in line and named in line and "must be an integer from" in line


def test_odd_taints_and_a_hand_set_cordon_are_read_and_warned_of_once_per_revision(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Dynamo accepts any string as a taint: the worker is read as it is, and each taint
    dynamod would not set is named, with the rule, once per revision, and counted."""
    warned: list[None] = []
    joined = roster(Refusals(on_warned=lambda: warned.append(None)))
    odd = ["dynamo.io/cordoned", "t" * 5000, "\u0000", "pool=a"]
    card = values.card(W, taints=odd)
    with caplog.at_level(logging.WARNING):
        joined.load(registered(card))
        joined.load(registered(card))  # the same revision, read again: said once
    assert sorted(shown(Put(e)).taints for e in joined.entries()) == [tuple(sorted(odd))]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(warned) == 3
    assert all(values.card_key(W) in line for line in lines)
    (cordon,) = [line for line in lines if "dynamo.io/cordoned" in line]
    assert "does not honour" in cordon and "uncordon" in cordon
    assert any("is 5000 bytes long (UTF-8); the limit is 1024 bytes" in line for line in lines)
    assert any("control or invisible character U+0000" in line for line in lines)
    assert all(len(line) < 1000 for line in lines)  # the 5,000-byte taint shown cut short


def test_a_card_too_large_is_refused_as_such_and_its_bytes_are_not_kept() -> None:
    kinds: list[str] = []
    joined = roster(Refusals(kinds.append))
    joined.apply(put(values.instance_key(W), values.instance(W), 4))
    huge = b" " * (MAX_RECORD_BYTES + 1)
    assert joined.apply(put(values.card_key(W), huge, 5)) == []
    assert kinds == ["card"]
    assert sys.getrefcount(huge) == 2  # here and getrefcount's argument: the roster has none
