"""The front of a daemon that watches an NVIDIA Dynamo fleet: it serves nothing.

Dynamo's workers take requests over Dynamo's own request plane (TCP with msgpack, or
NATS), not HTTP, so dynamod's front cannot relay to them. Every request under ``/v1/``
gets the same answer, 501 in OpenAI's error shape, naming Dynamo's frontend as the place
to send it (``/health`` and ``/metrics`` are served as usual).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from dynamod.http.openai import error_response

STATUS: Final = 501
CODE: Final = "dynamo_fleet"


class FleetFront:
    """Answers every inference request with where to send it instead."""

    def __init__(self, store_url: str) -> None:
        self.message = (
            f"this dynamod watches an NVIDIA Dynamo fleet ({store_url}) and routes no "
            "requests: Dynamo's workers speak Dynamo's request plane, not HTTP. Send "
            "requests to Dynamo's frontend (python -m dynamo.frontend); dynamod lists, "
            "explains and re-taints the fleet's workers (dynamoctl)"
        )

    def add_to(self, app: web.Application) -> None:
        app.router.add_route("*", "/v1/{tail:.*}", self._refuse)

    async def _refuse(self, request: web.Request) -> web.Response:
        return error_response(STATUS, self.message, CODE)
