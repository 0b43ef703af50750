"""Stores that need TLS and a login, as production ones do: an etcd that serves clients over
TLS only, requires client certificates and has authentication on (a user allowed one key
prefix), and nats-servers that require TLS with client certificates and a user, or an NKey.

The certificates are made at test time (``tests.support.pki``, with openssl). Each scenario is run
by the store in this process, and the etcd one also by real ``dynamod`` and
``dynamo-worker`` processes given the same URL.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import nkeys
import pytest

from dynamod.client import AsyncClient
from dynamod.errors import StoreError, StoreUnavailableError
from dynamod.store import KEEP, Put, Resync, Store, check_url, keep_alive, open_store
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.conftest import servers_required, start_server
from tests.support.natsauth import Key, Operator
from tests.support.pki import Pki, make_pki
from tests.support.processes import daemon, daemon_argv, env, running, worker
from tests.support.servers import EtcdServer, NatsServer
from tests.support.streams import next_event

pytestmark = pytest.mark.timeout(120)

PREFIX = "secure"
USER = "dynamod"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    with servers_required():
        return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("secrets")
    (folder / "password").write_text("etcd-s3cret\n")
    (folder / "wrong").write_text("not-it\n")
    for name in ("password", "wrong"):
        os.chmod(folder / name, 0o600)
    return folder


@pytest.fixture(scope="module")
def secure_etcd(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki, secrets: Path
) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd-tls"), tls=pki)
    start_server(server)
    server.enable_auth(USER, (secrets / "password").read_text().strip(), PREFIX)
    yield server
    server.stop()


def etcd_url(server: EtcdServer, pki: Pki, password: Path, prefix: str = PREFIX) -> str:
    return f"etcd://{server.endpoint}/{prefix}?{pki.query()}&user={USER}&password_file={password}"


async def exercise(url: str) -> None:
    """Check ``url`` without connecting, open it, and make every kind of call once: writes,
    a compare-and-swap, a lease kept alive, a watch."""
    check_url(url)
    async with await open_store(url) as store:
        await calls(store)


async def calls(store: Store) -> None:
    async with store.watch("w") as watch:
        assert isinstance(await next_event(watch), Resync)
        lease = await store.grant(5)
        revision = await store.put("w/1", b"a", lease=lease)
        await store.put("w/1", b"b", expect=revision, lease=KEEP)
        event = await next_event(watch)
        assert isinstance(event, Put) and event.entry.value == b"a"
        keeper = asyncio.create_task(keep_alive(store, lease))
        try:
            await store.refresh(lease)
            entries, _ = await store.list("w")
            assert [(e.key, e.value) for e in entries] == [("w/1", b"b")]
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        await store.revoke(lease)
        assert await store.get("w/1") is None


async def test_etcd_over_tls_with_a_user_serves_every_call(
    secure_etcd: EtcdServer, pki: Pki, secrets: Path
) -> None:
    url = etcd_url(secure_etcd, pki, secrets / "password")
    await exercise(url)


async def test_a_wrong_password_is_refused_at_once_and_for_good(
    secure_etcd: EtcdServer, pki: Pki, secrets: Path
) -> None:
    url = etcd_url(secure_etcd, pki, secrets / "wrong")
    check_url(url)  # the URL is well formed: only etcd can tell the password is wrong
    with pytest.raises(StoreError, match="invalid user ID or password") as caught:
        await open_store(url)
    assert not isinstance(caught.value, StoreUnavailableError), "retrying cannot help"
    assert "not-it" not in str(caught.value)


async def test_a_user_cannot_use_a_prefix_it_has_no_role_for(
    secure_etcd: EtcdServer, pki: Pki, secrets: Path
) -> None:
    url = etcd_url(secure_etcd, pki, secrets / "password", prefix="elsewhere")
    with pytest.raises(StoreError, match=r"permission denied.*readwrite permission"):
        await open_store(url)


async def test_a_client_without_tls_or_certificate_gets_no_connection(
    secure_etcd: EtcdServer, pki: Pki, secrets: Path
) -> None:
    login = f"user={USER}&password_file={secrets / 'password'}"
    for query in (login, f"ca={pki.ca}&{login}"):  # plain text; TLS without a certificate
        url = f"etcd://{secure_etcd.endpoint}/{PREFIX}?{query}"
        with pytest.raises(StoreUnavailableError, match=secure_etcd.endpoint):
            await open_store(url)


async def test_dynamod_and_a_worker_run_on_the_secured_etcd(
    secure_etcd: EtcdServer, pki: Pki, secrets: Path, tmp_path: Path
) -> None:
    """Both programs take the same URL: the worker registers over TLS as the user, the
    daemon sees it, and a taint update through the daemon lands in the store."""
    url = etcd_url(secure_etcd, pki, secrets / "password", prefix=f"{PREFIX}/procs")
    socket = tmp_path / "d.sock"
    async with running(worker(url)), running(daemon(url, socket)) as proc:
        assert "workers=1" in proc.ready_line
        async with AsyncClient(f"unix://{socket}", timeout=10) as client:
            (found,), _ = await client.list_workers()
            (change,) = await client.update_taints(
                TaintUpdate.add(["pool=tls"]), Target(worker=found.id)
            )
            assert change.error is None and "pool=tls" in change.after
    assert "s3cret" not in proc.stderr


async def test_dynamod_with_a_wrong_password_exits_1_with_one_line(
    secure_etcd: EtcdServer, pki: Pki, secrets: Path, tmp_path: Path
) -> None:
    url = etcd_url(secure_etcd, pki, secrets / "wrong")
    proc = await asyncio.create_subprocess_exec(
        *daemon_argv(url, tmp_path / "d.sock"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env(),
    )
    async with asyncio.timeout(60):
        _, stderr = await proc.communicate()
    text = stderr.decode()
    assert proc.returncode == 1, text
    assert "invalid user ID or password" in text and "Traceback" not in text
    assert "not-it" not in text


# -- NATS ---------------------------------------------------------------------------------


@pytest.fixture
def secure_nats(tmp_path: Path, pki: Pki) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats", tls=pki, user=("dynamod", "nats-s3cret"))
    start_server(server)
    yield server
    server.stop()


def nats_url(server: NatsServer, query: str) -> str:
    return f"nats://127.0.0.1:{server.port}/secured?{query}"


async def test_nats_over_tls_with_a_user_serves_every_call(
    secure_nats: NatsServer, pki: Pki, tmp_path: Path
) -> None:
    password = tmp_path / "nats.pass"
    password.write_text("nats-s3cret\n")
    url = nats_url(secure_nats, f"{pki.query()}&user=dynamod&password_file={password}")
    await exercise(url)


async def test_nats_refuses_a_wrong_password_at_once(
    secure_nats: NatsServer, pki: Pki, tmp_path: Path
) -> None:
    password = tmp_path / "wrong.pass"
    password.write_text("wrong\n")
    url = nats_url(secure_nats, f"{pki.query()}&user=dynamod&password_file={password}")
    with pytest.raises(StoreError, match="refused the login") as caught:
        await open_store(url)
    assert not isinstance(caught.value, StoreUnavailableError), "retrying cannot help"


async def test_nats_with_an_nkey_login(tmp_path: Path) -> None:
    user = Key.new(nkeys.PREFIX_BYTE_USER)
    config = f'authorization {{ users = [ {{ nkey: "{user.public}" }} ] }}'
    seed = tmp_path / "user.nk"
    seed.write_bytes(user.seed + b"\n")
    await login_works(tmp_path, config, f"nkey={seed}")


async def test_nats_with_a_credentials_file(tmp_path: Path) -> None:
    """Decentralized auth: an operator, its account with JetStream, a user's JWT and seed in
    a creds file."""
    operator = Operator.new()
    creds = tmp_path / "user.creds"
    creds.write_text(operator.creds)
    await login_works(tmp_path, operator.server_config, f"creds={creds}")


async def test_nats_with_a_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken-s3cret\n")
    await login_works(tmp_path, 'authorization { token: "t0ken-s3cret" }', f"token_file={token}")


async def login_works(tmp_path: Path, config: str, query: str) -> None:
    """A nats-server with ``config`` serves a store whose URL logs in by ``query``, and
    refuses one that does not log in."""
    server = NatsServer(tmp_path / "nats", config=config)
    start_server(server)
    try:
        await exercise(f"nats://127.0.0.1:{server.port}/auth?{query}")
        with pytest.raises(StoreError, match="refused the login"):
            await open_store(f"nats://127.0.0.1:{server.port}/auth")
    finally:
        await asyncio.to_thread(server.stop)
