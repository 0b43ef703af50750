"""``workers ls`` at fleet size: the pages of the daemon's stream are printed as they come,
and the output is exactly what printing the whole list at once gives, in every format."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamoctl import formats, listing
from dynamoctl.output import Printer
from dynamod.results import WorkerInfo, WorkerPage
from tests.cli.conftest import Cluster, record, register_records, start_cluster

FLEET = 1_203  # three pages of 500 and a short one
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=500, deadline=None)
@given(value=json_values)
def test_the_fast_indented_json_is_json_dumps_byte_for_byte(value: object) -> None:
    assert listing.indented(value) == json.dumps(value, indent=2)
    nested = {"k": [value]}
    assert listing.indented(nested) == json.dumps(nested, indent=2)


def test_non_string_keys_are_written_as_json_writes_them_and_others_refused() -> None:
    value: dict[object, object] = {1: "a", 2.5: None, False: [], None: {}}
    assert listing.indented(value) == json.dumps(value, indent=2)
    with pytest.raises(TypeError, match="keys must be str"):
        listing.indented({(1, 2): 0})


def infos(count: int) -> list[WorkerInfo]:
    return [
        WorkerInfo(record(f"{n:04x}aa00000000{n:02x}"[:16], taints=[f"pool=p{n % 3}"]), n + 1)
        for n in range(count)
    ]


async def pages(
    workers: list[WorkerInfo], size: int, gate: asyncio.Event
) -> AsyncIterator[WorkerPage]:
    """The daemon's pages; the second waits for ``gate`` (it is still "in flight")."""
    for start in range(0, max(len(workers), 1), size):
        if start:
            await gate.wait()
        yield WorkerPage(workers[start : start + size], 7, 8)


class Captured(Printer):
    """A printer writing to strings."""

    def __init__(self, output: str) -> None:
        self.out, self.err = io.StringIO(), io.StringIO()
        super().__init__(output, stdout=self.out, stderr=self.err)


def whole(output: str, workers: list[WorkerInfo]) -> str:
    """What printing the listing at once gives."""
    objects = [formats.worker_object(w) for w in workers]
    if output == "json":
        return json.dumps(objects, indent=2) + "\n"
    if output == "yaml":
        return yaml.safe_dump(objects, sort_keys=False, default_flow_style=False)
    return "\n".join(w.id for w in workers) + "\n"


@pytest.mark.parametrize("output", ["json", "yaml", "name", "table"])
async def test_the_first_page_is_printed_before_the_rest_arrives(output: str) -> None:
    workers = infos(7)
    printer, gate = Captured(output), asyncio.Event()
    async with asyncio.TaskGroup() as group:
        shown = group.create_task(listing.show(printer, pages(workers, 3, gate), filtered=False))
        await asyncio.sleep(0)
        first = printer.out.getvalue()
        assert workers[0].id[:8] in first and workers[3].id[:8] not in first
        gate.set()
    assert shown.result() == 7
    out = printer.out.getvalue()
    if output == "table":
        lines = out.splitlines()
        assert lines[0].split()[:3] == ["ID", "MODEL", "ADDRESS"] and len(lines) == 8
        assert len({line.index("llama") for line in lines[1:]}) == 1  # columns line up
    else:
        assert out == whole(output, workers)


@pytest.mark.parametrize("output", ["json", "yaml", "name", "table"])
async def test_an_empty_listing_prints_what_an_empty_list_prints(output: str) -> None:
    printer = Captured(output)
    assert await listing.show(printer, pages([], 3, asyncio.Event()), filtered=True) == 0
    expected = {"json": "[]\n", "yaml": "[]\n", "name": "", "table": ""}[output]
    assert printer.out.getvalue() == expected
    assert printer.err.getvalue() == "dynamoctl: no workers match\n"


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("large")
    fleet = [
        record(f"{n:06x}{n * 7919 % 65536:04x}beef00", model=("llama", "qwen")[n % 2],
               taints=[f"pool=p{n % 5}"], port=8000 + n)
        for n in range(FLEET)
    ]  # fmt: skip
    register_records((root / "store").as_uri(), fleet)
    started = start_cluster(root)
    try:
        yield started
    finally:
        started.stop()


def test_a_fleet_of_several_pages_lists_whole_in_every_format(large: Cluster) -> None:
    cli = large.cli
    objects: list[dict[str, Any]] = json.loads(cli.ok("workers", "ls", "-o", "json").out)
    assert len(objects) == FLEET
    assert [(o["model"], o["id"]) for o in objects] == sorted(
        (o["model"], o["id"]) for o in objects
    )
    assert yaml.safe_load(cli.ok("workers", "ls", "-o", "yaml").out) == objects
    assert cli.ok("workers", "ls", "-o", "name").lines == [o["id"] for o in objects]
    table = cli.ok("workers", "ls").lines
    assert len(table) == FLEET + 1
    assert {len(line.split()[0]) for line in table[1:]} == {8}
    assert len({line.index("http://") for line in table[1:]}) == 1  # one set of columns
    assert len(cli.ok("workers", "ls", "-l", "pool=p1", "-o", "name").lines) == FLEET // 5 + 1
