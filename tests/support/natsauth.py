"""NATS logins for tests: user NKeys, and the JWTs of NATS's decentralized auth (operator,
account, user) that a credentials file carries, signed with NKeys as nats-server checks.

A JWT here is three base64url parts, header ``{"typ": "JWT", "alg": "ed25519-nkey"}``,
claims (``iss`` the signer's public key, ``sub`` the subject's, ``nats`` the kind and its
limits) and the signer's Ed25519 signature of the first two.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

import nkeys


@dataclass(frozen=True)
class Key:
    seed: bytes

    @classmethod
    def new(cls, prefix: int) -> Key:
        return cls(nkeys.encode_seed(os.urandom(32), prefix))

    @property
    def pair(self) -> nkeys.KeyPair:
        return nkeys.from_seed(bytearray(self.seed))

    @property
    def public(self) -> str:
        return str(self.pair.public_key.decode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(signer: Key, subject: Key, name: str, nats: dict[str, Any]) -> str:
    claims = {
        "jti": secrets.token_hex(16).upper(),
        "iat": int(time.time()),
        "iss": signer.public,
        "name": name,
        "sub": subject.public,
        "nats": {**nats, "version": 2},
    }
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = signer.pair.sign(f"{head}.{body}".encode())
    return f"{head}.{body}.{_b64(signature)}"


UNLIMITED = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "conn": -1}
JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


@dataclass(frozen=True)
class Operator:
    """An operator with a system account (JetStream needs one), an account with JetStream
    on, and one user of that account."""

    server_config: str
    creds: str

    @classmethod
    def new(cls) -> Operator:
        operator = Key.new(nkeys.PREFIX_BYTE_OPERATOR)
        system = Key.new(nkeys.PREFIX_BYTE_ACCOUNT)
        account = Key.new(nkeys.PREFIX_BYTE_ACCOUNT)
        user = Key.new(nkeys.PREFIX_BYTE_USER)
        operator_jwt = jwt(operator, operator, "test", {"type": "operator"})
        limits = {**UNLIMITED, **JETSTREAM, "wildcards": True, "leaf": -1}
        account_jwt = jwt(operator, account, "dynamod", {"type": "account", "limits": limits})
        system_jwt = jwt(operator, system, "SYS", {"type": "account", "limits": UNLIMITED})
        user_jwt = jwt(account, user, "worker", {"type": "user", **UNLIMITED})
        config = (
            f'operator: "{operator_jwt}"\n'
            f"system_account: {system.public}\n"
            "resolver: MEMORY\n"
            f'resolver_preload: {{ {account.public}: "{account_jwt}", '
            f'{system.public}: "{system_jwt}" }}\n'
        )
        creds = (
            f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n"
            "------END USER NKEY SEED------\n"
        )
        return cls(config, creds)
