"""Dynamo 1.6.1's discovery records, as captured from a running fleet (``tests/data/
dynamo``), and synthetic ones shaped exactly like them: a card is the captured card with
its identity, taints, topology and file URLs replaced, nothing else."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "data" / "dynamo"
NAMESPACE, COMPONENT, ENDPOINT = "dynamo", "backend", "generate"
Json = dict[str, Any]


def captured(name: str) -> bytes:
    """A captured record's bytes, exactly as Dynamo wrote them."""
    return (DATA / name).read_bytes()


def captured_json(name: str) -> Json:
    found: Json = json.loads(captured(name))
    return found


def card_key(instance: int, lora: str = "") -> str:
    tail = f"/{lora}" if lora else ""
    return f"v1/mdc/{NAMESPACE}/{COMPONENT}/{ENDPOINT}/{instance:x}{tail}"


def instance_key(instance: int) -> str:
    return f"v1/instances/{NAMESPACE}/{COMPONENT}/{ENDPOINT}/{instance:x}"


def card(
    instance: int,
    *,
    taints: Iterable[str] | None = (),
    zone: str | None = None,
    system: str = "127.0.0.1:23447",
    model: str = "lab-model",
) -> bytes:
    """A model card like the captured one, for worker ``instance``: ``taints`` (None: the
    key absent, as at a registration without any taint or topology), a topology zone, the
    system port its file URLs name."""
    obj = captured_json("mdc.topology_zone_b.after_route_update.json")
    obj["instance_id"] = instance
    body = obj["card_json"]
    body["display_name"] = body["slug"] = model
    _retarget(body, system, f"{model}/_base")
    runtime = body["runtime_config"]
    for name in ("taints", "topology_domains", "kv_transfer_domain", "kv_transfer_enforcement"):
        runtime.pop(name, None)
    generated = []
    if zone is not None:
        runtime |= {"topology_domains": {"zone": zone}, "kv_transfer_domain": "zone",
                    "kv_transfer_enforcement": "required"}  # fmt: skip
        generated = [f"dynamo.topology/zone={zone}"]
    if taints is not None or generated:
        runtime["taints"] = sorted({*(taints or ()), *generated})
    return json.dumps(obj, separators=(",", ":")).encode()


def lora_card(instance: int, name: str = "lab-lora", system: str = "127.0.0.1:23447") -> bytes:
    obj = captured_json("mdc.lora_adapter.json")
    obj["instance_id"] = instance
    body = obj["card_json"]
    body["display_name"] = body["slug"] = obj["model_suffix"] = name
    body["lora"] = {"name": name}
    _retarget(body, system, f"{name}/{name}")
    return json.dumps(obj, separators=(",", ":")).encode()


def instance(instance: int, port: int = 43155) -> bytes:
    obj = captured_json("instance.generate.json")
    obj["instance_id"] = instance
    obj["transport"] = {"tcp": f"127.0.0.1:{port}/{instance:x}/{NAMESPACE}/{COMPONENT}/{ENDPOINT}"}
    return json.dumps(obj, separators=(",", ":")).encode()


def with_taints(value: bytes, taints: Iterable[str]) -> bytes:
    """``value`` (a card) with its caller taints replaced, as Dynamo's route writes it:
    sorted, the generated ones kept, nothing else changed."""
    obj = json.loads(value)
    runtime = obj["card_json"]["runtime_config"]
    generated = [t for t in runtime.get("taints", []) if t.startswith("dynamo.topology/")]
    runtime["taints"] = sorted({*taints, *generated})
    return json.dumps(obj, separators=(",", ":")).encode()


def caller_taints_of(value: bytes) -> list[str]:
    taints = json.loads(value)["card_json"]["runtime_config"].get("taints", [])
    return [t for t in taints if not t.startswith("dynamo.topology/")]


def _retarget(body: Mapping[str, Any], system: str, path: str) -> None:
    """Point every file URL of the card at ``system`` under ``path``."""
    for section in ("model_info", "tokenizer", "prompt_formatter", "gen_config"):
        for item in body.get(section, {}).values():
            name = item["path"].rsplit("/", 1)[1]
            item["path"] = (
                f"http://{system}/v1/metadata/{NAMESPACE}/{COMPONENT}/{ENDPOINT}/{path}/{name}"
            )


def mutated(
    value: bytes,
    *,
    top: Mapping[str, Any] | None = None,
    card_json: Mapping[str, Any] | None = None,
    runtime: Mapping[str, Any] | None = None,
) -> bytes:
    """A copy of a card with fields of the record, of ``card_json`` or of its
    ``runtime_config`` replaced (``...`` removes one): shapes the reader must refuse."""
    obj = copy.deepcopy(json.loads(value))
    for where, changes in (
        (obj, top),
        (obj["card_json"], card_json),
        (obj["card_json"]["runtime_config"], runtime),
    ):
        for name, new in (changes or {}).items():
            if new is ...:
                where.pop(name, None)
            else:
                where[name] = new
    return json.dumps(obj).encode()
