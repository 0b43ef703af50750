"""dynamod and dynamoctl as the operator plane of a real NVIDIA Dynamo 1.6.1 fleet: its
frontend (``--router-mode kv``) and mockers with Dynamo's own taint route (one with a
topology zone and initial taints, one with a LoRA card, one stock mocker without a route),
on etcd and on Dynamo's file store; dynamod a real process, dynamoctl run as an operator
runs it, nothing of Dynamo changed.

What Dynamo does is read from Dynamo: which worker its frontend sent a request to
(``nvext.worker_id.decode_worker_id``), what its store holds. A change is waited for with
a deadline, never a sleep; the only time bounds asserted are the ones the issues state: a
killed worker is shown not ready within 5 s, and leaves the listing within its TTL.
"""

from __future__ import annotations

import asyncio
import json
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.peer import venv as peer_venv
from dynamod.client import AsyncClient
from dynamod.errors import WorkerNotFoundError
from dynamod.results import WorkerState
from dynamod.store.dynamo.file_source import EXPIRY, TICK
from dynamod.taints import CORDONED
from tests.dynamo.fleet import DynamoFleet, WorkerSpec, build_model, post_json, until
from tests.support import envs
from tests.support.processes import Spawned, daemon_argv, dynamoctl, env, started
from tests.support.servers import require_servers

pytestmark = [pytest.mark.dynamo, pytest.mark.timeout(900)]

SPECS = (
    WorkerSpec("zoned", taints=("pool=slow",), zone="b"),
    WorkerSpec("lora", lora="lab-lora"),
    WorkerSpec("stock", stock=True),
)
ROUTED_WITHIN = 10.0
LEASE_TTL = 8  # s: ETCD_LEASE_TTL of the worker that is killed (Dynamo's default is 30)
SLACK = 2.0  # s: etcd's expiry sweep, the watch, a loaded machine
UNREADY_WITHIN = 5.0  # s: a killed worker is shown not ready within this (issue 29)


@pytest.fixture(scope="session")
def dynamo_venv() -> Path:
    """Dynamo's venv, built before the session by ``tests/support/envs.py`` through the
    same code as the peer benchmark (a failure to build it fails CI and skips elsewhere)."""
    try:
        return envs.dynamo_venv()
    except envs.EnvMissing as exc:
        if require_servers():
            pytest.fail(f"CI needs NVIDIA Dynamo {peer_venv.DYNAMO_VERSION}: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def dynamo_model(dynamo_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(dynamo_venv, tmp_path_factory.mktemp("dynamo-model"))


@dataclass
class Plane:
    """A Dynamo fleet and the dynamod that watches it; ``ctl`` runs dynamoctl."""

    fleet: DynamoFleet
    daemon: Spawned
    socket: Path
    home: Path

    def ctl(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        environment = {k: v for k, v in env().items() if not k.startswith("DYNAMO")}
        environment |= {"HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / "c")}
        done = subprocess.run(
            dynamoctl("--endpoint", f"unix://{self.socket}", *args),
            capture_output=True, text=True, env=environment, timeout=120, check=False,
        )  # fmt: skip
        assert "Traceback" not in done.stderr, done.stderr
        if ok:
            assert done.returncode == 0, f"dynamoctl {' '.join(args)}: {done.stderr}"
        return done

    def workers(self) -> dict[str, dict[str, Any]]:
        listed = json.loads(self.ctl("workers", "ls", "-o", "json").stdout)
        return {w["id"]: w for w in listed}

    def worker(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.ctl("workers", "get", self.id(name), "-o", "json").stdout
        )
        return found

    def id(self, name: str) -> str:
        return self.fleet.workers[name].id

    def number(self, name: str) -> int:
        return self.fleet.workers[name].instance_id

    def routes(self, required: list[str], name: str | None) -> None:
        """Dynamo's frontend sends requests requiring ``required`` to worker ``name``
        (None: refuses them), within a deadline, and then every time (5 of 5)."""
        wanted = None if name is None else self.number(name)
        until(lambda: True if self.fleet.routed_to(required) == wanted else None,
              f"Dynamo's frontend to route {required} to {name}", [], ROUTED_WITHIN)  # fmt: skip
        assert [self.fleet.routed_to(required) for _ in range(5)] == [wanted] * 5


@pytest.fixture(scope="module", params=["etcd", "file"])
def plane(
    request: pytest.FixtureRequest,
    dynamo_venv: Path,
    dynamo_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Plane]:
    workdir = tmp_path_factory.mktemp(f"dynamo-{request.param}")
    short = Path(tempfile.mkdtemp(prefix="dyn-"))  # a unix socket path has 108 bytes
    fleet = DynamoFleet(dynamo_venv, dynamo_model, workdir, request.param, SPECS)
    with fleet:
        argv = daemon_argv(fleet.store_url, short / "d.sock", "--log-level", "info")
        # Dynamo's store is read-only: dynamod keeps its own state (pools) in one of its own.
        state = {
            "DYNAMO_STATE_STORE": (workdir / "state").as_uri(),
            "DYNAMO_POOL_LEASE_TTL": "3",
            "DYNAMO_STORE_TIMEOUT": "1.5",
        }
        daemon = started(argv, r"^dynamod ready:", workdir / "dynamod.log", state)
        plane = Plane(fleet, daemon, short / "d.sock", workdir / "home")
        try:
            # The LoRA card comes a second after its base: every test starts once it is there.
            under = f"v1/mdc/dynamo/backend/generate/{plane.id('lora')}/"
            until(lambda: any(k.startswith(under) for k in fleet.records("v1/mdc/")) or None,
                  "Dynamo to register the LoRA card", [fleet.workers["lora"].proc])  # fmt: skip
            yield plane
        finally:
            log = daemon.finish()
            assert "is an NVIDIA Dynamo fleet" in log  # said at start
            shutil.rmtree(short)


def test_every_dynamo_worker_is_listed_with_its_taints_and_topology(plane: Plane) -> None:
    listed = plane.workers()
    assert sorted(listed) == sorted(w.id for w in plane.fleet.workers.values())
    zoned = listed[plane.id("zoned")]
    assert (zoned["model"], zoned["caller_taints"]) == ("lab-model", ["pool=slow"])
    assert zoned["generated_taints"] == ["dynamo.topology/zone=b"]
    assert zoned["topology"] == {"zone": "b"}
    assert zoned["system_address"] == plane.fleet.workers["zoned"].system
    assert listed[plane.id("stock")]["taints"] == []
    lora = until(lambda: plane.worker("lora")["dynamo"].get("loras") or None,
                 "dynamod to show the LoRA adapter", [], ROUTED_WITHIN)  # fmt: skip
    assert (lora, plane.worker("lora")["dynamo"]["lora_count"]) == (["lab-lora"], 1)
    got = plane.worker("zoned")
    assert got["dynamo"]["instance_id"] == str(plane.number("zoned"))
    # The key shown is Dynamo's own, one its store holds: get and list alike.
    assert got["key"] == f"v1/mdc/dynamo/backend/generate/{plane.id('zoned')}"
    assert got["key"] in plane.fleet.records("v1/mdc/") and zoned["key"] == got["key"]
    chosen = plane.ctl("workers", "ls", "-l", "pool=slow", "-o", "json").stdout
    assert [w["id"] for w in json.loads(chosen)] == [plane.id("zoned")]


def test_add_remove_set_and_clear_change_what_dynamos_frontend_routes(plane: Plane) -> None:
    zoned, lora = plane.id("zoned"), plane.id("lora")
    plane.routes(["pool=fast"], None)  # nobody holds it: Dynamo refuses the request
    plane.ctl("taints", "add", lora, "pool=fast")
    plane.routes(["pool=fast"], "lora")
    plane.ctl("taints", "set", zoned, "pool=fast", "gpu")
    plane.routes(["pool=slow"], None)
    plane.routes(["pool=fast", "gpu"], "zoned")
    plane.ctl("taints", "rm", lora, "pool=fast")
    plane.routes(["pool=fast"], "zoned")
    plane.ctl("taints", "clear", zoned)
    plane.routes(["pool=fast"], None)
    plane.routes(["dynamo.topology/zone=b"], "zoned")  # the generated taint stays
    after = plane.worker("zoned")
    assert (after["caller_taints"], after["generated_taints"]) == ([], ["dynamo.topology/zone=b"])
    plane.ctl("taints", "set", zoned, "pool=slow")  # as the fleet started


def test_route_explain_applies_dynamos_rule(plane: Plane) -> None:
    asked = ("route", "explain", "--model", "lab-model", "--require", "pool=slow", "-o", "json")
    explained = json.loads(plane.ctl(*asked).stdout)
    assert explained["chosen"] == plane.id("zoned")  # the one its rule allows
    refused = {c["id"] for c in explained["candidates"] if not c["eligible"]}
    assert refused == {plane.id("lora"), plane.id("stock")}
    assert plane.fleet.routed_to(["pool=slow"]) == plane.number("zoned")  # Dynamo agrees


def test_route_explain_says_dynamods_ranking_is_a_guess_and_takes_dynamos_weights(
    plane: Plane,
) -> None:
    """With every worker eligible, Dynamo picks by its own cost: explain names none, and
    says which part is Dynamo's rule and which dynamod's guess. A weight past [-1, 1],
    which Dynamo's frontend takes, is taken."""
    status, _ = plane.fleet.complete(
        nvext={"routing_constraints": {"preferred_taints": {"pool=slow": 5.0}}}
    )
    assert status == 200  # Dynamo takes the weight
    asked = ("route", "explain", "--model", "lab-model", "--prefer", "pool=slow=5", "-o", "json")
    explained = json.loads(plane.ctl(*asked).stdout)
    assert explained["chosen"] is None
    assert "one of these 3 workers" in explained["summary"]
    assert "Dynamo's rule" in explained["summary"] and "dynamod's guess" in explained["summary"]
    assert all(c["eligible"] for c in explained["candidates"])


def test_64_concurrent_adds_through_dynamod_are_all_kept(plane: Plane) -> None:
    lora = plane.id("lora")
    wanted = [f"batch={i}" for i in range(64)]

    async def add_all() -> None:
        async with AsyncClient(f"unix://{plane.socket}", timeout=60) as client:
            await asyncio.gather(*(client.add_taints(lora, [t]) for t in wanted))

    asyncio.run(add_all())
    assert sorted(plane.worker("lora")["caller_taints"]) == sorted(wanted)
    (card,) = [c for k, c in plane.fleet.records("v1/mdc/").items() if k.endswith(lora)]
    assert sorted(card["card_json"]["runtime_config"]["taints"]) == sorted(wanted)
    plane.routes(["batch=0", "batch=63"], "lora")
    plane.ctl("taints", "clear", lora)


def test_a_reserved_taint_is_refused_before_anything_is_sent(plane: Plane) -> None:
    zoned = plane.id("zoned")
    before = plane.worker("zoned")["revision"]
    refused = plane.ctl("taints", "add", zoned, "dynamo.topology/zone=x", ok=False)
    assert refused.returncode == 1
    assert "uses reserved prefix 'dynamo.topology/'" in refused.stderr
    assert plane.worker("zoned")["revision"] == before


def test_a_worker_without_the_route_gets_a_clear_error(plane: Plane) -> None:
    refused = plane.ctl("taints", "add", plane.id("stock"), "pool=fast", ok=False)
    assert refused.returncode == 1
    assert "has no taint route" in refused.stderr and "answered 404" in refused.stderr
    assert plane.worker("stock")["taints"] == []


def test_a_hand_set_cordon_is_shown_as_not_honoured_and_uncordon_removes_it(
    plane: Plane,
) -> None:
    """``workers cordon`` is refused (Dynamo's router would not honour it); a cordon set by
    hand through the worker's own route is shown as not honoured, with a warning, while
    Dynamo's frontend goes on routing to the worker; ``uncordon`` removes it."""
    zoned = plane.id("zoned")
    refused = plane.ctl("workers", "cordon", zoned, ok=False)
    assert refused.returncode == 1 and "does not carry over" in refused.stderr
    route = plane.fleet.workers["zoned"].system + "/engine/update/model_taints"
    assert post_json(route, {"taints": [CORDONED, "pool=slow"]})[0] == 200
    until(lambda: CORDONED in plane.worker("zoned")["taints"] or None,
          "dynamod to show the hand-set cordon", [], ROUTED_WITHIN)  # fmt: skip
    got = plane.ctl("workers", "get", zoned, "-o", "json")
    assert json.loads(got.stdout)["state"] == "ready,cordon-not-honoured"
    assert "does not honour" in got.stderr and f"uncordon {zoned}" in got.stderr
    assert plane.workers()[zoned]["state"] == "ready,cordon-not-honoured"
    plane.routes(["pool=slow"], "zoned")  # Dynamo routes to it, cordon or not
    plane.ctl("workers", "uncordon", zoned)
    after = plane.worker("zoned")
    assert (after["state"], after["caller_taints"]) == ("ready", ["pool=slow"])
    (card,) = [c for k, c in plane.fleet.records("v1/mdc/").items() if k.endswith(zoned)]
    assert CORDONED not in card["card_json"]["runtime_config"]["taints"]


def test_a_pool_policy_keeps_dynamo_workers_in_their_pools_through_their_routes(
    plane: Plane, tmp_path: Path
) -> None:
    """Pools work on a Dynamo fleet through the same write path as any taint change (each
    worker's own route), with the policy kept in dynamod's own ``state_store``."""
    zoned, lora, stock = plane.id("zoned"), plane.id("lora"), plane.id("stock")
    policy = tmp_path / "split.yaml"
    policy.write_text(
        f"name: dyn-split\nselector: model=lab-model,id!={stock}\n"
        "pools:\n  pool=fast: 1\n  pool=slow: 1\n"
    )
    plane.ctl("pools", "apply", "-f", str(policy))
    try:

        def split() -> dict[str, str] | None:
            listed = plane.workers()
            held = {w: {t for t in listed[w]["caller_taints"] if t.startswith("pool=")}
                    for w in (zoned, lora)}  # fmt: skip
            pools = sorted(p for taints in held.values() for p in taints)
            return (
                {w: next(iter(t)) for w, t in held.items()}
                if pools == ["pool=fast", "pool=slow"]
                else None
            )

        held = until(split, "the policy's pools on the two routed workers", [], ROUTED_WITHIN)
        fast = "zoned" if held[zoned] == "pool=fast" else "lora"
        plane.routes(["pool=fast"], fast)  # Dynamo's own frontend routes by the pools
    finally:
        said = plane.ctl("pools", "rm", "dyn-split").stdout
        assert "taints" in said  # it says the taints stay as they are
        plane.ctl("taints", "set", zoned, "pool=slow")  # as the fleet started
        plane.ctl("taints", "clear", lora)


def test_dynamods_front_sends_requests_to_dynamos_frontend(plane: Plane) -> None:
    status, answer = post_json(plane.daemon.field("http") + "/v1/completions",
                           {"model": "lab-model", "prompt": "hi", "max_tokens": 1})  # fmt: skip
    assert status == 501 and "Dynamo's frontend" in answer["error"]["message"]


def test_a_killed_worker_is_unreachable_at_once_leaves_within_its_ttl_and_tail_shows_it(
    plane: Plane,
) -> None:
    """Added, its taints updated, SIGKILLed: shown not ready (unreachable: its port
    refuses connection) within 5 s, while its record is still there; removed from the
    listing within its lease's TTL on etcd (``ETCD_LEASE_TTL``, honoured by Dynamo),
    within Dynamo's 10 s mtime rule (plus one scan) on the file store."""
    etcd = plane.fleet.etcd is not None
    ttl = LEASE_TTL if etcd else EXPIRY + TICK
    tail = subprocess.Popen(
        dynamoctl("--endpoint", f"unix://{plane.socket}", "events", "tail", "-o", "json"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    try:
        assert json.loads(_line(tail))["event"] == "RESYNC"
        spec = WorkerSpec("victim", env=(("ETCD_LEASE_TTL", str(LEASE_TTL)),))
        victim = plane.fleet.start_worker(spec)
        plane.fleet.wait_ready(victim)
        plane.ctl("taints", "add", victim.id, "pool=victim")
        plane.routes(["pool=victim"], "victim")
        assert plane.worker("victim")["state"] == "ready"
        unready, state, removed = asyncio.run(_after_kill(plane, victim.id))
        assert unready <= UNREADY_WITHIN, f"shown ready {unready:.1f} s after SIGKILL"
        assert str(state) == "unreachable", f"shown {state} after SIGKILL"
        assert removed <= ttl + SLACK, f"left the listing {removed:.1f} s after SIGKILL"
        assert victim.id not in plane.workers()
    finally:
        tail.send_signal(signal.SIGINT)  # Ctrl-C ends a tail: exit 0
        tail.wait(30)
        assert tail.stdout is not None and tail.stderr is not None
        rest = tail.stdout.read()  # what readline buffered, and the rest: the process ended
        tail.stdout.close()
        tail.stderr.close()
    seen = [json.loads(line) for line in rest.splitlines()]
    mine = [(e["event"], e.get("added")) for e in seen if e["worker"] == victim.id]
    assert mine == [("ADDED", None), ("TAINTS", ["pool=victim"]), ("REMOVED", None)]
    assert tail.returncode == 0


async def _after_kill(plane: Plane, victim: str) -> tuple[float, WorkerState | str, float]:
    """SIGKILL the worker; seconds until dynamod shows it other than ready, that state,
    and seconds until its events say it is removed."""
    async with AsyncClient(f"unix://{plane.socket}", timeout=60) as client:
        events = client.tail_events()
        await anext(events)  # the snapshot: the stream is established
        plane.fleet.kill(plane.fleet.workers["victim"])
        killed = time.monotonic()

        async def unready() -> tuple[float, WorkerState | str]:
            async with asyncio.timeout(60):
                while True:
                    try:
                        shown: WorkerState | str | None = (await client.get_worker(victim)).state
                    except WorkerNotFoundError:
                        shown = "gone"
                    if str(shown) != "ready":
                        return time.monotonic() - killed, shown or "none"
                    await asyncio.sleep(0.05)

        async def removed() -> float:
            async with asyncio.timeout(60):
                async for event in events:
                    if event.kind == "REMOVED" and event.worker and event.worker.id == victim:
                        return time.monotonic() - killed
            raise AssertionError("the events stream ended")

        (seconds, state), gone = await asyncio.gather(unready(), removed())
        return seconds, state, gone


def _line(proc: subprocess.Popen[str], within: float = 60.0) -> str:
    """The first line (select sees the pipe, not what readline buffers: once only)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], within)
    assert ready, "dynamoctl events tail printed nothing"
    line = proc.stdout.readline()
    assert line, f"dynamoctl events tail ended: {proc.stderr.read() if proc.stderr else ''}"
    return line
