"""A worker's own connection (issue 32, item 16): closed once unused for its bound, looked at
between jobs and at the end of an idle wait, never while it is used."""

from __future__ import annotations

import pytest

from brooq.supervisor.child import WorkerConfig
from brooq.supervisor.workerstore import WorkerStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_connection_is_closed_once_unused_for_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    config = WorkerConfig(slot=0, topics=("a",), dsn="postgresql://db/app", connection_idle_s=60)
    own = WorkerStore(config, clock)
    assert own.look() is None  # never needed one: nothing to close, no wake-up to plan
    store = own.store  # a job with effects: the connection opens
    closed: list[float] = []
    monkeypatch.setattr(store.connector, "fileno", lambda: None if closed else 7)
    monkeypatch.setattr(store, "close", lambda: closed.append(clock.now))
    assert own.look() == 60.0  # looked at when that job ended: a whole bound ahead
    clock.now = 130.0
    assert own.look() == 30.0  # plain jobs since: it counts down
    assert own.store is store  # used again (claim.parents, a settle)
    clock.now = 150.0
    assert own.look() == 60.0
    clock.now = 209.9
    assert own.look() == pytest.approx(0.1) and not closed
    clock.now = 210.0
    assert own.look() is None and closed == [210.0]
    assert own.look() is None and own.fileno() is None  # nothing open: nothing to wait for
