"""The routing table: the taint index agrees with a brute-force filter, cordon semantics,
event folding in any order, and the sentences that say why no worker fits."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from dynamod.discovery_events import ViewResync, WorkerAdded, WorkerModified, WorkerRemoved
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.router import RoutingTable, why_not
from dynamod.taints import CORDONED, RoutingConstraints, normalize

TAINTS = [
    "capacity/fast",
    "capacity/slow",
    "pool=a",
    "pool=b",
    "gpu",
    CORDONED,
    "dynamo.topology/zone=z1",
]
MODELS = ["m", "n"]


def worker(
    instance_id: str,
    *taints: str,
    model: str = "m",
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    kv_block_size: int = 16,
) -> WorkerRecord:
    """A worker record with just what routing reads."""
    card = ModelCard(
        name=model,
        kv_block_size=kv_block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
    )
    return WorkerRecord(
        instance_id=instance_id,
        namespace="ns",
        component="backend",
        endpoint="generate",
        address=f"http://127.0.0.1:1/{instance_id}",
        model_card=card,
        runtime_config=RuntimeConfig(taints=normalize(taints)),
    )


def retaint(record: WorkerRecord, *taints: str, revision: int) -> WorkerModified:
    """The event for ``record`` now holding exactly ``taints``."""
    new = replace(record, runtime_config=RuntimeConfig(taints=normalize(taints)))
    added = tuple(sorted(set(new.taints) - set(record.taints)))
    removed = tuple(sorted(set(record.taints) - set(new.taints)))
    return WorkerModified(new, added, removed, revision)


def required(*taints: str) -> RoutingConstraints:
    return RoutingConstraints(required_taints=frozenset(taints))


def brute_force(
    fleet: Iterable[WorkerRecord], model: str, constraints: RoutingConstraints, exclude: set[str]
) -> set[str]:
    """The rule written the obvious way: scan every worker."""
    need = constraints.required_taints
    return {
        w.key
        for w in fleet
        if w.model == model
        and need <= set(w.taints)
        and (CORDONED not in w.taints or CORDONED in need)
        and w.key not in exclude
    }


def keys(records: Iterable[WorkerRecord]) -> set[str]:
    return {r.key for r in records}


def snapshot(table: RoutingTable) -> dict[str, tuple[str, ...]]:
    """The table's observable state: every worker with its taints, via every model."""
    return {w.key: w.taints for m in table.models() for w in table.workers(m)}


# An operation on worker ``index``: add (or re-add) with taints, retaint, or remove.
operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "retaint", "remove"]),
        st.integers(0, 7),
        st.sampled_from(MODELS),
        st.frozensets(st.sampled_from(TAINTS), max_size=4),
    ),
    max_size=30,
)


@settings(max_examples=600, deadline=None)
@given(
    ops=operations,
    need=st.frozensets(st.sampled_from([*TAINTS, "absent/taint"]), max_size=3),
    excluded=st.frozensets(st.integers(0, 7), max_size=3),
    model=st.sampled_from(MODELS),
)
def test_eligible_equals_a_brute_force_filter_after_any_event_sequence(
    ops: list[tuple[str, int, str, frozenset[str]]],
    need: frozenset[str],
    excluded: frozenset[int],
    model: str,
) -> None:
    """Adds, taint updates and removals in any mix leave the index equal to a full scan."""
    table, fleet = RoutingTable(), dict[str, WorkerRecord]()
    for revision, (op, index, on_model, taints) in enumerate(ops, start=1):
        record = worker(f"w{index}", *taints, model=on_model)
        if op == "remove":
            if record.key in fleet:
                table.apply(WorkerRemoved(fleet.pop(record.key), revision))
            continue
        old = fleet.get(record.key)
        if op == "retaint" and old is not None:
            record = worker(f"w{index}", *taints, model=old.model)
            table.apply(retaint(old, *taints, revision=revision))
        else:
            table.apply(WorkerAdded(record, revision))
        fleet[record.key] = record

    constraints = required(*need)
    exclude = {worker(f"w{i}").key for i in excluded}
    got = table.eligible(model, constraints, exclude)
    assert keys(got) == brute_force(fleet.values(), model, constraints, exclude)
    assert len(got) == len(keys(got)), "a worker came back twice"
    for record in fleet.values():
        if record.model == model:
            assert (why_not(record, constraints, exclude) is None) == (record.key in keys(got))
    for taint in TAINTS:
        expect = sum(1 for w in fleet.values() if w.model == model and taint in w.taints)
        assert table.holders(model, taint) == expect
    assert snapshot(table) == {k: w.taints for k, w in fleet.items()}


def test_cordoned_workers_are_skipped_unless_the_request_requires_the_cordon() -> None:
    a = worker("a1", "capacity/fast")
    b = worker("b2", "capacity/fast", CORDONED)
    table = RoutingTable([a, b])
    assert keys(table.eligible("m", required("capacity/fast"))) == {a.key}
    assert keys(table.eligible("m", RoutingConstraints())) == {a.key}
    assert keys(table.eligible("m", required(CORDONED))) == {b.key}
    why = table.why_not(b, required("capacity/fast"))
    assert why is not None and why.cordoned and not why.missing
    assert table.why_not(b, required(CORDONED, "capacity/fast")) is None


def test_uncordoning_by_taint_update_makes_the_worker_eligible_again() -> None:
    a = worker("a1", "pool=a", CORDONED)
    table = RoutingTable()
    table.apply(WorkerAdded(a, 1))
    assert table.eligible("m", required("pool=a")) == []
    assert table.apply(retaint(a, "pool=a", revision=2)) == {"m"}
    assert [w.instance_id for w in table.eligible("m", required("pool=a"))] == ["a1"]


def test_exclude_removes_the_named_worker_keys_only() -> None:
    a, b = worker("a1", "gpu"), worker("b2", "gpu")
    table = RoutingTable([a, b])
    assert keys(table.eligible("m", required("gpu"), exclude={a.key})) == {b.key}
    why = table.why_not(a, required("gpu"), exclude={a.key})
    assert why is not None and why.excluded


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_adds_and_taint_updates_of_distinct_workers_converge_in_any_order(
    data: st.DataObject,
) -> None:
    """Each worker gets an add and some taint updates; any interleaving gives one table."""
    events: list[WorkerAdded | WorkerModified] = []
    revision = 0
    for index in range(data.draw(st.integers(1, 5))):
        record = worker(f"w{index}", *data.draw(st.frozensets(st.sampled_from(TAINTS))))
        revision += 1
        events.append(WorkerAdded(record, revision))
        for taints in data.draw(st.lists(st.frozensets(st.sampled_from(TAINTS)), max_size=3)):
            revision += 1
            events.append(retaint(record, *taints, revision=revision))
    in_order = RoutingTable()
    for event in events:
        in_order.apply(event)
    shuffled = RoutingTable()
    for event in data.draw(st.permutations(events)):
        shuffled.apply(event)
    assert snapshot(shuffled) == snapshot(in_order)
    for taint in TAINTS:
        assert keys(shuffled.eligible("m", required(taint))) == keys(
            in_order.eligible("m", required(taint))
        )


def test_an_event_older_than_the_workers_record_is_ignored() -> None:
    a = worker("a1", "capacity/fast")
    table = RoutingTable()
    table.apply(WorkerAdded(a, 5))
    assert table.apply(retaint(a, "capacity/slow", revision=4)) == frozenset()
    assert table.apply(WorkerRemoved(a, 3)) == frozenset()
    assert snapshot(table) == {a.key: ("capacity/fast",)}


def test_a_taint_update_for_an_unknown_worker_adds_it() -> None:
    a = worker("a1")
    table = RoutingTable()
    table.apply(retaint(a, "gpu", revision=3))
    assert snapshot(table) == {a.key: ("gpu",)}


def test_resync_replaces_the_whole_view_and_reports_old_and_new_models() -> None:
    old, new = worker("a1", "gpu"), worker("b2", "gpu", model="n")
    table = RoutingTable()
    table.apply(WorkerAdded(old, 1))
    assert table.apply(ViewResync((new,), 9)) == {"m", "n"}
    assert snapshot(table) == {new.key: ("gpu",)}
    assert table.models() == ["n"]
    assert table.holders("m", "gpu") == 0


def test_removing_the_last_worker_of_a_model_forgets_the_model() -> None:
    a = worker("a1", "gpu")
    table = RoutingTable()
    table.apply(WorkerAdded(a, 1))
    assert table.apply(WorkerRemoved(a, 2)) == {"m"}
    assert table.models() == []
    assert len(table) == 0
    assert table.apply(WorkerRemoved(a, 3)) == frozenset()


def test_unsatisfiable_says_what_was_required_and_what_each_worker_has() -> None:
    table = RoutingTable(
        [worker("a1b2", "capacity/slow"), worker("c3d4", "capacity/fast", CORDONED)]
    )
    assert table.unsatisfiable("m", required("capacity/fast")) == (
        "no worker of model 'm' has capacity/fast; 2 workers: "
        "a1b2 has capacity/slow (missing capacity/fast), c3d4 is cordoned"
    )


def test_unsatisfiable_names_excluded_workers_and_caps_the_list() -> None:
    fleet = [worker(f"w{i}") for i in range(7)]
    table = RoutingTable(fleet)
    message = table.unsatisfiable("m", required("gpu"), exclude={fleet[0].key})
    assert message.startswith("no worker of model 'm' has gpu; 7 workers: w0 is excluded by the ")
    assert "w1 has no taints (missing gpu)" in message
    assert message.endswith(", and 2 more")


def test_unsatisfiable_for_an_unknown_model_lists_the_models_that_exist() -> None:
    table = RoutingTable([worker("a1", model="llama")])
    assert table.unsatisfiable("qwen", RoutingConstraints()) == (
        "no worker serves model 'qwen'; workers serve 'llama'"
    )
    assert RoutingTable().unsatisfiable("qwen", RoutingConstraints()) == (
        "no worker serves model 'qwen'; no workers are registered"
    )
