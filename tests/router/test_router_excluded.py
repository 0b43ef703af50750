"""A worker the router leaves out by design says so (issue 27, item 6): one whose reading
(tokenizer, block size) disagrees with its model's other workers is ``excluded`` with the
reason, in listings (``Control.info``), in the refusal a request gets, and in an explain."""

from __future__ import annotations

from dynamod.audit import AuditLog
from dynamod.control import Control
from dynamod.discovery.view import WorkerView
from dynamod.errors import NoEligibleWorkerError
from dynamod.results import WorkerState
from dynamod.router import RouteRequest
from dynamod.store.memory import MemoryStore
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import Fixed
from tests.router.test_router_fit import reading_of, sized
from tests.router.test_router_queue import attempt, router_with
from tests.router.test_router_table import required


def test_the_odd_reading_is_named_with_its_reason_and_the_others_are_not() -> None:
    honest, other, odd = (
        sized("h", 8192, "real"),
        sized("i", 8192, "real"),
        sized("o", 8192, block=128),
    )
    router = router_with(honest, other, odd)
    why = router.disagreement(odd)
    assert why.startswith("its reading (tokenizer ") and "block size 128) disagrees" in why
    assert "block size 16); left out of routing" in why
    assert router.disagreement(honest) == "" and router.disagreement(other) == ""


def test_a_model_whose_workers_agree_excludes_none() -> None:
    router = router_with(sized("h", 8192), sized("i", 4096))
    assert router.disagreement(sized("h", 8192)) == ""


async def test_the_refusal_names_the_excluded_worker_and_its_reading() -> None:
    """The sentence of the issue: ``no worker of model 'tiny' has capacity/side; 1 worker:
    … has capacity/real`` hid the excluded worker, which held the taint."""
    honest, odd = sized("h", 8192, "real"), sized("o", 8192, "side", block=128)
    router = router_with(honest, sized("i", 8192, "real"), odd)
    needs = reading_of(router).needs(0)
    result = await attempt(router, RouteRequest("m", required("side"), needs=needs))
    assert isinstance(result, NoEligibleWorkerError)
    text = str(result)
    assert text.startswith("no worker of model 'm' has side; 2 workers: h has real (missing side)")
    assert "; 1 more worker excluded, reading bodies otherwise than the model's other" in text
    assert text.endswith(", block size 16): o (tokenizer " + text.split("o (tokenizer ")[1])
    assert "block size 128)" in text.split("excluded")[1]


async def test_the_listing_and_the_explain_show_it_excluded() -> None:
    honest, odd = sized("h", 8192, "real"), sized("o", 8192, "real", block=128)
    router = router_with(honest, sized("i", 8192, "real"), odd)
    store = MemoryStore()
    control = Control(
        store, WorkerView(store), router, AuditLog(None), "r", Fixed(SimpleTokenizer())
    )
    info = control.info(odd)
    assert info.state is WorkerState.EXCLUDED and not info.state.routable
    assert info.state_reason == router.disagreement(odd)
    assert control.info(honest).state is WorkerState.READY
    assert control.info(honest).state_reason == ""
    explained = await control.explain("m", required("real"), "")
    (shown,) = [c for c in explained.candidates if c.worker.id == "o"]
    assert not shown.eligible and shown.worker.state is WorkerState.EXCLUDED
    assert shown.reason == f"excluded: {router.disagreement(odd)}"
    assert {c.worker.id for c in explained.candidates if c.eligible} == {"h", "i"}
