"""Pool policies on an NVIDIA Dynamo fleet need dynamod's own state store (issue 29): a
daemon reading the fleet (one captured worker record in etcd, ``values.py``) without one
refuses an apply, a dry run too, before it plans anything, naming the setting, its
environment name, the flag and an example; its ready line and ``dynamoctl status`` name the
state store in use."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from dynamod.store.etcd import EtcdStore
from tests.dynamo import values
from tests.support.processes import daemon, dynamoctl, env, running

pytestmark = pytest.mark.timeout(300)

WORKER = 0x13B0A2323C378618
POLICY = "name: split\nselector: model=Qwen/Qwen3-0.6B\npools:\n  pool=a: 1\n  pool=b: 1\n"


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "apply"])
async def test_an_apply_without_a_state_store_is_refused_before_any_plan(
    dynamo_etcd: EtcdStore, dynamo_url: str, tmp_path: Path, dry_run: bool
) -> None:
    lease = await dynamo_etcd.grant(300)
    await dynamo_etcd.put(values.card_key(WORKER), values.card(WORKER), lease=lease)
    await dynamo_etcd.put(values.instance_key(WORKER), values.instance(WORKER), lease=lease)
    document = tmp_path / "split.yaml"
    document.write_text(POLICY)
    socket = tmp_path / "d.sock"
    async with running(daemon(dynamo_url, socket)) as proc:
        assert proc.field("state_store") == dynamo_url
        argv = dynamoctl("--endpoint", f"unix://{socket}", "pools", "apply", "-f", str(document))
        shown = await asyncio.to_thread(
            subprocess.run, dynamoctl("--endpoint", f"unix://{socket}", "status", "-o", "json"),
            capture_output=True, text=True, env=env(), timeout=60, check=False,
        )  # fmt: skip
        assert json.loads(shown.stdout)["state_store"] == dynamo_url, shown.stderr
        done = await asyncio.to_thread(
            subprocess.run, [*argv, *(["--dry-run"] if dry_run else [])],
            capture_output=True, text=True, env=env(), timeout=60, check=False,
        )  # fmt: skip
    await dynamo_etcd.revoke(lease)
    assert done.returncode != 0, done.stdout
    assert "planned" not in done.stdout
    for needed in ("state_store", "DYNAMO_STATE_STORE", "--state-store", "etcd://10.0.0.1"):
        assert needed in done.stderr, done.stderr
