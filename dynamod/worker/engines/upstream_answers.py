"""What an upstream server answers the ``--engine openai`` worker's own questions, read
bounded and checked: its models (``GET /v1/models``), its KV event publishers (``GET
/kv_event_sources``) and its metrics page (``GET /metrics``, parsed by ``scrape.py``).

The upstream is not trusted any more than a worker is: every answer is read through
``http.bounded.read_body`` with a budget (``MAX_LISTING`` bytes for a listing,
``MAX_METRICS_PAGE`` for a metrics page), parsed with the project's JSON reader
(``jsoncodec.read``: nesting bounded), and checked field by field before anything
is built from it. A refusal is a ``ConfigError`` (the upstream the worker was pointed at
is unusable) naming the upstream, the field, the value and the rule: ``max_model_len``
must be an integer from 1 to ``MAX_CONTEXT`` (JSON ``true`` is not a number, although
Python's bool subclasses int); ``data`` must be a list of objects. At start it ends the
worker with one line and exit 1, before anything is registered; while running, a bad
metrics page marks the upstream unhealthy instead (``upstream.py``).
"""

from __future__ import annotations

import json

import aiohttp

from dynamod import jsoncodec
from dynamod.errors import ConfigError, InvalidInputError, OversizeError
from dynamod.http.bounded import read_body
from dynamod.http.openai import brief

MAX_LISTING = 1024 * 1024
"""Bytes of a ``/v1/models`` or ``/kv_event_sources`` answer read at most."""
MAX_METRICS_PAGE = 16 * 1024 * 1024
"""Bytes of a ``/metrics`` page read at most (vLLM's is a few hundred KB)."""
MAX_CONTEXT = 2**31 - 1
"""The largest ``max_model_len`` taken from an upstream."""


async def read_json(response: aiohttp.ClientResponse, url: str) -> object:
    """The JSON of ``response`` (an answer of the upstream at ``url``), read bounded."""
    try:
        raw = await read_body(response, MAX_LISTING, f"the answer of {url}")
        return jsoncodec.read(raw, f"the answer of {url}")
    except (OversizeError, InvalidInputError) as exc:
        raise ConfigError(f"upstream {url}: {exc}") from None


async def read_page(response: aiohttp.ClientResponse, url: str) -> str:
    """The text of a metrics page, read bounded; ``OversizeError`` beyond its budget."""
    raw = await read_body(response, MAX_METRICS_PAGE, f"the metrics page of {url}")
    return raw.decode(errors="replace")


def served_context(body: object, model: str, url: str) -> int | None:
    """Check that the ``/v1/models`` answer ``body`` of the upstream at ``url`` lists
    ``model``; its context length when it gives one (``max_model_len``), else None.
    Raises ``ConfigError`` for an answer of the wrong shape or without the model."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ConfigError(
            f"upstream {url} answered {brief(body)}, not a JSON object with a 'data' list of models"
        )
    models = {m.get("id"): m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)}
    found = models.get(model)
    if found is None:
        served = ", ".join(sorted(repr(str(k)) for k in models)) or "none"
        raise ConfigError(
            f"upstream {url} does not serve model {model!r}; it serves: {_short(served, 300)}"
        )
    return _context(found.get("max_model_len"), model, url)


def _context(value: object, model: str, url: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_CONTEXT:
        raise ConfigError(
            f"upstream {url} says max_model_len {_json(value)} for model {model!r}; it must "
            f"be an integer from 1 to {MAX_CONTEXT}"
        )
    return value


def _json(value: object) -> str:
    """``value`` as the upstream wrote it (``true``, not Python's ``True``), cut short."""
    return _short(json.dumps(value), 80)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
