"""Pool policies in the discovery store: desired state at ``v1/pools/<name>``, revisioned.

The value is canonical JSON (keys sorted, compact) of ``{"policy": DOCUMENT, "retired":
[TAINT, ...]}``: the policy's document (``PoolPolicy.to_dict``) and the pool taints of the
versions it replaced that it no longer has. The leader strips retired taints from the
policy's workers (a policy that drops a pool must not leave that taint behind); they stay
retired until the policy is removed.

``apply_policy`` is the one write of a document: the policy is checked before anything is
read (``PoolPolicy``), then against the other stored policies (``refuse_overlaps``, and
``MAX_POLICIES`` for a new one), then
written with a compare-and-swap at the revision read (a create is create-only), so two
applies of one name never lose each other. Applying a document equal to the stored one
writes nothing and keeps the revision. ``set_paused`` and ``remove_policy`` are
compare-and-swaps too; a removal also deletes the leader's history of the policy. The
store has no transaction over two keys, so two applies of *different* overlapping
policies racing on two daemons can both pass the overlap check; the reconciler then
reconciles only the one whose name sorts first (``in_force``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from dynamod import jsoncodec
from dynamod.backoff import Backoff
from dynamod.errors import (
    ConflictError,
    InvalidInputError,
    KeyNotFoundError,
    PolicyNotFoundError,
    PoolPolicyError,
    RevisionMismatchError,
)
from dynamod.pool_results import ApplyKind, PolicyInfo
from dynamod.pools.history import history_key
from dynamod.pools.owners import required_field
from dynamod.pools.policy import POOLS_PREFIX, PoolPolicy, overlaps, refuse_overlaps
from dynamod.store import Entry, Store

log = logging.getLogger(__name__)

MAX_POLICIES: Final = 1000
"""Policies one store holds: a new one past it is refused at apply (every daemon plans
every policy)."""
CAS_ATTEMPTS: Final = 4
"""Compare-and-swap attempts of one apply, pause or resume before ``ConflictError``."""
BACKOFF_FIRST: Final = 0.005
BACKOFF_CAP: Final = 0.1
"""The back-off between those attempts (another daemon's write just won)."""
_NAME_CHARACTERS: Final = re.compile(r"[a-z0-9-]{1,63}")


@dataclass(frozen=True)
class StoredPolicy:
    """A policy as stored: the policy, its key's revision, its retired pool taints."""

    policy: PoolPolicy
    revision: int
    retired: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return self.policy.name

    def info(self) -> PolicyInfo:
        return PolicyInfo(
            self.policy.name, self.revision, self.policy.to_dict(), tuple(sorted(self.retired))
        )


def encode(policy: PoolPolicy, retired: Iterable[str] = ()) -> bytes:
    """The stored value of ``policy``: equal policies with equal retired taints give equal
    bytes."""
    body = {"policy": policy.to_dict(), "retired": sorted(set(retired))}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode(entry: Entry) -> StoredPolicy:
    """The policy stored in ``entry``; ``PoolPolicyError`` when it is not one (a value
    written past ``apply_policy``), naming the key."""
    try:
        body: Any = jsoncodec.read(entry.value, f"stored policy at {entry.key!r}")
        policy = PoolPolicy.from_dict(body["policy"])
        retired = frozenset(str(t) for t in body.get("retired", ()))
    except PoolPolicyError as exc:
        raise PoolPolicyError(f"stored policy at {entry.key!r} is refused: {exc}") from None
    except (InvalidInputError, ValueError, TypeError, KeyError) as exc:
        raise PoolPolicyError(
            f"stored policy at {entry.key!r} is not a policy record: {exc!r}"
        ) from None
    if entry.key != policy.key:
        raise PoolPolicyError(f"stored policy at {entry.key!r} is named {policy.name!r}")
    return StoredPolicy(policy, entry.revision, retired - policy.taints)


def name_of(key: str) -> str:
    """The policy name a key under ``v1/pools/`` holds."""
    return key.removeprefix(f"{POOLS_PREFIX}/")


async def list_policies(store: Store) -> list[StoredPolicy]:
    """Every readable stored policy, by name; an unreadable one is logged and left out."""
    entries, _ = await store.list(POOLS_PREFIX)
    return list(readable(entries))


def readable(entries: Iterable[Entry]) -> Iterable[StoredPolicy]:
    for entry in entries:
        try:
            yield decode(entry)
        except PoolPolicyError as exc:
            log.warning("%s; it is ignored until it is applied again", exc)


async def get_policy(store: Store, name: str) -> StoredPolicy:
    """The stored policy ``name``; ``PolicyNotFoundError`` when there is none."""
    entry = await store.get(f"{POOLS_PREFIX}/{name}") if _plausible(name) else None
    if entry is None:
        raise PolicyNotFoundError(name)
    return decode(entry)


async def apply_policy(
    store: Store, policy: PoolPolicy, *, dry_run: bool = False
) -> tuple[StoredPolicy, ApplyKind]:
    """Store ``policy`` (see the module docstring); what is stored now and what changed.
    With ``dry_run`` every check runs and nothing is written."""
    backoff = Backoff(BACKOFF_FIRST, BACKOFF_CAP)
    for _ in range(CAS_ATTEMPTS):
        stored = await list_policies(store)
        refuse_overlaps(policy, (s.policy for s in stored))
        old = next((s for s in stored if s.name == policy.name), None)
        if old is None and len(stored) >= MAX_POLICIES:
            raise PoolPolicyError(
                f"policy: the store holds {len(stored)} policies; the limit is {MAX_POLICIES} "
                f"(remove one, or merge policies, before applying {policy.name!r})"
            )
        if old is not None and old.policy == policy:
            return old, "unchanged"
        retired = set() if old is None else (old.retired | old.policy.taints) - policy.taints
        kind: ApplyKind = "created" if old is None else "changed"
        if dry_run:
            revision = 0 if old is None else old.revision
            return StoredPolicy(policy, revision, frozenset(retired)), kind
        expect = 0 if old is None else old.revision
        try:
            revision = await store.put(policy.key, encode(policy, retired), expect=expect)
        except (RevisionMismatchError, KeyNotFoundError):
            await backoff.wait()
            continue
        return StoredPolicy(policy, revision, frozenset(retired)), kind
    raise _conflict(policy.name, "apply")


async def set_paused(store: Store, name: str, paused: bool) -> tuple[StoredPolicy, bool]:
    """Pause or resume the stored policy ``name``; it as stored now, and whether this call
    changed it (pausing a paused policy writes nothing)."""
    backoff = Backoff(BACKOFF_FIRST, BACKOFF_CAP)
    for _ in range(CAS_ATTEMPTS):
        old = await get_policy(store, name)
        if old.policy.paused == paused:
            return old, False
        policy = replace(old.policy, paused=paused)
        try:
            revision = await store.put(policy.key, encode(policy, old.retired), expect=old.revision)
        except (RevisionMismatchError, KeyNotFoundError):
            await backoff.wait()
            continue
        return StoredPolicy(policy, revision, old.retired), True
    raise _conflict(name, "pause or resume")


async def remove_policy(store: Store, name: str) -> StoredPolicy:
    """Delete the stored policy ``name`` (at the revision read); what it was. Workers keep
    their taints."""
    old = await get_policy(store, name)
    try:
        await store.delete(old.policy.key, expect=old.revision)
    except KeyNotFoundError:
        raise PolicyNotFoundError(name) from None
    except RevisionMismatchError:
        raise _conflict(name, "remove") from None
    await store.delete(history_key(name))  # its history goes with it
    return old


def in_force(policies: Sequence[StoredPolicy]) -> tuple[list[StoredPolicy], dict[str, str]]:
    """The policies to reconcile, by name, and why each other one is not: a policy that
    overlaps one whose name sorts before it (which can only be stored by two applies racing)
    is left alone, with the reason. The policies chosen so far are indexed by the field
    each selector requires (``owners.required_field``), so a policy is compared only with
    those it could overlap: at a thousand policies of one model each, a few comparisons
    each, not a million in all."""
    chosen: list[StoredPolicy] = []
    conflicts: dict[str, str] = {}
    index = _ChosenIndex()
    for stored in sorted(policies, key=lambda s: s.name):
        clash = [c for c in index.candidates(stored.policy) if overlaps(c.policy, stored.policy)]
        if not clash:
            chosen.append(stored)
            index.add(stored)
            continue
        first = min(clash, key=lambda c: c.name)
        conflicts[stored.name] = (
            f"overlaps policy {first.name!r} (a shared pool taint on workers both selectors "
            f"can select), which is reconciled instead; change or remove one of them"
        )
    return chosen, conflicts


class _ChosenIndex:
    """Chosen policies by their required field and value; those requiring none apart."""

    def __init__(self) -> None:
        self.unkeyed: list[StoredPolicy] = []
        self.by_field: dict[str, dict[str, list[StoredPolicy]]] = {}

    def add(self, stored: StoredPolicy) -> None:
        key = required_field(stored.policy.match)
        if key is None:
            self.unkeyed.append(stored)
        else:
            self.by_field.setdefault(key[0], {}).setdefault(key[1], []).append(stored)

    def candidates(self, policy: PoolPolicy) -> Iterable[StoredPolicy]:
        """Every chosen policy that might overlap ``policy``: one keyed on a field that
        ``policy`` requires to hold another value cannot."""
        wanted = {t.kind: t.value for t in policy.match.terms if t.kind != "taint" and not t.negate}
        yield from self.unkeyed
        for name, groups in self.by_field.items():
            if name in wanted:
                yield from groups.get(wanted[name], ())
            else:
                for group in groups.values():
                    yield from group


def _plausible(name: str) -> bool:
    """Whether ``name`` can be a policy's name at all (a key segment): anything else is
    simply not found, never an invalid store key."""
    return _NAME_CHARACTERS.fullmatch(name) is not None


def _conflict(name: str, what: str) -> ConflictError:
    return ConflictError(
        f"{what} of pool policy {name!r} lost the compare-and-swap race {CAS_ATTEMPTS} times in "
        f"a row to concurrent writers; retry",
        attempts=CAS_ATTEMPTS,
    )
