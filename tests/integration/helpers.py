"""Shared helpers of the integration tests (no fixtures here: conftest.py owns those)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg

from brooq.engine.kinds import Registry
from brooq.engine.runner import Attempted, SlotRunner
from brooq.engine.store import Store
from brooq.vocabulary import Claim, KindOptions

_SIGNALS = (signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2)


@contextlib.contextmanager
def preserved_signals() -> Iterator[None]:
    """Keep pytest-timeout's SIGALRM handler and timer across a SlotRunner's use.

    The runner arms its own SIGALRM for soft attempt timeouts and restores the
    default disposition when closed; without this, the test would silently lose
    its pytest-timeout guard.
    """
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    try:
        yield
    finally:
        for s, h in handlers.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        if remaining > 0:
            signal.setitimer(signal.ITIMER_REAL, remaining, interval)


def run_one(
    store: Store,
    handler: Callable[[Claim], Any],
    *,
    topic: str = "work",
    holder: str = "worker-1",
    lease: timedelta = timedelta(minutes=5),
    **options: Any,
) -> Attempted | None:
    """Claim the next job of ``topic`` and run ``handler`` on it through a real SlotRunner."""
    registry = Registry()
    registry.register(topic, handler, KindOptions(**options))
    with preserved_signals():
        runner = SlotRunner(store, registry, holder=holder, lease=lease, topics=[topic])
        try:
            return runner.run_once()
        finally:
            runner.close()


def count_jobs(conn: psycopg.Connection[Any], where: str = "true") -> int:
    """``SELECT count(*) FROM job WHERE <where>``."""
    row = conn.execute(f"SELECT count(*) FROM job WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


def claim_race_worker(dsn: str, topics: list[str], start: Any, results: Any) -> None:
    """One process of the claim race: claim and settle done until no job of ``topics`` is left.

    Sends ``(pid, handled ids, ids whose settle returned False, error)`` back.
    """
    import os
    import time

    from brooq.engine.outcome import DONE
    from brooq.postgres.store import PostgresStore

    handled: list[str] = []
    lost: list[str] = []
    error = None
    store = PostgresStore(dsn)
    holder = f"racer-{os.getpid()}"
    deadline = time.monotonic() + 120  # generous: a loaded 2-core machine is slow
    try:
        with store.connector.connection() as conn:  # connect before the start line
            conn.execute("SELECT 1")
        start.wait(timeout=60)
        while time.monotonic() < deadline:
            claimed = store.claim(holder, topics, timedelta(minutes=5))
            if claimed is not None:
                handled.append(claimed.id)
                if not store.settle(claimed.ticket, DONE):
                    lost.append(claimed.id)
                continue
            # None while rows are only locked by other claimers is normal; stop
            # once no ready row of these topics is left at all.
            with store.connector.connection() as conn:
                row = conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM job WHERE state IN ('pending', 'failed') "
                    "AND topic = ANY(%s))",
                    (topics,),
                ).fetchone()
            if not (row and row[0]):
                break
            time.sleep(0.001)
        else:
            error = "ran out of time"
    except BaseException as exc:  # reported to the parent, which fails the test
        error = f"{type(exc).__name__}: {exc}"
    finally:
        store.close()
    results.put((os.getpid(), handled, lost, error))
