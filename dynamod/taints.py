"""Taints: the grammar, normalization, generated topology taints and request constraints.

A taint is a routing label on a worker, written ``[prefix/]name[=value]``:

* ``prefix``: a lowercase DNS subdomain of at most 253 characters (labels of ``a-z``,
  ``0-9`` and ``-``, separated by ``.``, each starting and ending alphanumeric);
* ``name``: 1-63 characters of letters, digits, ``-``, ``_`` and ``.``, starting and ending
  with a letter or digit;
* ``value``: the same class as ``name``; present only after ``=``, and then not empty.

A worker's taints are a set, stored sorted and de-duplicated, so order never matters.
Taints under ``dynamo.topology/`` are reserved: they are generated from the record's
``topology_domains`` and no caller may add or remove them. A ``TaintUpdate`` is one change
to a worker's caller-managed taints. Everything here is pure and synchronous, and works on
strings alone (``model.py`` applies taints to records).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from dynamod.errors import ConstraintError, InvalidInputError, TaintError

TOPOLOGY_PREFIX = "dynamo.topology/"
CORDONED = "dynamo.io/cordoned"
MAX_PREFIX = 253
MAX_NAME = 63

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.-]+")
_ALNUM = re.compile(r"[A-Za-z0-9]")
_NAME_CLASS = "letters, digits, '-', '_' and '.'"


def validate(taint: str, *, allow_reserved: bool = False) -> str:
    """Return ``taint`` if it follows the grammar, else raise ``TaintError`` naming the rule.

    With ``allow_reserved`` the ``dynamo.topology/`` prefix is accepted (routing
    constraints may require a topology taint; callers may never set one).
    """
    if not allow_reserved and taint.startswith(TOPOLOGY_PREFIX):
        raise TaintError(
            taint,
            f"uses reserved prefix {TOPOLOGY_PREFIX!r}; topology taints are generated "
            "from the worker's topology_domains",
        )
    if not taint:
        raise TaintError(taint, "is empty")
    key, has_value, value = taint.partition("=")
    prefix, slash, name = key.rpartition("/")
    if slash:
        _check_prefix(taint, prefix)
    _check_part(taint, "name", name)
    if has_value:
        _check_part(taint, "value", value)
    return taint


def _check_prefix(taint: str, prefix: str) -> None:
    if not prefix:
        raise TaintError(taint, "has an empty prefix before '/'")
    if "/" in prefix:
        raise TaintError(taint, "has more than one '/'; the form is [prefix/]name[=value]")
    if len(prefix) > MAX_PREFIX:
        raise TaintError(taint, f"has a prefix of {len(prefix)} characters; the limit is 253")
    if not all(_DNS_LABEL.fullmatch(label) for label in prefix.split(".")):
        raise TaintError(
            taint,
            f"has prefix {prefix!r} that is not a lowercase DNS subdomain (labels of a-z, "
            "0-9 and '-', separated by '.', each starting and ending with a letter or digit)",
        )


def _check_part(taint: str, part: str, text: str) -> None:
    if not text:
        where = "after '='" if part == "value" else "before '=' or at the end"
        raise TaintError(taint, f"has an empty {part} {where}")
    if len(text) > MAX_NAME:
        raise TaintError(taint, f"has a {part} of {len(text)} characters; the limit is 63")
    if not _NAME_CHARS.fullmatch(text):
        bad = next(c for c in text if not _NAME_CHARS.fullmatch(c))
        raise TaintError(
            taint, f"has {part} {text!r} with character {bad!r}; allowed are {_NAME_CLASS}"
        )
    if not (_ALNUM.fullmatch(text[0]) and _ALNUM.fullmatch(text[-1])):
        raise TaintError(
            taint, f"has {part} {text!r} that does not start and end with a letter or digit"
        )


def key_of(taint: str) -> str:
    """The ``[prefix/]name`` part of a taint: ``pool=batch`` → ``pool``."""
    return taint.partition("=")[0]


def normalize(taints: Iterable[str]) -> tuple[str, ...]:
    """De-duplicate and sort: two lists that differ only in order or repeats are equal."""
    return tuple(sorted(set(taints)))


def validate_caller_taints(taints: Iterable[str]) -> tuple[str, ...]:
    """Validate taints sent by a caller (reserved prefix refused) and normalize them."""
    return normalize(validate(t) for t in taints)


def is_topology(taint: str) -> bool:
    return taint.startswith(TOPOLOGY_PREFIX)


def topology_taint(domain: str, value: str) -> str:
    return f"{TOPOLOGY_PREFIX}{domain}={value}"


def topology_taints(domains: Mapping[str, str]) -> tuple[str, ...]:
    """The generated taints for ``topology_domains``, sorted."""
    return normalize(topology_taint(d, v) for d, v in domains.items())


def caller_taints(taints: Iterable[str]) -> tuple[str, ...]:
    """The caller-managed part of a taint set (everything outside ``dynamo.topology/``)."""
    return normalize(t for t in taints if not is_topology(t))


def with_topology(caller: Iterable[str], domains: Mapping[str, str]) -> tuple[str, ...]:
    """Caller taints plus the regenerated topology taints, sorted."""
    return normalize((*caller_taints(caller), *topology_taints(domains)))


UpdateAction = Literal["replace", "add", "remove", "clear"]
ACTIONS: tuple[UpdateAction, ...] = ("replace", "add", "remove", "clear")


@dataclass(frozen=True)
class TaintUpdate:
    """One change to a worker's caller-managed taints, from the CLI down to the store.

    ``action`` is one of ``ACTIONS``: ``replace`` sets the caller taints (empty clears; the
    CLI's ``taints set``, Dynamo's route), ``add`` / ``remove`` name exact taints,
    ``remove`` also drops every taint whose key (``[prefix/]name``) is in ``keys``, and
    ``clear`` removes them all. Everything is checked when the update is built, before any
    read: a reserved or malformed taint raises ``TaintError``, ``add`` / ``remove`` need at
    least one taint. Duplicates collapse.
    """

    action: UpdateAction
    taints: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise InvalidInputError(
                f"taint update action {self.action!r} is unknown; use replace, add, remove or clear"
            )
        if self.action == "clear" and self.taints:
            raise InvalidInputError("clear takes no taints; use remove to drop some of them")
        if self.keys and self.action != "remove":
            raise InvalidInputError("taint keys can only be given to remove")
        if self.action in ("add", "remove") and not (self.taints or self.keys):
            raise InvalidInputError(f"{self.action} needs at least one taint")
        object.__setattr__(self, "taints", normalize(validate(t) for t in self.taints))
        object.__setattr__(self, "keys", normalize(_valid_key(k) for k in self.keys))

    @classmethod
    def replace(cls, taints: Iterable[str]) -> TaintUpdate:
        return cls("replace", tuple(taints))

    @classmethod
    def add(cls, taints: Iterable[str]) -> TaintUpdate:
        return cls("add", tuple(taints))

    @classmethod
    def remove(cls, taints: Iterable[str], keys: Iterable[str] = ()) -> TaintUpdate:
        """Remove exact ``taints``, and every taint whose key is in ``keys``."""
        return cls("remove", tuple(taints), tuple(keys))

    @classmethod
    def clear(cls) -> TaintUpdate:
        return cls("clear")

    def apply(self, current: Iterable[str]) -> tuple[str, ...]:
        """The caller taints after this update, given the caller taints read just now."""
        held = set(current)
        if self.action == "add":
            held |= set(self.taints)
        elif self.action == "remove":
            held -= set(self.taints)
            held = {t for t in held if key_of(t) not in self.keys}
        else:
            held = set(self.taints)
        return normalize(held)


def _valid_key(key: str) -> str:
    validate(key)
    if "=" in key:
        raise InvalidInputError(f"taint key {key!r} must not contain '='; give the key alone")
    return key


@dataclass(frozen=True)
class RoutingConstraints:
    """What a request asks of a worker.

    ``required_taints``: the worker must hold every one (hard filter).
    ``preferred_taints``: taint → weight in [-1, 1]; matched weights are summed and bias the
    worker's cost by ``exp(-tanh(sum))`` (positive attracts, negative repels).
    """

    required_taints: frozenset[str] = frozenset()
    preferred_taints: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for taint in self.required_taints:
            _constraint_taint("required_taints", taint)
        for taint, weight in self.preferred_taints.items():
            _constraint_taint("preferred_taints", taint)
            if not math.isfinite(weight) or not -1.0 <= weight <= 1.0:
                raise ConstraintError(
                    f"preferred taint {taint!r} has weight {weight}; weights must be from -1 to 1"
                )

    @classmethod
    def from_json(cls, obj: object) -> RoutingConstraints:
        """Parse ``nvext.routing_constraints``; unknown keys and wrong types are refused."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise ConstraintError("routing_constraints must be a JSON object")
        unknown = sorted(set(obj) - {"required_taints", "preferred_taints"})
        if unknown:
            raise ConstraintError(
                f"routing_constraints has unknown key {unknown[0]!r}; allowed keys are "
                "'required_taints' and 'preferred_taints'"
            )
        return cls(
            required_taints=frozenset(_string_list(obj.get("required_taints"))),
            preferred_taints=_weight_map(obj.get("preferred_taints")),
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.required_taints:
            out["required_taints"] = sorted(self.required_taints)
        if self.preferred_taints:
            out["preferred_taints"] = dict(sorted(self.preferred_taints.items()))
        return out

    def describe(self) -> str:
        """A short human phrase for error messages."""
        parts = []
        if self.required_taints:
            parts.append("required " + ", ".join(sorted(self.required_taints)))
        if self.preferred_taints:
            parts.append(
                "preferred "
                + ", ".join(f"{t}={w:g}" for t, w in sorted(self.preferred_taints.items()))
            )
        return "; ".join(parts) or "no constraints"


def _constraint_taint(where: str, taint: object) -> None:
    if not isinstance(taint, str):
        raise ConstraintError(f"{where} entries must be strings, got {taint!r}")
    try:
        validate(taint, allow_reserved=True)
    except TaintError as exc:
        raise ConstraintError(f"{where}: {exc}") from None


def _string_list(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConstraintError("required_taints must be a JSON array of strings")
    return value


def _weight_map(value: object) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConstraintError("preferred_taints must be a JSON object of taint -> weight")
    out: dict[str, float] = {}
    for taint, weight in value.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ConstraintError(
                f"preferred taint {taint!r} has weight {weight!r}; weights must be numbers "
                "from -1 to 1"
            )
        try:
            out[taint] = float(weight)
        except OverflowError:  # a JSON integer too large for a float
            out[taint] = math.inf  # refused by the range check

    return out


def matches(worker_taints: Iterable[str], constraints: RoutingConstraints) -> bool:
    """Whether a worker holding ``worker_taints`` satisfies the hard constraints."""
    held = worker_taints if isinstance(worker_taints, frozenset | set) else set(worker_taints)
    return constraints.required_taints <= held


def preference(worker_taints: Iterable[str], constraints: RoutingConstraints) -> float:
    """Sum of the weights of the preferred taints the worker holds."""
    held = set(worker_taints)
    return sum(w for t, w in constraints.preferred_taints.items() if t in held)
