"""Worker selectors and access rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamod.auth import UNIX, Principal, Tokens
from dynamod.errors import ConfigError, PermissionDeniedError, SelectorError, UnauthenticatedError
from dynamod.selectors import parse
from tests.factories import make_record

WORKER = make_record(instance_id="ab12", taints=["capacity/fast", "pool=batch"], model="llama")


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", True),
        ("capacity/fast", True),
        ("capacity/slow", False),
        ("!pool=batch", False),
        ("!pool=other", True),
        ("model=llama", True),
        ("model!=llama", False),
        ("id=ab12, capacity/fast", True),
        ("namespace=dynamo,component=backend,endpoint=generate,host=test", True),
        ("pool", False),
    ],
)
def test_selector_matches(selector: str, expected: bool) -> None:
    assert parse(selector).matches(WORKER) is expected


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("a,,b", "selector 'a,,b' has an empty term; separate terms with one ','"),
        ("model=", "selector term 'model=' needs a value after '='"),
        (
            "bad taint",
            "selector term 'bad taint' is not a taint or a field match: taint 'bad taint'",
        ),
    ],
)
def test_bad_selectors_name_the_term(selector: str, message: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse(selector)
    assert str(caught.value).startswith(message)


def test_tokens_roles_and_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(
        '[[token]]\nname = "ro"\nsecret = "read-only-1"\n\n'
        '[[token]]\nname = "cap"\nsecret = "capacity-1"\nrole = "write"\nprefixes = ["capacity/"]\n'
    )
    tokens = Tokens.load(path)
    assert tokens.identify(peer="unix:", token=None, cert_name=None) is UNIX
    assert tokens.identify(peer="ipv4:1.2.3.4:5", token=None, cert_name="ops").name == "cert:ops"
    reader = tokens.identify(peer="ipv4:1.2.3.4:5", token="read-only-1", cert_name=None)
    with pytest.raises(PermissionDeniedError, match="'ro' has read-only access"):
        reader.require_write()
    writer = tokens.authenticate("capacity-1")
    writer.require_write()
    writer.check_taints({"capacity/fast"})
    with pytest.raises(PermissionDeniedError, match="'pool=a' is outside them"):
        writer.check_taints({"capacity/fast", "pool=a"})
    with pytest.raises(UnauthenticatedError, match="required on TCP"):
        tokens.identify(peer="ipv4:1.2.3.4:5", token=None, cert_name=None)
    with pytest.raises(UnauthenticatedError, match="not valid"):
        tokens.authenticate("guess")
    Principal("any", "write").check_taints({"anything"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[token]]\nname = "x"\nsecret = "short"', "needs a secret of at least 8 characters"),
        ('[[token]]\nsecret = "long-enough"', "needs a name"),
        ('[[token]]\nname = "x"\nsecret = "long-enough"\nrole = "root"', "has role 'root'"),
        ("[[token", "is not valid TOML"),
        ('[[token]]\nname = "x"\nsecret = "a b c d e f"', "a bearer token is visible ASCII"),
    ],
)
def test_bad_token_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        Tokens.load(path)
