"""Dynamo 1.6.1's stock mocker with Dynamo's own taint route added (run in Dynamo's venv).

    DYN_SYSTEM_PORT=23456 <dynamo venv>/bin/python bench/peer/mocker.py --model-path DIR ...

Takes exactly ``python -m dynamo.mocker``'s flags. The 1.6.1 mocker registers no taint
route, although Dynamo's vLLM, SGLang and TRT-LLM workers do; this wraps
``dynamo.mocker.main.run_input`` so that, just before the worker starts serving, Dynamo's
``register_model_taint_route(runtime, endpoint)`` adds ``POST /engine/update/model_taints``
to the worker's system port (``DYN_SYSTEM_PORT``, which Dynamo reads as a signed 16-bit
number: keep it at most 32767). Everything else is the stock ``dynamo.mocker.main.main()``.
"""

from __future__ import annotations

from typing import Any

from dynamo.common.model_taints import (  # type: ignore[import-not-found]  # Dynamo's venv only
    register_model_taint_route,
)
from dynamo.mocker import main as mocker  # type: ignore[import-not-found]

stock_run_input = mocker.run_input


def run_input(runtime: Any, endpoint_path: str, *args: Any, **kwargs: Any) -> Any:
    register_model_taint_route(runtime, runtime.endpoint(endpoint_path))
    return stock_run_input(runtime, endpoint_path, *args, **kwargs)


if __name__ == "__main__":
    mocker.run_input = run_input
    mocker.main()
