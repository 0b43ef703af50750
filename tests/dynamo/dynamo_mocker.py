"""Dynamo 1.6.1's stock mocker plus Dynamo's own taint route (run with Dynamo's venv python).

    DYN_SYSTEM_PORT=23456 <dynamo venv>/bin/python dynamo_mocker.py --model-path DIR ...

Takes exactly ``python -m dynamo.mocker``'s flags (the stock mocker itself, with no taint
route, is ``python -m dynamo.mocker``). Like ``bench/peer/mocker.py``, it wraps
``dynamo.mocker.main.run_input`` so that Dynamo's ``register_model_taint_route`` adds
``POST /engine/update/model_taints`` to the worker's system port, and adds two switches,
read from the environment, that the 1.6.1 mocker has no flag for (nor have Dynamo's vLLM,
SGLang and TRT-LLM workers: their taints start empty):

* ``DYNAMOD_TEST_TAINTS="a=1,b"``: initial caller taints, put into the worker's
  ``ModelRuntimeConfig.taints`` before it registers;
* ``DYNAMOD_TEST_LORA=name``: once serving, also register a LoRA card ``name`` on the same
  endpoint the way Dynamo's vLLM worker does (``register_model(..., lora_name=...)``);
  the mocker does not serve LoRA requests: this is the record's shape only.

Modelled on the launcher that captured the records in ``tests/data/dynamo``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from dynamo.common.model_taints import (  # type: ignore[import-not-found]  # Dynamo's venv only
    register_model_taint_route,
)
from dynamo.llm import (  # type: ignore[import-not-found]
    ModelInput,
    ModelType,
    WorkerType,
    register_model,
)
from dynamo.mocker import main as mocker  # type: ignore[import-not-found]

log = logging.getLogger("dynamod_test_mocker")
stock_run_input = mocker.run_input
stock_build_runtime_config = mocker.build_runtime_config
LORA_AFTER = 1.0  # s: let the base model register first
_tasks: set[asyncio.Task[None]] = set()


def build_runtime_config(engine_args: Any) -> Any:
    block_size, config = stock_build_runtime_config(engine_args)
    initial = [t for t in os.environ.get("DYNAMOD_TEST_TAINTS", "").split(",") if t]
    if initial:
        config.taints = set(initial)
    return block_size, config


def run_input(runtime: Any, endpoint_path: str, *args: Any, **kwargs: Any) -> Any:
    endpoint = runtime.endpoint(endpoint_path)
    register_model_taint_route(runtime, endpoint)
    serving = stock_run_input(runtime, endpoint_path, *args, **kwargs)
    lora = os.environ.get("DYNAMOD_TEST_LORA")
    if lora:
        task = asyncio.get_running_loop().create_task(_register_lora(endpoint, lora))
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)
    return serving


async def _register_lora(endpoint: Any, lora: str) -> None:
    await asyncio.sleep(LORA_AFTER)
    model_path = sys.argv[sys.argv.index("--model-path") + 1]
    try:
        await register_model(
            model_input=ModelInput.Tokens,
            model_type=ModelType.Chat | ModelType.Completions,
            endpoint=endpoint,
            model_path=model_path,
            user_data={"lora_adapter": True},
            lora_name=lora,
            base_model_path=model_path,
            worker_type=WorkerType.Aggregated,
            ignore_weights=True,
        )
    except Exception:  # reported; the base model goes on serving
        log.exception("registering the LoRA card %s failed", lora)


if __name__ == "__main__":
    mocker.build_runtime_config = build_runtime_config
    mocker.run_input = run_input
    mocker.main()
