"""dynamod's whole life, in one readable place.

Start: open the store → watch it → apply the first snapshot → bind gRPC (unix socket by
default) and the HTTP front → health SERVING, ``READY=1`` to systemd → serve.

SIGHUP: ``RELOADING=1``, re-read the settings, apply the log level, the tokens and the
router's queue settings, ``READY=1``. Other settings need a restart (and say so).

SIGTERM / SIGINT: ``STOPPING=1``, health NOT_SERVING, refuse new work, end event streams,
fail waiting requests with a clear error, let in-flight requests finish within the grace
period, stop the servers and the watcher, close the store. Exit 0, or 70 when the grace
period ran out (or a second signal skipped it) with requests still in flight. The bounded
drain of whatever is left happens in ``lifecycle.run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dynamod import __version__, logs, open_files, systemd
from dynamod.api import grpc_server
from dynamod.api.service import ServiceContext
from dynamod.api.stream_slots import StreamSlots
from dynamod.audit import AuditLog
from dynamod.auth import Principal, Tokens
from dynamod.boundary import Budgets, EngineStreams, KvIndexer, TokenizerRegistry
from dynamod.boundary.dynamo_reach import DynamoReach
from dynamod.control import BatchItem, Control
from dynamod.daemon_metrics import DaemonMetrics
from dynamod.discovery.view import WorkerView
from dynamod.engine_events import REACH, EngineLoad
from dynamod.errors import ConfigError, DynamoError
from dynamod.frontend import Frontend
from dynamod.frontend.dynamo_fleet import FleetFront
from dynamod.http.limits import MAX_BODY
from dynamod.http.memory import MemoryBudget
from dynamod.http.openai import openai_refusal
from dynamod.http.server import listen, serve_app, url
from dynamod.lifecycle import EX_OK, EX_SOFTWARE, Signals
from dynamod.open_files import OpenFiles
from dynamod.pools.demand import DemandReport
from dynamod.pools.operations import PoolOperations
from dynamod.pools.pool_metrics import PoolMetrics
from dynamod.pools.reconciler import BatchWriter as PoolBatchWriter
from dynamod.pools.reconciler import Check as PoolCheck
from dynamod.pools.reconciler import Observed, PoolReconciler, TaintWriter
from dynamod.pools.reconciler import Write as PoolWrite
from dynamod.prompts.processes import PROCESSES as PROMPT_PROCESSES
from dynamod.prompts.processes import PromptProcesses
from dynamod.prompts.reader import PromptReader
from dynamod.records import WorkerRecord
from dynamod.reports import DaemonState
from dynamod.results import UpdateOutcome
from dynamod.router import KvIndex, Overlaps, PrefixIndex, Router
from dynamod.settings import DaemonSettings, parse_hostport
from dynamod.stats_sampler import StatsSampler
from dynamod.store import Guard, Store, open_store
from dynamod.store.dynamo import DynamoStore, is_dynamo
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from dynamod.tasks import cancel_and_wait, wait_any
from dynamod.traffic import Traffic

log = logging.getLogger(__name__)

CUT_WITHIN = 1.0
"""Seconds the streams cut at the end of the grace period get to write their ending."""

ListenSocket = socket.socket | None


class Daemon:
    """One running dynamod; ``run()`` returns the exit code."""

    def __init__(
        self,
        settings: DaemonSettings,
        reload: Callable[[], DaemonSettings] | None = None,
        *,
        store: Store | None = None,
        announce: bool = True,
    ) -> None:
        """``store``: an already open store to use instead of opening ``settings.store``
        (the caller keeps owning it; tests share a memory store this way). ``announce``:
        print the ``dynamod ready:`` line (``dynamod demo`` prints its own banner instead,
        once its workers are up)."""
        self.settings = settings
        self._print_ready = announce
        self._store = store
        self._signals: Signals | None = None
        self._reload_settings = reload
        self.registry = CollectorRegistry()
        self.metrics = DaemonMetrics(self.registry)
        self.audit = AuditLog(settings.audit_log, on_failure=self.metrics.audit_failures.inc)
        self.ready = asyncio.Event()
        self.http_url = ""
        self._fleet: FleetFront | None = None

    def stop(self) -> None:
        """What SIGTERM does: start the graceful shutdown."""
        if self._signals is not None:
            self._signals.stopping.set()

    async def run(self) -> int:
        signals = self._signals = Signals(reload=self._on_sighup).install()
        self.audit.open()
        try:
            async with contextlib.AsyncExitStack() as stack:
                return await self._serve(stack, signals)
        finally:
            self.audit.close()

    async def _serve(self, stack: contextlib.AsyncExitStack, signals: Signals) -> int:
        settings = self.settings
        open_files.raise_limit()  # one connection per followed worker: dynamod/open_files.py
        # Listeners first: a busy socket or port ends the start before anything changed.
        listener = self._listen_http(stack)
        grpc = await grpc_server.bind(settings)
        stack.push_async_callback(grpc.stop, 0)
        store = self._store
        if store is None:
            store = await self._open_store()
            stack.push_async_callback(store.aclose)
        self._fleet = FleetFront(store.url) if isinstance(store, DynamoStore) else None
        view = WorkerView(
            store,
            replay=settings.event_history,
            replay_bytes=int(settings.event_history_mb * 1024 * 1024),
            queues_budget=int(settings.event_queues_mb * 1024 * 1024),
        )
        router, kv = self._router()
        view.listen(router.apply)
        view.listen(self.metrics.on_event)
        traffic = Traffic()  # answers per worker, for the stats stream (dynamoctl top)
        view.listen(traffic.apply)
        # Large bodies, explain prompts and every model's own tokenizer and chat template
        # run in child processes, within the tokenizer limits (prompts/reader.py).
        limits = settings.tokenizer_limits
        workers = await stack.enter_async_context(PromptProcesses(PROMPT_PROCESSES, limits=limits))
        pools: PoolReconciler | None = None
        reader = PromptReader(workers)
        # What the front's answers and the tokenizer fetches hold, in all (http/memory.py).
        memory = MemoryBudget(settings.memory_budget, self.metrics.memory_refusals.inc)
        self.metrics.follow_memory(memory)
        # Each model's workers' own tokenizer: the front and explain count and hash alike.
        tokenizers = await stack.enter_async_context(
            TokenizerRegistry(view, limits=limits, check=workers.check_tokenizer, memory=memory)
        )
        feeds = EngineStreams(
            view,
            lambda key, load: _reported(router, pools, key, load),
            kv=kv,
            budgets=self._budgets(),
            registry=self.registry,
            open_files=OpenFiles(self.registry),
            memory=memory,
        )
        # A Dynamo fleet's workers report nothing: their reach is dynamod's own check.
        reach = DynamoReach(view, lambda key, load: _reported(router, pools, key, load))
        control = Control(
            store,
            view,
            router,
            self.audit,
            settings.replica_id,
            tokenizers,
            metrics=self.metrics,
            prompts=reader,
            limits=settings.taint_limits,
        )
        slots = StreamSlots(settings.max_streams, settings.max_streams_per_caller)
        state = await self._state_store(stack, store)
        control.state_store_url = state.url
        pools = self._pools(state, view, control)
        stats = StatsSampler(
            view, router, traffic, replica=settings.replica_id, breaches=feeds.breaches,
            pools=pools, propagation=self.metrics.propagation,
        )  # fmt: skip
        self.api = ServiceContext(
            control, Tokens.load(settings.tokens_file), self.registry, slots, self.metrics,
            PoolOperations(state, view, pools, self.audit, settings.replica_id), stats,
        )  # fmt: skip
        self.router = router
        async with asyncio.TaskGroup() as group:
            watcher = group.create_task(view.run(), name="worker view")
            followers = group.create_task(feeds.run(), name="engine feeds")
            reaching = group.create_task(reach.run(), name="Dynamo reach") if self._fleet else None
            sampler = group.create_task(stats.run(), name="stats sampler")
            await self._first_snapshot(view, watcher, signals)
            if signals.stopping.is_set():
                for task in (watcher, followers, reaching, sampler):
                    if task is not None:
                        task.cancel()
                return EX_OK
            await grpc_server.start(grpc, self.api)
            front = await stack.enter_async_context(
                Frontend(
                    router,
                    view,
                    tokenizers,
                    registry=self.registry,
                    reader=reader,
                    gone_window=settings.model_gone_window,
                    limits=settings.answer_limits,
                    traffic=traffic,
                    memory=memory,
                )
            )
            http = await self._start_http(stack, front, listener)
            await grpc.serving(True)
            control.state = DaemonState.SERVING
            self.http_url = http
            self._announce(grpc.addresses, http, store.url, state.url, len(view))
            self.ready.set()
            dog = self._start_watchdog(group)
            reconciler = group.create_task(pools.run(), name="pool reconciler")
            await signals.stopping.wait()
            code = await self._shut_down(control, grpc, front, signals)
            pools.events.close()
            for task in (reconciler, watcher, followers, reaching, sampler, dog):
                if task is not None:
                    task.cancel()
        return code

    async def _state_store(self, stack: contextlib.AsyncExitStack, store: Store) -> Store:
        """Where dynamod keeps its own state (pool policies, their journal, the pool
        leader's key): ``state_store`` when set, else the discovery store itself (a Dynamo
        fleet's refuses every write, so pools there need one named)."""
        url = self.settings.state_store
        if not url or url == store.url:
            return store
        state = await open_store(url, timeout=self.settings.store_timeout)
        stack.push_async_callback(state.aclose)
        return state

    async def _open_store(self) -> Store:
        url = self.settings.store
        if not is_dynamo(url):
            return await open_store(url, timeout=self.settings.store_timeout)
        log.warning(
            "%s is an NVIDIA Dynamo fleet: dynamod lists, explains and re-taints its workers "
            "(through each worker's own taint route) and never writes its store; its front "
            "serves no requests (501: they go to Dynamo's frontend), and the cordon does not "
            "carry over (one set by hand is shown as not honoured, and uncordon removes it)",
            url,
        )
        return await DynamoStore.open(
            url,
            addresses=self.settings.dynamo_addresses,
            on_refused=self.metrics.refused_dynamo_record,
            on_warned=self.metrics.dynamo_taint_warnings.inc,
            timeout=self.settings.store_timeout,
        )

    def _router(self) -> tuple[Router, KvIndexer | None]:
        """The router, and the feed of its KV index when engines' KV events are used
        (where none arrive, overlap stays approximate: ``router/kvindex.py``)."""
        config = self.settings.router
        approximate = PrefixIndex(config.prefix_ttl, config.prefix_capacity)
        if config.kv_blocks_per_worker == 0:
            return Router(config, registry=self.registry, overlaps=approximate), None
        index = KvIndex(total=self.settings.kv_blocks_total)
        kv = KvIndexer(index, config.kv_blocks_per_worker, self.registry)
        overlaps = Overlaps(approximate, index)
        return Router(config, registry=self.registry, overlaps=overlaps), kv

    def _budgets(self) -> Budgets:
        """What each worker may cost this daemon (``boundary/budgets.py``)."""
        s = self.settings
        return Budgets(
            events_per_second=s.worker_events_per_second,
            events_burst=s.worker_events_burst,
            bytes_per_second=s.worker_event_bytes_per_second,
            bytes_burst=s.worker_event_bytes_burst,
        )

    async def _first_snapshot(
        self, view: WorkerView, watcher: asyncio.Task[None], signals: Signals
    ) -> None:
        systemd.notify("STATUS=waiting for the first snapshot of the store")
        await wait_any(view.ready, signals.stopping)
        if view.ready.is_set():
            log.info("first snapshot applied: %d workers at revision %d", len(view), view.revision)

    def _listen_http(self, stack: contextlib.ExitStack | contextlib.AsyncExitStack) -> ListenSocket:
        if not self.settings.http:
            return None
        host, port = parse_hostport(self.settings.http, "http")
        listener = listen(host, port)
        stack.callback(listener.close)
        return listener

    async def _start_http(
        self, stack: contextlib.AsyncExitStack, front: Frontend, listener: ListenSocket
    ) -> str:
        if listener is None:
            return ""
        app = web.Application(client_max_size=MAX_BODY)
        (self._fleet or front).add_to(app)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        limits = self.settings.http_limits
        bound_host, bound_port = await serve_app(stack, app, listener, openai_refusal, limits)
        return url(bound_host, bound_port)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _health(self, request: web.Request) -> web.Response:
        state = self.api.control.state
        serving = state is DaemonState.SERVING
        return web.json_response({"status": str(state)}, status=200 if serving else 503)

    def _announce(self, grpc: list[str], http: str, store: str, state: str, workers: int) -> None:
        systemd.notify("READY=1", f"STATUS=serving {workers} workers")
        if not self._print_ready:
            return
        print(
            f"dynamod ready: grpc={','.join(grpc)} http={http or '-'} store={store} "
            f"workers={workers} replica={self.settings.replica_id} state_store={state}",
            flush=True,
        )

    def _start_watchdog(self, group: asyncio.TaskGroup) -> asyncio.Task[None] | None:
        interval = systemd.watchdog_interval()
        if interval is None:
            return None
        log.info("systemd watchdog: pinging every %.1fs", interval)
        return group.create_task(systemd.watchdog(interval), name="systemd watchdog")

    async def _shut_down(
        self, control: Control, grpc: grpc_server.GrpcServer, front: Frontend, signals: Signals
    ) -> int:
        grace = self.settings.grace
        systemd.notify("STOPPING=1", "STATUS=draining")
        control.state = DaemonState.DRAINING
        await grpc.serving(False)
        self.api.end_tails()
        if self.api.stats is not None:
            self.api.stats.close()
        front.begin_drain()
        self.router.close()
        started = time.monotonic()
        code = await self._wait_idle(front, signals, grace)
        left = max(0.0, grace - (time.monotonic() - started))
        await grpc.stop(0 if signals.forced.is_set() else min(left, 5.0))
        log.info("stopped")
        return code

    async def _wait_idle(self, front: Frontend, signals: Signals, grace: float) -> int:
        idle = asyncio.Event()

        async def watch_idle() -> None:
            await front.wait_idle()
            idle.set()

        waiter = asyncio.create_task(watch_idle(), name="front idle")
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await wait_any(idle, signals.forced)
            if idle.is_set():
                return EX_OK
            log.warning("grace period over with %d requests in flight", front.in_flight)
            why = (
                "the daemon was told to stop at once"
                if signals.forced.is_set()
                else f"the daemon's grace period of {grace:g} s ended"
            )
            if front.cut_streams(f"{why}; this stream is cut short"):
                # Each stream's handler writes its ending: give them a bounded moment.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CUT_WITHIN):
                        await idle.wait()
            return EX_SOFTWARE
        finally:
            await cancel_and_wait(waiter)

    def _on_sighup(self) -> None:
        systemd.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            self._reload()
        except ConfigError as exc:
            log.error("reload refused, keeping the running settings: %s", exc)
        systemd.notify("READY=1", "STATUS=reloaded")

    def _reload(self) -> None:
        if self._reload_settings is None:
            return
        new = self._reload_settings()
        logs.configure(new.log_level, new.log_format)
        self.api.tokens = Tokens.load(new.tokens_file)
        self.router.reconfigure(new.router)
        if self.api.pools is not None:
            self.api.pools.reconciler.settings_changed()  # refused pool moves try again
        restart_only = [
            name
            for name in ("store", "listen", "http", "tls_cert", "tls_key", "tls_client_ca")
            if getattr(new, name) != getattr(self.settings, name)
        ]
        if restart_only:
            log.warning("changed settings that need a restart: %s", ", ".join(restart_only))
        log.info("reloaded: log level %s, tokens, router settings", new.log_level)

    # Pools: the reconciler, its view of each worker, and its writes through Control.

    def _pools(self, store: Store, view: WorkerView, control: Control) -> PoolReconciler:
        router = control.router
        identity = self.settings.replica_id

        def observe(key: str) -> Observed:
            engine = router.reported(key)
            mine = router.load(key).active_requests
            if engine is None:
                return Observed(True, mine)
            if engine.source == REACH:  # no figures of its own: this router's count
                return Observed(engine.healthy, mine, engine.kv_blocks_used)
            in_flight = engine.running + engine.waiting
            return Observed(engine.healthy, in_flight, engine.kv_blocks_used, engine=True)

        def demand() -> DemandReport:
            waiting = router.waiting_for().items()
            by_taints = {tuple(sorted(t)): n for t, n in waiting if t}
            return DemandReport(identity, router.in_flight(), by_taints)

        return PoolReconciler(
            store, view, _pool_writer(control, identity),
            identity=identity, ttl=self.settings.pool_lease_ttl,
            observe=observe, metrics=PoolMetrics(self.registry), demand=demand,
            batch=_pool_batches(control, identity, fenced=control.store is store),
            audit=self.audit,
        )  # fmt: skip


def _reported(
    router: Router, pools: PoolReconciler | None, key: str, load: EngineLoad | None
) -> None:
    """An engine's report: the router's, then the pools' (a health flip re-plans)."""
    router.report(key, load)
    if pools is not None:
        pools.engine_reported(key, load is None or load.healthy)


def _pool_writer(control: Control, identity: str) -> TaintWriter:
    """The pool leader's writes: ``Control.update_taints`` on one worker at the revision the
    plan saw, as ``pools@<replica>`` (rights, the lock per worker, the audit line)."""
    caller = Principal(f"pools@{identity}", "write")

    async def write(
        record: WorkerRecord,
        update: TaintUpdate,
        *,
        expect_revision: int,
        check: PoolCheck,
        audit: Mapping[str, object],
    ) -> UpdateOutcome:
        target = Target(worker=record.key, expect_revision=expect_revision)
        [outcome] = await control.update_taints(
            target, update, caller=caller, check=check, audit=audit
        )
        return outcome

    return write


def _pool_batches(control: Control, identity: str, *, fenced: bool) -> PoolBatchWriter:
    """The pool leader's moves many to a transaction where the store has them
    (``Control.update_taints_batch``): each still fenced, locked and audited; guarded by
    the leader key when it is on the same store as the records (``fenced``: no
    ``state_store`` of its own), else fenced by time only."""
    caller = Principal(f"pools@{identity}", "write")

    async def write(
        writes: list[PoolWrite], *, check: PoolCheck, guard: Guard | None
    ) -> list[UpdateOutcome | DynamoError | None]:
        items = [BatchItem(*w) for w in writes]
        guard = guard if fenced else None
        return await control.update_taints_batch(items, caller=caller, check=check, guard=guard)

    return write


async def run_daemon(
    settings: DaemonSettings, reload: Callable[[], DaemonSettings] | None = None
) -> int:
    log.info("dynamod %s starting on %s", __version__, settings.store)
    return await Daemon(settings, reload).run()
