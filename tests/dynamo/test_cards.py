"""Dynamo 1.6.1's captured records read as worker records: ids from the key, exact above
2^53, the model, the taints split as Dynamo splits them, topology, the system address
from the card (or the operator's template and map); every shape the reader does not
understand refused by name, never guessed at; taints Dynamo holds that dynamod would not
set named with their rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dynamod.errors import ConfigError
from dynamod.records import WorkerRecord
from dynamod.store.base import Entry
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.cards import (
    MAX_RECORD_BYTES,
    WARNED_TAINTS,
    NotUnderstood,
    Parts,
    taint_warnings,
    worker_record,
)
from dynamod.store.dynamo.keys import WorkerRef, parse_key, parse_shown
from tests.dynamo import values

ZONE_B = 1418812219264042520  # 0x13b0a2323c378618, the captured worker with zone b


def read(
    card: bytes, *, instance: bytes | None = None, number: int | None = None, **options: Any
) -> WorkerRecord:
    """``card`` as read for worker ``number`` (by default the id the card names)."""
    number = json.loads(card)["instance_id"] if number is None else number
    found = parse_key(values.card_key(number))
    assert found is not None
    endpoint = instance or values.instance(number)
    parts = Parts(
        Entry(values.card_key(number), card, 7), Entry(values.instance_key(number), endpoint, 8)
    )
    addresses = options.pop("addresses", SystemAddresses())
    return worker_record(found.worker, parts, addresses, **options)


def test_the_captured_card_with_topology_reads_whole() -> None:
    record = read(values.captured("mdc.topology_zone_b.after_route_update.json"),
                  instance=values.captured("instance.generate.json"))  # fmt: skip
    assert record.instance_id == "13b0a2323c378618"
    assert record.key == "v1/workers/dynamo/backend/generate/13b0a2323c378618"
    assert (record.model, record.model_card.engine, record.model_card.kv_block_size) == (
        "lab-model", "dynamo", 64,
    )  # fmt: skip
    assert record.model_card.context_length == 8192  # 0 in the card: the architectural maximum
    assert record.taints == ("dynamo.topology/zone=b", "gpu", "pool=fast")
    assert dict(record.runtime_config.topology_domains) == {"zone": "b"}
    assert record.runtime_config.kv_transfer_enforcement == "required"
    assert record.address == "tcp://127.0.0.1:43155"
    assert record.system_address == "http://127.0.0.1:23447"
    assert record.extra["dynamo"]["instance_id"] == str(ZONE_B)


def test_an_id_above_2_to_the_63_stays_exact() -> None:
    """File-store ids are random u64s: 13963417943699230391 is one the lab saw."""
    number = 13963417943699230391
    record = read(values.card(number), instance=values.instance(number))
    assert record.instance_id == f"{number:x}"
    assert record.extra["dynamo"]["instance_id"] == "13963417943699230391"
    assert WorkerRecord.from_bytes(record.to_bytes()) == record  # no float on the way


@pytest.mark.parametrize(
    ("fixture", "taints"),
    [
        ("mdc.no_taints.taints_key_absent.json", ()),
        ("mdc.taints_cleared.empty_list_present.json", ()),
        ("mdc.initial_taints_unsorted.at_registration.json", ("gpu", "pool=slow")),
    ],
)
def test_taints_absent_cleared_or_unsorted_read_as_one_sorted_set(
    fixture: str, taints: tuple[str, ...]
) -> None:
    assert read(values.captured(fixture)).taints == taints


def test_system_address_from_the_card_then_template_then_map() -> None:
    card = values.card(0x1F, system="127.0.0.1:29000")
    assert read(card).system_address == "http://127.0.0.1:29000"
    template = SystemAddresses("http://{host}:9090")
    assert read(card, addresses=template).system_address == "http://127.0.0.1:9090"
    mapped = SystemAddresses("http://{host}:9090", {"1F": "http://10.0.0.7:9345/"})
    assert read(card, addresses=mapped).system_address == "http://10.0.0.7:9345"


def test_a_card_url_on_every_interface_takes_the_request_plane_host() -> None:
    card = values.card(0x2A, system="0.0.0.0:29001")
    assert read(card).system_address == "http://127.0.0.1:29001"


def test_taints_dynamod_would_not_set_are_read_and_named_with_their_rule() -> None:
    odd = ["dynamo.io/cordoned", "t" * 5000, "\u0000", *(f" pad{n} " for n in range(5))]
    record = read(values.card(0x3B, taints=[*odd, "pool=a"], zone="b"))
    assert set(record.taints) == {*odd, "pool=a", "dynamo.topology/zone=b"}
    said = taint_warnings(record)
    assert len(said) == 1 + WARNED_TAINTS + 1  # the cordon, three named, the rest counted
    assert sum("NVIDIA Dynamo's router does not honour" in line for line in said) == 1
    assert said[-1] == f"holds {len(odd) - 1 - WARNED_TAINTS} more taints dynamod would refuse"
    assert taint_warnings(read(values.card(0x3C, taints=["pool=a"], zone="b"))) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"top": {"type": "ModelV2"}}, '"type" is "ModelV2"'),
        ({"top": {"card_json": ...}}, "card_json is missing"),
        ({"top": {"instance_id": 1.4188122192640425e18}}, "instance_id is 1.41"),
        ({"top": {"instance_id": 7}}, "instance_id is 7 but the key's id"),
        ({"top": {"component": "other"}}, "component is 'other' but the key says 'backend'"),
        ({"card_json": {"kv_cache_block_size": ...}}, "kv_cache_block_size is missing"),
        ({"card_json": {"display_name": ..., "slug": ...}}, "display_name is missing"),
        ({"card_json": {"runtime_config": []}}, "runtime_config is [], not an object"),
        ({"runtime": {"taints": "gpu"}}, 'taints is "gpu", not an array'),
        ({"runtime": {"taints": [1]}}, "taints holds something other than strings"),
        ({"runtime": {"topology_domains": {"zone": 1}}}, "topology_domains has a value"),
        ({"card_json": {"kv_cache_block_size": 0}}, "kv_cache_block_size is 0; it must be"),
        ({"runtime": {"max_num_seqs": -3}}, "runtime_config.max_num_seqs is -3; it must be"),
        ({"runtime": {"max_num_batched_tokens": 2**54}}, "max_num_batched_tokens is 1801"),
    ],
)
def test_a_shape_not_understood_names_the_key_and_the_field(
    change: dict[str, Any], named: str
) -> None:
    number = 0x13B0A2323C378618
    card = values.mutated(values.card(number), **change)
    with pytest.raises(NotUnderstood) as caught:
        read(card, number=number)
    assert named in str(caught.value)
    assert values.card_key(number) in str(caught.value)


def test_a_card_that_is_not_json_or_an_instance_without_transport_is_refused() -> None:
    with pytest.raises(NotUnderstood, match="not valid JSON"):
        read(b'{"type": "Model", ', number=0x44)
    with pytest.raises(NotUnderstood, match="more than 64 levels deep"):
        read(b"[" * 100_000 + b"]" * 100_000, number=0x44)
    with pytest.raises(NotUnderstood, match="bytes long"):
        read(b" " * (MAX_RECORD_BYTES + 1), number=0x44)
    odd = values.card(0x44, system="[::1:29000")  # a URL that does not parse: no address
    assert read(odd).system_address == ""
    number = 0x44
    broken = json.dumps({"type": "Endpoint", "instance_id": number}).encode()
    with pytest.raises(NotUnderstood, match="transport is missing") as caught:
        read(values.card(number), instance=broken)
    assert caught.value.kind == "instance"


def test_keys_other_than_a_workers_card_or_instance_are_not_workers() -> None:
    query = parse_key("v1/instances/dynamo/backend/worker_kv_query_source_3e52/13b0a2323c3786f7")
    assert query is not None and query.worker.endpoint == "worker_kv_query_source_3e52"
    channel = "v1/event_channels/namespace/dynamo/component/backend/endpoint/generate/topic/kv"
    assert parse_key(channel) is None
    assert parse_key("v1/mdc/dynamo/backend/generate/not-hex") is None
    assert parse_key("v1/mdc/dynamo/backend/generate/12345678901234567") is None  # > 64 bits
    lora = parse_key("v1/mdc/dynamo/backend/generate/13b0a2323c3786f7/lab-lora")
    assert lora is not None and (lora.kind, lora.lora) == ("lora", "lab-lora")
    assert parse_shown("v1/workers/dynamo/backend/generate/13b0a2323c3786f7") == WorkerRef(
        "dynamo", "backend", "generate", "13b0a2323c3786f7"
    )


@pytest.mark.parametrize(
    ("template", "by_id", "message"),
    [
        ("http://{host}:{port}", {}, "names {port}"),
        ("ftp://{host}:9090", {}, "must be an http:// or https:// URL"),
        ("http://{host}:9090/engine", {}, "without a path"),
        ("", {"abc": "not a url"}, "dynamo_system_addresses['abc']"),
    ],
)
def test_an_unusable_system_address_setting_is_refused(
    template: str, by_id: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("{", r"\{")):
        SystemAddresses(template, by_id)
