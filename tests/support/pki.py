"""A throw-away certificate authority for TLS tests, made with the ``openssl`` command.

``openssl`` rather than the ``cryptography`` package: it is on every machine this project
runs on (Debian's openssl), where ``cryptography`` would be a 4 MB dependency for tests
alone. Keys are EC P-256 (fast to make); certificates last two days. The server certificate
names 127.0.0.1 and localhost; the client certificate's common name is the user etcd sees.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import ServerMissing

_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
_SERIALS = {"server": "2", "client": "3"}


@dataclass(frozen=True)
class Pki:
    """The files of one CA, one server certificate and one client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self) -> ssl.SSLContext:
        """A context that trusts the CA and presents the client certificate."""
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.client_cert, self.client_key)
        return context

    def query(self) -> str:
        """The store URL parameters that use this CA and client certificate."""
        return f"ca={self.ca}&cert={self.client_cert}&key={self.client_key}"


def openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        raise ServerMissing("openssl not found (Debian: apt-get install openssl)")
    return found


def make_pki(folder: Path, *, client: str = "dynamod") -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    _run(
        "req", "-x509", *_KEY, "-keyout", ca_key, "-out", ca, "-days", "2",
        "-subj", "/CN=dynamod test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    server = _issue(folder, "server", ca, ca_key, "/CN=localhost", [
        "subjectAltName=IP:127.0.0.1,DNS:localhost",
        "extendedKeyUsage=serverAuth,clientAuth",
    ])  # fmt: skip
    user = _issue(folder, "client", ca, ca_key, f"/CN={client}", ["extendedKeyUsage=clientAuth"])
    return Pki(ca, *server, *user)


def _issue(
    folder: Path, name: str, ca: Path, ca_key: Path, subject: str, extensions: list[str]
) -> tuple[Path, Path]:
    cert, key, request = folder / f"{name}.pem", folder / f"{name}.key", folder / f"{name}.csr"
    extfile = folder / f"{name}.ext"
    extfile.write_text("\n".join(extensions) + "\n")
    _run("req", "-new", *_KEY, "-keyout", key, "-out", request, "-subj", subject)
    _run(
        "x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key,
        "-set_serial", _SERIALS[name], "-days", "2", "-out", cert, "-extfile", extfile,
    )  # fmt: skip
    return cert, key


def _run(*args: str | Path) -> None:
    done = subprocess.run([openssl(), *map(str, args)], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"openssl {args[0]} failed ({done.returncode}):\n{done.stderr}")
