"""Pool policies: the desired shares of pool taints over a set of workers, checked at apply.

A policy is a YAML or JSON document, stored canonical (``to_dict``, in ``stored.encode``)
at ``v1/pools/<name>`` beside the workers::

    name: interactive-split       # required: a DNS label, 1-63 of a-z 0-9 '-'
    selector: model=demo-llama    # required: dynamoctl's -l language; the workers it owns
    pools:                        # required: pool taint -> weight, two or more
      pool=fast: 40
      pool=slow: 60
    min_per_pool: 1               # workers each pool keeps while the fleet allows (0)
    max_moves: 2                  # at most this many moves ...
    move_interval: 60             # ... per this many seconds (60 when max_moves is set)
    spread_by: zone               # split each pool across dynamo.topology/zone= values
    paused: false                 # compute and report, write nothing, put no drift back
    elastic:                      # shares that follow demand (``elastic.py`` has the rules)
      target_in_flight: 2         # requests in flight per worker, for every pool; or a
                                  # map pool taint -> number (pools not named are not elastic)
      scale_down_after: 60        # seconds a pool's lower want must last before it shrinks (60)
      tolerance: 0.1              # a demand within this fraction of capacity moves nothing (0.1)

Every owned worker carries exactly one of the pool taints; the policy owns those taints on
those workers and nothing else (``plan.py`` turns weights into counts and moves).

A document is refused, with nothing stored, when it is over ``MAX_POLICY_BYTES`` (checked
before parsing), is not UTF-8 YAML or JSON holding one mapping (``document`` bounds the
parse: depth, aliases, expansion), repeats a key, has an unknown key or lacks a required
one, or when a field breaks its rule: a name that is not a DNS label; an empty selector
(it would own every worker), one that does not parse, or one naming the policy's own pool
taints (the set it selects would change with every move); fewer than two pools, or more
than ``MAX_POOLS``; a pool taint that is not a valid caller taint (``dynamod.taints``: the
reserved prefix and its look-alikes, padding, control characters, length) or that is an
operator taint (the cordon); a weight that is not a positive finite number (booleans are
not numbers); ``min_per_pool`` not a whole number >= 0; ``max_moves`` not a whole number
>= 1; ``move_interval`` not a positive finite number of seconds, or given without
``max_moves``; ``spread_by`` not a topology domain name; ``paused`` not a boolean;
``elastic`` not a mapping, with an unknown key or without ``target_in_flight``, a target
that is not a positive finite number, a map of targets that is empty or names a pool the
policy does not have, ``scale_down_after`` not a finite number of seconds >= 0,
``tolerance`` not a number from 0 up to (not including) 1, or ``elastic`` beside
``spread_by`` (elastic pools do not support it). Every refusal is a ``PoolPolicyError``
whose message starts with the field (``elastic.tolerance`` inside the section), then the
rule and the offending value. At apply, a ``spread_by`` over more than
``MAX_SPREAD_CELLS`` pools times domain values (among the workers selected then) is
refused too (``spread_refusal``); a plan that meets more later moves nothing and says why
(``plan.Plan.refused``).

Two policies conflict (``overlaps``) when they share a pool taint and their selectors
could both select one worker. Selectors are conjunctions of terms, and two are treated as
disjoint only when their terms together are provably unsatisfiable; anything else might
overlap and is refused at apply (``refuse_overlaps``). See ``disjoint`` for the rules.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, TypeGuard

from dynamod import jsoncodec
from dynamod.errors import PoolPolicyError, SelectorError, TaintError, shown
from dynamod.pools import document
from dynamod.selectors import Selector, Term
from dynamod.selectors import parse as parse_selector
from dynamod.taints import OPERATOR_TAINTS, TOPOLOGY_PREFIX, topology_taint, validate

MAX_POLICY_BYTES: Final = 64 * 1024
"""A policy document of more bytes (UTF-8) is refused before it is parsed."""
MAX_POOLS: Final = 256
"""Pool taints one policy may name."""
MAX_SPREAD_CELLS: Final = 1024
"""Pools times values of the ``spread_by`` domain among the workers a policy selects: what a
plan's spread costs (1,024 cells plan in 10-70 ms at 1,000 workers; 2,000,000 took 24 s)."""
POOLS_PREFIX: Final = "v1/pools"
"""Where policies live in the store, beside ``v1/workers``: ``v1/pools/<name>``."""
DEFAULT_MOVE_INTERVAL: Final = 60.0
"""Seconds of ``move_interval`` when a policy sets ``max_moves`` alone."""
KNOWN_KEYS: Final = (
    "name",
    "selector",
    "pools",
    "min_per_pool",
    "max_moves",
    "move_interval",
    "spread_by",
    "paused",
    "elastic",
)
ELASTIC_KEYS: Final = ("target_in_flight", "scale_down_after", "tolerance")
REQUIRED_KEYS: Final = ("name", "selector", "pools")
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")

Weight = int | float


@dataclass(frozen=True)
class Elastic:
    """A policy's ``elastic`` section: the pools whose shares follow their demand
    (``elastic.py`` turns demand into wanted workers and those into an allotment).

    ``target_in_flight`` maps each elastic pool's taint to the requests in flight per
    worker that pool should hold, sorted and read-only; a pool it does not name is not
    elastic and takes what the elastic pools leave, by weight. ``__post_init__`` checks
    the numbers; the pool names are checked against the policy by ``PoolPolicy`` (a
    document's single number becomes this map there)."""

    target_in_flight: Mapping[str, float] = field(hash=False)
    scale_down_after: float = 60.0
    """Seconds a pool's lower want must last before the pool shrinks."""
    tolerance: float = 0.1
    """Like an HPA's: a demand within this fraction of what the current size holds moves
    nothing."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_in_flight", _check_targets(self.target_in_flight))
        object.__setattr__(self, "scale_down_after", _check_scale_down(self.scale_down_after))
        object.__setattr__(self, "tolerance", _check_tolerance(self.tolerance))

    def target(self, pool: str) -> float | None:
        """``pool``'s requests in flight per worker; None: the pool is not elastic (it
        takes what is left, by weight)."""
        return self.target_in_flight.get(pool)

    def to_dict(self) -> dict[str, object]:
        """The canonical section: always the map, with both numbers."""
        return {
            "target_in_flight": dict(self.target_in_flight),
            "scale_down_after": self.scale_down_after,
            "tolerance": self.tolerance,
        }


@dataclass(frozen=True)
class PoolPolicy:
    """One policy, valid by construction: ``__post_init__`` applies every rule of the
    module docstring, so a ``PoolPolicy`` built in code is held to the same rules as a
    parsed document. ``pools`` is kept sorted by taint, read-only; a float weight that is
    a whole number becomes an int, so equal policies have equal ``to_json``."""

    name: str
    selector: str
    pools: Mapping[str, Weight] = field(hash=False)
    min_per_pool: int = 0
    max_moves: int | None = None
    move_interval: float | None = None
    spread_by: str | None = None
    paused: bool = False
    elastic: Elastic | None = None
    """Shares that follow demand; None: the weights alone decide."""
    match: Selector = field(init=False, repr=False, compare=False)
    """``selector``, parsed."""

    def __post_init__(self) -> None:
        _check_name(self.name)
        pools = _check_pools(self.pools)
        object.__setattr__(self, "pools", pools)
        object.__setattr__(self, "match", _check_selector(self.selector, pools))
        _check_whole("min_per_pool", self.min_per_pool, least=0, unit="workers")
        if self.max_moves is not None:
            _check_whole("max_moves", self.max_moves, least=1, unit="moves")
        if self.move_interval is not None:
            object.__setattr__(self, "move_interval", _check_interval(self))
        if self.spread_by is not None:
            _check_domain(self.spread_by)
        if not isinstance(self.paused, bool):
            raise PoolPolicyError(f"paused: must be true or false, got {_show(self.paused)}")
        if self.elastic is not None:
            object.__setattr__(self, "elastic", _check_elastic(self))

    @classmethod
    def parse(cls, text: str | bytes) -> PoolPolicy:
        """A policy from a YAML or JSON document (JSON when it starts with ``{``)."""
        return cls.from_dict(read_document(text))

    @classmethod
    def from_dict(cls, doc: object) -> PoolPolicy:
        """A policy from a parsed document: unknown and missing keys are refused here, every
        value's rule in the constructor."""
        if not isinstance(doc, Mapping):
            raise PoolPolicyError(
                f"policy: the document must be a mapping of keys ({', '.join(REQUIRED_KEYS)}, "
                f"...), got {_show(doc)}"
            )
        _refuse_unknown("policy", doc, KNOWN_KEYS)
        missing = [key for key in REQUIRED_KEYS if key not in doc]
        if missing:
            raise PoolPolicyError(
                f"policy: missing key {missing[0]!r} (required: {', '.join(REQUIRED_KEYS)})"
            )
        fields: dict[str, Any] = dict(doc)
        return cls(**fields)

    @property
    def key(self) -> str:
        """The policy's store key."""
        return f"{POOLS_PREFIX}/{self.name}"

    @property
    def taints(self) -> frozenset[str]:
        """The pool taints this policy owns on its workers."""
        return frozenset(self.pools)

    @property
    def interval(self) -> float | None:
        """Seconds of the move budget's window; None without a budget."""
        if self.max_moves is None:
            return None
        return DEFAULT_MOVE_INTERVAL if self.move_interval is None else self.move_interval

    def to_dict(self) -> dict[str, object]:
        """The document: required keys, and each optional key that differs from its default."""
        doc: dict[str, object] = {
            "name": self.name,
            "selector": self.selector,
            "pools": dict(self.pools),
        }
        optional = {
            "min_per_pool": self.min_per_pool or None,
            "max_moves": self.max_moves,
            "move_interval": self.move_interval,
            "spread_by": self.spread_by,
            "paused": self.paused or None,
            "elastic": None if self.elastic is None else self.elastic.to_dict(),
        }
        doc.update((key, value) for key, value in optional.items() if value is not None)
        return doc

    def to_json(self) -> bytes:
        """The canonical form to store: compact JSON, keys sorted. Equal policies give equal
        bytes, so applying the same document twice writes nothing new."""
        return jsoncodec.canonical(self.to_dict())


def spread_refusal(policy: PoolPolicy, domains: int) -> str:
    """Why ``policy`` cannot be spread over ``domains`` values of its ``spread_by`` domain
    (``MAX_SPREAD_CELLS``); ``""`` when it can, or has no ``spread_by``."""
    cells = len(policy.pools) * domains
    if policy.spread_by is None or cells <= MAX_SPREAD_CELLS:
        return ""
    return (
        f"spread_by: {len(policy.pools)} pools over {domains} values of "
        f"{TOPOLOGY_PREFIX}{policy.spread_by} among the workers selected is {cells} cells; "
        f"the limit is {MAX_SPREAD_CELLS} (pools times domain values): use fewer pools or a "
        "coarser domain"
    )


def overlaps(a: PoolPolicy, b: PoolPolicy) -> bool:
    """Whether ``a`` and ``b`` conflict: a shared pool taint on workers both could select."""
    return bool(a.taints & b.taints) and not disjoint(a.match, b.match)


def refuse_overlaps(policy: PoolPolicy, others: Iterable[PoolPolicy]) -> None:
    """Raise ``PoolPolicyError`` when ``policy`` conflicts with another stored policy (one
    of the same name is the policy it replaces, so it is skipped)."""
    for other in others:
        if other.name != policy.name and overlaps(policy, other):
            both = sorted(policy.taints & other.taints)
            shared = ", ".join(repr(t) for t in both) + (" is" if len(both) == 1 else " are")
            raise PoolPolicyError(
                f"pools: {shared} also owned by policy {other.name!r}, whose selector "
                f"{other.selector!r} can select the same workers as {policy.selector!r}; "
                "use other pool taints, or selectors that exclude each other (such as "
                "different model= values)"
            )


def disjoint(a: Selector, b: Selector) -> bool:
    """Whether no worker can match both selectors, provably. True only when the terms of
    both together contradict themselves:

    * a taint both required and refused (``t`` and ``!t``);
    * one field required to equal two values (``model=a``, ``model=b``), or to equal and
      differ from one value (``model=a``, ``model!=a``);
    * two required topology taints of one domain with different values
      (``dynamo.topology/zone=a``, ``dynamo.topology/zone=b``): a worker holds one value
      per domain. Only taints with a single ``=`` after the prefix count, since
      ``zone=a=b`` could be domain ``zone`` or ``zone=a``.

    Otherwise some worker could match both (taints are free, fields are single-valued), so
    the answer is False: unsure means overlapping, which is the safe side at apply.
    """
    terms = (*a.terms, *b.terms)
    return _taints_contradict(terms) or _fields_contradict(terms) or _zones_contradict(terms)


def _taints_contradict(terms: tuple[Term, ...]) -> bool:
    held = {t.value for t in terms if t.kind == "taint" and not t.negate}
    return any(t.kind == "taint" and t.negate and t.value in held for t in terms)


def _fields_contradict(terms: tuple[Term, ...]) -> bool:
    equal: dict[str, set[str]] = {}
    for term in terms:
        if term.kind != "taint" and not term.negate:
            equal.setdefault(term.kind, set()).add(term.value)
    if any(len(values) > 1 for values in equal.values()):
        return True
    return any(t.negate and t.value in equal.get(t.kind, ()) for t in terms if t.kind != "taint")


def _zones_contradict(terms: tuple[Term, ...]) -> bool:
    value_of: dict[str, str] = {}
    for term in terms:
        rest = term.value.removeprefix(TOPOLOGY_PREFIX)
        if term.kind != "taint" or term.negate or rest == term.value or rest.count("=") != 1:
            continue
        domain, _, value = rest.partition("=")
        if value_of.setdefault(domain, value) != value:
            return True
    return False


def read_document(text: str | bytes) -> object:
    """A document's one value, not yet checked as a policy: over ``MAX_POLICY_BYTES`` it is
    refused before it is parsed, and parsing is bounded (``document``). Seconds of CPU at
    most, not microseconds: call it off the event loop."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if len(data) > MAX_POLICY_BYTES:
        raise PoolPolicyError(
            f"policy: the document is {len(data)} bytes; the limit is {MAX_POLICY_BYTES} bytes"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PoolPolicyError(f"policy: the document is not UTF-8 text: {exc}") from None
    return document.load(text)


def name_in(doc: object) -> str:
    """The policy name a parsed document gives, when it gives a valid one; else ``""``
    (for the audit line of a refused document)."""
    name = doc.get("name") if isinstance(doc, Mapping) else None
    return name if isinstance(name, str) and _NAME.fullmatch(name) else ""


def _refuse_unknown(where: str, keys: Iterable[object], known: tuple[str, ...]) -> None:
    unknown = [key for key in keys if key not in known]
    if unknown:
        listed = ", ".join(known)
        raise PoolPolicyError(f"{where}: unknown key {_show(unknown[0])} (known: {listed})")


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise PoolPolicyError(f"name: must be a string, got {_show(name)}")
    if not _NAME.fullmatch(name):
        raise PoolPolicyError(
            f"name: {shown(name, 100)} must be 1 to 63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit (a DNS label)"
        )


def _check_selector(text: object, pools: Mapping[str, Weight]) -> Selector:
    if not isinstance(text, str):
        raise PoolPolicyError(f"selector: must be a string, got {_show(text)}")
    try:
        selector = parse_selector(text)
    except SelectorError as exc:
        raise PoolPolicyError(f"selector: {exc}") from None
    if not selector:
        raise PoolPolicyError(
            "selector: must not be empty (it would own every worker of every model); name "
            "the workers, e.g. model=NAME"
        )
    for term in selector.terms:
        if term.kind == "taint" and term.value in pools:
            raise PoolPolicyError(
                f"selector: term {shown(term.value, 100)} names one of the policy's own pool "
                "taints; the workers it selects would change as the policy moves them"
            )
    return selector


def _check_pools(pools: object) -> Mapping[str, Weight]:
    if not isinstance(pools, Mapping):
        raise PoolPolicyError(
            f"pools: must be a mapping of pool taint to weight, got {_show(pools)}"
        )
    if len(pools) < 2:
        raise PoolPolicyError(
            f"pools: needs at least two pool taints, got {len(pools)} ({_show(list(pools))})"
        )
    if len(pools) > MAX_POOLS:
        raise PoolPolicyError(
            f"pools: names {len(pools)} pool taints; the limit is {MAX_POOLS} per policy"
        )
    checked = {_check_taint(taint): _check_weight(taint, weight) for taint, weight in pools.items()}
    return MappingProxyType(dict(sorted(checked.items())))


def _check_taint(taint: object) -> str:
    if not isinstance(taint, str):
        raise PoolPolicyError(f"pools: taint {_show(taint)} must be a string")
    try:
        validate(taint)
    except TaintError as exc:
        raise PoolPolicyError(f"pools: {exc}") from None
    if taint in OPERATOR_TAINTS:
        raise PoolPolicyError(
            f"pools: taint {taint!r} is the operator's (set and lifted by dynamoctl workers "
            "cordon / uncordon); a policy cannot own it"
        )
    return taint


def _check_weight(taint: str, weight: object) -> Weight:
    if not _positive(weight):
        raise PoolPolicyError(
            f"pools: weight of {shown(taint, 100)} must be a positive number, got {_show(weight)}"
        )
    assert isinstance(weight, int | float)  # _positive said so
    return _whole_if_integral(weight)


def _check_whole(field_name: str, value: object, *, least: int, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise PoolPolicyError(
            f"{field_name}: must be a whole number of {unit}, {least} or more, got {_show(value)}"
        )


def _check_interval(policy: PoolPolicy) -> Weight:
    seconds: object = policy.move_interval
    if not _positive(seconds):
        raise PoolPolicyError(
            f"move_interval: must be a positive number of seconds, got {_show(seconds)}"
        )
    if policy.max_moves is None:
        raise PoolPolicyError(
            "move_interval: applies only with max_moves (at most max_moves moves per "
            "move_interval seconds); add max_moves or remove move_interval"
        )
    assert isinstance(seconds, int | float)  # _positive said so
    return _whole_if_integral(seconds)


def _check_elastic(policy: PoolPolicy) -> Elastic:
    """The ``elastic`` section as an ``Elastic`` over the policy's pools: a document's
    mapping is read here (a single target becomes one per pool), an ``Elastic`` built in
    code is checked alike."""
    section: object = policy.elastic
    if isinstance(section, Elastic):
        section = section.to_dict()
    if not isinstance(section, Mapping):
        raise PoolPolicyError(
            f"elastic: must be a mapping of keys ({', '.join(ELASTIC_KEYS)}), got {_show(section)}"
        )
    _refuse_unknown("elastic", section, ELASTIC_KEYS)
    if "target_in_flight" not in section:
        raise PoolPolicyError(
            "elastic: missing key 'target_in_flight' (the requests in flight per worker a "
            "pool should hold: one number for every pool, or a map pool taint -> number)"
        )
    if policy.spread_by is not None:
        raise PoolPolicyError(
            f"elastic: elastic pools do not support spread_by (spread_by is "
            f"{_show(policy.spread_by)}); remove spread_by or elastic"
        )
    fields = dict(section)
    fields["target_in_flight"] = _targets_of(fields["target_in_flight"], policy.pools)
    return Elastic(**fields)


def _targets_of(targets: object, pools: Mapping[str, Weight]) -> object:
    """A document's ``target_in_flight``: one number for every pool, or a map whose taints
    are all the policy's (its numbers are checked by ``Elastic``)."""
    if not isinstance(targets, Mapping):
        if not _positive(targets):
            raise PoolPolicyError(
                "elastic.target_in_flight: must be a positive number of requests in flight "
                f"per worker, or a map of pool taint to one, got {_show(targets)}"
            )
        return dict.fromkeys(pools, targets)
    for taint in targets:
        if taint not in pools:
            raise PoolPolicyError(
                f"elastic.target_in_flight: names {_show(taint, 100)}, which is not a pool of "
                f"this policy (pools: {', '.join(repr(p) for p in pools)})"
            )
    return targets


def _check_targets(targets: object) -> Mapping[str, Weight]:
    if not isinstance(targets, Mapping):
        raise PoolPolicyError(
            "elastic.target_in_flight: must be a map of pool taint to requests in flight per "
            f"worker, got {_show(targets)}"
        )
    if not targets:
        raise PoolPolicyError(
            "elastic.target_in_flight: the map names no pool; name at least one pool taint, "
            "or give one number for every pool"
        )
    checked: dict[str, Weight] = {}
    for taint, target in targets.items():
        if not isinstance(taint, str):
            raise PoolPolicyError(
                f"elastic.target_in_flight: taint {_show(taint)} must be a string"
            )
        if not _positive(target):
            raise PoolPolicyError(
                f"elastic.target_in_flight: target of {shown(taint, 100)} must be a positive "
                f"number of requests in flight per worker, got {_show(target)}"
            )
        assert isinstance(target, int | float)  # _positive said so
        checked[taint] = _whole_if_integral(target)
    return MappingProxyType(dict(sorted(checked.items())))


def _check_scale_down(seconds: object) -> Weight:
    if not _finite(seconds) or seconds < 0:
        raise PoolPolicyError(
            f"elastic.scale_down_after: must be a number of seconds, 0 or more, got "
            f"{_show(seconds)}"
        )
    return _whole_if_integral(seconds)


def _check_tolerance(fraction: object) -> Weight:
    if not _finite(fraction) or not 0 <= fraction < 1:
        raise PoolPolicyError(
            "elastic.tolerance: must be a fraction from 0 up to (not including) 1, got "
            f"{_show(fraction)}"
        )
    return _whole_if_integral(fraction)


def _check_domain(domain: object) -> None:
    """A topology domain name as workers hold it: ``dynamo.topology/<domain>=<value>``."""
    rule = (
        "spread_by: must be a topology domain name such as 'zone' (workers hold it as "
        f"{TOPOLOGY_PREFIX}zone=VALUE)"
    )
    if not isinstance(domain, str) or not domain or domain != domain.strip() or "=" in domain:
        raise PoolPolicyError(f"{rule}, got {_show(domain)}")
    try:
        validate(topology_taint(domain, "v"), allow_reserved=True)
    except TaintError as exc:
        raise PoolPolicyError(f"{rule}: {exc}") from None


def _positive(number: object) -> bool:
    """A positive finite int or float; a bool is not a number here, an int of any size is."""
    return _finite(number) and number > 0


def _finite(number: object) -> TypeGuard[int | float]:
    """A finite int or float; a bool is not a number here, an int of any size is."""
    if isinstance(number, bool) or not isinstance(number, int | float):
        return False
    return not isinstance(number, float) or math.isfinite(number)


def _whole_if_integral(number: int | float) -> Weight:
    """``40.0`` -> ``40``: one canonical form for equal numbers."""
    if isinstance(number, float) and number.is_integer() and abs(number) < 2**53:
        return int(number)
    return number


def _show(value: object, limit: int = 200) -> str:
    """A value as a message shows it: a bounded prefix of its repr (``document.brief``)."""
    return document.brief(value, limit)
