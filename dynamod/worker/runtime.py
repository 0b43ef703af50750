"""The worker runtime every engine shares: bind, register, serve, and shut down in order.

Start: open the store → start the engine → bind the inference and system servers (port 0
picks a free port) → register the record (address, model card, runtime config with the
validated taints and generated topology taints) and keep its lease alive → announce the
bound addresses on stdout.

SIGTERM / SIGINT: deregister first (routers stop choosing this worker), refuse new
requests, let in-flight ones finish within the grace period, then close servers, engine and
store. Exit 0 when everything finished; 70 when in-flight requests had to be cut short
(the grace period ran out, or a second signal skipped it): streams still open are then
ended with an error event (code ``shutting_down``) and ``[DONE]`` where the routes relay
them (``Routes.cut_streams``), as the daemon's front ends its own.

Code running inside the worker process (an engine, a hook) changes the worker's taints
with ``update_model_taints(taints)``, as Dynamo's ``update_model_taints(endpoint,
taints)`` does: the same replace as the system route, through the same one writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dynamod import __version__
from dynamod.audit import AuditLog
from dynamod.auth import Tokens
from dynamod.discovery.registration import Registration, new_instance_id
from dynamod.engine_events import RECORD_FIELD, offer
from dynamod.errors import ConfigError, InvalidInputError, InvalidKeyError, ShuttingDownError
from dynamod.http.limits import MAX_BODY, HttpLimits
from dynamod.http.openai import openai_refusal
from dynamod.http.server import listen, serve_app, url
from dynamod.lifecycle import EX_OK, EX_SOFTWARE, Signals
from dynamod.records import RuntimeConfig, WorkerRecord, validate_topology
from dynamod.store import open_store
from dynamod.store.base import validate_key
from dynamod.taints import TaintLimits, TaintUpdate, validate_caller_taints, with_topology
from dynamod.tasks import wait_any
from dynamod.worker.engines.base import Engine, WorkerEngine
from dynamod.worker.engines.mocker import MockerConfig, MockerEngine
from dynamod.worker.engines.upstream import UpstreamConfig, UpstreamEngine
from dynamod.worker.inference import InferenceRoutes
from dynamod.worker.proxy import ProxyRoutes
from dynamod.worker.publish import EnginePublisher
from dynamod.worker.system import SystemServer, refusal
from dynamod.worker.writer import IN_PROCESS, WorkerTaintWriter

log = logging.getLogger(__name__)

ENGINES = ("mocker", "vllm", "openai")
CUT_WITHIN = 1.0
"""Seconds the handlers of streams cut at the end of the grace get to write their ending."""


@dataclass(frozen=True)
class WorkerSettings:
    """Everything ``dynamo-worker`` is told; ``__post_init__`` refuses what is invalid."""

    store: str
    model: str
    engine: str = "mocker"
    namespace: str = "dynamo"
    component: str = "backend"
    endpoint: str = "generate"
    taints: tuple[str, ...] = ()
    topology: Mapping[str, str] = field(default_factory=dict)
    kv_transfer_domain: str | None = None
    kv_transfer_enforcement: str | None = None
    kv_transfer_preferred_weight: float | None = None
    host: str = "127.0.0.1"
    port: int = 0
    advertise_host: str | None = None
    system_host: str = "127.0.0.1"
    system_port: int = 0
    tokens: Tokens | None = None
    audit_log: Path | None = None
    taint_limits: TaintLimits = field(default_factory=TaintLimits)
    lease_ttl: float = 10.0
    grace: float = 10.0
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    mocker: MockerConfig = field(default_factory=MockerConfig)
    model_path: Path | None = None
    vllm_args: Mapping[str, Any] = field(default_factory=dict)
    upstream: UpstreamConfig | None = None
    kv_events: str = "auto"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(
                f"engine {self.engine!r} is not available; choose from {', '.join(ENGINES)}"
            )
        self._check_engine_flags()
        for name in ("namespace", "component", "endpoint"):
            value = getattr(self, name)
            if "/" in value:
                raise ConfigError(f"--{name} {value!r} must not contain '/'")
            try:
                validate_key(value)
            except InvalidKeyError as exc:
                raise ConfigError(f"--{name} {value!r} is invalid: {exc}") from None
        if self.lease_ttl < 1:
            raise ConfigError(f"--lease-ttl must be at least 1 second, got {self.lease_ttl:g}")
        if self.grace < 0:
            raise ConfigError(f"--grace must not be negative, got {self.grace:g}")
        self.runtime_config()

    def _check_engine_flags(self) -> None:
        if self.engine == "vllm" and self.model_path is None:
            raise ConfigError("--engine vllm needs --model-path DIR (the model's directory)")
        if self.model_path is not None and not self.model_path.is_dir():
            raise ConfigError(f"--model-path {str(self.model_path)!r} is not a directory")
        if self.engine == "openai" and self.upstream is None:
            raise ConfigError("--engine openai needs --upstream URL (the server to front)")
        if self.engine != "openai" and self.upstream is not None:
            raise ConfigError("--upstream and --launch go with --engine openai only")
        if self.engine != "vllm" and self.vllm_args:
            raise ConfigError("--vllm-arg goes with --engine vllm only")
        if self.engine != "openai" and self.kv_events not in ("auto", "off"):
            raise ConfigError(
                f"--kv-events {self.kv_events!r}: an endpoint goes with --engine openai only; "
                "the mocker and vllm take auto or off"
            )

    def runtime_config(self) -> RuntimeConfig:
        """The validated runtime config: caller taints plus generated topology taints."""
        config = RuntimeConfig(
            topology_domains=dict(self.topology),
            kv_transfer_domain=self.kv_transfer_domain,
            kv_transfer_enforcement=self.kv_transfer_enforcement,
            kv_transfer_preferred_weight=self.kv_transfer_preferred_weight,
        )
        validate_topology(config)
        caller = validate_caller_taints(self.taints)
        try:
            self.taint_limits.check((), caller)
        except InvalidInputError as exc:
            raise ConfigError(f"--taint: {exc} (--max-taints, --max-taint-bytes)") from None
        return RuntimeConfig(
            taints=with_topology(caller, config.topology_domains),
            topology_domains=config.topology_domains,
            kv_transfer_domain=config.kv_transfer_domain,
            kv_transfer_enforcement=config.kv_transfer_enforcement,
            kv_transfer_preferred_weight=config.kv_transfer_preferred_weight,
        )


class EngineCollector(Collector):
    """Engine load as Prometheus gauges, read at scrape time."""

    def __init__(self, engine: WorkerEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self.engine.stats()
        for name, doc, value in [
            ("active_requests", "Requests the engine is running.", stats.active_requests),
            ("waiting_requests", "Requests waiting for an engine slot.", stats.waiting_requests),
            ("kv_blocks_used", "KV cache blocks in use.", stats.kv_blocks_used),
            ("kv_blocks_total", "KV cache blocks in all.", stats.kv_blocks_total),
            ("prefix_cache_hits", "KV blocks found in the prefix cache.", stats.prefix_cache_hits),
        ]:
            yield GaugeMetricFamily(f"dynamo_worker_{name}", doc, value=value)


def make_engine(settings: WorkerSettings) -> WorkerEngine:
    if settings.engine == "vllm":
        assert settings.model_path is not None  # checked by WorkerSettings
        # Imported here only: vLLM is an optional extra, and slow to import.
        from dynamod.worker.engines.vllm import VllmConfig, VllmEngine

        kv = settings.kv_events != "off"
        config = VllmConfig(settings.model, settings.model_path, settings.vllm_args, kv_events=kv)
        return VllmEngine(config)
    if settings.engine == "openai":
        assert settings.upstream is not None  # checked by WorkerSettings
        return UpstreamEngine(settings.upstream)
    return MockerEngine(dataclasses.replace(settings.mocker, model_name=settings.model))


class Routes(Protocol):
    """The inference routes of a worker: served on its HTTP port, drained at shutdown
    (as ``http.inflight.Drains`` says)."""

    @property
    def in_flight(self) -> int: ...

    def begin_drain(self) -> None: ...

    async def wait_idle(self) -> None: ...

    def cut_streams(self, message: str) -> int:
        """End the streams still open with an error event (``message``, code
        ``shutting_down``) and ``[DONE]``; how many there were."""
        ...

    def add_to(self, app: web.Application) -> None: ...


def make_routes(engine: WorkerEngine, instance_id: str, registry: CollectorRegistry) -> Routes:
    """Generated here (an ``Engine``), or forwarded to an upstream server."""
    if isinstance(engine, UpstreamEngine):
        return ProxyRoutes(engine, instance_id, registry=registry)
    # Every other engine (mocker, vllm) is an Engine: it generates in this process.
    return InferenceRoutes(cast(Engine, engine), instance_id, registry=registry)


_writer: WorkerTaintWriter | None = None
"""The writer of the worker running in this process (one per process, as in Dynamo)."""


async def update_model_taints(taints: Iterable[str]) -> tuple[str, ...]:
    """Replace this worker's caller-managed taints; return its complete taint set after.

    For code running inside the worker process, as Dynamo's ``update_model_taints(endpoint,
    taints)``: the same replace as ``POST /engine/update/model_taints`` (``[]`` clears;
    topology taints stay), made by the same one writer and audited with peer
    ``in-process``. While the worker is starting it waits until it is registered (so do
    not await it in an engine's ``__aenter__``, which runs before registration). Raises
    ``TaintError`` for a refused taint, ``ShuttingDownError`` when no worker runs in this
    process or it is shutting down, ``ConflictError`` when every compare-and-swap attempt
    lost to other processes."""
    update = TaintUpdate.replace(taints)
    writer = _writer
    if writer is None:
        raise ShuttingDownError("no dynamo-worker is running in this process")
    change = await writer.apply(update, peer=IN_PROCESS, wait=True)
    return change.after


async def run_worker(settings: WorkerSettings) -> int:
    """The whole life of one worker process; returns its exit code."""
    global _writer
    audit = AuditLog(settings.audit_log)
    audit.open()
    writer = _writer = WorkerTaintWriter(audit, settings.taint_limits)
    try:
        return await _run(settings, writer)
    finally:
        writer.shutting_down()
        _writer = None
        audit.close()


async def _run(settings: WorkerSettings, writer: WorkerTaintWriter) -> int:
    signals = Signals().install()
    registry = CollectorRegistry()
    instance_id = new_instance_id()
    async with contextlib.AsyncExitStack() as stack:
        # Listeners first: a busy port ends the start before anything is registered.
        inference_socket = listen(settings.host, settings.port, "inference http")
        stack.callback(inference_socket.close)
        system_socket = listen(settings.system_host, settings.system_port, "system http")
        stack.callback(system_socket.close)
        store = await open_store(settings.store)
        stack.push_async_callback(store.aclose)
        engine = await stack.enter_async_context(make_engine(settings))
        registry.register(EngineCollector(engine))
        routes = make_routes(engine, instance_id, registry)
        system = SystemServer(tokens=settings.tokens, registry=registry, writer=writer)
        inference = web.Application(client_max_size=MAX_BODY)
        routes.add_to(inference)
        limits = settings.http_limits
        host, port = await serve_app(stack, inference, inference_socket, openai_refusal, limits)
        system_app = system.app()
        publisher = EnginePublisher(engine, authorize=system.check_write)
        publisher.add_to(system_app)
        sys_host, sys_port = await serve_app(stack, system_app, system_socket, refusal, limits)
        advertised = settings.advertise_host or (
            socket.gethostname() if host in ("0.0.0.0", "::") else host
        )
        record = WorkerRecord(
            instance_id=instance_id,
            namespace=settings.namespace,
            component=settings.component,
            endpoint=settings.endpoint,
            address=url(advertised, port),
            system_address=url(
                sys_host if sys_host not in ("0.0.0.0", "::") else advertised, sys_port
            ),
            model_card=engine.model_card(),
            runtime_config=settings.runtime_config(),
            started_at=time.time(),
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            extra={RECORD_FIELD: offer(kv=engine.kv_events is not None)},
        )
        registration = await stack.enter_async_context(
            Registration(store, record, ttl=settings.lease_ttl)
        )
        writer.running(registration)
        print(
            f"dynamo-worker ready: id={instance_id} model={record.model} "
            f"http={record.address} system={record.system_address} key={record.key}",
            flush=True,
        )
        await signals.stopping.wait()
        code = await _shutdown(writer, registration, routes, signals, settings.grace)
        publisher.close()
    return code


async def _shutdown(
    writer: WorkerTaintWriter,
    registration: Registration,
    routes: Routes,
    signals: Signals,
    grace: float,
) -> int:
    writer.shutting_down()
    await registration.deregister()
    routes.begin_drain()
    log.info("deregistered; waiting up to %gs for %d in-flight requests", grace, routes.in_flight)
    idle = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        waiter = group.create_task(_set_when_idle(routes, idle))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await wait_any(idle, signals.forced)
        cut = 0 if idle.is_set() else routes.cut_streams(_cut_message(signals, grace))
        if cut:
            # Each stream's handler writes its ending: give them a bounded moment.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CUT_WITHIN):
                    await idle.wait()
        waiter.cancel()
    if routes.in_flight or cut:
        log.warning(
            "shutting down with %d requests still in flight (%d streams cut short)",
            routes.in_flight,
            cut,
        )
        return EX_SOFTWARE
    return EX_OK


def _cut_message(signals: Signals, grace: float) -> str:
    why = (
        "the worker was told to stop at once"
        if signals.forced.is_set()
        else f"the worker's grace period of {grace:g} s ended"
    )
    return f"{why}; this stream is cut short"


async def _set_when_idle(routes: Routes, idle: asyncio.Event) -> None:
    await routes.wait_idle()
    idle.set()
