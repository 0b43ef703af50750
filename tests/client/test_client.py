"""The public Python client against a real dynamod and a real worker: the README's example
runs as written, the Dynamo-style helpers return the complete taint set, errors are ours,
and the endpoint comes from where dynamoctl finds it (DYNAMO_ENDPOINT, the config file).

Blocking ``Client`` code runs the way a user runs it: as a script in its own process."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamod.client import AsyncClient, Credentials
from dynamod.errors import TaintError, WorkerNotFoundError
from tests.support.processes import BAD_STDERR, ROOT, Proc, daemon, env, running, worker

pytestmark = pytest.mark.timeout(120)

TOPOLOGY = "dynamo.topology/zone=a"


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python client") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md has no python example under 'Python client'"
    return match.group(1)


async def run_script(source: str, tmp_path: Path, **extra: str) -> tuple[int, str, str]:
    """Run ``source`` as a script in a fresh Python process with ``extra`` environment."""
    script = tmp_path / "script.py"
    script.write_text(source)
    environ = {k: v for k, v in env().items() if not k.startswith("DYNAMO")}
    environ.update({"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / ".config")})
    environ.update(extra)
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=environ,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def clean(err: str) -> None:
    for bad in BAD_STDERR:
        assert bad not in err, err


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[Proc, Path]]:
    """A worker tainted capacity/fast in zone a, and a dynamod that sees it."""
    store = (tmp_path / "store").as_uri()
    socket = tmp_path / "dynamod.sock"
    async with (
        running(worker(store, "--taint", "capacity/fast", "--topology", "zone=a")) as proc,
        running(daemon(store, socket)),
    ):
        await seen_by_daemon(socket)
        yield proc, socket


async def seen_by_daemon(socket: Path) -> None:
    """Wait until dynamod's view holds a worker (its event stream says so)."""
    async with AsyncClient(f"unix://{socket}", credentials=Credentials()) as client:
        async with asyncio.timeout(30):
            async for event in client.events():
                if event.workers or event.kind == "ADDED":
                    return


async def test_the_readme_example_runs_as_written(fleet: tuple[Proc, Path], tmp_path: Path) -> None:
    proc, socket = fleet
    code, out, err = await run_script(
        readme_example(), tmp_path, DYNAMO_ENDPOINT=f"unix://{socket}"
    )
    assert code == 0, err
    clean(err)
    wid = proc.field("id")
    assert out.splitlines() == [
        f"{wid} llama ('capacity/fast', '{TOPOLOGY}')",
        f"('capacity/slow', '{TOPOLOGY}', 'pool=batch')",
        f"('capacity/slow', '{TOPOLOGY}', 'gpu:h100', 'pool=batch')",
        f"('capacity/slow', '{TOPOLOGY}', 'gpu:h100')",
        f"RESYNC ['{wid}']",
    ]


BLOCKING = """
import json, sys
from dynamod.client import Client
from dynamod.errors import TaintError, WorkerNotFoundError

out = {}
with Client() as client:
    (worker,) = client.workers()
    out["worker"] = [worker.id, worker.model, list(worker.taints),
                     list(worker.caller_taints), list(worker.generated_taints)]
    out["none"] = [w.id for w in client.workers("capacity/slow")]
    out["cleared"] = list(client.clear_taints(worker.id[:8]))
    out["replaced"] = list(client.update_model_taints(worker, ["Region/us=1", "gpu,h100"]))
    out["quoted"] = [w.id for w in client.workers('"gpu,h100"')]
    out["removed"] = list(client.remove_taints(worker, [], keys=["Region/us"]))
    events = client.events()
    first = next(events)
    client.add_taints(worker, ["pool=b"])
    change = next(events)
    events.close()
    out["events"] = [first.kind, change.kind, list(change.added), list(change.worker.taints)]
    try:
        client.add_taints(worker, ["dynamo.topology/zone=x"])
    except TaintError as exc:
        out["reserved"] = str(exc)
    try:
        client.worker("ffffffffffff")
    except WorkerNotFoundError as exc:
        out["missing"] = type(exc).__name__
try:
    client.workers()
except RuntimeError as exc:
    out["closed"] = str(exc)
print(json.dumps(out))
"""


async def test_blocking_client_helpers_show_the_complete_set(
    fleet: tuple[Proc, Path], tmp_path: Path
) -> None:
    proc, socket = fleet
    code, out, err = await run_script(BLOCKING, tmp_path, DYNAMO_ENDPOINT=f"unix://{socket}")
    assert code == 0, err
    clean(err)
    got = json.loads(out)
    wid = proc.field("id")
    assert got["worker"] == [
        wid, "llama", ["capacity/fast", TOPOLOGY], ["capacity/fast"], [TOPOLOGY]
    ]  # fmt: skip
    assert got["none"] == []
    assert got["cleared"] == [TOPOLOGY]  # cleared, yet the router still matches on zone a
    assert got["replaced"] == ["Region/us=1", TOPOLOGY, "gpu,h100"]
    assert got["quoted"] == [wid]
    assert got["removed"] == [TOPOLOGY, "gpu,h100"]
    assert got["events"] == ["RESYNC", "TAINTS", ["pool=b"], [TOPOLOGY, "gpu,h100", "pool=b"]]
    assert got["reserved"] == (
        "taint 'dynamo.topology/zone=x' uses reserved prefix 'dynamo.topology/'"
    )
    assert got["missing"] == "WorkerNotFoundError"
    assert got["closed"] == f"the client of unix://{socket} is closed"


async def test_the_endpoint_comes_from_dynamoctls_config_file(
    fleet: tuple[Proc, Path], tmp_path: Path
) -> None:
    proc, socket = fleet
    config = tmp_path / ".config" / "dynamoctl" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'endpoint = "unix://{socket}"\noutput = "wide"\ntimeout = 5\n')
    script = "from dynamod.client import Client\nwith Client() as c: print(c.workers()[0].id)\n"
    code, out, err = await run_script(script, tmp_path)
    assert (code, out.strip()) == (0, proc.field("id")), err
    config.write_text('endpoint = "unix:///nonexistent/d.sock"\n')  # the variable wins
    code, out, err = await run_script(script, tmp_path, DYNAMO_ENDPOINT=f"unix://{socket}")
    assert (code, out.strip()) == (0, proc.field("id")), err
    config.write_text('endpont = "x"\n')
    code, out, err = await run_script(script, tmp_path, DYNAMO_ENDPOINT=f"unix://{socket}")
    assert code == 1
    assert f"config file '{config}' has unknown key 'endpont'" in err


async def test_async_client_helpers(fleet: tuple[Proc, Path]) -> None:
    proc, socket = fleet
    async with AsyncClient(f"unix://{socket}", credentials=Credentials(), timeout=10) as client:
        (info,) = await client.workers(model="llama")
        assert (info.id, info.model, info.taints) == (
            proc.field("id"), "llama", ("capacity/fast", TOPOLOGY)
        )  # fmt: skip
        assert await client.update_model_taints(info, []) == (TOPOLOGY,)
        assert await client.add_taints(info, ["a", "b"]) == ("a", "b", TOPOLOGY)
        assert await client.remove_taints(info, ["a"]) == ("b", TOPOLOGY)
        stream = client.events(selector="b")
        assert (await anext(stream)).kind == "RESYNC"
        await client.clear_taints(info)
        event = await anext(stream)
        assert (event.kind, event.removed, event.worker and event.worker.taints) == (
            "TAINTS", ("b",), (TOPOLOGY,)
        )  # fmt: skip
        await stream.aclose()
        with pytest.raises(TaintError, match="has leading or trailing whitespace"):
            await client.add_taints(info, [" padded"])
        with pytest.raises(WorkerNotFoundError):
            await client.clear_taints("ffffffffffff")
    assert client.closed


FORGETFUL = {
    "blocking": """
import sys
from dynamod.client import Client
client = Client()
events = client.events()
print(next(events).kind, flush=True)
""",
    "async": """
import asyncio
from dynamod.client import AsyncClient

async def main():
    client = AsyncClient()
    first = asyncio.Event()

    async def follow():
        async for _ in client.events():
            first.set()

    globals()["follower"] = asyncio.create_task(follow())
    await first.wait()
    print("RESYNC", flush=True)

asyncio.run(main())
""",
}


@pytest.mark.parametrize("kind", sorted(FORGETFUL))
async def test_a_script_that_forgets_to_close_its_client_exits_cleanly(
    fleet: tuple[Proc, Path], tmp_path: Path, kind: str
) -> None:
    """The client's drain at exit closes it (bench/exit_drain.py measures the difference)."""
    _, socket = fleet
    code, out, err = await run_script(FORGETFUL[kind], tmp_path, DYNAMO_ENDPOINT=f"unix://{socket}")
    assert (code, out, err) == (0, "RESYNC\n", "")
