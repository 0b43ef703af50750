"""When each model lost its last worker (``dynamod/frontend/departures.py``), from real
discovery events."""

from __future__ import annotations

import time

from dynamod.discovery_events import ViewResync, WorkerAdded, WorkerRemoved
from dynamod.frontend.departures import Departures
from tests.support.factories import make_record


def test_a_model_is_gone_only_once_its_last_worker_left() -> None:
    a, b = make_record(model="m"), make_record(model="m")
    departures = Departures(window=60)
    departures.follow([a, b])
    departures.apply(WorkerRemoved(a, 2))
    assert departures.gone_since("m") is None  # b still serves it
    departures.apply(WorkerRemoved(b, 3))
    gone = departures.gone_since("m")
    assert gone is not None and 0 <= gone < 60
    departures.apply(WorkerAdded(a, 4))
    assert departures.gone_since("m") is None  # served again
    assert departures.gone_since("never") is None


def test_a_resync_without_a_model_counts_as_its_departure() -> None:
    departures = Departures(window=60)
    departures.follow([make_record(model="kept"), make_record(model="lost")])
    departures.apply(ViewResync((make_record(model="kept"),), 9))
    assert departures.gone_since("lost") is not None
    assert departures.gone_since("kept") is None


def test_a_departure_is_forgotten_after_the_window() -> None:
    record = make_record(model="m")
    departures = Departures(window=0.0)
    departures.follow([record])
    departures.apply(WorkerRemoved(record, 2))
    left = time.monotonic()
    while time.monotonic() == left:  # the clock must move past the zero-length window
        pass
    assert departures.gone_since("m") is None
