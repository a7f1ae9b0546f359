"""Scheduling across real supervisors: max_running over two supervisors, periodic runs once.

Two ``brooq supervise`` processes share one database. A sampler reads the
table as fast as it can while they work; the periodic test reads the rows and
both supervisors' logs. Every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from tests.system.harness import count, insert_jobs, states, wait_until
from tests.system.obs_helpers import http_addr, scrape

pytestmark = [pytest.mark.system, pytest.mark.db]

ARGS = (
    "--workers",
    "4",
    "--http-addr",
    "127.0.0.1:0",
    "--poll-interval",
    "200ms",
    "--graceful-timeout",
    "3s",
)


class Sampler(threading.Thread):
    """Counts report jobs in flight, as fast as one connection allows, until stopped."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.samples: list[int] = []
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.halt.is_set():
                    row = conn.execute(
                        "SELECT count(*) FROM job WHERE state = 'processing' AND topic = 'report'"
                    ).fetchone()
                    assert row is not None
                    self.samples.append(int(row[0]))
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.mark.timeout(90)
def test_max_running_holds_across_two_supervisors(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """2 supervisors × 4 workers, report max_running=3, 40 jobs of 0.3 s: never more than 3."""
    logged = {"QUEUE_LOG_JOBS": "true"}  # JobDone says which supervisor ran each job
    a = supervise(*ARGS, app="sysapp_limits:queue", name="limits-a", env=logged)
    b = supervise(*ARGS, app="sysapp_limits:queue", name="limits-b", env=logged)
    a.wait_children(4, timeout=30)
    b.wait_children(4, timeout=30)
    sampler = Sampler(dsn)
    sampler.start()
    try:
        ids = insert_jobs(pg, "report", [{"sleep": 0.3}] * 40)
        free = insert_jobs(pg, "free", [{"sleep": 0.05}] * 20)  # unlimited, same workers
        wait_until(lambda: count(pg, "state = 'done'") == 60, 60, "all 60 jobs done", interval=0.2)
    finally:
        sampler.halt.set()
        sampler.join(timeout=10)
    assert sampler.error is None, sampler.error
    assert not sampler.is_alive()
    samples = sampler.samples
    assert len(samples) >= 500, f"only {len(samples)} samples"
    seen = Counter(samples)
    assert max(samples) <= 3, f"saw {max(samples)} report jobs processing at once: {seen}"
    assert max(samples) == 3, f"never reached the limit: {seen}"
    assert states(pg) == {"done": 60}
    assert count(pg, "attempts <> 1") == 0
    assert len(ids) == 40 and len(free) == 20
    # Both supervisors took part: the cap is global, not per supervisor.
    done_by = Counter(e["topic"] for sup in (a, b) for e in sup.events("JobDone"))
    assert done_by["report"] == 40, done_by
    per_sup = [
        sum(1 for e in sup.events("JobDone") if e.get("topic") == "report") for sup in (a, b)
    ]
    assert all(n > 0 for n in per_sup), per_sup
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.timeout(90)
def test_two_supervisors_enqueue_a_periodic_run_once(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """Both start and try to enqueue the latest run of ``* * * * *``: one row per run,
    and each run's PeriodicEnqueued comes from exactly one of them."""
    a = supervise(*ARGS, app="sysapp_periodic:queue", name="periodic-a")
    b = supervise(*ARGS, app="sysapp_periodic:queue", name="periodic-b")
    addrs = [http_addr(a), http_addr(b)]
    a.wait_children(4, timeout=30)
    b.wait_children(4, timeout=30)
    # Both schedulers have ticked (once a second, the first at once) by now.
    wait_until(lambda: count(pg, "topic = 'tick'") >= 1, 15, "the periodic job row")
    time.sleep(2.0)

    def settled() -> tuple[list[str], dict[str, list[str]]] | None:
        """Rows and log events, once every row has been announced (a row is written
        just before its event; a minute boundary may add a second run meanwhile)."""
        rows = pg.execute(
            "SELECT idempotency_key, available_at FROM job WHERE topic = 'tick' "
            "ORDER BY available_at"
        ).fetchall()
        assert all(k.startswith("periodic:every-minute:") for k, _ in rows), rows
        runs = [at.isoformat() for _, at in rows]
        assert len(runs) == len(set(runs)), f"a run enqueued twice: {rows}"
        events = {
            sup.log_path.name: [e["run"] for e in sup.events("PeriodicEnqueued")] for sup in (a, b)
        }
        logged = Counter(run for found in events.values() for run in found)
        return (runs, events) if logged == Counter(runs) else None

    runs, events = wait_until(settled, 10, "every run row announced once in the logs")
    # A start right at a minute boundary may see two runs; each one once.
    assert 1 <= len(runs) <= 2, runs
    first = runs[0]
    assert sum(first in found for found in events.values()) == 1, events
    # The metric agrees: the runs enqueued, summed over both supervisors, equal the rows.
    total = sum(
        scrape(addr).value("brooq_periodic_enqueued_total", schedule="every-minute")
        for addr in addrs
    )
    assert total == len(runs)
    wait_until(
        lambda: count(pg, "topic = 'tick' AND state = 'done'") == len(runs),
        15,
        "the periodic job to run",
    )
    assert a.stop() == 0 and b.stop() == 0
