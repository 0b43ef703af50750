"""dynamod's settings: defaults < TOML file < ``DYNAMO_*`` environment < flags.

The file (``--config FILE``, else ``$DYNAMO_CONFIG``, else ``/etc/dynamod/dynamod.toml`` when
it exists) holds top-level keys named like the fields below and a ``[router]`` table of
router knobs (``dynamod.router.RouterKnobs``). The environment uses ``DYNAMO_<FIELD>``
(``DYNAMO_STORE``, ``DYNAMO_LISTEN`` as a comma-separated list, ``DYNAMO_ROUTER_<KNOB>``).
Unknown keys and malformed values are refused with a message naming them, so a typo never
silently falls back to a default.

=================  ==========================================  ==========================
setting            default                                     meaning
=================  ==========================================  ==========================
store              file://<state dir>/store                    discovery store URL
listen             unix://<runtime dir>/dynamod.sock           gRPC listeners: unix://PATH
                                                               or HOST:PORT (TCP needs
                                                               tokens_file or mTLS)
http               127.0.0.1:8080                              OpenAI front + /metrics;
                                                               "" turns it off
tokens_file        (none)                                      bearer tokens, see auth.py
tls_cert/tls_key   (none)                                      TLS for TCP listeners
tls_client_ca      (none)                                      require client certs (mTLS)
audit_log          <state dir>/audit.log                       JSON lines, one per mutation
log_level          info                                        debug, info, warning, error
log_format         auto                                        auto (plain under journald,
                                                               timestamped otherwise), json
grace              30                                          seconds for in-flight work
                                                               at shutdown
drain              0.25                                        the bounded drain at exit
event_history      10000                                       events kept for tail --since
event_history_mb   64                                          ... and at most this many MB
max_streams        64                                          API streams open at once
max_streams_per    16                                          ... for one caller (token,
_caller                                                        certificate, unix socket)
event_queues_mb    64                                          events queued for all
                                                               streams together, in MB
max_taints         4096                                        taints an update may leave
                                                               one worker
max_taint_bytes    262144                                      ... and bytes of them
http_head_timeout  10                                          seconds for a request's head
http_body_timeout  30                                          seconds for a request's body
http_idle_timeout  75                                          seconds a kept-alive
                                                               connection may idle
model_gone_window  30                                          seconds after a model's last
                                                               worker left during which
                                                               its requests get a
                                                               retryable 503, not 404
replica_id         <host>-<suffix>: the suffix made once and   this replica's name
                   kept in <audit log>.replica-id (no audit    (printable, no spaces)
                   log: <state dir>/replica-id)
max_answer_mb      64                                          MiB of a worker's whole
                                                               answer the front reads
max_event_mb       16                                          MiB of one SSE event of a
                                                               worker's stream
memory_budget_mb   512                                         MiB of peers' bytes held in
                                                               all: relayed streams, whole
                                                               answers, tokenizer bundles
                                                               being fetched, engine events
                                                               buffers; past it the
                                                               largest holder is refused
                                                               (at least twice each one's
                                                               limit)
dynamo_system_     (none: the card's URLs)                     an NVIDIA Dynamo fleet
address                                                        (dynamo+etcd://, dynamo+
                                                               file://): its workers'
                                                               system port, a template:
                                                               http://{host}:9090
dynamo_system_     (none)                                      ... and per worker: a
addresses                                                      table of instance id (hex)
                                                               to base URL; env:
                                                               "id=URL,id=URL"
kv_blocks_total    4194304                                     KV blocks the router's
                                                               index keeps, all workers
                                                               (0: no bound); at start
worker_events_per_second                                       lines a worker's engine
  / _burst         1000 / 10000                                events may send a second
                                                               / at once
worker_event_bytes_per_second                                  ... and bytes of them (a
  / _burst         2097152 / 67108864                          KV worker's burst: its
                                                               whole snapshot if larger)
store_timeout      5                                           seconds: the deadline of
                                                               each store call
pool_lease_ttl     15                                          seconds of the pool
                                                               leader's lease: failover
                                                               within it plus a second;
                                                               at least twice
                                                               store_timeout (the fence)
state_store        (the store)                                 where pool policies, their
                                                               history and the pool
                                                               leader's key are kept; a
                                                               Dynamo fleet's store is
                                                               read-only: name one there
                                                               (never a dynamo+ URL)
=================  ==========================================  ==========================

What a model's own tokenizer and chat template may cost (``tokenizers.limits``; the
README's "Limits and threat model" says what each refusal is):

========================  =======  =============================================
setting                   default  meaning
========================  =======  =============================================
tokenizer_bundle_max_mb   128      MiB of a tokenizer bundle read from a worker
tokenizer_cache_mb        256      MiB of bundles kept (daemon, each prompt process)
template_cpu_seconds      2        CPU seconds of a model's template and tokenizer
                                   for one request, plus as much per MiB of prompt
template_max_output_mb    32       Mi characters a chat template may render
prompt_process_memory_mb  4096     MiB of address space of one prompt process
========================  =======  =============================================

``settings.checks.verify`` checks what a start needs beyond the values themselves, and
``dynamod check-config`` and every start run it alike: files, the store URL, and every listener —
each TCP address (the front's and gRPC's) is bound and released, all of them held at
once in the order a start binds them, and each unix socket path is looked at. A listener
that cannot be bound (the port is taken, or the address is not this host's) is a
``ListenError`` (exit 69 at start and in check-config alike); everything else is a
``ConfigError`` (exit 78). So a start refuses nothing check-config approved, unless a
port was taken in between (the start then says so in one line, exit 69).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamod.engine_events import MAX_LINE
from dynamod.errors import ConfigError, InvalidInputError, shown
from dynamod.http import memory
from dynamod.http.limits import AnswerLimits, HttpLimits
from dynamod.lifecycle import DRAIN_SECONDS
from dynamod.paths import default_socket, default_store, state_dir
from dynamod.router import RouterKnobs
from dynamod.settings.replica import default_replica_id
from dynamod.store import DEFAULT_TIMEOUT
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.url import is_dynamo
from dynamod.taints import TaintLimits
from dynamod.tokenizers.limits import MIB, TokenizerLimits

SYSTEM_CONFIG = Path("/etc/dynamod/dynamod.toml")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "plain", "json")
MAX_SOCKET_PATH = 107
"""Bytes of a unix socket's path: ``sun_path`` holds 108, the last one a NUL."""
MAX_REPLICA_ID = 256
WILDCARDS = ("", "0.0.0.0", "::")
FENCE_MARGIN = 2
"""``pool_lease_ttl`` is at least this many times ``store_timeout`` (``pools.leader``)."""


@dataclass(frozen=True)
class DaemonSettings:
    store: str = field(default_factory=default_store)
    listen: tuple[str, ...] = field(default_factory=lambda: (f"unix://{default_socket()}",))
    http: str = "127.0.0.1:8080"
    tokens_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    audit_log: Path | None = field(default_factory=lambda: state_dir() / "audit.log")
    log_level: str = "info"
    log_format: str = "auto"
    grace: float = 30.0
    drain: float = DRAIN_SECONDS
    event_history: int = 10_000
    event_history_mb: float = 64.0
    max_streams: int = 64
    max_streams_per_caller: int = 16
    event_queues_mb: float = 64.0
    max_taints: int = TaintLimits.count
    max_taint_bytes: int = TaintLimits.bytes
    http_head_timeout: float = HttpLimits.head_timeout
    http_body_timeout: float = HttpLimits.body_timeout
    http_idle_timeout: float = HttpLimits.idle_timeout
    model_gone_window: float = 30.0
    replica_id: str = ""  # "": <host>-<suffix kept beside the audit log> (settings.replica)
    router: RouterKnobs = field(default_factory=RouterKnobs)
    max_answer_mb: float = AnswerLimits.whole / 1024 / 1024
    max_event_mb: float = AnswerLimits.event / 1024 / 1024
    memory_budget_mb: float = memory.DEFAULT_LIMIT / MIB
    tokenizer_bundle_max_mb: float = TokenizerLimits.bundle_bytes / MIB
    tokenizer_cache_mb: float = TokenizerLimits.cache_bytes / MIB
    template_cpu_seconds: float = TokenizerLimits.cpu_seconds
    template_max_output_mb: float = TokenizerLimits.max_output / MIB
    prompt_process_memory_mb: float = TokenizerLimits.process_memory / MIB
    dynamo_system_address: str = ""
    dynamo_system_addresses: Mapping[str, str] = field(default_factory=dict)
    # The worker boundary (dynamod/boundary/): the defaults are boundary.budgets' own.
    kv_blocks_total: int = 1 << 22
    worker_events_per_second: float = 1000.0
    worker_events_burst: int = 10_000
    worker_event_bytes_per_second: float = float(2 << 20)
    worker_event_bytes_burst: int = 64 << 20
    store_timeout: float = DEFAULT_TIMEOUT
    pool_lease_ttl: float = 15.0
    state_store: str = ""

    def __post_init__(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"log_format {self.log_format!r} is not one of {', '.join(LOG_FORMATS)}"
            )
        for name in ("grace", "drain", "model_gone_window"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a number of seconds >= 0, got {value!r}")
        self._check_pools()
        if self.event_history < 1:
            raise ConfigError(f"event_history must be at least 1, got {self.event_history}")
        if not 0 < self.event_history_mb < 1e6:
            raise ConfigError(
                f"event_history_mb must be above 0 (megabytes), got {self.event_history_mb!r}"
            )
        self._check_streams()
        if not self.replica_id:  # frozen: set once, here, from the audit log's place
            object.__setattr__(self, "replica_id", default_replica_id(self.audit_log))
        _check_replica_id(self.replica_id)
        try:
            self.http_limits  # noqa: B018 - built to check the three timeouts
        except InvalidInputError as exc:
            raise ConfigError(f"http_{exc}") from None
        for name in ("max_answer_mb", "max_event_mb"):
            value = getattr(self, name)
            if not math.isfinite(value) or not 0 < value <= 1024 * 1024:
                raise ConfigError(f"{name} must be a number of MiB above 0, got {value!r}")
        try:
            self.taint_limits  # noqa: B018 - built to check max_taints and max_taint_bytes
        except InvalidInputError as exc:
            raise ConfigError(f"max_taints / max_taint_bytes: {exc}") from None
        try:
            self.tokenizer_limits  # noqa: B018 - built to check the five tokenizer bounds
        except InvalidInputError as exc:
            raise ConfigError(f"tokenizer and template limits: {exc}") from None
        self._check_memory()
        if not self.listen:
            raise ConfigError("listen needs at least one address")
        for address in self.listen:
            self._check_listener(address)
        if self.http:
            parse_hostport(self.http, "http")
        self._check_boundary()
        _check_distinct(self.listen, self.http)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key must be set together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("tls_client_ca (mTLS) needs tls_cert and tls_key")
        self.dynamo_addresses  # noqa: B018 - built to check the template and the URLs

    @property
    def dynamo_addresses(self) -> SystemAddresses:
        """Where an NVIDIA Dynamo fleet's workers have their system port."""
        return SystemAddresses(self.dynamo_system_address, self.dynamo_system_addresses)

    @property
    def http_limits(self) -> HttpLimits:
        return HttpLimits(self.http_head_timeout, self.http_body_timeout, self.http_idle_timeout)

    @property
    def answer_limits(self) -> AnswerLimits:
        """What the front reads of a worker's answer at most."""
        return AnswerLimits.of_mib(self.max_answer_mb, self.max_event_mb)

    @property
    def taint_limits(self) -> TaintLimits:
        return TaintLimits(self.max_taints, self.max_taint_bytes)

    @property
    def tokenizer_limits(self) -> TokenizerLimits:
        """What a model's own tokenizer may cost (``tokenizers.limits``), from the
        ``tokenizer_*``, ``template_*`` and ``prompt_process_memory_mb`` settings."""
        return TokenizerLimits(
            bundle_bytes=_mib(self.tokenizer_bundle_max_mb, "tokenizer_bundle_max_mb"),
            cache_bytes=_mib(self.tokenizer_cache_mb, "tokenizer_cache_mb"),
            cpu_seconds=self.template_cpu_seconds,
            max_output=_mib(self.template_max_output_mb, "template_max_output_mb"),
            process_memory=_mib(self.prompt_process_memory_mb, "prompt_process_memory_mb"),
        )

    @property
    def memory_budget(self) -> int:
        """Bytes of peers' bytes the daemon holds in all (``http.memory.MemoryBudget``)."""
        return int(self.memory_budget_mb * MIB)

    def _check_memory(self) -> None:
        if not math.isfinite(self.memory_budget_mb) or not 0 < self.memory_budget_mb < 1e7:
            raise ConfigError(
                f"memory_budget_mb must be a number of MiB above 0, got {self.memory_budget_mb!r}"
            )
        each = ("max_answer_mb", "max_event_mb", "tokenizer_bundle_max_mb")
        name, largest = max(((n, getattr(self, n)) for n in each), key=lambda item: item[1])
        if self.memory_budget_mb < 2 * largest:
            raise ConfigError(
                f"memory_budget_mb ({self.memory_budget_mb:g}) must be at least twice {name} "
                f"({largest:g}): the budget holds what all answers, streams and tokenizer "
                f"fetches hold together, so one at its own limit must fit, counted twice "
                f"while it is copied; raise memory_budget_mb to {2 * largest:g} or more, or "
                f"lower {name}"
            )

    def _check_pools(self) -> None:
        if not math.isfinite(self.store_timeout) or not 0.1 <= self.store_timeout <= 600:
            raise ConfigError(
                f"store_timeout must be 0.1 to 600 seconds, got {self.store_timeout!r}"
            )
        if not math.isfinite(self.pool_lease_ttl) or not 1 <= self.pool_lease_ttl <= 3600:
            raise ConfigError(
                f"pool_lease_ttl must be 1 to 3600 seconds, got {self.pool_lease_ttl!r}"
            )
        if self.pool_lease_ttl < FENCE_MARGIN * self.store_timeout:
            raise ConfigError(
                f"pool_lease_ttl ({self.pool_lease_ttl:g} s) must be at least {FENCE_MARGIN} "
                f"times store_timeout ({self.store_timeout:g} s): the pool leader stops "
                "writing half a TTL after its last refresh, and a write that passed its fence "
                "just before must reach the store within the other half; raise pool_lease_ttl "
                f"to {FENCE_MARGIN * self.store_timeout:g} or lower store_timeout"
            )
        if is_dynamo(self.state_store):
            raise ConfigError(
                f"state_store {shown(self.state_store, 80)} is an NVIDIA Dynamo fleet's store, "
                "which dynamod only reads; name a store it can write (DYNAMO_STATE_STORE, "
                "e.g. etcd://10.0.0.1:2379/dynamod or file:///var/lib/dynamod/state)"
            )

    def _check_boundary(self) -> None:
        if self.kv_blocks_total < 0:
            raise ConfigError(f"kv_blocks_total must be >= 0, got {self.kv_blocks_total}")
        for name in ("worker_events_per_second", "worker_events_burst",
                     "worker_event_bytes_per_second"):  # fmt: skip
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a number above 0, got {value!r}")
        if self.worker_event_bytes_burst < MAX_LINE:
            raise ConfigError(
                f"worker_event_bytes_burst must be at least one line ({MAX_LINE} bytes), "
                f"got {self.worker_event_bytes_burst}"
            )

    def _check_streams(self) -> None:
        if not 1 <= self.max_streams_per_caller <= self.max_streams:
            raise ConfigError(
                f"max_streams ({self.max_streams}) and max_streams_per_caller "
                f"({self.max_streams_per_caller}) must be at least 1, the second no larger "
                "than the first"
            )
        if not 0 < self.event_queues_mb < 1e6:
            raise ConfigError(
                f"event_queues_mb must be above 0 (megabytes), got {self.event_queues_mb!r}"
            )

    def _check_listener(self, address: str) -> None:
        if address.startswith("unix://"):
            path = address[len("unix://") :]
            if not path.startswith("/"):
                raise ConfigError(
                    f"listen address {address!r} needs an absolute path: unix:///PATH"
                )
            size = len(os.fsencode(path))
            if size > MAX_SOCKET_PATH:
                raise ConfigError(
                    f"listen address {shown(address, 80)} is a path of {size} bytes; a unix "
                    f"socket path holds at most {MAX_SOCKET_PATH}: choose a shorter one, such as "
                    "/run/dynamod/dynamod.sock"
                )
            return
        parse_hostport(address, "listen")
        if self.tokens_file is None and self.tls_client_ca is None:
            raise ConfigError(
                f"listen address {address!r} is TCP: set tokens_file or tls_client_ca (mTLS), "
                "so nobody on the network can change taints unauthenticated"
            )


def parse_hostport(text: str, name: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name} {text!r} must look like HOST:PORT (port 0-65535)")
    return host.strip("[]"), int(port)


def _mib(value: float, name: str) -> int:
    if not math.isfinite(value) or not 0 < value < 1e7:
        raise InvalidInputError(f"{name} must be a number of MiB above 0, got {value!r}")
    return int(value * MIB)


def _check_replica_id(replica_id: str) -> None:
    """The replica id is one word of the ready line, the logs and ``status``: printable,
    without spaces, so nothing can split or forge a line."""
    bad = next((c for c in replica_id if not c.isprintable() or c.isspace()), None)
    if replica_id and bad is None and len(replica_id) <= MAX_REPLICA_ID:
        return
    why = f"holds {bad!r}" if bad is not None else f"is {len(replica_id)} characters long"
    raise ConfigError(
        f"replica_id {shown(replica_id, 80)} {why}; a replica id is 1 to {MAX_REPLICA_ID} "
        "printable characters without spaces"
    )


def _check_distinct(listen: tuple[str, ...], http: str) -> None:
    """No address may be taken twice: a unix socket path listed twice (after
    normalization), or two TCP addresses on one port whose hosts overlap (equal, or one
    a wildcard), the front's included."""
    seen: dict[object, str] = {}
    for address in (*listen, *([f"http {http}"] if http else [])):
        for other_key, other in seen.items():
            if _overlap(_place(address), other_key):
                raise ConfigError(
                    f"{other!r} and {address!r} are the same listener; list each address once "
                    "(the front's http address may not be a gRPC listen address)"
                )
        seen[_place(address)] = address


def _place(address: str) -> object:
    """What an address binds: a normalized socket path, or (host, port)."""
    if address.startswith("unix://"):
        return os.path.normpath(address[len("unix://") :])
    return parse_hostport(address.removeprefix("http "), "listen")


def _overlap(a: object, b: object) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        (host_a, port_a), (host_b, port_b) = a, b
        same_host = host_a == host_b or host_a in WILDCARDS or host_b in WILDCARDS
        return port_a == port_b != 0 and same_host
    return a == b


def _path(value: object) -> Path | None:
    return Path(str(value)) if value not in (None, "") else None


def _listen(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"listen must be a string or a list of strings, got {value!r}")


def _addresses(value: object) -> dict[str, str]:
    """A table of instance id to URL (TOML), or ``"id=URL,id=URL"`` (the environment)."""
    if isinstance(value, str):
        pairs = [p.strip().partition("=") for p in value.split(",") if p.strip()]
        if any(not sep or not k.strip() for k, sep, _ in pairs):
            raise ConfigError(f"expected 'id=URL,id=URL', got {value!r}")
        return {k.strip(): v.strip() for k, _, v in pairs}
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return {str(k): v for k, v in value.items()}
    raise ConfigError(f"expected a table of instance id to URL, got {value!r}")


def _number(kind: type) -> Callable[[object], Any]:
    def convert(value: object) -> Any:
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"expected a {kind.__name__}, got {value!r}") from None

    return convert


PARSERS: dict[str, Callable[[object], Any]] = {
    "store": str,
    "listen": _listen,
    "http": str,
    "tokens_file": _path,
    "tls_cert": _path,
    "tls_key": _path,
    "tls_client_ca": _path,
    "audit_log": _path,
    "log_level": lambda v: str(v).lower(),
    "log_format": lambda v: str(v).lower(),
    "grace": _number(float),
    "drain": _number(float),
    "event_history": _number(int),
    "event_history_mb": _number(float),
    "max_streams": _number(int),
    "max_streams_per_caller": _number(int),
    "event_queues_mb": _number(float),
    "max_taints": _number(int),
    "max_taint_bytes": _number(int),
    "http_head_timeout": _number(float),
    "http_body_timeout": _number(float),
    "http_idle_timeout": _number(float),
    "model_gone_window": _number(float),
    "replica_id": str,
    "max_answer_mb": _number(float),
    "max_event_mb": _number(float),
    "memory_budget_mb": _number(float),
    "tokenizer_bundle_max_mb": _number(float),
    "tokenizer_cache_mb": _number(float),
    "template_cpu_seconds": _number(float),
    "template_max_output_mb": _number(float),
    "prompt_process_memory_mb": _number(float),
    "dynamo_system_address": str,
    "dynamo_system_addresses": _addresses,
    "kv_blocks_total": _number(int),
    "worker_events_per_second": _number(float),
    "worker_events_burst": _number(int),
    "worker_event_bytes_per_second": _number(float),
    "worker_event_bytes_burst": _number(int),
    "store_timeout": _number(float),
    "pool_lease_ttl": _number(float),
    "state_store": str,
}
ROUTER_FIELDS = {f.name: f for f in dataclasses.fields(RouterKnobs)}


def _router_value(name: str, value: object) -> Any:
    if name == "max_queue_wait" and value in ("none", "None", None):
        return None
    kind = int if ROUTER_FIELDS[name].type in ("int", int) else float
    return _number(kind)(value)


def _apply(
    values: dict[str, Any], router: dict[str, Any], raw: Mapping[str, object], where: str
) -> None:
    for key, value in raw.items():
        if key == "router" and isinstance(value, dict):
            for knob, knob_value in value.items():
                if knob not in ROUTER_FIELDS:
                    raise ConfigError(f"{where}: unknown router setting {knob!r}")
                router[knob] = _wrap(where, f"router.{knob}", _router_value, knob, knob_value)
        elif key in PARSERS:
            values[key] = _wrap(where, key, PARSERS[key], value)
        else:
            raise ConfigError(
                f"{where}: unknown setting {key!r}; known: {', '.join(PARSERS)}, [router]"
            )


def _wrap(where: str, key: str, convert: Callable[..., Any], *args: object) -> Any:
    try:
        return convert(*args)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {key}: {exc}") from None


def _env(environ: Mapping[str, str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in PARSERS:
        name = f"DYNAMO_{key.upper()}"
        if name in environ:
            out[key] = environ[name]
    router = {
        knob: environ[f"DYNAMO_ROUTER_{knob.upper()}"]
        for knob in ROUTER_FIELDS
        if f"DYNAMO_ROUTER_{knob.upper()}" in environ
    }
    if router:
        out["router"] = router
    return out


def config_file(explicit: Path | None, environ: Mapping[str, str]) -> Path | None:
    if explicit is not None:
        return explicit
    if environ.get("DYNAMO_CONFIG"):
        return Path(environ["DYNAMO_CONFIG"])
    return SYSTEM_CONFIG if SYSTEM_CONFIG.exists() else None


def read_file(path: Path) -> dict[str, object]:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def load(
    *,
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> DaemonSettings:
    """Merge the layers (see the module docstring) into validated ``DaemonSettings``."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    router: dict[str, Any] = {}
    file = config_file(path, env)
    if file is not None:
        _apply(values, router, read_file(file), f"config file {str(file)!r}")
    _apply(values, router, _env(env), "environment")
    _apply(values, router, {k: v for k, v in (flags or {}).items() if v is not None}, "flags")
    return DaemonSettings(**values, router=RouterKnobs(**router))
