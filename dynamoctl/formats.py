"""What each command shows: the API's dataclasses turned into table rows and into the JSON
objects of ``-o json`` / ``-o yaml``. Pure functions; no I/O.

The JSON shapes are an interface for scripts: keys are only ever added. A worker object has
at least ``id``, ``model``, ``address``, ``taints`` (the complete sorted set the router
matches on, the generated ``dynamo.topology/`` taints included), ``caller_taints`` and
``generated_taints`` (that set split by who manages it), ``topology`` (domain → value; it
generates the reserved taints), ``revision`` and ``state`` (``ready``, ``cordoned``,
``draining``, ``drained``, ``unhealthy``). Events carry the same three lists, and a
change's ``before`` / ``after`` are complete sets too (``caller_before`` /
``caller_after`` the caller-managed part). Tables show the complete set; the reserved
prefix marks the generated taints, since no caller can set one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dynamod.taints import caller_taints

if TYPE_CHECKING:
    from dynamod.reports import CandidateInfo, EventInfo, ExplainInfo, StatusInfo
    from dynamod.results import UpdateOutcome, WorkerInfo

NONE = "<none>"
SHORT_ID = 8  # dynamod.results.ID_PREFIX; not imported, so that --help loads no model code

WORKER_HEADERS = ("ID", "MODEL", "ADDRESS", "TAINTS", "STATE", "LOAD", "AGE")
WORKER_WIDE_HEADERS = (
    "ID", "MODEL", "ADDRESS", "TAINTS", "TOPOLOGY", "STATE", "LOAD", "REVISION", "MDCSUM", "AGE",
)  # fmt: skip


def short_ids(ids: Iterable[str], minimum: int = SHORT_ID) -> dict[str, str]:
    """Each id → its shortest prefix of at least ``minimum`` characters that no other id
    in ``ids`` shares (the daemon accepts any unique prefix)."""
    unique = sorted(set(ids))
    length = id_length(unique, minimum)
    return {i: i[:length] for i in unique}


def id_length(ids: Iterable[str], minimum: int = SHORT_ID) -> int:
    """``results.id_prefix_length``: the shortest prefix, at least ``minimum`` long, that
    no two of ``ids`` share."""
    from dynamod.results import id_prefix_length

    return id_prefix_length(ids, minimum)


def age(seconds: float) -> str:
    """kubectl-style: 45s, 3m12s, 47m, 5h20m, 9h, 3d4h, 12d."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return f"{m}m{s % 60}s"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m"
    if d < 2:
        return f"{h}h"
    return f"{d}d{h % 24}h" if d < 8 else f"{d}d"


UNKNOWN = "-"
"""What a table shows for a value a worker does not report (an NVIDIA Dynamo worker's
start time, pid and version)."""


def started_age(started_at: float, now: float | None = None) -> str:
    if started_at <= 0:
        return UNKNOWN
    return age((time.time() if now is None else now) - started_at)


def joined(items: Sequence[str]) -> str:
    return ",".join(items) if items else NONE


def taints_text(taints: Sequence[str]) -> str:
    """A table's taints: comma-separated, each odd one quoted (``shown_taint``)."""
    return joined([shown_taint(t) for t in taints])


_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def shown_taint(taint: str) -> str:
    """A taint as ``ls`` shows an odd file name: as it is when it reads plainly, else in
    shell quotes, so that it can be told apart and pasted back (``taints rm ID ' a '``):
    ``' padded '``, ``''``, ``$'\\t'``. NVIDIA Dynamo takes taints our grammar refuses
    (``dynamod.taints.validate``): whitespace around them, empty ones, control characters;
    a comma or a quote would make a list of them ambiguous."""
    if taint and taint == taint.strip() and taint.isprintable() and not set(taint) & set(",'\""):
        return taint
    if taint.isprintable():
        return "'" + taint.replace("'", "'\\''") + "'"
    return "$'" + "".join(_escaped(c) for c in taint) + "'"


def _escaped(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else (f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    )


def topology_text(domains: dict[str, str]) -> str:
    return joined([f"{k}={v}" for k, v in sorted(domains.items())])


def load_text(info: WorkerInfo) -> str:
    """The router's in-flight count, then what the engine reports when it reports:
    ``2 (run 3, wait 1, kv 12%)``, or ``2 (unhealthy)``."""
    own = str(info.load.active_requests)
    engine = info.engine
    if engine is None:
        return own
    if not engine.healthy:
        return f"{own} (unhealthy)"
    return f"{own} (run {engine.running}, wait {engine.waiting}, kv {engine.kv_usage:.0%})"


def engine_text(info: WorkerInfo) -> str:
    """``workers get``: the engine's own report, in words."""
    engine = info.engine
    if engine is None:
        return NONE
    health = "healthy" if engine.healthy else f"unhealthy: {engine.reason}"
    return (
        f"{engine.running} running, {engine.waiting} waiting, KV {engine.kv_usage:.1%} "
        f"({engine.kv_blocks_used} of {engine.kv_blocks_total} blocks), {health}, "
        f"from {engine.source}"
    )


def card_sum(info: WorkerInfo, known: dict[int, str]) -> str:
    """The worker's mdcsum, hashed once per model card object in ``known``: the workers of a
    listing that share a card share its object (``convert.worker_from_pb``)."""
    card = info.record.model_card
    found = known.get(id(card))
    if found is None:
        found = known[id(card)] = info.mdcsum
    return found


def worker_row(
    info: WorkerInfo, short: str, wide: bool, now: float, mdcsum: str | None = None
) -> list[str]:
    record = info.record
    domains = dict(record.runtime_config.topology_domains)
    start = [short, record.model, record.address, taints_text(info.taints)]
    when = started_age(record.started_at, now)
    state = str(info.state)
    if not wide:
        return [*start, state, load_text(info), when]
    summed = info.mdcsum if mdcsum is None else mdcsum
    if info.state_reason:
        state = f"{state} ({info.state_reason})"
    extra = [topology_text(domains), state, load_text(info), str(info.revision), summed[:12]]
    return [*start, *extra, when]


def worker_rows(
    infos: Sequence[WorkerInfo], wide: bool, id_length: int | None = None
) -> list[list[str]]:
    """Table rows; ids cut to ``id_length`` (the daemon's, unique over a whole streamed
    listing) or to the shortest unique prefix among ``infos``."""
    if id_length is None:
        shorts = short_ids(i.id for i in infos)
    else:
        shorts = {i.id: i.id[:id_length] for i in infos}
    now = time.time()
    sums: dict[int, str] = {}
    return [
        worker_row(i, shorts[i.id], wide, now, card_sum(i, sums) if wide else None) for i in infos
    ]


def worker_object(
    info: WorkerInfo, mdcsum: str | None = None, card: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON object of a worker; ``mdcsum`` and its ``card``'s JSON when already known
    (``card_sum``; a listing shares one dict among the workers of one card)."""
    record = info.record
    load = info.load
    return {
        "id": info.id,
        "model": record.model,
        "address": record.address,
        **taint_lists(info),
        "topology": dict(sorted(record.runtime_config.topology_domains.items())),
        "revision": info.revision,
        "state": str(info.state),
        "state_reason": info.state_reason,
        "mdcsum": info.mdcsum if mdcsum is None else mdcsum,
        "key": info.key,
        "namespace": record.namespace,
        "component": record.component,
        "endpoint": record.endpoint,
        "system_address": record.system_address,
        "host": record.host,
        "pid": record.pid,
        "version": record.version,
        "started_at": record.started_at,
        "load": {
            "active_requests": load.active_requests,
            "active_prompt_tokens": load.prefill_tokens,
            "active_kv_blocks": load.kv_blocks,
        },
        "model_card": record.model_card.to_json() if card is None else card,
        "engine": None if info.engine is None else info.engine.to_json(),
        **_dynamo(record.extra, info.key, info.id),
    }


DYNAMO_CARDS = "v1/mdc/"
"""Where an NVIDIA Dynamo worker's card is: the key it is shown by."""


def _dynamo(extra: Mapping[str, Any], key: str = "", ident: str = "") -> dict[str, Any]:
    """An NVIDIA Dynamo worker's own part of a record (its card's key, its instance id in
    decimal) or of a model card (its LoRA adapters), when it is one. A listing carries
    no record, only the key: its card's key, and the id in decimal is the hex id's
    number (``store.dynamo.keys``)."""
    found = extra.get("dynamo")
    if isinstance(found, dict):
        return {"dynamo": found}
    if key.startswith(DYNAMO_CARDS) and ident:
        try:
            return {"dynamo": {"card_key": key, "instance_id": str(int(ident, 16))}}
        except ValueError:
            return {}
    return {}


def worker_details(info: WorkerInfo) -> list[tuple[str, str]]:
    """``workers get``: one worker, described field by field."""
    record = info.record
    card = record.model_card
    return [
        ("ID", info.id),
        ("Model", record.model),
        ("Address", record.address),
        ("System address", record.system_address or NONE),
        ("Taints", taints_text(info.taints)),
        ("Generated", taints_text(info.generated_taints)),
        ("Topology", topology_text(dict(record.runtime_config.topology_domains))),
        ("Revision", str(info.revision)),
        ("State", f"{info.state} ({info.state_reason})" if info.state_reason else str(info.state)),
        ("Key", info.key),
        ("Host", record.host or UNKNOWN)
        if not record.pid
        else ("Host", f"{record.host or UNKNOWN} (pid {record.pid})"),
        ("Version", record.version or UNKNOWN),
        ("Age", started_age(record.started_at)),
        ("Load", f"{info.load.active_requests} requests, {info.load.kv_blocks} KV blocks"),
        ("Engine load", engine_text(info)),
        ("Engine", card.engine),
        ("KV blocks", f"{card.total_kv_blocks} of {card.kv_block_size} tokens"),
        ("Context length", str(card.context_length)),
        ("Mdcsum", info.mdcsum),
        *_dynamo_details(record.extra),
    ]


def _dynamo_details(extra: Mapping[str, Any]) -> list[tuple[str, str]]:
    found = _dynamo(extra).get("dynamo")
    if found is None:
        return []
    loras = [str(name) for name in found.get("loras") or []]
    count = found.get("lora_count", len(loras))
    beyond = count - len(loras) if isinstance(count, int) else 0
    more = f" (and {beyond} more)" if beyond > 0 else ""
    return [
        ("Dynamo card", str(found.get("card_key", NONE))),
        ("Dynamo id", str(found.get("instance_id", NONE))),
        ("LoRA adapters", joined(loras) + more),
    ]


def change_text(added: Sequence[str], removed: Sequence[str]) -> str:
    """``+capacity/fast -pool=slow``, or ``unchanged``."""
    parts = [f"+{shown_taint(t)}" for t in added] + [f"-{shown_taint(t)}" for t in removed]
    return " ".join(parts) if parts else "unchanged"


def caller_part(taints: Sequence[str]) -> list[str]:
    return list(caller_taints(taints))


def taint_lists(info: WorkerInfo) -> dict[str, list[str]]:
    """``taints`` (the complete set), ``caller_taints`` and ``generated_taints``."""
    return {
        "taints": list(info.taints),
        "caller_taints": list(info.caller_taints),
        "generated_taints": list(info.generated_taints),
    }


def change_object(change: UpdateOutcome, dry_run: bool) -> dict[str, Any]:
    error = change.error
    return {
        "id": change.worker,
        "key": change.key,
        "before": list(change.before),
        "after": list(change.after),
        "caller_before": caller_part(change.before),
        "caller_after": caller_part(change.after),
        "added": list(change.added),
        "removed": list(change.removed),
        "changed": change.changed,
        "revision": change.revision,
        "dry_run": dry_run,
        "error": None if error is None else {"code": error.code, "message": error.message},
    }


def iso_time(epoch: float) -> str:
    """UTC, millisecond precision, sortable and free of spaces (awk-friendly)."""
    from datetime import UTC, datetime  # here: a table of workers or changes shows none

    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


EVENT_HEADERS = ("TIME", "REVISION", "EVENT", "WORKER", "CHANGE")
EVENT_WIDE_HEADERS = ("TIME", "REVISION", "EVENT", "WORKER", "MODEL", "CHANGE")


def event_change(event: EventInfo) -> str:
    if event.kind == "RESYNC":
        count = len(event.workers)
        return f"snapshot of {count} worker{'' if count == 1 else 's'}"
    if event.kind == "TAINTS":
        return change_text(event.added, event.removed)
    assert event.worker is not None
    return f"taints={taints_text(event.worker.taints)}"


def event_row(event: EventInfo, wide: bool, id_length: int = SHORT_ID) -> list[str]:
    """A row of ``events tail``; the worker's id cut to ``id_length`` (``EventTail``)."""
    worker = event.worker
    ident = worker.id if wide and worker else (worker.id[:id_length] if worker else "-")
    start = [iso_time(event.time), str(event.revision), event.kind, ident]
    model = [worker.record.model if worker else "-"] if wide else []
    return [*start, *model, event_change(event)]


def event_object(event: EventInfo) -> dict[str, Any]:
    worker = event.worker
    obj: dict[str, Any] = {
        "time": iso_time(event.time),
        "revision": event.revision,
        "event": event.kind,
        "worker": worker.id if worker else None,
    }
    if worker is not None:
        obj["model"] = worker.record.model
        obj.update(taint_lists(worker))
    if event.kind == "TAINTS":
        obj["added"] = list(event.added)
        obj["removed"] = list(event.removed)
    if event.kind == "RESYNC":
        obj["workers"] = [worker_object(w) for w in event.workers]
    return obj


EXPLAIN_HEADERS = (
    "RANK", "WORKER", "TAINTS", "LOAD", "OVERLAP", "PREFERENCE", "MULTIPLIER", "COST", "WHY",
)  # fmt: skip


def candidate_row(candidate: CandidateInfo, short: str) -> list[str]:
    rank = str(candidate.rank) if candidate.rank else "-"
    why = candidate.reason or ("chosen" if candidate.rank == 1 else "eligible")
    if not candidate.eligible:
        return [rank, short, taints_text(candidate.worker.taints), *["-"] * 5, why]
    return [
        rank,
        short,
        taints_text(candidate.worker.taints),
        f"{candidate.load_cost:.3f}",
        f"{candidate.overlap_credit:.3f} ({candidate.overlap_blocks} blocks, "
        f"{candidate.overlap_source})",
        f"{candidate.preference:+.2f}",
        f"x{candidate.multiplier:.3f}",
        f"{candidate.cost:.3f}",
        why,
    ]


def ranked(info: ExplainInfo) -> list[CandidateInfo]:
    """Eligible workers by rank, then the excluded ones by id."""
    eligible = sorted((c for c in info.candidates if c.rank), key=lambda c: c.rank)
    others = sorted((c for c in info.candidates if not c.rank), key=lambda c: c.worker.id)
    return [*eligible, *others]


def explain_rows(info: ExplainInfo, id_prefix: int = SHORT_ID) -> list[list[str]]:
    shorts = short_ids((c.worker.id for c in info.candidates), id_prefix)
    return [candidate_row(c, shorts[c.worker.id]) for c in ranked(info)]


def explain_object(info: ExplainInfo) -> dict[str, Any]:
    return {
        "chosen": info.chosen or None,
        "summary": info.summary,
        "candidates": [
            {
                "id": c.worker.id,
                "rank": c.rank or None,
                "eligible": c.eligible,
                "reason": c.reason,
                **taint_lists(c.worker),
                "load_cost": c.load_cost,
                "overlap_credit": c.overlap_credit,
                "overlap_blocks": c.overlap_blocks,
                "overlap_source": c.overlap_source,
                "preference": c.preference,
                "multiplier": c.multiplier,
                "cost": c.cost,
            }
            for c in ranked(info)
        ],
    }


def status_object(status: StatusInfo, endpoint: str, client_version: str) -> dict[str, Any]:
    return {
        "endpoint": endpoint,
        "version": status.version,
        "client_version": client_version,
        "state": status.state,
        "store": status.store_url,
        "store_healthy": status.store_healthy,
        "store_error": status.store_error or None,
        "state_store": status.state_store_url or status.store_url,
        "workers": status.workers,
        "revision": status.revision,
        "queue_depth": status.queue_depth,
        "uptime_seconds": status.uptime_seconds,
        "replica": status.replica_id,
    }


def status_details(status: StatusInfo, endpoint: str, client_version: str) -> list[tuple[str, str]]:
    health = "healthy" if status.store_healthy else f"UNHEALTHY: {status.store_error}"
    return [
        ("Endpoint", endpoint),
        ("Version", f"{status.version} (dynamoctl {client_version})"),
        ("State", status.state),
        ("Store", f"{status.store_url} ({health})"),
        ("State store", status.state_store_url or status.store_url),
        ("Workers", str(status.workers)),
        ("Revision", str(status.revision)),
        ("Queue", f"{status.queue_depth} waiting"),
        ("Uptime", age(status.uptime_seconds)),
        ("Replica", status.replica_id),
    ]


def details_lines(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """``Key:   value`` lines, values aligned (kubectl describe)."""
    width = max(len(k) for k, _ in pairs) + 1
    return [f"{(key + ':').ljust(width)}  {value}" for key, value in pairs]
