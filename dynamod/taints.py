"""Taints: the grammar, normalization, generated topology taints and request constraints.

A taint is a routing label on a worker: any string Dynamo accepts (it checks only "a JSON
array of strings" and the reserved prefix), except what cannot be routed on safely. A
taint is refused when it

* is empty;
* is longer than ``MAX_TAINT_BYTES`` (1024 bytes, 1 KiB, of UTF-8);
* has leading or trailing whitespace (two taints that print alike must be equal);
* holds a control or invisible character: Unicode categories Cc (C0 and C1 controls, tab
  and newline included), Cf (zero-width characters, bidirectional overrides, the byte
  order mark), Cs (lone surrogates), Zl and Zp (line and paragraph separators), and the
  other default-ignorable characters (variation selectors, the combining grapheme joiner,
  Hangul fillers);
* starts with the reserved prefix ``dynamo.topology/``, or with something that reads as
  that prefix: in another case, in a Unicode compatibility form (fullwidth letters,
  mathematical alphanumerics, ``U+2024`` one dot leader) or with look-alike characters
  from other scripts (Cyrillic ``U+0430`` a, Greek ``U+03BF`` omicron, the division slash
  ``U+2215``, ...);
* reads as the operator's cordon ``dynamo.io/cordoned`` without being it, by the same
  reading (``DYNAMO.IO/cordoned``, a Cyrillic ``U+0441`` c), or is the cordon with a
  value (``dynamo.io/cordoned=no``): routers match the cordon exactly, so a taint an
  operator would read as it must not exist.

Conventional shapes such as ``capacity/fast``, ``pool=batch`` or
``dynamo.policy/version=run%2Fa:step%3A17`` are nothing special to the grammar; ``key_of``
reads a taint's key as everything before its first ``=``.

A worker's taints are a set, stored sorted and de-duplicated, so order never matters.
Taints under ``dynamo.topology/`` are generated from the record's ``topology_domains`` and
no caller may add or remove them. A ``TaintUpdate`` is one change to a worker's
caller-managed taints. Everything here is pure and synchronous, and works on strings alone
(``records.py`` applies taints to records).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from dynamod.errors import (
    ConstraintError,
    InvalidInputError,
    PermissionDeniedError,
    TaintError,
    TaintLimitError,
)

TOPOLOGY_PREFIX = "dynamo.topology/"
CORDONED = "dynamo.io/cordoned"
DRAINING = "dynamo.io/draining"
"""The drain: set with the cordon in one update (``dynamoctl workers drain``), lifted with it
(``uncordon``). It says the operator waits for the worker to finish what it has in flight
(its state is then ``draining``, then ``drained``: ``results.worker_state``)."""
DRAIN_TAINTS = (CORDONED, DRAINING)
"""What a drain adds, in one taint update; ``uncordon`` removes both (it ends a drain)."""
OPERATOR_TAINTS = frozenset(DRAIN_TAINTS)
"""Taints the operator owns: set and lifted through dynamod (``dynamoctl workers cordon``,
``drain``, ``uncordon``, ``taints``). A worker's own updates (its system route,
``update_model_taints``) keep them as they are: ``TaintUpdate.keeping``. The router sends a
worker holding one of them no request that does not require it."""
MAX_TAINT_BYTES = 1024
"""The length bound: a taint of more UTF-8 bytes is refused (1 KiB)."""
DYNAMO_MAX_WEIGHT = 3.4028234663852886e38
"""The largest preferred-taint weight NVIDIA Dynamo 1.6.1 takes: its weights are 32-bit
floats (``f32``), any finite one."""

_CONTROL = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
# Default-ignorable characters outside those categories: they print as nothing.
_INVISIBLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u3164\uffa0"
    + "".join(map(chr, range(0xFE00, 0xFE10)))
    + "".join(map(chr, range(0xE0100, 0xE01F0)))
)
# Characters that read as one of the reserved prefix's own ("dynamo.topology/") or the
# cordon's ("dynamo.io/cordoned") and that NFKC does not already fold into it: a subset of
# Unicode's confusables.txt for exactly those characters, plus the digits 0 and 1 (for o
# and l; i reads as l too, so both names are compared in that reading).
_LOOK_ALIKES = {
    **dict.fromkeys("\u0441\u03f2\u1d04\u2ca5", "c"),  # Cyrillic es, lunate sigma, ...
    **dict.fromkeys("\u0435\u04bd\u212e", "e"),  # Cyrillic ie, abkhasian che, estimated
    **dict.fromkeys("\u0433\u1d26\u2c85", "r"),  # Cyrillic ghe, small capital gamma, ...
    **dict.fromkeys("\u0501", "d"),  # Cyrillic komi de
    **dict.fromkeys("\u0443\u04af\u03b3\u028f", "y"),  # Cyrillic u, straight u; gamma
    **dict.fromkeys("\u0578\u057c", "n"),  # Armenian vo, ra
    **dict.fromkeys("\u0430\u0251\u03b1\u237a", "a"),  # Cyrillic a, Latin / Greek alpha
    **dict.fromkeys("\u043c", "m"),  # Cyrillic em
    **dict.fromkeys("0\u043e\u03bf\u0585\u1d0f\u03c3\u0966\u0ce6", "o"),
    **dict.fromkeys("\u3002\u0660\u06f0\u00b7\u2027", "."),  # ideographic stop, ...
    **dict.fromkeys("\u0442\u03c4", "t"),  # Cyrillic te, Greek tau
    **dict.fromkeys("\u0440\u03c1\u2ca3", "p"),  # Cyrillic er, Greek rho, Coptic ro
    **dict.fromkeys("1i|\u0131\u01c0\u04cf\u0406\u0456\u05c0", "l"),  # digit one, ...
    **dict.fromkeys("\u0261\u0581", "g"),  # script g, Armenian co
    **dict.fromkeys("\u2215\u2044\u29f8\u2571\u30ce\u4e3f\u3033", "/"),  # slashes
}
_RESERVED_LOOK = 2 * len(TOPOLOGY_PREFIX)
"""How much of a taint the look-alike check reads: enough for the prefix, NFKC's changes
in length included (it may compose two characters into one)."""
_CORDON_LOOK = 2 * len(CORDONED)


def validate(taint: str, *, allow_reserved: bool = False) -> str:
    """Return ``taint`` if a caller may name it, else raise ``TaintError`` naming the rule.

    With ``allow_reserved`` the exact ``dynamo.topology/`` prefix is accepted (routing
    constraints and selectors may name a topology taint; callers may never set one).
    Look-alikes of the prefix are refused either way: no worker can hold one.
    """
    if not taint:
        raise TaintError(taint, "is empty")
    if taint.startswith(TOPOLOGY_PREFIX):
        if allow_reserved:
            return _checked(taint)
        # Dynamo's own words, byte for byte.
        raise TaintError(taint, f"uses reserved prefix '{TOPOLOGY_PREFIX}'")
    _checked(taint)
    if _skeleton(taint[:_RESERVED_LOOK]).startswith(TOPOLOGY_PREFIX):
        raise TaintError(
            taint,
            f"looks like reserved prefix '{TOPOLOGY_PREFIX}' (another case, a Unicode "
            "compatibility form or a look-alike character); topology taints are generated "
            "from the worker's topology_domains",
        )
    _refuse_cordon_look_alike(taint)
    return taint


def removable(taint: str) -> str:
    """Return ``taint`` if a caller may remove it by its exact value: any taint a worker
    can hold, those outside our grammar included (NVIDIA Dynamo's route takes any string:
    ``" padded "``, ``""``, a tab), within the length bound; never a generated one."""
    if taint.startswith(TOPOLOGY_PREFIX):
        raise TaintError(taint, f"uses reserved prefix '{TOPOLOGY_PREFIX}'")
    size = len(taint.encode("utf-8", "surrogatepass"))
    if size > MAX_TAINT_BYTES:
        raise TaintError(
            taint, f"is {size} bytes long (UTF-8); the limit is {MAX_TAINT_BYTES} bytes"
        )
    return taint


def _refuse_cordon_look_alike(taint: str) -> None:
    key = key_of(taint)
    if taint == CORDONED or len(key) > _CORDON_LOOK:
        return
    if _skeleton(key) == _CORDON_SKELETON:
        raise TaintError(
            taint,
            f"reads as the operator's cordon '{CORDONED}' (another case, a Unicode "
            "compatibility form, a look-alike character or a value) without being it; the "
            "cordon is set only as itself, through dynamod (dynamoctl workers cordon)",
        )


def _checked(taint: str) -> str:
    size = len(taint.encode("utf-8", "surrogatepass"))
    if size > MAX_TAINT_BYTES:
        raise TaintError(
            taint, f"is {size} bytes long (UTF-8); the limit is {MAX_TAINT_BYTES} bytes"
        )
    if taint != taint.strip():
        raise TaintError(taint, "has leading or trailing whitespace")
    for at, char in enumerate(taint):
        if char in _INVISIBLE or unicodedata.category(char) in _CONTROL:
            raise TaintError(
                taint,
                f"has control or invisible character U+{ord(char):04X} at position {at}; "
                "taints may not hold control, format or line-separator characters",
            )
    return taint


def _skeleton(text: str) -> str:
    """``text`` as it reads: compatibility forms folded, case folded, look-alikes mapped."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return "".join(_LOOK_ALIKES.get(c, c) for c in folded)


_CORDON_SKELETON = _skeleton(CORDONED)


def key_of(taint: str) -> str:
    """A taint's key, everything before its first ``=``: ``pool=batch`` → ``pool``."""
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
    ``remove`` also drops every taint whose key (``key_of``) is in ``keys``, and
    ``clear`` removes them all. Everything is checked when the update is built, before any
    read: a reserved or malformed taint raises ``TaintError``, ``add`` / ``remove`` need at
    least one taint. Duplicates collapse.
    """

    action: UpdateAction
    taints: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    kept: frozenset[str] = frozenset()
    """Taints this update leaves as they are (``keeping``)."""

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
        check = removable if self.action == "remove" else validate
        object.__setattr__(self, "taints", normalize(check(t) for t in self.taints))
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

    def keeping(self, taints: frozenset[str]) -> TaintUpdate:
        """This update, leaving ``taints`` as they are: a replace or clear that leaves a held
        one out keeps it; adding one, or removing one by name or key, raises
        ``PermissionDeniedError`` (nothing written). A worker's own updates keep the
        operator's taints this way (``OPERATOR_TAINTS``)."""
        return replace(self, kept=self.kept | taints)

    def apply(self, current: Iterable[str]) -> tuple[str, ...]:
        """The caller taints after this update, given the caller taints read just now.
        Linear in the taints held and named (sets throughout)."""
        held = set(current)
        if self.action == "add":
            after = held | set(self.taints)
        elif self.action == "remove":
            keys = set(self.keys)
            after = {t for t in held - set(self.taints) if key_of(t) not in keys}
        else:
            after = set(self.taints)
        if self.kept:
            after = self._keep(held, after)
        return normalize(after)

    def _keep(self, held: set[str], after: set[str]) -> set[str]:
        """``after`` with the kept taints as ``held`` has them. Adding one, or removing
        one by name or key, is refused; a replace or clear that leaves one out keeps it."""
        touched = (after - held) & self.kept
        if self.action == "remove":
            touched |= (held - after) & self.kept
        if touched:
            raise PermissionDeniedError(
                f"taint {min(touched)!r} is the operator's: only dynamod changes it "
                "(dynamoctl workers cordon / uncordon, drain); a worker's own taint updates "
                "keep it as it is"
            )
        return (after - self.kept) | (held & self.kept)


@dataclass(frozen=True)
class TaintLimits:
    """How many caller taints one worker may hold, and their total size (UTF-8 bytes, one
    separator each). The defaults keep a worker's record well inside etcd's request limit
    (1.5 MiB) and NATS's message limit (1 MiB) beside its model card."""

    count: int = 4096
    bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        if self.count < 1 or self.bytes < MAX_TAINT_BYTES:
            raise InvalidInputError(
                f"taint limits must allow at least one taint of {MAX_TAINT_BYTES} bytes, got "
                f"{self.count} taints and {self.bytes} bytes"
            )

    def check(self, before: tuple[str, ...], after: tuple[str, ...]) -> None:
        """Refuse (``TaintLimitError``, permanent) an update that leaves ``after`` over a
        limit and larger by it than ``before``: a set already over a lowered limit may
        still shrink."""
        for name, limit, measure in (
            ("taints", self.count, len),
            ("bytes of taints", self.bytes, _size),
        ):
            held, wanted = measure(before), measure(after)
            if wanted > limit and wanted > held:
                raise TaintLimitError(
                    f"the update would leave the worker {wanted} {name}; the limit is {limit} "
                    f"{name} per worker (the worker holds {held})"
                )


def _size(taints: tuple[str, ...]) -> int:
    return sum(len(t.encode("utf-8", "surrogatepass")) + 1 for t in taints)


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
    ``max_weight``: the largest weight, either way, accepted: 1 for dynamod's front; an
    NVIDIA Dynamo fleet's router takes any finite 32-bit float (``DYNAMO_MAX_WEIGHT``),
    and so does ``route explain`` there.
    """

    required_taints: frozenset[str] = frozenset()
    preferred_taints: Mapping[str, float] = field(default_factory=dict)
    max_weight: float = field(default=1.0, compare=False)

    def __post_init__(self) -> None:
        for taint in self.required_taints:
            _constraint_taint("required_taints", taint)
        bound = self.max_weight
        for taint, weight in self.preferred_taints.items():
            _constraint_taint("preferred_taints", taint)
            if not math.isfinite(weight) or not -bound <= weight <= bound:
                raise ConstraintError(
                    f"preferred taint {taint!r} has weight {weight}; weights must be from "
                    f"{-bound:g} to {bound:g}"
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
