"""Small builders for test data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dynamod.discovery.registration import new_instance_id
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.taints import with_topology


def make_record(
    *,
    model: str = "llama",
    taints: Iterable[str] = (),
    topology: Mapping[str, str] | None = None,
    instance_id: str | None = None,
    address: str = "http://127.0.0.1:1",
    max_num_seqs: int = 256,
) -> WorkerRecord:
    domains = dict(topology or {})
    return WorkerRecord(
        instance_id=instance_id or new_instance_id(),
        namespace="dynamo",
        component="backend",
        endpoint="generate",
        address=address,
        model_card=ModelCard(name=model, max_num_seqs=max_num_seqs),
        runtime_config=RuntimeConfig(
            taints=with_topology(taints, domains), topology_domains=domains
        ),
        host="test",
        pid=1,
        version="test",
    )
