"""dynamod as a real process: systemd notifications, the drain, exit cleanliness, access
control over TCP, and two replicas on one etcd."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from dynamod.client import AsyncClient, Credentials
from dynamod.errors import PermissionDeniedError, UnauthenticatedError, UnreachableError
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.support.processes import daemon, running, worker
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(180)


class NotifySocket:
    """A test-owned datagram socket standing in for systemd's $NOTIFY_SOCKET."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.messages: list[str] = []

    async def until(self, wanted: str, within: float = 20.0) -> list[str]:
        """Collect datagrams until one contains ``wanted``; return everything so far."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(within):
            while not any(wanted in m for m in self.messages):
                data = await loop.sock_recv(self.sock, 4096)
                self.messages.append(data.decode())
        return self.messages

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def sock_path(tmp_path: Path, name: str = "d.sock") -> Path:
    return tmp_path / name


async def test_ready_only_after_the_first_snapshot_then_stopping(
    shared_store_url: str, tmp_path: Path, notify: NotifySocket
) -> None:
    async with running(worker(shared_store_url)):
        proc = daemon(shared_store_url, sock_path(tmp_path), NOTIFY_SOCKET=str(notify.path))
        async with running(proc):
            messages = await notify.until("READY=1")
            ready = next(i for i, m in enumerate(messages) if "READY=1" in m)
            assert any("first snapshot" in m for m in messages[:ready])
            assert "STATUS=serving 1 workers" in messages[ready]
            assert "workers=1" in proc.ready_line
            proc.send(signal.SIGTERM)
            await notify.until("STOPPING=1")
            assert await proc.wait() == 0
    proc.assert_clean_stderr()


async def test_watchdog_pings_and_reload(
    shared_store_url: str, tmp_path: Path, notify: NotifySocket
) -> None:
    proc = daemon(
        shared_store_url,
        sock_path(tmp_path),
        NOTIFY_SOCKET=str(notify.path),
        WATCHDOG_USEC="400000",
    )
    async with running(proc):
        await notify.until("READY=1")
        before = len(notify.messages)
        await notify.until("WATCHDOG=1")
        pings = [m for m in notify.messages[before:] if m == "WATCHDOG=1"]
        assert pings
        proc.send(signal.SIGHUP)
        messages = await notify.until("STATUS=reloaded")
        reloading = max(i for i, m in enumerate(messages) if "RELOADING=1" in m)
        assert "MONOTONIC_USEC=" in messages[reloading]
        assert any("READY=1" in m for m in messages[reloading + 1 :])
        assert await proc.stop() == 0
    assert "reloaded: log level info" in proc.stderr
    proc.assert_clean_stderr()


async def stream_through(
    http: aiohttp.ClientSession, front: str, tokens: int
) -> aiohttp.ClientResponse:
    body = {"model": "llama", "prompt": "a long story", "max_tokens": tokens, "stream": True}
    response = await http.post(front + "/v1/completions", json=body)
    assert response.status == 200
    await response.content.readline()
    return response


async def cut_ending(response: aiohttp.ClientResponse) -> dict[str, str]:
    """The error a stream cut by the daemon ends with: the event before its ``[DONE]``."""
    try:
        events = [e.strip() for e in (await response.text()).split("\n\n") if e.strip()]
    finally:
        response.release()
    assert events[-1] == "data: [DONE]", events[-3:]
    error: dict[str, str] = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "shutting_down", error
    return error


async def test_drain_finishes_a_stream_within_grace(
    shared_store_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running(worker(shared_store_url, "--speedup-ratio", "1")):
        proc = daemon(shared_store_url, sock_path(tmp_path), "--grace", "30")
        async with running(proc):
            response = await stream_through(http, proc.field("http"), 200)
            proc.send(signal.SIGTERM)
            body = await response.text()
            response.release()
            assert body.rstrip().endswith("data: [DONE]")
            assert await proc.wait() == 0
    proc.assert_clean_stderr()


async def test_drain_past_grace_exits_70_and_a_second_signal_is_immediate(
    shared_store_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running(worker(shared_store_url, "--speedup-ratio", "1")):
        proc = daemon(shared_store_url, sock_path(tmp_path), "--grace", "0.5")
        async with running(proc):
            response = await stream_through(http, proc.field("http"), 5000)
            proc.send(signal.SIGTERM)
            ending = await cut_ending(response)
            assert "the daemon's grace period of 0.5 s ended" in ending["message"]
            assert await proc.wait() == 70
        proc.assert_clean_stderr()
        second = daemon(shared_store_url, sock_path(tmp_path, "e.sock"), "--grace", "60")
        async with running(second):
            response = await stream_through(http, second.field("http"), 5000)
            second.send(signal.SIGTERM)
            await second.logged("SIGTERM received")
            second.send(signal.SIGINT)
            ending = await cut_ending(response)
            assert "the daemon was told to stop at once" in ending["message"]
            assert await second.wait(within=10) == 70
        assert "skipping the grace period" in second.stderr
        second.assert_clean_stderr()


def write_tokens(path: Path) -> Path:
    path.write_text(
        """
[[token]]
name = "admin"
secret = "admin-secret-1"
role = "write"

[[token]]
name = "viewer"
secret = "viewer-secret-1"
role = "read"

[[token]]
name = "scaler"
secret = "scaler-secret-1"
role = "write"
prefixes = ["capacity/"]
"""
    )
    return path


async def test_access_control_over_tcp(shared_store_url: str, tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens.toml")
    port = free_port()
    proc = daemon(
        shared_store_url,
        sock_path(tmp_path),
        "--listen", f"127.0.0.1:{port}",
        "--tokens-file", str(tokens),
    )  # fmt: skip
    async with running(worker(shared_store_url, "--taint", "pool=a")) as w, running(proc):
        wid = w.field("id")
        endpoint = f"127.0.0.1:{port}"
        async with AsyncClient(endpoint) as anonymous:
            with pytest.raises(UnauthenticatedError, match="a bearer token is required on TCP"):
                await anonymous.update_taints(TaintUpdate.add(["capacity/x"]), Target(worker=wid))
            with pytest.raises(UnauthenticatedError):
                await anonymous.list_workers()
        async with AsyncClient(endpoint, credentials=Credentials(token="nope-nope")) as wrong:
            with pytest.raises(UnauthenticatedError, match="not valid"):
                await wrong.list_workers()
        async with AsyncClient(
            endpoint, credentials=Credentials(token="viewer-secret-1")
        ) as viewer:
            assert len((await viewer.list_workers())[0]) == 1
            with pytest.raises(PermissionDeniedError, match="'viewer' has read-only access"):
                await viewer.update_taints(TaintUpdate.add(["capacity/x"]), Target(worker=wid))
        async with AsyncClient(
            endpoint, credentials=Credentials(token="scaler-secret-1")
        ) as scaler:
            (change,) = await scaler.update_taints(
                TaintUpdate.add(["capacity/x"]), Target(worker=wid)
            )
            assert "capacity/x" in change.after
            with pytest.raises(PermissionDeniedError, match="'pool=a' is outside them"):
                await scaler.update_taints(TaintUpdate.replace(["capacity/y"]), Target(worker=wid))
        async with AsyncClient(endpoint, credentials=Credentials(token="admin-secret-1")) as admin:
            (change,) = await admin.update_taints(
                TaintUpdate.replace(["capacity/y"]), Target(worker=wid)
            )
            assert change.after == ("capacity/y",)
        assert await proc.stop() == 0
    lines = [json.loads(x) for x in (tmp_path / "audit.log").read_text().splitlines()]
    # refused attempts are audited too: who (as far as known), what, why
    assert lines[0]["caller"].startswith("unauthenticated ipv4:127.0.0.1:")
    assert [(x["caller"], x["outcome"]) for x in lines[1:]] == [
        ("viewer", "PermissionDeniedError"),
        ("scaler", "ok"),
        ("scaler", "PermissionDeniedError"),
        ("admin", "ok"),
    ]
    assert lines[0]["outcome"] == "UnauthenticatedError"
    assert (lines[0]["action"], lines[0]["taints"], lines[0]["target"]) == (
        "add",
        ["capacity/x"],
        wid,
    )


async def test_tcp_listener_without_credentials_is_a_config_error(tmp_path: Path) -> None:
    proc = daemon("memory://", sock_path(tmp_path), "--listen", "127.0.0.1:0")
    with pytest.raises(AssertionError, match="exited 78 before ready"):
        await proc.start()
    assert "is TCP: set tokens_file or tls_client_ca" in proc.stderr


async def test_unreachable_daemon_names_the_endpoint(tmp_path: Path) -> None:
    async with AsyncClient(f"unix://{tmp_path}/none.sock") as client:
        with pytest.raises(
            UnreachableError, match=f"cannot reach dynamod at unix://{tmp_path}/none.sock"
        ):
            await client.status()


async def test_two_replicas_on_one_etcd_both_see_a_taint_change_and_route_by_it(
    etcd_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    socks = [sock_path(tmp_path, "a.sock"), sock_path(tmp_path, "b.sock")]
    replicas = [daemon(etcd_url, s) for s in socks]
    body = {
        "model": "llama",
        "prompt": "hi",
        "max_tokens": 2,
        "nvext": {"routing_constraints": {"required_taints": ["capacity/fast"]}},
    }
    async with (
        running(worker(etcd_url, "--taint", "capacity/slow")) as w,
        running(replicas[0]),
        running(replicas[1]),
    ):
        async with AsyncClient(f"unix://{socks[0]}") as client:
            await client.update_taints(
                TaintUpdate.replace(["capacity/fast"]), Target(worker=w.field("id"))
            )
        for replica, sock in zip(replicas, socks, strict=True):
            async with AsyncClient(f"unix://{sock}") as client, asyncio.timeout(10):
                await _wait_taint(client, w.field("id"), "capacity/fast")
            async with http.post(replica.field("http") + "/v1/completions", json=body) as r:
                assert r.status == 200
                assert r.headers["x-dynamo-worker-id"] == w.field("id")


async def _wait_taint(client: AsyncClient, worker_id: str, taint: str) -> None:
    async for event in client.tail_events():
        workers = (
            event.workers if event.kind == "RESYNC" else (event.worker,) if event.worker else ()
        )
        if any(x.id == worker_id and taint in x.record.taints for x in workers):
            return


EXIT_CYCLES = {"file": 200, "etcd": 25, "nats": 25}


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_exit_is_clean_over_many_cycles(shared_store_url: str, tmp_path: Path) -> None:
    """Start → an event stream open and a streaming request in flight → SIGTERM or SIGINT,
    many times: every exit is 0 and stderr has no traceback or asyncio complaint."""
    backend = shared_store_url.split(":", 1)[0]
    cycles = int(os.environ.get("DYNAMO_EXIT_CYCLES", EXIT_CYCLES[backend]))
    async with running(worker(shared_store_url)), aiohttp.ClientSession() as session:
        for cycle in range(cycles):
            sock = sock_path(tmp_path, f"c{cycle % 2}.sock")
            proc = daemon(shared_store_url, sock, "--grace", "5")
            await proc.start()
            async with AsyncClient(f"unix://{sock}") as client:
                events = client.tail_events()
                await anext(events)
                body = {"model": "llama", "prompt": "x", "max_tokens": 20, "stream": True}
                async with session.post(
                    proc.field("http") + "/v1/completions", json=body
                ) as response:
                    await response.content.readline()
                    proc.send(signal.SIGTERM if cycle % 3 else signal.SIGINT)
                    text = (await response.read()).decode()
                assert text.rstrip().endswith("data: [DONE]"), f"cycle {cycle}: {text!r}"
                async for _ in events:
                    pass
            code = await proc.wait()
            assert code == 0, f"cycle {cycle}: exit {code}\n{proc.stderr}"
            proc.assert_clean_stderr()
