"""``dynamod demo``: the whole product on one machine, for the README's run command.

A fresh directory holds a file store and the gRPC socket; dynamod runs in this process;
a few ``dynamo-worker`` processes run as supervised children (restarted with back-off if
they die), each with different taints: mocker workers, or with ``--engine vllm`` real
vLLM workers serving ``--model-path`` under the ``--python`` that has vLLM (run from this
checkout: ``python -m dynamod.worker``). Ctrl-C (or SIGTERM) stops the daemon first, then
the workers, then removes a temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import dynamod
from dynamod import logs
from dynamod.backoff import Backoff
from dynamod.daemon import Daemon
from dynamod.errors import ConfigError
from dynamod.lifecycle import guarded, run
from dynamod.settings import DaemonSettings

log = logging.getLogger(__name__)

RESTART_FIRST = 0.5
RESTART_CAP = 10.0
"""Bounds of the back-off before a demo worker that exited is started again."""

MODEL = "demo-llama"
TAINTS = [
    ["capacity/fast", "pool=interactive"],
    ["capacity/slow", "pool=batch"],
    ["capacity/fast", "pool=batch"],
]
ZONES = ["a", "b"]
BIN = Path(sys.executable).parent
CHECKOUT = Path(dynamod.__file__).resolve().parent.parent


@dataclass(frozen=True)
class DemoEngine:
    """What the demo's workers run: the mocker, or vLLM on ``model_path`` under ``python``."""

    name: str = "mocker"
    model_path: Path | None = None
    python: Path | None = None
    vllm_args: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, name: str, model_path: Path | None, python: Path | None, vllm_args: tuple[str, ...]
    ) -> DemoEngine:
        if name not in ("mocker", "vllm"):
            raise ConfigError(f"--engine {name!r}: the demo runs mocker or vllm workers")
        if name == "vllm" and (model_path is None or not model_path.is_dir()):
            raise ConfigError("--engine vllm needs --model-path DIR, an existing model directory")
        return cls(name, model_path, python, vllm_args)

    @property
    def ready_within(self) -> float:
        return 300.0 if self.name == "vllm" else 30.0  # vLLM starts in 15-50 s each

    def argv(self) -> list[str]:
        if self.name == "mocker":
            return [str(BIN / "dynamo-worker"), "--speedup-ratio", "10"]
        assert self.model_path is not None
        args = [a for arg in self.vllm_args for a in ("--vllm-arg", arg)]
        python = str(self.python or sys.executable)
        return [python, "-m", "dynamod.worker", "--engine", "vllm",
                "--model-path", str(self.model_path), *args]  # fmt: skip

    def env(self) -> dict[str, str] | None:
        if self.name == "mocker":
            return None
        path = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


class Child:
    """One supervised worker process: restarted with back-off until ``stop()``."""

    def __init__(self, index: int, store: str, engine: DemoEngine) -> None:
        self.index = index
        self.engine = engine
        self.argv = [
            *engine.argv(),
            "--model", MODEL,
            "--store", store,
            "--lease-ttl", "5",
            "--topology", f"zone={ZONES[index % len(ZONES)]}",
            *[arg for taint in TAINTS[index % len(TAINTS)] for arg in ("--taint", taint)],
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
        self.ready = asyncio.Event()
        self.line = ""

    async def supervise(self) -> None:
        backoff = Backoff(RESTART_FIRST, RESTART_CAP)
        while True:
            await self._start()
            code = await self._wait_ready_then_exit()
            if self.stopping:
                return
            delay = backoff.delay()
            log.warning(
                "demo worker %d exited with %s; restarting in %.1fs", self.index, code, delay
            )
            await asyncio.sleep(delay)

    async def _start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches only dynamod, which stops us in order
            env=self.engine.env(),
        )

    async def _wait_ready_then_exit(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode().strip()
            if line.startswith("dynamo-worker ready:"):
                self.line = line
                self.ready.set()
        return await self.proc.wait()

    async def stop(self, grace: float = 30.0) -> None:
        self.stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            async with asyncio.timeout(grace):
                await proc.wait()
        except TimeoutError:
            # Its whole group: a vLLM worker's engine processes would outlive it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def _describe(children: list[Child]) -> str:
    lines = []
    for child in children:
        fields = dict(p.split("=", 1) for p in child.line.split()[2:] if "=" in p)
        taints = ", ".join(TAINTS[child.index % len(TAINTS)])
        lines.append(f"    {fields.get('id', '?')[:8]}  {fields.get('http', '')}  ({taints})")
    return "\n".join(lines)


def _banner(settings: DaemonSettings, http: str, children: list[Child]) -> str:
    socket = settings.listen[0]
    ctl = BIN / "dynamoctl"
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": "hello there",
            "max_tokens": 8,
            "nvext": {"routing_constraints": {"required_taints": ["capacity/fast"]}},
        }
    )
    return f"""
dynamod demo is running. Ctrl-C stops everything.
  store    {settings.store}
  gRPC     {socket}
  OpenAI   {http}/v1   (model {MODEL!r})
  workers
{_describe(children)}

Try, in another shell:
  export DYNAMO_ENDPOINT={socket}
  {ctl} workers ls
  {ctl} taints add <ID> pool=experiment
  {ctl} events tail
  {ctl} route explain --model {MODEL} --require capacity/fast
  curl -s {http}/v1/completions -H 'content-type: application/json' \\
       -d '{body}'
"""


async def _demo(count: int, root: Path, http: str, engine: DemoEngine) -> int:
    settings = DaemonSettings(
        store=(root / "store").as_uri(),
        listen=(f"unix://{root / 'dynamod.sock'}",),
        http=http,
        audit_log=root / "audit.log",
        grace=5.0,
    )
    daemon = Daemon(settings)
    children = [Child(i, settings.store, engine) for i in range(count)]
    async with asyncio.TaskGroup() as group:
        served = group.create_task(daemon.run(), name="dynamod")
        await daemon.ready.wait()
        supervisors = [group.create_task(c.supervise(), name=f"worker {c.index}") for c in children]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(engine.ready_within):
                await asyncio.gather(*(c.ready.wait() for c in children))
        print(_banner(settings, daemon.http_url, children), flush=True)
        code = await served
        await asyncio.gather(*(c.stop() for c in children))
        for supervisor in supervisors:
            supervisor.cancel()
    return code


def run_demo(
    *,
    workers: int = 3,
    directory: Path | None = None,
    http: str = "127.0.0.1:8080",
    engine: DemoEngine | None = None,
) -> int:
    logs.configure("info", "auto")
    temporary = directory is None
    root = Path(tempfile.mkdtemp(prefix="dynamod-demo-")) if directory is None else directory
    root.mkdir(parents=True, exist_ok=True)
    try:
        chosen = engine or DemoEngine()
        return run(lambda: guarded(_demo(workers, root, http, chosen), "dynamod demo"), server=True)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
