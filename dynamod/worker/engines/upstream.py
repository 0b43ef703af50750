"""``--engine openai``: a worker that registers and controls an OpenAI-compatible server
running beside it (``vllm serve``, SGLang, llama.cpp's ``llama-server``, ...).

* **Start** (``__aenter__``): optionally launch the server (``launch``: an argv, run in a
  process group of its own, its output on our stderr); wait until ``GET /health``
  answers 200 (``start_timeout``; a launched server that exits first fails the start);
  check that ``GET /v1/models`` lists the model; scrape ``/metrics`` once. The model card
  comes from ``/v1/models`` (``max_model_len``) and vLLM's ``vllm:cache_config_info``
  (block size, KV blocks); ``max_num_seqs`` / ``max_num_batched_tokens`` from the
  launch argv's flags of those names when present, else from the worker's settings.
* **Load** (``stats()``): scraped from ``/metrics`` every ``scrape_interval``
  (``scrape.py``: vLLM, SGLang and llama.cpp names); for a server without metrics, the
  requests this worker is forwarding (``proxy.py``) count as running. A scrape samples:
  routers learn of a load up to an interval late, and a burst that comes and goes
  between two scrapes may never show (``bench/engines.py`` measures the lag).
* **Health**: a scrape (or, without metrics, a health check) that fails marks the
  upstream unhealthy (``stats().healthy``, with the reason), which the worker reports to
  routers: they stop routing to it until a later scrape succeeds. A page the worker
  refuses (``NaN``, an odd label, over its byte budget: ``upstream_answers.py``) fails the
  scrape like a silence does; each distinct problem is logged once, when it starts.
* **Background tasks** (the scrape, each KV event subscriber) run supervised: one that
  dies of anything but cancellation is logged with why, and started again after the one
  back-off (``backoff.py``); the scrape's death also marks the upstream unhealthy.
* **Bad upstreams**: whatever the upstream answers at start (``/v1/models`` not a list of
  models, ``max_model_len`` not a positive integer, an answer over its byte budget) ends
  the start with one line naming it and exit 1, before anything is registered.
* **Requests go through the worker** (``proxy.py``), not to the upstream directly: so
  the worker knows every request in flight (a drain that waits for them, a load without
  metrics), answers like every worker (``x-dynamo-worker-id``, 503 while draining), and
  one loopback hop is its whole cost (measured: ``bench/engines.py``).
* **KV events** (``kv_events``): ``"auto"`` asks the upstream's ``GET
  /kv_event_sources`` (vLLM's route: its ZMQ publisher per data-parallel rank, a ``*``
  host replaced by the upstream's) and follows each publisher it lists, with its replay
  socket when configured (``vllm_events.py``); no such route, or no publisher enabled:
  no KV events (routers keep approximate overlap for this worker). An explicit
  ``tcp://host:port`` follows that publisher (no replay); ``"off"`` none.
* **Stop** (``__aexit__``, after the worker drained its requests): stop scraping, then
  signal a launched server's process group with SIGTERM, give it ``stop_timeout``
  seconds, then SIGKILL the group. Start ``vllm serve`` with ``--shutdown-timeout N`` as
  the backstop for a request still inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import aiohttp

from dynamod.backoff import Backoff
from dynamod.errors import ConfigError, InvalidInputError, UpstreamError
from dynamod.http.inflight import RequestTracker
from dynamod.http.limits import AnswerLimits
from dynamod.records import ModelCard
from dynamod.tasks import cancel_and_wait
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import Publishable, with_tokenizer
from dynamod.worker.engines.base import Changes, EngineStats
from dynamod.worker.engines.kv_sources import followable
from dynamod.worker.engines.kvevents import KvPublisher
from dynamod.worker.engines.scrape import Scraped, parse
from dynamod.worker.engines.upstream_answers import read_json, read_page, served_context

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
RESTART_FIRST = 0.5
RESTART_CAP = 30.0
"""Bounds of the back-off before a background task that died is started again; one that
ran longer than the cap before dying starts the back-off over."""


@dataclass(frozen=True)
class UpstreamConfig:
    """What ``--engine openai`` is told; see the module docstring."""

    url: str
    model_name: str
    launch: tuple[str, ...] = ()
    tokenizer_path: Path | None = None
    scrape_interval: float = 0.5
    start_timeout: float = 600.0
    stop_timeout: float = 30.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_events: str = "auto"
    limits: AnswerLimits = field(default_factory=AnswerLimits)
    """The most an answer of the upstream to a forwarded request may hold (``proxy.py``)."""

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"--upstream {self.url!r} must be an http:// or https:// URL")
        if self.kv_events not in ("auto", "off") and not self.kv_events.startswith(
            ("tcp://", "ipc://")
        ):
            raise ConfigError(
                f"--kv-events {self.kv_events!r} must be auto, off, or a publisher endpoint "
                "(tcp://HOST:PORT or ipc://PATH)"
            )
        if self.scrape_interval <= 0:
            raise ConfigError(f"--scrape-interval must be above 0, got {self.scrape_interval:g}")

    def launch_flag(self, flag: str, default: int) -> int:
        """An integer flag of the launch argv (``--max-num-seqs 8`` or ``=8``), or default."""
        value = launch_value(self.launch, flag)
        return int(value) if value is not None and value.isdigit() else default


def launch_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag value`` or ``--flag=value``), if given."""
    for i, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if name == flag:
            return value if sep else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def tokenizer_of(config: UpstreamConfig) -> Publishable:
    """The model's own tokenizer when its directory is known (``tokenizer_path``, or a
    launch argv's ``--model DIR``), else the approximate ``SimpleTokenizer``."""
    path = config.tokenizer_path
    if path is None:
        model = launch_value(config.launch, "--model")
        path = Path(model) if model and Path(model, "tokenizer.json").is_file() else None
    if path is None:
        log.warning(
            "no tokenizer for %s (give --model-path): routers will count and hash its "
            "prompts with an approximate tokenizer",
            config.model_name,
        )
        return SimpleTokenizer()
    from dynamod.tokenizers.hf import HfTokenizer  # the hf extra, needed only here

    return HfTokenizer.from_directory(path)


class UpstreamEngine:
    """An OpenAI-compatible server beside the worker; see the module docstring.

    ``requests`` counts what the worker forwards (``proxy.py`` owns the counting).
    """

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.requests = RequestTracker()
        self._tokenizer = tokenizer_of(config)
        self._changes = Changes()
        self._scraped = Scraped()
        self._healthy = True
        self._reason = ""
        self._card = with_tokenizer(ModelCard(config.model_name, engine="openai"), self._tokenizer)
        self._child: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self._scraper: asyncio.Task[None] | None = None
        self._kv_events: KvPublisher | None = None
        self._kv_tasks: list[asyncio.Task[None]] = []

    @property
    def tokenizer(self) -> Publishable:
        return self._tokenizer

    @property
    def changes(self) -> Changes:
        return self._changes

    @property
    def kv_events(self) -> KvPublisher | None:
        return self._kv_events

    async def reset_prefix_cache(self) -> bool:
        """vLLM's ``POST /reset_prefix_cache`` (served with ``VLLM_SERVER_DEV_MODE=1``)."""
        try:
            async with self.session.post(self.url("/reset_prefix_cache"), timeout=_quick()) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("enter the UpstreamEngine with 'async with' first")
        return self._session

    def model_card(self) -> ModelCard:
        return self._card

    def stats(self) -> EngineStats:
        s = self._scraped
        total = s.num_blocks or 0
        if s.kind is None:  # no metrics: our own count of what we forward
            running, waiting, source = len(self.requests), 0, "proxy"
        else:
            running, waiting, source = s.running, s.waiting, "metrics"
        return EngineStats(
            active_requests=running,
            waiting_requests=waiting,
            kv_blocks_used=round(s.kv_usage * max(total - 1, 0)),
            kv_blocks_total=total,
            prefix_cache_hits=s.prefix_cache_hits,
            prefix_cache_queries=s.prefix_cache_queries,
            healthy=self._healthy,
            reason=self._reason,
            source=source,
        )

    def url(self, path: str) -> str:
        return self.config.url.rstrip("/") + path

    async def __aenter__(self) -> Self:
        # A new connection per request: a kept-alive one that the upstream closes as a
        # request is sent on it fails as "Server disconnected" (uvicorn, behind vllm serve
        # and SGLang, closes idle ones; under load the tier saw 502s from a healthy vllm
        # serve even with the pool's idle time under uvicorn's 5 s). A new connection costs
        # about 1.5 ms at best here (bench.engines: the sidecar hop's minimum), small beside
        # an inference; a completion cannot be re-sent safely once it may have run.
        connector = aiohttp.TCPConnector(force_close=True)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None)
        )
        try:
            if self.config.launch:
                await self._launch()
            await self._wait_healthy()
            context = await self._served_context()
            await self._scrape()
            self._card = self._card_of(context)
            await self._follow_kv_events()
            self._scraper = asyncio.create_task(
                supervised("the upstream scrape", self._scrape_forever, self._scrape_died),
                name="upstream scrape",
            )
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._scraper is not None:
            await cancel_and_wait(self._scraper)
        for task in self._kv_tasks:
            await cancel_and_wait(task)
        await self._stop_child()
        if self._session is not None:
            await self._session.close()

    # -- the child

    async def _launch(self) -> None:
        argv = self.config.launch
        log.info("launching the upstream server: %s", " ".join(argv))
        try:
            self._child = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sys.stderr.fileno(),  # our stdout carries the readiness line
                start_new_session=True,  # its own process group: signalled only by us
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise ConfigError(f"--launch {argv[0]!r} cannot be started: {exc}") from None

    async def _stop_child(self) -> None:
        child, self._child = self._child, None
        if child is None or child.returncode is not None:
            return
        log.info("stopping the upstream server (pid %d) with SIGTERM", child.pid)
        _signal_group(child.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(self.config.stop_timeout):
                await child.wait()
        except TimeoutError:
            log.warning("upstream server still up after %gs: SIGKILL", self.config.stop_timeout)
            _signal_group(child.pid, signal.SIGKILL)
            await child.wait()
        # Its own children (vLLM's engine core) may outlive it: end the whole group.
        _signal_group(child.pid, signal.SIGKILL)

    # -- health, models, metrics

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._child is not None and self._child.returncode is not None:
                raise ConfigError(
                    f"the launched upstream server exited with {self._child.returncode} "
                    "before it was healthy"
                )
            try:
                if await self._alive():
                    return
                last = "/health did not answer 200"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = str(exc) or type(exc).__name__
            await asyncio.sleep(0.5)  # a server starting up announces nothing: ask again
        raise ConfigError(
            f"upstream {self.config.url} not healthy within {self.config.start_timeout:g}s ({last})"
        )

    async def _alive(self) -> bool:
        """``GET /health`` answers 200; for a server without that route, ``/v1/models``."""
        async with self.session.get(self.url("/health"), timeout=_quick()) as response:
            if response.status != 404:
                return response.status == 200
        async with self.session.get(self.url("/v1/models"), timeout=_quick()) as response:
            return response.status == 200

    async def _served_context(self) -> int | None:
        """Check that the upstream serves our model; its context length if it says."""
        url = self.url("/v1/models")
        try:
            async with self.session.get(url, timeout=_quick()) as response:
                if response.status != 200:
                    raise ConfigError(f"upstream {url} answered {response.status}")
                body = await read_json(response, url)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConfigError(f"upstream {url} failed: {exc or type(exc).__name__}") from None
        return served_context(body, self.config.model_name, self.config.url)

    def _card_of(self, context: int | None) -> ModelCard:
        config, scraped, default = self.config, self._scraped, ModelCard(self.config.model_name)
        card = ModelCard(
            name=config.model_name,
            engine="openai",
            kv_block_size=scraped.block_size or default.kv_block_size,
            context_length=context or default.context_length,
            max_num_seqs=config.launch_flag("--max-num-seqs", config.max_num_seqs),
            max_num_batched_tokens=config.launch_flag(
                "--max-num-batched-tokens", config.max_num_batched_tokens
            ),
            total_kv_blocks=scraped.num_blocks or default.total_kv_blocks,
        )
        return with_tokenizer(card, self._tokenizer)

    async def _scrape_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.scrape_interval)
            await self._scrape()

    def _scrape_died(self, why: str) -> None:
        self._mark(False, f"the scrape of upstream {self.config.url} stopped: {why}")

    async def _scrape(self) -> None:
        """One scrape; its outcome becomes the load and health ``stats()`` reports."""
        try:
            scraped = await self._fetch_metrics()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._mark(
                False, f"upstream {self.config.url} is not answering: {exc or type(exc).__name__}"
            )
            return
        except (InvalidInputError, UpstreamError) as exc:
            self._mark(False, f"upstream {self.config.url} sent metrics the worker refuses: {exc}")
            return
        self._scraped = scraped
        self._mark(True, "")
        self._changes.changed()

    async def _fetch_metrics(self) -> Scraped:
        url = self.url("/metrics")
        async with self.session.get(url, timeout=_quick()) as response:
            if response.status == 404:  # a server without metrics: is it alive at all?
                if not await self._alive():
                    raise aiohttp.ClientError("its health check failed")
                return Scraped()
            response.raise_for_status()
            return parse(await read_page(response, url))

    def _mark(self, healthy: bool, reason: str) -> None:
        """Record the upstream's health; one log line per change, and per distinct problem
        while it lasts (not one per scrape)."""
        if (healthy, reason) == (self._healthy, self._reason):
            return
        if healthy:
            log.warning("upstream %s healthy again", self.config.url)
        else:
            log.warning("%s", reason)
        self._healthy, self._reason = healthy, reason
        self._changes.changed()

    # -- KV events

    async def _follow_kv_events(self) -> None:
        sources = await self._kv_sources()
        if not sources:
            return
        try:
            from dynamod.worker.engines.vllm_events import VllmSubscriber  # the kv extra
        except ImportError as exc:
            if self.config.kv_events != "auto":
                raise ConfigError(
                    f"--kv-events needs the kv extra (pyzmq, msgspec): {exc}"
                ) from None
            log.warning("not following the upstream's KV events: %s (install dynamod[kv])", exc)
            return
        self._kv_events = KvPublisher(self._card.total_kv_blocks)
        for endpoint, replay in sources:
            subscriber = VllmSubscriber(endpoint, self._kv_events, replay=replay)
            follow = supervised(f"the KV events of {endpoint}", subscriber.run, _logged)
            self._kv_tasks.append(asyncio.create_task(follow, name=f"KV events {endpoint}"))

    async def _kv_sources(self) -> list[tuple[str, str | None]]:
        """The publishers to follow: (endpoint, replay endpoint or None)."""
        setting = self.config.kv_events
        if setting == "off":
            return []
        if setting != "auto":
            return [(setting, None)]
        url = self.url("/kv_event_sources")
        try:
            async with self.session.get(url, timeout=_quick()) as response:
                if response.status != 200:
                    said = "upstream has no /kv_event_sources (%d): no KV events"
                    log.info(said, response.status)
                    return []
                body = await read_json(response, url)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConfigError(f"upstream {url} failed: {exc or type(exc).__name__}") from None
        host = urlsplit(self.config.url).hostname or "127.0.0.1"
        return kv_sources(body, host)


async def supervised(
    name: str, run: Callable[[], Awaitable[None]], died: Callable[[str], None]
) -> None:
    """Run ``run()`` until cancelled: each time it ends (by an exception, or by returning)
    log why, tell ``died`` (a sentence), and start it again after the one back-off, reset
    when a run lasted longer than its cap (it made progress). Cancelling this cancels it."""
    backoff = Backoff(RESTART_FIRST, RESTART_CAP)
    while True:
        started = time.monotonic()
        try:
            await run()
            why = "it returned"
        except Exception as exc:  # noqa: BLE001 - whatever ends it is logged and survived
            why = f"{type(exc).__name__}: {exc}"
        if time.monotonic() - started > RESTART_CAP:
            backoff.reset()
        log.warning("%s stopped (%s); starting it again", name, why)
        died(why)
        await backoff.wait()


def _logged(why: str) -> None:
    """A task whose death ``supervised`` logs, and nothing more: KV events only sharpen
    routing (without them routers keep approximate overlap)."""


def kv_sources(body: object, host: str) -> list[tuple[str, str | None]]:
    """vLLM's ``/kv_event_sources`` answer (rank → its ``KVEventsConfig``) as the
    endpoints a subscriber connects to: a wildcard host (``*``, ``0.0.0.0``, ``::``)
    is the server's own, ``host``; only those ``kv_sources.followable`` allows."""
    found: list[tuple[str, str | None]] = []
    for config in body.values() if isinstance(body, dict) else ():
        if not isinstance(config, dict) or not config.get("enable_kv_cache_events"):
            continue
        if config.get("publisher") != "zmq" or not isinstance(config.get("endpoint"), str):
            continue
        replay = config.get("replay_endpoint")
        try:
            endpoint = followable(_reachable(config["endpoint"], host), host)
            again = followable(_reachable(replay, host), host) if isinstance(replay, str) else None
        except InvalidInputError as exc:
            log.warning("not following a KV event publisher the upstream names: %s", exc)
            continue
        found.append((endpoint, again))
    return found


def _reachable(endpoint: str, host: str) -> str:
    for wildcard in ("//*:", "//0.0.0.0:", "//[::]:", "//:::"):
        endpoint = endpoint.replace(wildcard, f"//{host}:")
    return endpoint


def _quick() -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=5.0)


def _die_with_parent() -> None:
    """In the launched server, before it runs: SIGTERM it if this worker dies without
    stopping it (SIGKILL, a crash), so it does not serve on, unregistered (Linux only)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
