"""``workers ls`` and ``taints add`` run without typer (``dynamoctl.direct``) must do exactly
what the live CLI does: the same stdout, stderr and exit status, for a matrix of command
lines run both ways against a real dynamod with three mocker workers. The matrix holds
the lines ``direct`` runs itself (each case says so, and that is checked, so a case cannot
silently compare the live CLI with itself) and the ones it must leave to the live CLI:
usage errors, odd spellings, options it does not know, a config file it cannot vouch for.

``direct`` makes its calls with the light client (``dynamod.client.light``: our own HTTP/2,
no gRPC, no event loop), the live CLI with gRPC's: so the matrix compares the two clients
too, for answers, the daemon's errors and a daemon that is not there. That the light one
made the calls is checked (``loaded``), and so is a second daemon on TCP with TLS, client
certificates and tokens.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dynamoctl import direct
from tests.cli.conftest import Cli, Cluster, Result, assert_clean, start_cluster
from tests.support.pki import Pki, make_pki
from tests.support.ports import free_port
from tests.support.processes import ROOT, dynamoctl

pytestmark = pytest.mark.timeout(600)

LIVE = "import sys; from dynamoctl.main import live; sys.exit(live(sys.argv[1:]))"
# direct.run, then which of the heavy modules it loaded and its status, on stderr's last line.
LOADED = (
    "import os, sys; from dynamoctl import direct; code = direct.run(sys.argv[1:], os.environ); "
    "sys.stdout.flush(); heavy = [m for m in ('asyncio', 'grpc') if m in sys.modules]; "
    "print(' '.join(heavy) or '-', code, file=sys.stderr)"
)
GONE = "unix:///nonexistent/dynamod.sock"
AGE = re.compile(r"\S+$")  # AGE, the last column of worker tables: the one cell that moves
LOOP = re.compile(r"id\(loop\)=\d+")  # --debug: gRPC logs its event loop's address


@dataclass
class Fleet:
    cluster: Cluster
    a: str
    b: str
    c: str
    configs: dict[str, Path] = field(default_factory=dict)

    @property
    def cli(self) -> Cli:
        return self.cluster.cli


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("direct")
    cluster = start_cluster(root)
    try:
        a, b, c = cluster.start_workers(
            ("alpha", ["--taint", "pool=a"]), ("alpha", ["--taint", "pool=b"]), ("beta", [])
        )
        ids = [w.field("id") for w in (a, b, c)]
        cluster.seen(ids)
        found = Fleet(cluster, ids[0], ids[1], ids[2])
        # Every later "taints add ... keep/x" is then unchanged, and compares alike.
        found.cli.ok("taints", "add", "--all", "--yes", "keep/x")
        found.configs = _configs(root, cluster.cli.endpoint)
        yield found
    finally:
        cluster.stop()


def _configs(root: Path, endpoint: str) -> dict[str, Path]:
    texts = {
        "plain": f'endpoint = "{endpoint}"\noutput = "wide"\ntimeout = 7\nno_headers = true\n',
        "context": f'current_context = "here"\n[contexts.here]\nendpoint = "{endpoint}"\n',
        "text-timeout": 'timeout = "5"\n',
        "bad-output": 'output = "bogus"\n',
        "not-toml": "endpoint = \n",
        "unknown-key": "colour = true\n",
    }
    paths = {}
    for name, text in texts.items():
        paths[name] = root / f"{name}.toml"
        paths[name].write_text(text)
    return paths


def live(cli: Cli, args: list[str], extra: dict[str, str]) -> Result:
    """The same command line through the live CLI (typer), in the same environment."""
    done = subprocess.run(
        [sys.executable, "-c", LIVE, *args], input="", capture_output=True, text=True,
        env=cli.env(**extra), cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    return Result(done.returncode, done.stdout, done.stderr)


def comparable(result: Result) -> tuple[int, str, str]:
    """The result with the AGE cell of each worker table row (a line of many columns,
    with or without headers) made constant: a second may pass between the two runs."""
    lines = result.out.splitlines(keepends=True)
    out = "".join(AGE.sub("<age>", ln) if ln.count("   ") >= 5 else ln for ln in lines)
    return result.code, out, LOOP.sub("id(loop)=<id>", result.err)


# (arguments, extra environment, config file, whether direct runs it: None when that
# depends on the test's own terminal). "{a}" stands for a worker's id.
Case = tuple[list[str], dict[str, str], str | None, bool | None]
LS: list[Case] = [
    (["workers", "ls"], {}, None, True),
    (["workers", "ls", "-o", "json"], {}, None, True),
    (["-o", "yaml", "workers", "ls"], {}, None, True),
    (["workers", "ls", "-o", "name", "--no-headers"], {}, None, True),
    (["workers", "ls", "--output=wide"], {}, None, True),
    (["-o", "json", "workers", "ls", "-o", "name"], {}, None, True),
    (["workers", "ls", "--no-headers"], {}, None, True),
    (["workers", "ls", "-l", "pool=a"], {}, None, True),
    (["workers", "ls", "--selector", "model=alpha,!pool=b", "-o", "name"], {}, None, True),
    (["workers", "ls", "--model", "beta"], {}, None, True),
    (["workers", "ls", "--model", "nothing"], {}, None, True),
    (["workers", "ls", "-l", "pool=a,,"], {}, None, True),
    (["workers", "ls", "-o", "jsonpath={.items[*].id}"], {}, None, True),
    (["workers", "ls", "-o", "custom-columns=ID:.id,MODEL:.model"], {}, None, True),
    (["workers", "ls", "--sort-by", ".model", "-o", "name"], {}, None, True),
    (["--timeout", "5", "workers", "ls", "--debug"], {}, None, True),
    (["workers", "ls"], {"DYNAMO_TIMEOUT": "4.5"}, None, True),
    (["workers", "ls"], {"DYNAMO_TIMEOUT": ""}, None, True),
    (["workers", "ls"], {"DYNAMO_TLS": "0"}, None, True),
    (["workers", "ls"], {}, "plain", True),
    (["workers", "ls", "-o", "table"], {}, "plain", True),
    (["workers", "ls"], {}, "context", True),
    (["--endpoint", GONE, "workers", "ls"], {}, None, True),
    (["workers", "ls", "-e", GONE, "-o", "json"], {}, None, True),
    (["--token-file", "/nonexistent/token", "workers", "ls"], {}, None, True),
    (["--cert", "/nonexistent/cert", "workers", "ls"], {}, None, True),
    # Left to the live CLI.
    (["workers", "ls", "-ojson"], {}, None, False),
    (["workers", "ls", "-o", "bogus"], {}, None, False),
    (["workers", "ls", "-o", "jsonpath={.items["], {}, None, False),
    (["workers", "ls", "-o"], {}, None, False),
    (["workers", "ls", "-o", "--no-headers"], {}, None, False),
    (["workers", "ls", "--sort-by", "{.a"], {}, None, False),
    (["workers", "ls", "extra"], {}, None, False),
    (["workers", "ls", "--timeout", "0"], {}, None, False),
    (["workers", "ls", "--watch=1"], {}, None, False),
    (["workers", "ls", "--mod", "beta"], {}, None, False),
    (["workers", "ls", "--help", "-o", "json"], {}, None, False),
    (["workers", "ls", "--"], {}, None, False),
    (["workers", "-o", "json", "ls"], {}, None, False),
    (["--version", "workers", "ls"], {}, None, False),
    (["--context", "nowhere", "workers", "ls"], {}, None, False),
    (["workers", "ls"], {"DYNAMO_TIMEOUT": "soon"}, None, False),
    (["workers", "ls"], {"DYNAMO_TLS": "maybe"}, None, False),
    (["workers", "ls"], {}, "text-timeout", False),
    (["workers", "ls"], {}, "bad-output", False),
    (["workers", "ls"], {}, "not-toml", False),
    (["workers", "ls"], {}, "unknown-key", False),
]
TAINTS_ADD: list[Case] = [
    (["taints", "add", "{a}", "keep/x"], {}, None, True),
    (["taints", "add", "{a}", "keep/x", "-o", "json"], {}, None, True),
    (["-o", "wide", "taints", "add", "{b}", "keep/x", "-y"], {}, None, True),
    (["taints", "add", "{a}", "new/y", "--dry-run"], {}, None, True),
    (["taints", "add", "-l", "pool=a", "keep/x"], {}, None, True),
    (["taints", "add", "-l", "pool=a", "new/y", "--dry-run", "-o", "yaml"], {}, None, True),
    (["taints", "add", "{a}", "-l", "pool=a", "new/y", "--dry-run"], {}, None, True),
    (["taints", "add", "--all", "--yes", "keep/x"], {}, None, True),
    (["taints", "add", "--all", "new/z", "--dry-run"], {}, None, True),
    (["taints", "add", "-l", "pool=nowhere", "keep/x"], {}, None, True),
    (["taints", "add", "-l", "!!", "keep/x"], {}, None, True),
    (["taints", "add", "{a}", "dynamo.topology/zone=x"], {}, None, True),
    (["taints", "add", "{a}", " padded"], {}, None, True),
    (["taints", "add", "{a}", ""], {}, None, True),
    (["taints", "add", "nosuchworker", "keep/x"], {}, None, True),
    (["taints", "add", "{a}", "keep/x", "--if-revision", "1"], {}, None, True),
    (["taints", "add", "{a}", "keep/x", "--if-revision=1", "-o", "json"], {}, None, True),
    (["-e", GONE, "taints", "add", "{a}", "keep/x"], {}, None, True),
    (["taints", "add", "{a}", "keep/x"], {}, "plain", True),
    # Left to the live CLI.
    (["taints", "add"], {}, None, False),
    (["taints", "add", "{a}"], {}, None, False),
    (["taints", "add", "-l", "pool=a"], {}, None, False),
    (["taints", "add", "{a}", "keep/x", "--if-revision", "0"], {}, None, False),
    (["taints", "add", "{a}", "keep/x", "--if-revision", "-1"], {}, None, False),
    (["taints", "add", "{a}", "keep/x", "--if-revision", "two"], {}, None, False),
    (["taints", "add", "-l", "pool=a", "keep/x", "--if-revision", "3"], {}, None, False),
    (["taints", "add", "-l", "pool=a", "--all", "keep/x"], {}, None, False),
    (["taints", "add", "--all", "keep/x"], {}, None, None),
    (["taints", "add", "{a}", "--dry-run", "--", "-x"], {}, None, False),
    (["taints", "add", "{a}", "-x"], {}, None, False),
    (["taints", "add", "{a}", "keep/x", "--dry-run=yes"], {}, None, False),
    (["taints", "add", "{a}", "keep/x", "-yo", "json"], {}, None, False),
    (["taints", "add", "{a}", "keep/x", "-h"], {}, None, False),
]


@pytest.mark.parametrize(("args", "extra", "config", "runs_direct"), LS + TAINTS_ADD)
def test_direct_and_live_cli_agree(
    fleet: Fleet,
    args: list[str],
    extra: dict[str, str],
    config: str | None,
    runs_direct: bool | None,
) -> None:
    args = [word.replace("{a}", fleet.a).replace("{b}", fleet.b) for word in args]
    if config is not None:
        extra = {**extra, "DYNAMOCTL_CONFIG": str(fleet.configs[config])}
    if runs_direct is not None:
        assert (direct.plan(args, fleet.cli.env(**extra)) is not None) is runs_direct
    fast = fleet.cli.run(*args, env=extra, clean=False)
    slow = live(fleet.cli, args, extra)
    assert comparable(fast) == comparable(slow), args
    if "--debug" not in args:
        assert_clean(fast.err)


def test_a_direct_taints_add_writes_and_lists(fleet: Fleet) -> None:
    """Not only alike but right: a taint added without typer is in the next listing."""
    added = fleet.cli.ok("taints", "add", fleet.c, "direct/written")
    assert re.search(rf"^{fleet.c[:8]}\S*\s+\+direct/written\s+\d+$", added.out, re.M), added.out
    listed = fleet.cli.ok("workers", "ls", "-l", "direct/written", "-o", "name")
    assert listed.lines == [fleet.c]


def loaded(cli: Cli, args: list[str], extra: dict[str, str] | None = None) -> tuple[str, int]:
    """Run ``args`` through ``direct.run``: which of asyncio and gRPC it loaded ("-" for
    neither: the light client made the calls) and its exit status."""
    done = subprocess.run(
        [sys.executable, "-c", LOADED, *args], input="", capture_output=True, text=True,
        env=cli.env(**(extra or {})), cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    heavy, code = done.stderr.splitlines()[-1].rsplit(" ", 1)
    return heavy, int(code)


@pytest.mark.parametrize(
    ("args", "heavy", "code"),
    [
        (["workers", "ls"], "-", 0),
        (["workers", "ls", "-o", "json", "--sort-by", ".model"], "-", 0),
        (["taints", "add", "{a}", "keep/x"], "-", 0),
        (["taints", "add", "-l", "pool=a", "keep/x"], "-", 0),
        (["taints", "add", "nosuchworker", "keep/x"], "-", 1),
        (["taints", "add", "{a}", "dynamo.topology/zone=x"], "-", 1),
        # Left to gRPC's client: a daemon that is not there (gRPC's words for why) and
        # --debug (gRPC's logging); so are a watch and a question on the terminal.
        (["-e", GONE, "taints", "add", "{a}", "keep/x"], "asyncio grpc", 3),
        (["workers", "ls", "--debug"], "asyncio grpc", 0),
    ],
)
def test_the_light_client_makes_the_calls_without_grpc_or_an_event_loop(
    fleet: Fleet, args: list[str], heavy: str, code: int
) -> None:
    args = [word.replace("{a}", fleet.a) for word in args]
    assert loaded(fleet.cli, args) == (heavy, code)


TOKENS = """
[[token]]
name = "viewer"
secret = "viewer-secret-1"
role = "read"
"""
NO_PROXY = {"http_proxy": "", "https_proxy": "", "grpc_proxy": ""}  # gRPC would use one


@dataclass
class Secured:
    """A daemon on TCP with TLS, client certificates required, and tokens; one worker."""

    cluster: Cluster
    pki: Pki
    endpoint: str
    worker: str
    root: Path

    def env(self, *, cert: bool = True, token: str | None = None, **extra: str) -> dict[str, str]:
        found = {**NO_PROXY, "DYNAMO_ENDPOINT": self.endpoint, "DYNAMO_CACERT": str(self.pki.ca)}
        if cert:
            found |= {"DYNAMO_CERT": str(self.pki.client_cert),
                      "DYNAMO_CERT_KEY": str(self.pki.client_key)}  # fmt: skip
        if token is not None:
            path = self.root / f"token-{token}"
            path.write_text(token + "\n")
            found["DYNAMO_TOKEN_FILE"] = str(path)
        return {**found, **extra}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    pki = make_pki(root / "pki")
    (root / "tokens.toml").write_text(TOKENS)
    port = free_port()
    cluster = start_cluster(
        root, "--listen", f"127.0.0.1:{port}", "--tokens-file", str(root / "tokens.toml"),
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
        "--tls-client-ca", str(pki.ca),
    )  # fmt: skip
    try:
        (worker,) = cluster.start_workers(("gamma", ["--taint", "pool=s"]))
        cluster.seen([worker.field("id")])
        # Every later "taints add ... sec/x" is then unchanged, and compares alike.
        cluster.cli.ok("taints", "add", worker.field("id"), "sec/x")
        yield Secured(cluster, pki, f"127.0.0.1:{port}", worker.field("id"), root)
    finally:
        cluster.stop()


@pytest.mark.parametrize(
    ("args", "how", "light"),
    [
        (["workers", "ls"], {}, True),  # the client certificate: write access
        (["workers", "ls", "-o", "json"], {"token": "viewer-secret-1"}, True),
        (["taints", "add", "{w}", "sec/x"], {}, True),
        (["taints", "add", "{w}", "sec/y"], {"token": "viewer-secret-1"}, True),  # read-only
        (["workers", "ls"], {"token": "not-a-token-1"}, True),
        (["workers", "ls", "-e", "localhost:{port}"], {}, True),  # the certificate's DNS name
        # The handshake refused (no client certificate), gRPC's own roots: gRPC's client.
        (["workers", "ls"], {"cert": False}, False),
        (["taints", "add", "{w}", "sec/z"], {"cert": False, "token": "viewer-secret-1"}, False),
        (["workers", "ls"], {"cert": False, "DYNAMO_CACERT": "", "DYNAMO_TLS": "1"}, False),
    ],
)
def test_tls_client_certificates_and_tokens_alike_on_both_clients(
    secured: Secured, args: list[str], how: dict[str, Any], light: bool
) -> None:
    port = secured.endpoint.rpartition(":")[2]
    args = [word.replace("{w}", secured.worker).replace("{port}", port) for word in args]
    extra = secured.env(**how)
    cli = secured.cluster.cli
    fast = cli.run(*args, env=extra, clean=False)
    slow = live(cli, args, extra)
    assert comparable(fast) == comparable(slow), args
    assert_clean(fast.err)
    assert loaded(cli, args, extra) == ("-" if light else "asyncio grpc", fast.code)


IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)
"""Runs its arguments with SIGINT ignored, as a shell starts a script's background job."""


@pytest.mark.parametrize("ignored", [False, True], ids=["plain", "sigint-ignored"])
@pytest.mark.parametrize("how", ["direct", "live"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_waiting_for_the_daemon_ends_it_with_130_and_nothing_said(
    fleet: Fleet, tmp_path: Path, how: str, sig: signal.Signals, ignored: bool
) -> None:
    """A daemon's socket that takes the connection and never answers: the command waits
    (on the light client's socket, or gRPC's loop) until the signal, then exits 130
    having printed nothing, both ways; also when it was started with SIGINT ignored (gRPC's
    loop takes SIGINT itself, so the light client must too: it once waited out its
    timeout there)."""
    path = tmp_path / "mute.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        server.settimeout(60)
        args = ["-e", f"unix://{path}", "--timeout", "60", "taints", "add", fleet.a, "keep/x"]
        command = dynamoctl(*args) if how == "direct" else [sys.executable, "-c", LIVE, *args]
        if ignored:
            command = [sys.executable, "-c", IGNORING_SIGINT, *command]
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env=fleet.cli.env(), cwd=ROOT,
        )  # fmt: skip
        connection, _ = server.accept()
        with connection:
            connection.settimeout(60)
            assert connection.recv(24).startswith(b"PRI * HTTP/2.0")  # it is waiting now
            proc.send_signal(sig)
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:  # it ignored the signal: fail this test alone
                proc.kill()
                proc.communicate()
                raise
    assert (proc.returncode, out, err) == (130, b"", b"")
