"""The public Python client of dynamod's API (``AsyncClient``); dynamoctl is built on it.

It returns the daemon's reports (``dynamod.reports``) and raises the errors of
``dynamod.errors``. It is the only part of dynamod besides ``dynamod/api/`` that imports
gRPC.
"""

from dynamod.client.aio import AsyncClient, Credentials, default_endpoint, target_of

__all__ = ["AsyncClient", "Credentials", "default_endpoint", "target_of"]
