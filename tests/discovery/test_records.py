"""Worker record JSON, mdcsum, and the immutable boundary."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamod.errors import ImmutableFieldError, InvalidInputError
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord, immutable_diff, mdcsum
from dynamod.taints import topology_taints

MANY = settings(max_examples=1000, deadline=None)


def make_record(**changes: object) -> WorkerRecord:
    domains = {"zone": "a"}
    base = WorkerRecord(
        instance_id="00ff00ff00ff00ff",
        namespace="dynamo",
        component="backend",
        endpoint="generate",
        address="http://127.0.0.1:8000",
        system_address="http://127.0.0.1:9090",
        model_card=ModelCard(name="llama", kv_block_size=16, total_kv_blocks=1024),
        runtime_config=RuntimeConfig(
            taints=("capacity/fast", *topology_taints(domains)), topology_domains=domains
        ),
        started_at=1700000000.5,
        host="node-1",
        pid=4242,
        version="0.1.0",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_record_round_trips_through_json() -> None:
    record = make_record()
    assert WorkerRecord.from_bytes(record.to_bytes()) == record


def test_record_json_is_canonical() -> None:
    record = make_record()
    assert record.to_bytes() == WorkerRecord.from_bytes(record.to_bytes()).to_bytes()
    assert b" " not in record.to_bytes()


def test_unknown_fields_are_kept_at_every_level() -> None:
    obj = make_record().to_json()
    obj["lora"] = {"name": "x"}
    obj["model_card"]["tokenizer_sha"] = "abc"
    obj["runtime_config"]["future_knob"] = 3
    record = WorkerRecord.from_json(obj)
    assert record.extra == {"lora": {"name": "x"}}
    assert record.model_card.extra == {"tokenizer_sha": "abc"}
    assert record.runtime_config.extra == {"future_knob": 3}
    assert record.to_json() == obj
    updated = record.with_caller_taints(["new"])
    assert updated.to_json()["model_card"]["tokenizer_sha"] == "abc"


def test_old_records_without_optional_fields_parse_with_defaults() -> None:
    old = {
        "instance_id": "1",
        "namespace": "n",
        "component": "c",
        "endpoint": "e",
        "address": "http://h:1",
        "model_card": {"name": "m"},
    }
    record = WorkerRecord.from_json(old)
    assert record.taints == ()
    assert record.runtime_config.topology_domains == {}
    assert record.model_card.kv_block_size == ModelCard(name="m").kv_block_size
    assert (record.pid, record.host, record.system_address) == (0, "", "")


def test_empty_optional_runtime_fields_are_omitted() -> None:
    assert RuntimeConfig().to_json() == {"taints": []}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.pop("address"), "worker.address is required"),
        (lambda o: o.update(pid="12"), "worker.pid must be int, got '12'"),
        (lambda o: o.update(pid=True), "worker.pid must be int, got True"),
        (lambda o: o.update(model_card=[]), "worker.model_card must be dict, got []"),
        (
            lambda o: o["runtime_config"].update(taints="a"),
            "runtime_config.taints must be list, got 'a'",
        ),
        (
            lambda o: o["runtime_config"].update(taints=[1]),
            "runtime_config.taints entries must be strings",
        ),
        (
            lambda o: o["runtime_config"].update(topology_domains={"zone": 1}),
            "runtime_config.topology_domains values must be strings",
        ),
        (lambda o: o["model_card"].pop("name"), "model_card.name is required"),
    ],
)
def test_malformed_records_are_refused_naming_the_field(mutate: object, message: str) -> None:
    obj = make_record().to_json()
    mutate(obj)  # type: ignore[operator]
    with pytest.raises(InvalidInputError) as caught:
        WorkerRecord.from_json(obj)
    assert str(caught.value) == message


def test_record_that_is_not_json_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="worker record is not valid JSON"):
        WorkerRecord.from_bytes(b"{nope")
    with pytest.raises(InvalidInputError, match="worker must be a JSON object, got list"):
        WorkerRecord.from_bytes(b"[]")


# --- mdcsum ---

cards = st.builds(
    ModelCard,
    name=st.text(min_size=1, max_size=10),
    engine=st.sampled_from(["mocker", "vllm"]),
    kv_block_size=st.integers(1, 128),
    context_length=st.integers(1, 1 << 20),
    max_num_batched_tokens=st.integers(1, 1 << 16),
    max_num_seqs=st.integers(1, 1024),
    total_kv_blocks=st.integers(1, 1 << 20),
)


@MANY
@given(cards, st.lists(st.sampled_from(["a", "b", "pool=x", "capacity/fast"]), max_size=4))
def test_mdcsum_is_unchanged_by_any_taint_change(card: ModelCard, taints: list[str]) -> None:
    record = make_record(model_card=card)
    assert mdcsum(record.with_caller_taints(taints).model_card) == mdcsum(card)


@MANY
@given(cards, cards)
def test_mdcsum_changes_with_any_model_card_change(a: ModelCard, b: ModelCard) -> None:
    assert (mdcsum(a) == mdcsum(b)) == (a == b)


def test_mdcsum_is_stable_across_processes() -> None:
    assert mdcsum(ModelCard(name="llama")) == mdcsum(
        ModelCard.from_json(json.loads(json.dumps(ModelCard(name="llama").to_json())))
    )
    assert len(mdcsum(ModelCard(name="llama"))) == 64


# --- the immutable boundary ---


def test_a_taint_only_change_passes_the_boundary() -> None:
    old = make_record()
    immutable_diff(old, old.with_caller_taints(["other", "pool=b"]))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"address": "http://elsewhere:1"}, "address"),
        ({"pid": 1}, "pid"),
        (
            {"model_card": ModelCard(name="mistral", kv_block_size=16, total_kv_blocks=1024)},
            "model_card.name",
        ),
        (
            {"model_card": ModelCard(name="llama", kv_block_size=32, total_kv_blocks=1024)},
            "model_card.kv_block_size",
        ),
        (
            {
                "runtime_config": RuntimeConfig(
                    taints=("dynamo.topology/zone=b",), topology_domains={"zone": "b"}
                )
            },
            "runtime_config.topology_domains.zone",
        ),
        ({"extra": {"lora": "x"}}, "lora"),
    ],
)
def test_any_other_change_is_refused_naming_the_field(
    change: dict[str, object], field: str
) -> None:
    old = make_record()
    with pytest.raises(ImmutableFieldError) as caught:
        immutable_diff(old, make_record(**change))
    assert caught.value.field == field
    assert str(caught.value) == f"worker record field '{field}' is immutable after registration"


def test_topology_taints_must_match_domains() -> None:
    old = make_record()
    forged = make_record(
        runtime_config=RuntimeConfig(
            taints=("dynamo.topology/zone=b",), topology_domains={"zone": "a"}
        )
    )
    with pytest.raises(ImmutableFieldError) as caught:
        immutable_diff(old, forged)
    assert str(caught.value) == (
        "worker record field 'runtime_config.taints' is immutable after registration; its "
        "dynamo.topology/ taints must match runtime_config.topology_domains"
    )
