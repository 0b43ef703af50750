"""Worker selectors (with the quoted form for taints holding separators) and access rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamod.auth import UNIX, Principal, Tokens
from dynamod.errors import (
    ConfigError,
    PermissionDeniedError,
    SelectorError,
    TaintError,
    UnauthenticatedError,
)
from dynamod.selectors import Term, parse, quote
from dynamod.taints import is_topology, validate
from tests.support.factories import make_record

WORKER = make_record(instance_id="ab12", taints=["capacity/fast", "pool=batch"], model="llama")
ODD = make_record(
    instance_id="cd34",
    taints=["gpu,h100", "!x", "model=llama", 'say "hi"', "back\\slash", "Region/us=1"],
    model="mistral",
)


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
    ("selector", "expected"),
    [
        ('"gpu,h100"', True),
        ("gpu,h100", False),  # two terms: "gpu" and "h100", neither held
        ('!"!x"', False),
        ('! "!x"', False),
        ('"!x", "gpu,h100" , Region/us=1', True),
        ('"model=llama"', True),  # quoted: the taint, not the field
        ("model=llama", False),  # bare: the field (this worker serves mistral)
        ('model="mistral"', True),
        ('"say \\"hi\\""', True),
        ('"back\\\\slash"', True),
        ("back\\slash", True),  # outside quotes a backslash is an ordinary character
        ('!"pool=batch"', True),
    ],
)
def test_quoted_terms_name_taints_holding_separators(selector: str, expected: bool) -> None:
    assert parse(selector).matches(ODD) is expected


@pytest.mark.parametrize(
    "taint", ["gpu,h100", "!x", "model=llama", 'say "hi"', "back\\slash", "pool=a", "a!=b", "x"]
)
def test_quote_reads_back_as_the_same_taint(taint: str) -> None:
    (term,) = parse(quote(taint)).terms
    assert (term.kind, term.value, term.negate) == ("taint", taint, False)
    assert quote(taint) == taint or quote(taint).startswith('"')


@given(st.text(min_size=1, max_size=30).filter(lambda t: t == t.strip()))
def test_any_taint_the_grammar_accepts_can_be_selected(taint: str) -> None:
    try:
        validate(taint, allow_reserved=True)
    except TaintError:
        return
    record = make_record(instance_id="ef56", taints=[] if is_topology(taint) else [taint])
    selector = parse(quote(taint))
    assert selector.terms == (Term("taint", taint),)
    assert selector.matches(record) is not is_topology(taint)
    assert parse("!" + quote(taint)).matches(record) is is_topology(taint)


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("a,,b", "selector 'a,,b' has an empty term; separate terms with one ','"),
        ("model=", "selector term 'model=' needs a value after '='"),
        ('model=""', "selector term 'model=\"\"' needs a value after '='"),
        (
            "bad\tterm",
            "selector term 'bad\\tterm' is not a taint or a field match: taint 'bad\\tterm' has "
            "control or invisible character U+0009 at position 3",
        ),
        (
            "DYNAMO.topology/zone=a",
            "selector term 'DYNAMO.topology/zone=a' is not a taint or a field match: taint "
            "'DYNAMO.topology/zone=a' looks like reserved prefix 'dynamo.topology/'",
        ),
        ('"open', "selector '\"open' has a '\"' that is never closed"),
        ('a"b"', "selector term 'a\"b\"' has a '\"' inside it; quote the whole taint"),
        ('"a"b', "selector term '\"a\"b' has text after its closing '\"'"),
        ('"a\\qb"', "selector term '\"a\\\\qb\"' has the escape \\q; inside quotes only"),
        ('""', "selector term '\"\"' is not a taint or a field match: taint '' is empty"),
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
