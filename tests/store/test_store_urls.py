"""Store URLs checked without connecting: ``dynamod.store.check_url`` on every backend, the
parameters that name TLS and credential files, and secrets kept out of every message."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from dynamod.errors import ConfigError
from dynamod.store import check_url
from dynamod.store.etcd import parse_url as parse_etcd
from dynamod.store.nats import parse_url as parse_nats
from tests.conftest import servers_required
from tests.support.pki import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    with servers_required():
        return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "password"
    path.write_text("s3cret\n")
    return path


def test_every_backend_checks_a_good_url(tmp_path: Path, pki: Pki, secret: Path) -> None:
    login = f"user=dynamod&password_file={secret}"
    for url in (
        "memory://",
        (tmp_path / "store").as_uri(),
        "etcd://a:2379,b:2379,c/prefix",
        f"etcd://a/p?{pki.query()}&{login}",
        "etcd://a/p?tls=true",
        "nats://a,b:4223/bucket?replicas=3",
        f"nats://a/b?{pki.query()}&{login}",
        f"nats://a/b?token_file={secret}",
    ):
        check_url(url)


def test_the_parsed_url_keeps_paths_never_secrets(pki: Pki, secret: Path) -> None:
    target = parse_etcd(f"etcd://h1,h2:1/ns?{pki.query()}&user=u&password_file={secret}")
    assert target.endpoints == (("h1", 2379), ("h2", 1))
    assert target.tls is not None and target.tls.ca == pki.ca
    assert target.login is not None and target.login.password() == "s3cret"
    assert "s3cret" not in repr(target)
    nats = parse_nats(f"nats://h/b?user=u&password_file={secret}&{pki.query()}")
    assert nats.servers == ["tls://h:4222"]
    options = nats.connect_options()
    assert (options["user"], options["password"]) == ("u", "s3cret")
    assert isinstance(options["tls"], ssl.SSLContext)
    assert "s3cret" not in f"{nats!r} {nats.shown}"


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis://h", "unknown scheme 'redis'"),
        ("memory://x", "takes nothing after it"),
        ("file://relative/dir", "file:///absolute/path"),
        ("etcd://u:pw@h/p", "carries credentials before '@'"),
        ("nats://u:pw@h/b", "carries credentials before '@'"),
        ("etcd://h/p?timeout=3", "unknown parameter 'timeout'"),
        ("etcd://h/p?ca=/a&ca=/b", "parameter 'ca' twice"),
        ("etcd://h/p?ca=relative.pem", "not an absolute path"),
        ("etcd://h/p?ca=", "gives parameter 'ca' no value"),
        ("etcd://h/p?cert=/c.pem", "cert and key together"),
        ("etcd://h/p?tls=false&ca=/ca.pem", "tls=false but names TLS files"),
        ("etcd://h/p?tls=maybe", "'maybe' is not true or false"),
        ("etcd://h/p?user=u", "user and password_file together"),
        ("etcd://h/p?password_file=/p", "user and password_file together"),
        ("etcd://h/p?ca=/no/such/ca.pem", "ca file '/no/such/ca.pem' cannot be read"),
        ("etcd://h/p?user=u&password_file=/no/such", "cannot be read: No such file"),
        ("etcd://h/p?token_file=/t", "unknown parameter 'token_file'"),
        ("nats://h/b?replicas=7", "replicas='7' is not a whole number from 1 to 5"),
        ("nats://h/b?token_file=/t&user=u&password_file=/p", "names user and token_file"),
        ("nats://h/b?creds=/no/such.creds", "creds file '/no/such.creds' cannot be read"),
    ],
)
def test_a_bad_url_is_a_config_error_saying_what_is_wrong(url: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint.replace("?", r"\?").replace("(", r"\(")):
        check_url(url)


def test_credentials_in_a_url_never_reach_the_message() -> None:
    for url in ("etcd://alice:s3cret@h/p", "nats://alice:s3cret@h,b/x"):
        with pytest.raises(ConfigError) as caught:
            check_url(url)
        assert "s3cret" not in str(caught.value)
        assert "password_file" in str(caught.value)


@pytest.mark.parametrize(
    ("content", "complaint"),
    [(b"", "is empty"), (b"one\ntwo\n", "more than one line"), (b"\n", "is empty")],
)
def test_a_password_file_holds_one_line(tmp_path: Path, content: bytes, complaint: str) -> None:
    path = tmp_path / "password"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=complaint):
        check_url(f"etcd://h/p?user=u&password_file={path}")


def test_tls_files_must_be_what_they_say(tmp_path: Path, pki: Pki) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="holds no usable PEM certificate"):
        check_url(f"etcd://h/p?ca={junk}")
    # A certificate with another certificate's key.
    with pytest.raises(ConfigError, match="are not a PEM certificate and its private key"):
        check_url(f"nats://h/b?cert={pki.client_cert}&key={pki.server_key}")


def test_nkey_and_creds_files_must_be_of_their_kind(tmp_path: Path, secret: Path) -> None:
    with pytest.raises(ConfigError, match="holds no user NKey seed"):
        check_url(f"nats://h/b?nkey={secret}")
    with pytest.raises(ConfigError, match="is not a NATS credentials file"):
        check_url(f"nats://h/b?creds={secret}")


def test_a_file_store_needs_a_writable_directory(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("x")
    with pytest.raises(ConfigError, match="is a file or lies under one"):
        check_url((taken / "store").as_uri())
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "format").write_text("something else\n")
    with pytest.raises(ConfigError, match="holds a store of format"):
        check_url(foreign.as_uri())
    check_url((tmp_path / "not" / "yet" / "there").as_uri())  # open creates it
