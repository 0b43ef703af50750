"""Worker selectors: one small language for ``-l`` everywhere.

A selector is comma-separated terms; a worker matches when every term holds:

* ``capacity/fast`` — the worker holds this exact taint;
* ``!pool=batch`` — the worker does not hold it;
* ``model=llama`` / ``model!=llama`` — a field equals (or not) a value. Fields:
  ``model``, ``namespace``, ``component``, ``endpoint``, ``id``, ``host``. A term whose key
  is one of these names is always a field match, never a taint.

Spaces around terms are ignored; the empty selector matches every worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamod.errors import SelectorError, TaintError, shown
from dynamod.model import WorkerRecord
from dynamod.taints import validate

FIELDS = ("model", "namespace", "component", "endpoint", "id", "host")


@dataclass(frozen=True)
class Term:
    kind: str  # "taint" or a field name
    value: str
    negate: bool = False

    def matches(self, record: WorkerRecord) -> bool:
        if self.kind == "taint":
            found = self.value in record.taints
        else:
            found = _field(record, self.kind) == self.value
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
    """Parse a selector; ``SelectorError`` names the term and what is wrong with it."""
    if not text.strip():
        return Selector()
    return Selector(tuple(_term(raw.strip(), text) for raw in text.split(",")), text)


def _term(raw: str, text: str) -> Term:
    if not raw:
        raise SelectorError(
            f"selector {shown(text)} has an empty term; separate terms with one ','"
        )
    key, op, value = _split(raw)
    if key in FIELDS:
        if not value:
            raise SelectorError(f"selector term {shown(raw)} needs a value after {op!r}")
        return Term(key, value, negate=op == "!=")
    negate = raw.startswith("!")
    taint = raw[1:] if negate else raw
    try:
        validate(taint, allow_reserved=True)
    except TaintError as exc:
        raise SelectorError(
            f"selector term {shown(raw, 100)} is not a taint or a field match: {exc}"
        ) from None
    return Term("taint", taint, negate=negate)


def _split(raw: str) -> tuple[str, str, str]:
    if "!=" in raw:
        key, _, value = raw.partition("!=")
        return key.strip(), "!=", value.strip()
    key, _, value = raw.partition("=")
    return key.strip(), "=", value.strip()


def _field(record: WorkerRecord, name: str) -> str:
    if name == "model":
        return record.model
    if name == "id":
        return record.instance_id
    value: str = getattr(record, name)
    return value
