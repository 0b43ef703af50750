"""A small real NVIDIA Dynamo 1.6.1 fleet on loopback, for tests and the Dynamo fleet bench.

``DynamoFleet`` runs Dynamo's frontend (``python -m dynamo.frontend --router-mode kv``:
the one 1.6.1 router mode that honours ``nvext.routing_constraints``) and mocker workers
on etcd (a private ``tests.support.servers.EtcdServer``) or on Dynamo's file store, from the venv
``bench.peer.venv`` builds. A worker is ``WorkerSpec``: initial caller taints, a topology
zone, a LoRA card, or the stock mocker with no taint route. It launches Dynamo 1.6.1 the
way the session that measured what these tests rely on did.

Every Dynamo process runs in a session of its own, with ``PR_SET_PDEATHSIG``: if the test
process dies, the kernel kills them. Waiting for readiness polls (Dynamo gives no signal
of its own): a worker is ready when its card is in discovery, the fleet when the frontend
serves a completion pinned to every worker.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from bench.peer.stacks import system_port
from tests.support.eventually import eventually_blocking
from tests.support.servers import EtcdServer, free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODEL = "lab-model"
PROMPT_WORDS = "the quick brown fox jumps over the lazy dog hello world"
READY_WITHIN = 180.0  # s: < 1 s on a quiet machine; Dynamo imports transformers on a busy one
Discovery = Literal["etcd", "file"]
Json = dict[str, Any]
T = TypeVar("T")

_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RoomyEtcd(EtcdServer):
    """An etcd that takes requests of up to 256 MiB (its default is 1.5 MiB), as one
    configured with a large ``--max-request-bytes`` does: a writer can put cards larger
    than dynamod reads."""

    MAX_REQUEST_BYTES = 256 * 1024 * 1024

    def argv(self) -> list[str]:
        return [*super().argv(), "--max-request-bytes", str(self.MAX_REQUEST_BYTES)]


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    taints: tuple[str, ...] = ()
    zone: str | None = None
    lora: str | None = None
    stock: bool = False
    env: tuple[tuple[str, str], ...] = ()
    """More environment for this worker only (``ETCD_LEASE_TTL``)."""


class Proc:
    """One Dynamo process in its own session, logging to a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                cwd=log.parent, start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.popen.pid

    def check(self, waiting_for: str) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited ({self.popen.returncode}) while waiting for "
                f"{waiting_for}:\n{self.tail()}"
            )

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # its own session: the group id is its pid
        except ProcessLookupError:
            pass

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.signal(signal.SIGKILL)
        self.popen.wait()


@dataclass
class Worker:
    spec: WorkerSpec
    proc: Proc
    system_port: int
    instance_id: int = 0

    @property
    def id(self) -> str:
        """As Dynamo's keys write it, and as dynamod lists it."""
        return f"{self.instance_id:x}"

    @property
    def system(self) -> str:
        return f"http://127.0.0.1:{self.system_port}"


@dataclass
class DynamoFleet:
    """etcd (or a file store) + Dynamo's frontend + mocker workers: ``with DynamoFleet(...)``."""

    venv: Path
    model_dir: Path
    workdir: Path
    discovery: Discovery = "etcd"
    specs: Iterable[WorkerSpec] = ()
    frontend_url: str = ""
    etcd: EtcdServer | None = None
    file_kv: Path | None = None
    workers: dict[str, Worker] = field(default_factory=dict)
    _procs: list[Proc] = field(default_factory=list)

    def __enter__(self) -> DynamoFleet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def store_url(self) -> str:
        """The fleet as dynamod reads it."""
        if self.etcd is not None:
            return f"dynamo+etcd://{self.etcd.endpoint}"
        return f"dynamo+file://{self.file_kv}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.discovery == "etcd":
            self.etcd = EtcdServer(self.workdir / "etcd")
            self.etcd.start()
        else:
            self.file_kv = self.workdir / "file_kv"
            self.file_kv.mkdir(exist_ok=True)
        port = free_port()
        self.frontend_url = f"http://127.0.0.1:{port}"
        argv = [self._python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                "--http-port", str(port), "--router-mode", "kv"]  # fmt: skip
        self._procs.append(Proc("frontend", argv, self.env(), self.workdir / "frontend.log"))
        for worker in [self.start_worker(spec) for spec in self.specs]:
            self.wait_ready(worker)

    def stop(self) -> None:
        """Workers first (SIGTERM: they delete their own records), then the frontend."""
        for proc in reversed(self._procs):
            proc.signal(signal.SIGTERM)
        for proc in reversed(self._procs):
            proc.stop()
        if self.etcd is not None:
            self.etcd.stop()

    def env(self, **extra: str) -> dict[str, str]:
        """Offline, loopback-only, quiet: what every Dynamo process gets (nothing of ours)."""
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        loopback = ("DYN_TCP_RPC_HOST", "DYN_EVENT_PLANE_HOST", "DYN_TCP_RESPONSE_STREAM_HOST",
                    "DYN_SYSTEM_HOST")  # fmt: skip
        env = {
            "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(home),
            "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "DYN_LOG": "warn", "PYTHONUNBUFFERED": "1", "DYN_DISCOVERY_BACKEND": self.discovery,
            **dict.fromkeys(loopback, "127.0.0.1"),
        }  # fmt: skip
        if self.etcd is not None:
            env["ETCD_ENDPOINTS"] = f"http://{self.etcd.endpoint}"
        else:
            env["DYN_FILE_KV"] = str(self.file_kv)  # absolute: each process has its own cwd
        return env | extra

    def start_worker(self, spec: WorkerSpec) -> Worker:
        """Start one mocker; ``wait_ready`` waits for it."""
        port = system_port()
        extra = {"DYN_SYSTEM_PORT": str(port), **dict(spec.env)}
        if spec.taints:
            extra["DYNAMOD_TEST_TAINTS"] = ",".join(spec.taints)
        if spec.lora:
            extra["DYNAMOD_TEST_LORA"] = spec.lora
        if spec.zone:
            mount = self.workdir / f"topology-{spec.name}"
            mount.mkdir(exist_ok=True)
            (mount / "zone").write_text(spec.zone + "\n")
            extra |= {"DYN_TOPOLOGY_ENABLED": "1", "DYN_TOPOLOGY_MOUNT_PATH": str(mount),
                      "DYN_KV_TRANSFER_DOMAIN": "zone"}  # fmt: skip
        program = ["-m", "dynamo.mocker"] if spec.stock else [str(HERE / "dynamo_mocker.py")]
        argv = [self._python, *program, "--model-path", str(self.model_dir),
                "--model-name", MODEL, "--speedup-ratio", "1000000", "--block-size", "64",
                "--num-gpu-blocks-override", "16384"]  # fmt: skip
        proc = Proc(spec.name, argv, self.env(**extra), self.workdir / f"{spec.name}.log")
        self._procs.append(proc)
        worker = Worker(spec, proc, port)
        self.workers[spec.name] = worker
        return worker

    def wait_ready(self, worker: Worker) -> None:
        """Its card is in discovery, and the frontend serves a request pinned to it."""
        watched = [worker.proc, *self._procs[:1]]  # it, and the frontend
        name = worker.spec.name
        card = until(lambda: self._card_on(worker.system_port), f"{name}'s card", watched)
        worker.instance_id = int(card["instance_id"])
        pinned = {"backend_instance_id": worker.instance_id}
        served = lambda: self.complete(nvext=pinned)[0] == 200 or None  # noqa: E731
        until(served, f"the frontend to reach {name}", watched)

    def kill(self, worker: Worker, sig: int = signal.SIGKILL) -> None:
        worker.proc.signal(sig)
        worker.proc.popen.wait(30)

    # -- what a third party sees -------------------------------------------------------

    def records(self, prefix: str = "v1/") -> dict[str, Json]:
        """Every discovery record under ``prefix``: key → parsed value."""
        if self.etcd is not None:
            return {k: json.loads(v) for k, v in _etcd_range(self.etcd.endpoint, prefix).items()}
        return _file_records(self.file_kv, prefix)

    def complete(
        self, *, required: Iterable[str] = (), nvext: Json | None = None
    ) -> tuple[int, Json]:
        """One completion through Dynamo's frontend, asking it to name its worker."""
        extension: Json = {"extra_fields": ["worker_id"], **(nvext or {})}
        if required:
            extension["routing_constraints"] = {"required_taints": list(required)}
        body = {"model": MODEL, "prompt": "hello world", "max_tokens": 1, "nvext": extension}
        return post_json(f"{self.frontend_url}/v1/completions", body)

    def routed_to(self, required: Iterable[str]) -> int | None:
        """The instance id Dynamo's frontend sent a request requiring ``required`` to
        (``nvext.worker_id.decode_worker_id``), or None when it refused the request."""
        status, answer = self.complete(required=required)
        if status != 200:
            return None
        return int(answer["nvext"]["worker_id"]["decode_worker_id"])

    def _card_on(self, port: int) -> Json | None:
        for key, card in self.records("v1/mdc/").items():
            if key.count("/") == 5 and f"127.0.0.1:{port}/" in json.dumps(card["card_json"]):
                return card
        return None

    @property
    def _python(self) -> str:
        return str(self.venv / "bin" / "python")


def until(probe: Callable[[], T | None], what: str, procs: Iterable[Proc],
          within: float = READY_WITHIN) -> T:  # fmt: skip
    """``probe()``'s first value other than None; each sample first checks that ``procs``
    are still alive (a dead one fails at once, with its log)."""

    def sample() -> tuple[T] | None:
        for proc in procs:
            proc.check(what)
        found = probe()
        return None if found is None else (found,)

    return eventually_blocking(sample, within=within, what=what)[0]


def build_model(venv: Path, model_dir: Path) -> Path:
    """The offline model directory (tokenizer and configs, no weights), built once."""
    if not (model_dir / "tokenizer.json").exists():
        builder = REPO / "bench" / "peer" / "model.py"
        subprocess.run([str(venv / "bin" / "python"), str(builder), str(model_dir), PROMPT_WORDS],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return model_dir


def post_json(url: str, body: Json) -> tuple[int, Json]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text or b"{}")
        except ValueError:
            return exc.code, {"body": text.decode(errors="replace")}
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}


def _etcd_range(endpoint: str, prefix: str) -> dict[str, str]:
    """key → value under ``prefix``, through etcd's JSON gateway (no client library)."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = {"key": base64.b64encode(prefix.encode()).decode(),
            "range_end": base64.b64encode(end.encode()).decode()}  # fmt: skip
    status, found = post_json(f"http://{endpoint}/v3/kv/range", body)
    return {
        base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode()
        for kv in (found.get("kvs", []) if status == 200 else [])
    }


def _file_records(root: Path | None, prefix: str) -> dict[str, Json]:
    out: dict[str, Json] = {}
    for path in root.rglob("*") if root is not None else ():
        if not path.is_file() or path.name.startswith(".tmp"):
            continue
        parts = path.relative_to(root).as_posix().split("/")  # type: ignore[arg-type]
        key = "/".join([*parts[:-1], urllib.parse.unquote(parts[-1])])
        if key.startswith(prefix):
            try:
                out[key] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # replaced or removed under us
    return out
