"""Worker selectors: one small language for ``-l`` everywhere.

A selector is comma-separated terms; a worker matches when every term holds:

* ``capacity/fast`` — the worker holds this exact taint;
* ``!pool=batch`` — the worker does not hold it;
* ``model=llama`` / ``model!=llama`` — a field equals (or not) a value. Fields:
  ``model``, ``namespace``, ``component``, ``endpoint``, ``id``, ``host``. A bare term
  whose key is one of these names is always a field match, never a taint.

A taint that holds ``,``, ``!``, ``=`` or ``"`` can be written in double quotes, as in
JSON: ``"gpu,h100"``, ``!"!x"``, ``"model=llama"`` (a quoted term is always a taint,
never a field match). Inside the quotes ``\\"`` stands for ``"`` and ``\\\\`` for ``\\``;
no other backslash escape exists. A field's value may be quoted the same way:
``model="a,b"``. Outside quotes a ``"`` is an error.

Spaces around terms are ignored; the empty selector matches every worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamod.errors import SelectorError, TaintError, shown
from dynamod.records import WorkerRecord
from dynamod.taints import validate

FIELDS = ("model", "namespace", "component", "endpoint", "id", "host")
QUOTE = '"'
MAX_SELECTOR = 64 * 1024
"""The longest selector (characters) ``parse`` reads, checked before anything is parsed: a
selector comes from any caller of the API and is parsed on the daemon's event loop. 64
terms of the longest taint fit."""
MAX_TERMS = 256
"""The most terms a selector may have, counted before any is checked: each costs the
taint checks (tens of microseconds), and a selector's terms all hold at once."""


@dataclass(frozen=True)
class Term:
    kind: str  # "taint" or a field name
    value: str
    negate: bool = False

    def matches(self, record: WorkerRecord) -> bool:
        if self.kind == "taint":
            found = self.value in record.taints
        else:
            found = field_of(record, self.kind) == self.value
        return found != self.negate


@dataclass(frozen=True)
class Selector:
    terms: tuple[Term, ...] = ()
    text: str = ""

    def matches(self, record: WorkerRecord) -> bool:
        return all(term.matches(record) for term in self.terms)

    def __bool__(self) -> bool:
        return bool(self.terms)


def parse(text: str) -> Selector:
    """Parse a selector; ``SelectorError`` names the term and what is wrong with it, or the
    length limit (``MAX_SELECTOR``) for a selector over it."""
    if len(text) > MAX_SELECTOR:
        raise SelectorError(
            f"selector {shown(text, 60)} is over the limit of {MAX_SELECTOR} characters; "
            "select with fewer or shorter terms"
        )
    if not text.strip():
        return Selector()
    raws = _terms(text)
    if len(raws) > MAX_TERMS:
        raise SelectorError(
            f"selector {shown(text, 60)} has {len(raws)} terms, over the limit of {MAX_TERMS}; "
            "select with fewer terms"
        )
    return Selector(tuple(_term(raw.strip(), text) for raw in raws), text)


def quote(taint: str) -> str:
    """``taint`` as a selector term: bare when it reads back as itself, else quoted."""
    if _bare_safe(taint):
        return taint
    return QUOTE + taint.replace("\\", "\\\\").replace(QUOTE, "\\" + QUOTE) + QUOTE


def _bare_safe(taint: str) -> bool:
    if any(c in taint for c in ',"') or taint.startswith("!"):
        return False
    key = _split(taint)[0]
    return key not in FIELDS


def _terms(text: str) -> list[str]:
    """The raw terms of ``text``: split at each ``,`` outside double quotes."""
    if QUOTE not in text:
        return text.split(",")
    terms: list[str] = []
    start, inside, escaped = 0, False, False
    for at, char in enumerate(text):
        if escaped:
            escaped = False
        elif inside and char == "\\":
            escaped = True
        elif char == QUOTE:
            inside = not inside
        elif char == "," and not inside:
            terms.append(text[start:at])
            start = at + 1
    if inside:
        raise SelectorError(f"selector {shown(text)} has a '\"' that is never closed")
    terms.append(text[start:])
    return terms


def _term(raw: str, text: str) -> Term:
    if not raw:
        raise SelectorError(
            f"selector {shown(text)} has an empty term; separate terms with one ','"
        )
    negate = raw.startswith("!")
    rest = raw[1:].lstrip() if negate else raw
    if rest.startswith(QUOTE):
        return _taint(raw, _unquote(raw, rest), negate)
    key, op, value = _split(raw)
    if key in FIELDS:
        if value.startswith(QUOTE):
            value = _unquote(raw, value)
        if not value:
            raise SelectorError(f"selector term {shown(raw)} needs a value after {op!r}")
        return Term(key, value, negate=op == "!=")
    if QUOTE in raw:
        raise SelectorError(
            f"selector term {shown(raw, 100)} has a '\"' inside it; quote the whole taint "
            '("...") or a field\'s value (model="...")'
        )
    return _taint(raw, rest, negate)


def _taint(raw: str, taint: str, negate: bool) -> Term:
    try:
        validate(taint, allow_reserved=True)
    except TaintError as exc:
        raise SelectorError(
            f"selector term {shown(raw, 100)} is not a taint or a field match: {exc}"
        ) from None
    return Term("taint", taint, negate=negate)


def _unquote(raw: str, quoted: str) -> str:
    """The text inside ``quoted`` (which starts with ``"``); nothing may follow it."""
    out: list[str] = []
    chars = iter(enumerate(quoted[1:], start=1))
    for at, char in chars:
        if char == QUOTE:
            if quoted[at + 1 :].strip():
                raise SelectorError(
                    f"selector term {shown(raw, 100)} has text after its closing '\"'"
                )
            return "".join(out)
        if char == "\\":
            _, char = next(chars, (at, ""))
            if char not in (QUOTE, "\\"):
                raise SelectorError(
                    f"selector term {shown(raw, 100)} has the escape \\{char}; inside quotes "
                    'only \\" and \\\\ are escapes'
                )
        out.append(char)
    raise SelectorError(f"selector term {shown(raw, 100)} has a '\"' that is never closed")


def _split(raw: str) -> tuple[str, str, str]:
    if "!=" in raw:
        key, _, value = raw.partition("!=")
        return key.strip(), "!=", value.strip()
    key, _, value = raw.partition("=")
    return key.strip(), "=", value.strip()


def field_of(record: WorkerRecord, name: str) -> str:
    """A record's value of a selector field (``model``, ``id`` or a record attribute)."""
    if name == "model":
        return record.model
    if name == "id":
        return record.instance_id
    value: str = getattr(record, name)
    return value
