"""The gRPC servicer context every service method of the API is handed."""

from __future__ import annotations

from typing import Any

from grpc import aio

Context = aio.ServicerContext[Any, Any]
