"""Issue 22, item 1: dashboard readers never hold off forks, the loop or /healthz.

A real supervisor recycles each worker after one job (``--max-jobs-per-worker
1``: a fork per job) while 32 clients read ``/ui/jobs?limit=1000`` over
20,000 rows without a pause. Its forks go on as if nobody read (the
replacement of an exited worker stays quick, a drain is not slowed down),
/healthz answers every poll, and the pages the supervisor has no room for
are answered 503 at once instead of queueing behind the others.
"""

from __future__ import annotations

import http.client
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from tests.system.harness import count, insert_jobs, wait_until
from tests.system.obs_helpers import http_addr
from tests.system.test_slowloris import timed_healthz

pytestmark = [pytest.mark.system, pytest.mark.db]

READERS = 32
BALLAST = 20_000
DRAIN = 60
PAGE = "/ui/jobs?limit=1000"


@dataclass
class Readers:
    """``n`` threads that GET ``path`` back to back until stopped; each answer's status, time."""

    host: str
    port: int
    n: int
    path: str
    answers: list[tuple[int | str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Readers:
        for i in range(self.n):
            thread = threading.Thread(target=self._read, name=f"reader-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _read(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            try:
                conn.request("GET", self.path)
                response = conn.getresponse()
                response.read()
                status: int | str = response.status
            except (OSError, http.client.HTTPException) as exc:
                status = type(exc).__name__
            finally:
                conn.close()
            self.answers.append((status, time.monotonic() - started))
            if status != 200:
                time.sleep(0.05)  # as a browser's retry would: not a busy loop on refusals

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)


def fork_gaps(sup: Any) -> list[float]:
    """Seconds from each worker's exit (after its one job) to the start of its slot's next one."""
    events = sorted(sup.events(), key=lambda e: e["ts"])
    exited: dict[int, float] = {}
    gaps = []
    for e in events:
        if e.get("event") == "WorkerExited" and isinstance(e.get("slot"), int):
            exited[e["slot"]] = e["ts"]
        elif e.get("event") == "WorkerStarted" and e.get("slot") in exited:
            gaps.append(e["ts"] - exited.pop(e["slot"]))
    return gaps


@pytest.mark.timeout(240)
def test_page_readers_never_hold_off_forks_or_healthz(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    pg.execute(
        "INSERT INTO job (topic, payload) "
        "SELECT 'ballast', jsonb_build_object('n', g) FROM generate_series(1, %s) g",
        (BALLAST,),
    )
    sup = supervise("--workers", "2", "--max-jobs-per-worker", "1", "--poll-interval", "100ms")
    host, port = http_addr(sup).rsplit(":", 1)
    sup.wait_children(2)
    wait_until(lambda: timed_healthz(host, int(port))[1] == 200, 15, "/healthz 200")

    readers = Readers(host, int(port), READERS, PAGE).start()
    try:
        wait_until(lambda: len(readers.answers) >= READERS, 30, "every reader's first answer")
        polls = []
        for _ in range(30):
            seconds, status = timed_healthz(host, int(port))
            polls.append((round(seconds, 3), status))
            time.sleep(max(0.0, 0.2 - seconds))
        began = time.monotonic()
        insert_jobs(pg, "work", [None] * DRAIN)
        wait_until(lambda: count(pg, "state = 'done'") == DRAIN, 60, f"{DRAIN} jobs done")
        drain_s = time.monotonic() - began
    finally:
        readers.stop()

    gaps = fork_gaps(sup)
    statuses = [status for status, _ in readers.answers]
    served = [seconds for status, seconds in readers.answers if status == 200]
    summary = (
        f"drain of {DRAIN} jobs {drain_s:.1f}s; fork gaps median "
        f"{statistics.median(gaps):.3f}s max {max(gaps):.3f}s; /healthz {polls}; "
        f"pages: {statuses.count(200)} served (slowest {max(served, default=0):.2f}s), "
        f"{statuses.count(503)} shed, others {[s for s in statuses if s not in (200, 503)][:5]}"
    )
    print(summary)
    problems = []
    if len(gaps) < DRAIN - 2 or max(gaps) > 1.0:
        problems.append("a worker waited for its replacement")
    if drain_s > 20:
        problems.append("the drain was slowed down")
    if any(status != 200 or seconds >= 1.0 for seconds, status in polls):
        problems.append("/healthz failed or was slow")
    if statuses.count(503) == 0 or statuses.count(200) == 0:
        problems.append("pages were not both served and shed")
    if any(s not in (200, 503) for s in statuses):
        problems.append("a page failed otherwise than by shedding")
    assert not problems, "; ".join([*problems, summary])
