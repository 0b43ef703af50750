"""Start-up and configuration under hostile or careless hands.

``dynamod check-config`` refuses what a start would refuse, with the same line and exit
code (78 for a configuration error; 69 for a listener that cannot be bound now: both bind
and release every listener alike); a second daemon on a taken socket or port says so in
one line and exits 69, leaves no socket file and does not disturb the first; an audit
log that cannot be written does not turn a committed change into an error; credential
files a token cannot come from are refused with a message naming them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket as sockets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynamod.lifecycle import EX_UNAVAILABLE
from tests.support.processes import BIN, Proc, daemon, dynamoctl, env, running, worker
from tests.support.servers import free_port

EX_CONFIG = 78
EX_USAGE = 2


async def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    """``dynamoctl ARGS``, run off the event loop (the daemons under test share it)."""
    run = subprocess.run
    return await asyncio.to_thread(
        run, dynamoctl(*args), capture_output=True, text=True, env=env(), timeout=60
    )


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line]


def check_config(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "dynamod"), *args, "check-config"]
    return subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=60)


@pytest.fixture
def good(tmp_path: Path) -> list[str]:
    return [
        "--store", (tmp_path / "store").as_uri(),
        "--listen", f"unix://{tmp_path}/d.sock",
        "--http", "127.0.0.1:0",
        "--audit-log", str(tmp_path / "audit.log"),
    ]  # fmt: skip


def start(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "dynamod"), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=60)


def test_check_config_accepts_a_good_configuration(good: list[str]) -> None:
    result = check_config(*good)
    assert result.returncode == 0, result.stderr
    assert "configuration OK" in result.stderr


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--store", "zookeeper://h/x"], "unknown scheme 'zookeeper'"),
        (["--store", "etcd://127.0.0.1:2379/p?ca={tmp}/missing.pem"], "missing.pem"),
        (["--store", "nats://127.0.0.1:4222/b?user=u&password_file={tmp}/none"], "none"),
        (["--tokens-file", "{tmp}/missing.toml"], "missing.toml' cannot be read"),
        (["--tokens-file", "{tmp}/bad.toml"], "is not valid TOML"),
        (["--tokens-file", "{tmp}/weak.toml"], "needs a secret of at least 8 characters"),
        (["--tokens-file", "{tmp}/spaced.toml"], "a bearer token is visible ASCII"),
        (["--tls-cert", "{tmp}/junk.pem", "--tls-key", "{tmp}/junk.pem"], "TLS files cannot"),
        (["--audit-log", "{tmp}/adir"], "is a directory"),
    ],
)
def test_check_config_refuses_what_a_start_would_refuse(
    good: list[str], tmp_path: Path, extra: list[str], said: str
) -> None:
    (tmp_path / "bad.toml").write_text("[[token]\n")
    (tmp_path / "weak.toml").write_text('[[token]]\nname = "a"\nsecret = "short"\n')
    (tmp_path / "spaced.toml").write_text('[[token]]\nname = "a"\nsecret = "has a space"\n')
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    (tmp_path / "adir").mkdir()
    args = [*good, *(a.format(tmp=tmp_path) for a in extra)]
    checked = check_config(*args)
    assert checked.returncode == EX_CONFIG
    assert said in checked.stderr
    assert len(checked.stderr.strip().splitlines()) == 1, checked.stderr
    started = start(*args)
    assert (started.returncode, started.stderr) == (checked.returncode, checked.stderr)


TOKENS = '[[token]]\nname = "ops"\nsecret = "ops-secret-1"\nrole = "write"\n'
NOT_THIS_HOST = "192.0.2.1"  # TEST-NET-1 (RFC 5737): no machine has it


@contextlib.contextmanager
def taken(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A TCP port and a unix socket with a process (this one) listening on them, and the
    names the cases below use: ``{tmp}``, ``{port}`` (free), ``{busy}``, ``{live}``."""
    with (
        sockets.create_server(("127.0.0.1", 0)) as tcp,
        sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as unix,
    ):
        unix.bind(str(tmp_path / "live.sock"))
        unix.listen()
        yield {
            "tmp": str(tmp_path),
            "port": str(free_port()),
            "busy": str(tcp.getsockname()[1]),
            "live": str(tmp_path / "live.sock"),
        }


@pytest.mark.parametrize(
    ("extra", "code", "said"),
    [
        (["--listen", "unix://{tmp}/" + "s" * 110 + ".sock"], EX_CONFIG,
         "a unix socket path holds at most 107"),
        (["--listen", "unix://{tmp}/d.sock"], EX_CONFIG, "are the same listener"),
        (["--listen", "unix://{tmp}//d.sock"], EX_CONFIG, "are the same listener"),
        (["--listen", "127.0.0.1:{port}", "--http", "127.0.0.1:{port}"], EX_CONFIG,
         "are the same listener"),
        (["--listen", "127.0.0.1:{port}", "--http", "0.0.0.0:{port}"], EX_CONFIG,
         "are the same listener"),
        (["--listen", "unix://{tmp}/afile/d.sock"], EX_CONFIG, "is not a directory"),
        (["--listen", "unix://{tmp}/afile"], EX_CONFIG, "names a file that is not a socket"),
        (["--replica-id", "a\nb"], EX_CONFIG, "replica_id 'a\\nb' holds '\\n'"),
        (["--replica-id", "a b"], EX_CONFIG, "holds ' '; a replica id is 1 to 256 printable"),
        (["--http", f"{NOT_THIS_HOST}:8080"], EX_UNAVAILABLE,
         f"cannot listen on http {NOT_THIS_HOST}:8080: Cannot assign requested address"),
        (["--listen", f"{NOT_THIS_HOST}:50051"], EX_UNAVAILABLE,
         f"cannot listen on gRPC {NOT_THIS_HOST}:50051: Cannot assign requested address"),
        (["--http", "127.0.0.1:{busy}"], EX_UNAVAILABLE,
         "cannot listen on http 127.0.0.1:{busy}: Address already in use"),
        (["--listen", "127.0.0.1:{busy}"], EX_UNAVAILABLE,
         "cannot listen on gRPC 127.0.0.1:{busy}: Address already in use"),
        (["--listen", "unix://{live}"], EX_UNAVAILABLE,
         "cannot listen on unix://{live}: another process is listening there"),
    ],
)  # fmt: skip
def test_check_config_and_a_start_run_the_same_listener_checks(
    good: list[str], tmp_path: Path, extra: list[str], code: int, said: str
) -> None:
    """Listeners a start cannot take: check-config refuses each with the very line and
    exit code of the start (which never gets as far as a traceback), and touches nothing
    (a file in the socket's place stays)."""
    (tmp_path / "tokens.toml").write_text(TOKENS)
    (tmp_path / "afile").write_text("not a socket\n")
    with taken(tmp_path) as names:
        args = [*good, "--tokens-file", str(tmp_path / "tokens.toml")]
        args += [a.format(**names) for a in extra]
        checked = check_config(*args)
        started = start(*args)
    assert checked.returncode == code, checked.stderr
    (line,) = checked.stderr.strip().splitlines()
    assert said.format(**names) in line
    assert (started.returncode, started.stderr) == (checked.returncode, checked.stderr)
    assert (tmp_path / "afile").read_text() == "not a socket\n"


async def test_a_taken_socket_or_port_is_one_line_and_disturbs_nobody(tmp_path: Path) -> None:
    store = (tmp_path / "store").as_uri()
    first_socket = tmp_path / "first.sock"
    http_port = free_port()
    first = daemon(store, first_socket, "--http", f"127.0.0.1:{http_port}")
    async with running(first):
        cases = [
            (tmp_path / "second.sock", ["--http", f"127.0.0.1:{http_port}"], f"{http_port}"),
            (first_socket, ["--http", "127.0.0.1:0"], "another process is listening there"),
        ]
        for socket, args, said in cases:
            second = Proc(
                [str(BIN / "dynamod"), "--store", store, "--listen", f"unix://{socket}", *args],
                r"^dynamod ready:",
            )
            with pytest.raises(AssertionError):  # it never becomes ready
                await second.start(within=20)
            assert await second.wait() == EX_UNAVAILABLE
            assert said in second.stderr
            assert "Traceback" not in second.stderr
            assert len(second.stderr.strip().splitlines()) == 1, second.stderr
            assert socket == first_socket or not socket.exists(), "no socket file left behind"
        status = await ctl("--endpoint", f"unix://{first_socket}", "status", "-o", "json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["state"] == "serving"


async def test_a_worker_on_a_taken_port_says_so_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    store = (tmp_path / "store").as_uri()
    async with running(worker(store, "--port", str(port))):
        second = worker(store, "--port", str(port))
        with pytest.raises(AssertionError):
            await second.start(within=20)
        assert await second.wait() == EX_UNAVAILABLE
        assert f"cannot listen on inference http 127.0.0.1:{port}" in second.stderr
        assert "Traceback" not in second.stderr


async def test_an_unwritable_audit_log_does_not_fail_a_committed_change(tmp_path: Path) -> None:
    """/dev/full takes the open and refuses every write (ENOSPC), as a full disk would."""
    store = (tmp_path / "store").as_uri()
    socket = tmp_path / "d.sock"
    async with (
        running(worker(store, "--taint", "pool=a")) as w,
        running(daemon(store, socket, "--audit-log", "/dev/full")),
    ):
        endpoint = f"unix://{socket}"
        changed = await ctl(
            "--endpoint", endpoint, "taints", "add", w.field("id"), "b", "-o", "json"
        )
        assert changed.returncode == 0, changed.stderr
        assert "b" in json.loads(changed.stdout)[0]["after"]


@pytest.mark.parametrize(
    ("content", "said"),
    [(b"", "is empty"), (b"t\xc3\xb6ken\n", "character 'ö'"), (b"two words", "character ' '")],
)
def test_dynamoctl_refuses_a_token_file_no_token_can_come_from(
    tmp_path: Path, content: bytes, said: str
) -> None:
    (tmp_path / "token").write_bytes(content)
    result = subprocess.run(
        dynamoctl("--token-file", str(tmp_path / "token"), "--endpoint", "127.0.0.1:9", "status"),
        capture_output=True, text=True, env=env(), timeout=60,
    )  # fmt: skip
    assert result.returncode == EX_USAGE
    assert said in result.stderr and "--token-file" in result.stderr
    assert "internal error" not in result.stderr
