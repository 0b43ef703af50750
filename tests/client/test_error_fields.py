"""Errors keep their fields across the wire: every class of the error tree, raised behind a
real gRPC server and encoded as the daemon encodes it (``api/error_status.py``), arrives in
``dynamod.client`` as the same class built through its own constructor, with the same
fields and message; and the errors a real daemon raises for a caller's mistakes carry
their fields to the caller, one worker's share of a bulk update included."""

from __future__ import annotations

import inspect
import typing
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from dynamod import errors
from dynamod.api.error_status import fit, status_of, trailers
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from dynamod.client import AsyncClient
from dynamod.discovery.registration import register
from dynamod.errors import (
    AmbiguousWorkerError,
    DynamoError,
    RevisionMismatchError,
    WorkerNotFoundError,
)
from dynamod.store.memory import MemoryStore
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.daemon.helpers import client_for, running_daemon, settings_for
from tests.support.factories import make_record


def every_error_class() -> list[type[DynamoError]]:
    found, pending = [], [DynamoError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.__name__)


SAMPLES: dict[object, object] = {str: "sample value", int: 7, list[str]: ["w1", "w2"]}


def sample(cls: type[DynamoError]) -> DynamoError:
    """An instance of ``cls`` built through its constructor with a sample of every
    parameter (the optional ones too, so no field stays at its default)."""
    hints = typing.get_type_hints(cls.__init__)
    arguments: dict[str, Any] = {}
    for name in inspect.signature(cls.__init__).parameters:
        if name == "self":
            continue
        hint = hints[name]
        options = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        arguments[name] = next(SAMPLES[o] for o in options if o in SAMPLES)
        if name == "message":
            arguments[name] = f"{cls.__name__} happened"
    return cls(**arguments)


class Raising(rpc.StatusServiceServicer):
    """``GetStatus`` fails with whichever error the test put in ``next``, encoded as the
    daemon's API encodes every error (or with the trailers the test put in ``trailers``)."""

    next: DynamoError = errors.InvalidInputError("unset")
    trailers: tuple[tuple[str, str | bytes], ...] | None = None

    async def GetStatus(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        context.set_trailing_metadata(self.trailers or trailers(self.next))
        await context.abort(status_of(self.next), fit(str(self.next)))
        raise AssertionError("abort raises")


@pytest.fixture
async def raising(tmp_path: Path) -> AsyncIterator[tuple[Raising, AsyncClient]]:
    server = aio.server()
    servicer = Raising()
    rpc.add_StatusServiceServicer_to_server(servicer, server)
    socket = tmp_path / "raising.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    client = AsyncClient(f"unix://{socket}", timeout=10)
    try:
        yield servicer, client
    finally:
        await client.close()
        await server.stop(None)


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda c: c.__name__)
async def test_every_error_class_arrives_whole(
    cls: type[DynamoError], raising: tuple[Raising, AsyncClient]
) -> None:
    servicer, client = raising
    sent = servicer.next = sample(cls)
    with pytest.raises(DynamoError) as caught:
        await client.status()
    got = caught.value
    if cls is errors.UnreachableError:
        # The client's own word for a daemon it cannot reach names the endpoint.
        assert type(got) is cls and "cannot reach dynamod" in str(got)
        return
    assert type(got) is cls
    assert got.fields() == sent.fields()
    assert str(got) == str(sent)
    assert vars(got) == vars(sent)


async def test_a_class_the_client_does_not_know_arrives_as_its_nearest_ancestor(
    raising: tuple[Raising, AsyncClient],
) -> None:
    """A newer daemon's subclass of WorkerNotFoundError, with a field of its own."""
    servicer, client = raising
    servicer.next = WorkerNotFoundError("w9", "worker 'w9' is retired")
    servicer.trailers = (
        ("dynamo-error", "RetiredWorkerError WorkerNotFoundError NotFoundError DynamoError"),
        ("dynamo-error-fields-bin", b'{"worker": "w9", "retired_at": 17}'),
    )
    with pytest.raises(WorkerNotFoundError) as caught:
        await client.status()
    assert type(caught.value) is WorkerNotFoundError
    assert (caught.value.worker, str(caught.value)) == ("w9", "worker 'w9' is retired")


async def test_a_daemons_errors_carry_their_fields(tmp_path: Path) -> None:
    async with MemoryStore() as store:
        lease = await store.grant(30)
        for suffix in ("a", "b"):
            await register(store, make_record(instance_id=f"cafe0{suffix}"), lease)
        settings = settings_for(store, tmp_path)
        async with running_daemon(store, settings), client_for(settings) as client:
            update = TaintUpdate.add(["pool=x"])
            with pytest.raises(WorkerNotFoundError) as missing:
                await client.update_taints(update, Target(worker="beef"))
            assert missing.value.worker == "beef"
            with pytest.raises(AmbiguousWorkerError) as ambiguous:
                await client.update_taints(update, Target(worker="cafe"))
            assert (ambiguous.value.prefix, ambiguous.value.matches) == (
                "cafe",
                ["cafe0a", "cafe0b"],
            )
            (done,) = await client.update_taints(update, Target(worker="cafe0a"))
            stale = Target(worker="cafe0a", expect_revision=done.revision - 1)
            with pytest.raises(RevisionMismatchError) as mismatch:
                await client.update_taints(TaintUpdate.add(["pool=y"]), stale)
            assert (mismatch.value.expected, mismatch.value.actual) == (
                done.revision - 1,
                done.revision,
            )


async def test_one_workers_failure_in_a_bulk_update_rebuilds_its_error(tmp_path: Path) -> None:
    async with MemoryStore() as store:
        lease = await store.grant(30)
        record = make_record(taints=[f"t{i}" for i in range(4)])
        await register(store, record, lease)
        settings = settings_for(store, tmp_path, max_taints=4)
        async with running_daemon(store, settings), client_for(settings) as client:
            (outcome,) = await client.update_taints(
                TaintUpdate.add(["one-too-many"]), Target(all=True)
            )
    assert outcome.error is not None
    error = outcome.error.error()
    assert isinstance(error, errors.TaintLimitError)
    assert str(error) == outcome.error.message
    assert grpc.StatusCode[outcome.error.code] == status_of(error)
